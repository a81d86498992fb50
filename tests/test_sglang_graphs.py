"""SGLang tier, PARSE's GPU graph path executed on CPU.

One engine runs with decode graphs ON: SGLang's `DecodeCudaGraphRunner` captures PARSE's
TARGET_VERIFY (fixed window, N_max rows, request-major logits rows, the PARSE capture input)
and its `EAGLEDraftCudaGraphRunner` captures the whole draft chain, for batch sizes 1..16;
graph capture/replay itself is the eager stand-in (`sglang_cpu.graph_replay`), every
runner around it is SGLang's GPU-path code (`sglang_cpu/cpu_graphs.py`). A second
engine runs the same settings eagerly with the variable window. Batches of 11 requests are
padded to the captured 16, and shrink (and pad) as requests finish.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import BATCH_PROMPTS, assert_drafts_are_draft_greedy, hf_greedy, probe_config
from parse_sglang.settings import ParseConfig
from sglang_cpu import CPU_GRAPHS_ENV
from parse_sglang.settings import parse_engine_kwargs

pytestmark = pytest.mark.sglang

MAX_NEW = 24
JUDGED = probe_config(draft_budget=6, probe_stride=2, threshold=0.3)
GRAPH_BATCH_SIZES = [1, 2, 4, 8, 16]
SCORES = {"custom_params": {"parse": {"return_probe_scores": True}}}
LOSSLESS = {"custom_params": {"parse": {"judge": False, "return_probe_scores": True}}}


def greedy(**extra):
    return {"max_new_tokens": MAX_NEW, "temperature": 0.0, **extra}


@pytest.fixture(scope="module")
def graphs_engine(tiny_pair, engine_factory):
    with pytest.MonkeyPatch.context() as env:
        env.setenv(CPU_GRAPHS_ENV, "1")  # read by this process's server-argument resolution and the scheduler
        with engine_factory(
            tiny_pair[0],
            **parse_engine_kwargs(tiny_pair[1], JUDGED),
            disable_cuda_graph=False,
            disable_prefill_cuda_graph=True,
            cuda_graph_bs_decode=GRAPH_BATCH_SIZES,
        ) as engine:
            env.delenv(CPU_GRAPHS_ENV)
            yield engine


@pytest.fixture(scope="module")
def eager_engine(tiny_pair, engine_factory):
    with engine_factory(tiny_pair[0], **parse_engine_kwargs(tiny_pair[1], JUDGED)) as engine:
        yield engine


def parse_totals(engine) -> dict:
    (state,) = engine.get_server_info()["internal_states"]
    return state["parse"]


def test_lossless_under_graphs_equals_target_greedy(graphs_engine, hf_target):
    """Judge off per request: token-level speculative decoding through both graph runners,
    11 concurrent prompts of different lengths (padded 11 -> 16, then smaller buckets)."""
    tokenizer, model = hf_target
    before = parse_totals(graphs_engine)
    outs = graphs_engine.generate(BATCH_PROMPTS, greedy(**LOSSLESS))
    after = parse_totals(graphs_engine)
    for prompt, out in zip(BATCH_PROMPTS, outs):
        assert out["output_ids"] == hf_greedy(model, tokenizer(prompt).input_ids, MAX_NEW), prompt
        assert out["meta_info"]["parse"]["accepted_judged"] == 0
    passes = after["verify_passes"] - before["verify_passes"]
    assert passes > 0 and after["graph_passes"] - before["graph_passes"] == passes  # every round replayed
    # No request probes: the chain-only graph (L + 1 rows), not the probe-width one.
    rows = after["verify_rows"] - before["verify_rows"]
    assert rows == (after["rounds"] - before["rounds"]) * (JUDGED.draft_budget + 1)
    assert sum(out["meta_info"]["parse"]["accepted_exact"] for out in outs) > 0


def test_judged_under_graphs_equals_eager_variable_window(graphs_engine, eager_engine):
    """τ = 0.3: the graphed fixed window (K_max probes, padding probes included) gives the
    eager variable window's tokens, counters and judge scores."""
    graphed = graphs_engine.generate(BATCH_PROMPTS, greedy(**SCORES))
    eager = eager_engine.generate(BATCH_PROMPTS, greedy(**SCORES))
    compared = judged = 0
    for prompt, g, e in zip(BATCH_PROMPTS, graphed, eager):
        assert g["output_ids"] == e["output_ids"], prompt
        g_stats, e_stats = g["meta_info"]["parse"], e["meta_info"]["parse"]
        assert {k: v for k, v in g_stats.items() if k != "probe_scores"} == {
            k: v for k, v in e_stats.items() if k != "probe_scores"
        }
        for g_round, e_round in zip(g_stats["probe_scores"], e_stats["probe_scores"], strict=True):
            assert (g_round["draft"], g_round["accepted"]) == (e_round["draft"], e_round["accepted"])
            assert [b for b, _ in g_round["probes"]] == [b for b, _ in e_round["probes"]]
            g_scores = torch.tensor([p for _, p in g_round["probes"]])
            e_scores = torch.tensor([p for _, p in e_round["probes"]])
            assert torch.allclose(g_scores, e_scores, rtol=0, atol=1e-4)
            compared += len(g_round["probes"])
        judged += g_stats["accepted_judged"]
    assert compared >= 20 and judged > 0
    assert parse_totals(eager_engine)["graph_passes"] == 0


