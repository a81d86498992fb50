"""GPU tier: PARSE served by stock SGLang on CUDA with CUDA graphs (skipped without CUDA).

Per attention backend, FlashInfer (skipped where SGLang does not find it: not installed, or
SGLANG_IS_FLASHINFER_AVAILABLE=false as in the gpu-kit) and Triton, three engines on a tiny random
pair (tiny_models.build_pair, head_dim 64: FlashInfer has no kernels for conftest.tiny_pair's 16),
decode graphs captured for batch sizes 1/2/4/8/16 (prefill graphs off: not
this test's subject; benchmarks/gpu_serving.py runs them), SGLang's PyTorch sampling backend:
- target-only, graphs on;
- PARSE (L = 6, Δ = 2, τ = 0.3, verify_window "fixed"), graphs on: with the judge off per request
  the 11 prompts of conftest.BATCH_PROMPTS (different lengths, sent at once: the batch is padded
  11 -> 16 and shrinks as requests finish) must give target-only's output and every round must
  replay the draft chain's and the verify's graphs; judged (τ = 0.3), the same engine must give
  what the eager engine gives;
- the same PARSE settings with disable_cuda_graph=True (verify_window "fixed" in both, so the
  window shapes agree).
Triton runs float32: outputs must be equal token for token (and judged counters too). FlashInfer's
prefill kernels take 16-bit inputs only, so its engines run float16, where two runs may part at a
near-tie: lossless vs target-only, the fp32 transformers model must put the two tokens within TIE
of each other there; judged graphs vs eager, a parting may also be a judge score near τ. Nothing
after a parting is compared, and at most a third of the prompts may part.
The engines run one at a time. The backend that ran is recorded (`record_property(
"attention_backend", ...)`, in the junit XML, and a line on the terminal) and checked against
`get_server_info()`.
"""

from __future__ import annotations

import pytest
import torch

from conftest import BATCH_PROMPTS, probe_config
from parse_sglang.settings import parse_engine_kwargs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

MAX_NEW = 24
GRAPH_BATCH_SIZES = [1, 2, 4, 8, 16]
JUDGED = probe_config(draft_budget=6, probe_stride=2, threshold=0.3, verify_window="fixed")
LOSSLESS = {"custom_params": {"parse": {"judge": False, "return_probe_scores": True}}}
SCORES = {"custom_params": {"parse": {"return_probe_scores": True}}}
BACKENDS = {"triton": "float32", "flashinfer": "float16"}
TIE = 0.05  # fp32 logit gap under which a 16-bit run may pick either token
SCORE_TOLERANCE = {"float32": 1e-4, "float16": 2e-2}


def greedy(**extra):
    return {"max_new_tokens": MAX_NEW, "temperature": 0.0, **extra}


def cuda_engine_kwargs(model_path, backend: str, graphs: bool, **overrides) -> dict:
    kwargs = dict(
        model_path=str(model_path),
        dtype=BACKENDS[backend],
        attention_backend=backend,
        sampling_backend="pytorch",
        max_running_requests=16,
        max_total_tokens=65536,
        mem_fraction_static=0.5,
        log_level="error",
    )
    if graphs:
        kwargs.update(disable_cuda_graph=False, cuda_graph_bs_decode=GRAPH_BATCH_SIZES, disable_prefill_cuda_graph=True)
    else:
        kwargs["disable_cuda_graph"] = True
    kwargs.update(overrides)
    return kwargs


@pytest.fixture(scope="module", params=list(BACKENDS))
def backend(request):
    name = request.param
    if name == "flashinfer":
        from sglang.srt.utils.common import is_flashinfer_available

        if not is_flashinfer_available():
            pytest.skip(
                "FlashInfer is not available to SGLang here (not installed, or SGLANG_IS_FLASHINFER_AVAILABLE=false)"
            )
    return name