def test_drafts_are_the_draft_models_greedy(graphs_engine, hf_target, hf_draft):
    """Every round's draft from SGLang's EAGLE chain machinery, replayed as a graph, is the
    draft model's own greedy continuation (L = 6)."""
    prompts = BATCH_PROMPTS[:6]
    outs = graphs_engine.generate(prompts, greedy(**LOSSLESS))
    assert assert_drafts_are_draft_greedy(outs, [hf_target[0](p).input_ids for p in prompts], hf_draft) >= 12


def test_graph_reservations_of_the_design_example():
    """Qwen3-8B target, context 40,960, max_bs 48, N_max 125 (L=32, K=4, m=23): docs/gpu.md §7's
    figures (FlashInfer KV indices ~983 MB at N_max, mask ~246 MB, logits 3.6 GB unpruned),
    plus the chain-only verify graph's KV indices (33 rows), with the logits buffer cut to the
    37 rows PARSE reads per request."""
    from parse_sglang.graph_memory import MIB, GraphReservations
    from parse_sglang.attention.window import WindowGeometry

    def reservations(config: ParseConfig, suffix_len: int) -> GraphReservations:
        widths = tuple(s.rows for s in WindowGeometry(config, suffix_len).shapes())
        return GraphReservations(
            max_bs=48,
            window_rows=max(widths),
            read_rows=37 if suffix_len else 33,
            verify_widths=widths,
            draft_steps=tuple(L + 2 for L in config.chain_lengths),
            context_len=40960,
            vocab_size=151936,
        )

    r = reservations(probe_config(draft_budget=32, probe_stride=8), suffix_len=23)
    n_max_indices, chain_indices = 983_040_000, 259_522_560  # 48 x 125 (33) rows x 40,960 x 4 bytes
    assert r.verify_kv_indices == n_max_indices + chain_indices and round(r.verify_custom_mask / 1e6) == 247
    assert round(r.logits_unpruned / 1e9, 1) == 3.6 and round(r.logits / 1e9, 2) == 1.08
    assert r.total == 1_242_562_560 + 246_510_000 + 267_386_880 + 1_079_353_344
    assert f"{r.total / MIB:.0f} MiB" in r.describe()
    lossless = reservations(probe_config(draft_budget=32, judge=False), suffix_len=0)  # one width: no probes
    assert lossless.verify_kv_indices == chain_indices
    # Adaptive tiers 0/8/32: widths 1, 9 + 2 x 23 (Δ at most L / 2 = 4: two probes), 9, 33 and 125;
    # chains of 10 and 34 steps (tier 0 has none: its rounds skip the draft).
    adaptive = reservations(
        probe_config(draft_budget=32, probe_stride=8, adaptive=True, adaptive_tiers=[0, 8]), suffix_len=23
    )
    assert adaptive.verify_kv_indices == 48 * (1 + 55 + 9 + 125 + 33) * 40960 * 4
    assert adaptive.draft_kv_indices == (10 + 34) * 48 * 40960 * 4
    # With an EAGLE-3 head of k = 3 reading 3 aux layers of hidden 4096 (bf16): its head-round verify
    # width 4, every width's aux buffer, and its chain's and extend's KV indices (2k + 1 rows)
    config = ParseConfig(
        draft_budget=32, judge=False, adaptive=True, adaptive_tiers=[0, 8], eagle3_head="h", eagle3_steps=3
    )
    headed = dataclasses.replace(reservations(config, suffix_len=0), head_steps=3, aux_width=3 * 4096)
    widths = (1, 4, 9, 33)
    assert headed.verify_widths == widths
    assert headed.head == 48 * sum(widths) * 3 * 4096 * 2 + 7 * 48 * 40960 * 4
    assert headed.total - headed.head == dataclasses.replace(headed, head_steps=0).total
    assert "EAGLE-3 head" in headed.describe()


def test_startup_refuses_graph_reservations_beyond_headroom(tiny_pair, cpu_runtime):
    """With decode graphs on, a configuration whose PARSE graph buffers exceed the memory SGLang
    leaves outside its static pool is refused at startup, in the caller, naming the settings."""
    import sglang

    from conftest import engine_kwargs

    with pytest.MonkeyPatch.context() as env:
        env.setenv(CPU_GRAPHS_ENV, "1")
        kwargs = engine_kwargs(
            tiny_pair[0],
            **parse_engine_kwargs(tiny_pair[1], JUDGED),
            disable_cuda_graph=False,
            cuda_graph_bs_decode=[1, 2, 4, 8, 16, 32],
            max_running_requests=32,
            mem_fraction_static=0.999,
        )
        with pytest.raises(ValueError) as err:
            sglang.Engine(**kwargs)
    message = str(err.value)
    assert "PARSE's CUDA-graph reservations need" in message
    for setting in (
        "--cuda-graph-max-bs",
        "--max-running-requests (max_bs=32)",
        "--context-length (2048)",
        "--mem-fraction-static=0.999",
        "--disable-cuda-graph",
    ):
        assert setting in message, setting