@pytest.fixture(scope="module")
def gpu_pair(tmp_path_factory):
    """A tiny Llama target (hidden 256, 4 heads / 2 KV heads of 64) and its 5%-noise draft."""
    from support.tiny_models import build_pair

    return build_pair(
        tmp_path_factory.mktemp("gpu_pair"), arch="llama", noise=0.05, hidden_size=256, num_heads=4, num_kv_heads=2
    )


@pytest.fixture(scope="module")
def hf_gpu_target(gpu_pair):
    """(tokenizer, model): the target in transformers, fp32 on CPU (the near-tie referee)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return (
        AutoTokenizer.from_pretrained(gpu_pair[0]),
        AutoModelForCausalLM.from_pretrained(gpu_pair[0], dtype=torch.float32).eval(),
    )


@pytest.fixture(scope="module")
def served(backend, gpu_pair) -> dict:
    """What the three engines answer, each engine started, used and shut down before the next
    (SGLang's speculative settings are process-global: a target-only engine still running when a
    speculative one starts in the same process then fails reading speculative metrics)."""
    import sglang

    target, draft = gpu_pair
    out = {}

    def run(name, graphs, spec, calls):
        engine = sglang.Engine(**cuda_engine_kwargs(target, backend, graphs, **spec))
        try:
            out[f"{name} backend"] = engine.get_server_info()["attention_backend"]
            for key, params in calls.items():
                before = parse_totals(engine)
                out[key] = engine.generate(BATCH_PROMPTS, params)
                after = parse_totals(engine)
                out[f"{key} passes"] = {
                    k: after.get(k, 0) - before.get(k, 0) for k in ("verify_passes", "graph_passes")
                }
        finally:
            engine.shutdown()

    run("target-only", True, {}, {"target-only": greedy()})
    run(
        "graphs", True, parse_engine_kwargs(draft, JUDGED), {"lossless": greedy(**LOSSLESS), "judged": greedy(**SCORES)}
    )
    run("eager", False, parse_engine_kwargs(draft, JUDGED), {"judged eager": greedy(**SCORES)})
    return out


def parse_totals(engine) -> dict:
    (state,) = engine.get_server_info()["internal_states"]
    return state.get("parse") or {}


def first_parting(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def assert_same_up_to_ties(got, want, hf_target, dtype: str, what: str) -> list[str]:
    """got[i] == want[i] (float32); in 16-bit, equal up to a near-tie of the fp32 target, in at
    most a third of the prompts. Returns a line per parting."""
    tokenizer, model = hf_target
    partings = []
    for prompt, g, w in zip(BATCH_PROMPTS, got, want):
        j = first_parting(g, w)
        if j is None:
            continue
        assert dtype != "float32", f"{what}: {prompt!r} parts at token {j}: {g} != {w}"
        assert j < min(len(g), len(w)), f"{what}: {prompt!r}: one output stops early at {j}: {g} / {w}"
        ids = tokenizer(prompt).input_ids + w[:j]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].float()
        gap = abs(float(logits[g[j]] - logits[w[j]]))
        assert gap <= TIE, f"{what}: {prompt!r} parts at token {j} ({g[j]} vs {w[j]}), fp32 logit gap {gap:.4f} > {TIE}"
        partings.append(f"{prompt!r}: token {j}, fp32 gap {gap:.4f}")
    assert len(partings) <= len(BATCH_PROMPTS) // 3, f"{what}: {len(partings)} prompts part: {partings}"
    return partings


def test_backend_is_recorded(served, backend, record_property, capsys):
    assert [served[f"{name} backend"] for name in ("target-only", "graphs", "eager")] == [backend] * 3
    record_property("attention_backend", backend)
    record_property("dtype", BACKENDS[backend])
    with capsys.disabled():
        print(f"\n[test_gpu_serving] attention backend {backend}, {BACKENDS[backend]}, {torch.cuda.get_device_name()}")


def test_lossless_under_cuda_graphs_equals_target_only(served, backend, hf_gpu_target):
    want = [out["output_ids"] for out in served["target-only"]]
    outs = served["lossless"]
    assert_same_up_to_ties([o["output_ids"] for o in outs], want, hf_gpu_target, BACKENDS[backend], "lossless")
    assert all(o["meta_info"]["parse"]["accepted_judged"] == 0 for o in outs)
    assert sum(o["meta_info"]["parse"]["accepted_exact"] for o in outs) > 0
    passes = served["lossless passes"]
    assert passes["verify_passes"] > 0 and passes["graph_passes"] == passes["verify_passes"]  # every round replayed


def test_judged_under_cuda_graphs_equals_eager(served, backend):
    graphed, eager, dtype = served["judged"], served["judged eager"], BACKENDS[backend]
    parted = [prompt for prompt, g, e in zip(BATCH_PROMPTS, graphed, eager) if g["output_ids"] != e["output_ids"]]
    if dtype == "float32":
        assert not parted, parted
    else:  # a 16-bit parting may be a token near-tie or a judge score near τ
        assert len(parted) <= len(BATCH_PROMPTS) // 3, parted
    compared = judged = 0
    for g, e in zip(graphed, eager):
        g_stats, e_stats = g["meta_info"]["parse"], e["meta_info"]["parse"]
        if dtype == "float32":
            assert {k: v for k, v in g_stats.items() if k != "probe_scores"} == {
                k: v for k, v in e_stats.items() if k != "probe_scores"
            }
        for g_round, e_round in zip(g_stats["probe_scores"], e_stats["probe_scores"]):
            if g_round["draft"] != e_round["draft"]:
                assert dtype != "float32"
                break  # after a parting the rounds see other contexts
            assert [b for b, _ in g_round["probes"]] == [b for b, _ in e_round["probes"]]
            g_scores = torch.tensor([p for _, p in g_round["probes"]])
            e_scores = torch.tensor([p for _, p in e_round["probes"]])
            assert torch.allclose(g_scores, e_scores, rtol=0, atol=SCORE_TOLERANCE[dtype])
            compared += len(g_round["probes"])
        judged += g_stats["accepted_judged"]
    assert compared >= 20 and judged > 0, (compared, judged, parted)
    passes = served["judged passes"]
    assert passes["verify_passes"] > 0 and passes["graph_passes"] == passes["verify_passes"]
    assert served["judged eager passes"]["graph_passes"] == 0


def test_sampled_distribution_under_graphs(tmp_path_factory):
    """tests/test_sglang_sampling.py's check on CUDA (Triton, fp32, CUDA graphs): PARSE lossless
    with each verification rule samples the target's distribution (SGLang's CUDA / Triton
    sampling kernels, the draft's sampled proposals in its graph), and the biased control (the
    judge accepting every whole draft) is told apart by the same statistic."""
    import sglang
    from test_sglang_sampling import ALPHA, BIASED, LOSSLESS as OFF, RULES, SERVER, SETTINGS, draw, homogeneity

    from support.tiny_models import build_pair

    target, draft = build_pair(
        tmp_path_factory.mktemp("sharp_gpu_pair"),
        noise=0.5,
        logit_scale=6.0,
        hidden_size=256,
        num_heads=4,
        num_kv_heads=2,
    )
    out = {}
    runs = [
        ("target_only", {}),
        ("target_only_rule", parse_engine_kwargs(draft, SERVER)),
        ("rejection_rule", {**parse_engine_kwargs(draft, SERVER), "speculative_use_rejection_sampling": True}),
    ]
    for source, spec in runs:
        engine = sglang.Engine(**cuda_engine_kwargs(target, "triton", graphs=True, random_seed=1, **spec))
        try:
            for name, sampling in SETTINGS.items():
                out[source, name] = draw(engine, sampling, OFF if spec else None)
                if source == "target_only_rule":
                    out["biased", name] = draw(engine, sampling, BIASED)
        finally:
            engine.shutdown()
    for name in SETTINGS:
        reference = out["target_only", name]
        for rule in RULES:
            assert homogeneity(out[rule, name], reference)[0] >= ALPHA, (rule, name)
        assert homogeneity(out["biased", name], reference)[0] < ALPHA, name
