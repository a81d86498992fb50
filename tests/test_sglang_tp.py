"""SGLang tier, tensor parallelism: PARSE with `tp_size=2` on CPU (gloo) against one rank.

SGLang's CPU engine binds each rank to the cores of one NUMA node unless
`SGLANG_CPU_OMP_THREADS_BIND` names each rank's cores; a one-node machine needs it ("0|1":
rank 0 on core 0, rank 1 on core 1). The tiny pair has 4 attention heads and 2 KV heads,
so both models split across 2 ranks (the draft shares the target's TP group).

Four engines, one after the other, each serving three batches of PROMPTS (the judge off per
request: lossless; the judge on: τ = 0.3, a probe every 2 tokens; sampled at temperature 0.001,
the judge off: SGLang's sampling verification, the draft's sampled proposals and each rank's
coins, greedy in effect) and shut down:
- TP=1 PARSE: the judged reference (the lossless one is transformers' greedy decoding);
- TP=2 PARSE: both batches equal the references token for token;
- TP=2 with the test fault `PARSE_TEST_TP_FAULT=skew` (parse_sglang.tp_sync): rank 1's
  drafts, boundaries, judged flags, accepted lengths and emitted tokens are all moved
  before each broadcast, and the outputs still equal the references;
- TP=2 with `skew-drafts-unsynced`: rank 1's drafts moved and the plan broadcast skipped;
  its verify input then differs from rank 0's and rank 0's output leaves the references.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re

import pytest
import torch

from conftest import PROMPTS, hf_greedy, parse_server_flags, sglang_engine, probe_config
from sglang_cpu import CPU_BIND_ENV
from parse_sglang.settings import ParseConfig
from parse_sglang.settings import parse_engine_kwargs
from parse_sglang.tp_sync import FAULT_ENV, TpSync, broadcast_packed

# Eight prompts of different lengths, one concurrent batch.
TP_PROMPTS = PROMPTS + ["A", "the cat and the dog and the sun and the moon", "Is the answer correct? Yes. Is it"]
MAX_NEW = 24
JUDGED = probe_config(draft_budget=6, probe_stride=2, threshold=0.3)


def greedy(parse: dict) -> dict:
    return {"max_new_tokens": MAX_NEW, "temperature": 0.0, "custom_params": {"parse": parse}}


def serve(tiny_pair, tp_size: int, fault: str | None = None, config: ParseConfig = JUDGED) -> dict:
    """Start a PARSE engine, run the lossless, the judged and the cold sampled batch, shut it
    down; returns {"lossless": [...], "judged": [...], "cold": [...]} of (output_ids, meta_info["parse"])."""
    # Sampled, yet only the argmax survives top-p: the sampling path with one outcome (a tiny
    # temperature alone leaves near-tied logits to the coins).
    cold = {**greedy({"judge": False}), "temperature": 0.7, "top_p": 1e-6}
    batches = {"lossless": greedy({"judge": False}), "judged": greedy({}), "cold": cold}
    with pytest.MonkeyPatch.context() as patch:  # the scheduler processes inherit the environment
        if tp_size > 1:
            patch.setenv(CPU_BIND_ENV, os.environ.get(CPU_BIND_ENV, "0|1"))
        if fault is not None:
            patch.setenv(FAULT_ENV, fault)
        with sglang_engine(tiny_pair[0], tp_size=tp_size, **parse_engine_kwargs(tiny_pair[1], config)) as engine:
            return {
                name: [(out["output_ids"], out["meta_info"]["parse"]) for out in engine.generate(TP_PROMPTS, params)]
                for name, params in batches.items()
            }


@pytest.fixture(scope="module")
def target_greedy(hf_target):
    tokenizer, model = hf_target
    return [hf_greedy(model, tokenizer(prompt).input_ids, MAX_NEW) for prompt in TP_PROMPTS]


@pytest.fixture(scope="module")
def tp1(tiny_pair, cpu_runtime):
    return serve(tiny_pair, 1)


@pytest.fixture(scope="module")
def tp2(tiny_pair, cpu_runtime):
    return serve(tiny_pair, 2)


@pytest.fixture(scope="module")
def tp2_skewed(tiny_pair, cpu_runtime):
    return serve(tiny_pair, 2, fault="skew")


@pytest.fixture(scope="module")
def slow_draft_costs(tmp_path_factory) -> str:
    """A cost table pricing a draft step at 1 s and every verify alike (its rows free)."""
    costs = tmp_path_factory.mktemp("tp_costs") / "costs.json"
    costs.write_text(
        json.dumps(
            {
                "draft": [{"bucket": 8, "L": L, "seconds": float(L)} for L in (0, 6)],
                "rest": [{"bucket": 8, "rows": r, "seconds": 1e-3} for r in (1, 7)],
            }
        )
    )
    return str(costs)


@pytest.fixture(scope="module")
def tp2_tier0(tiny_pair, cpu_runtime, slow_draft_costs):
    """An adaptive TP=2 server whose costs keep every round at tier 0 (no copies): rounds of
    decode steps, each step's tokens broadcast from rank 0."""
    config = dataclasses.replace(
        JUDGED, adaptive=True, adaptive_tiers=(0,), cost_table=slow_draft_costs, retrieval=False
    )
    return serve(tiny_pair, 2, config=config)


@pytest.fixture(scope="module")
def tp2_copies(tiny_pair, cpu_runtime, slow_draft_costs):
    """The same with retrieval: a copy's verify costs what a decode step does, so every request
    that has a copy verifies it, rank 0's copies and choices on both ranks."""
    config = dataclasses.replace(JUDGED, adaptive=True, adaptive_tiers=(0,), cost_table=slow_draft_costs)
    return serve(tiny_pair, 2, config=config)


@pytest.fixture(scope="module")
def tp2_drafts_unsynced(tiny_pair, cpu_runtime):
    return serve(tiny_pair, 2, fault="skew-drafts-unsynced")


def ids(outs) -> list[list[int]]:
    return [output_ids for output_ids, _ in outs]


# ----- TpSync on its own: two gloo ranks, no SGLang ------------------------------------


@dataclasses.dataclass
class _Record:
    tokens: torch.Tensor
    flags: torch.Tensor


@dataclasses.dataclass
class _Accepted:
    """acceptance.Accepted's shared fields."""

    emitted: torch.Tensor
    lengths: torch.Tensor
    exact_tokens: torch.Tensor


@dataclasses.dataclass
class _Plan:
    """window_plan.ProbePlan's fields (that module imports SGLang's runtime)."""

    drafts: torch.Tensor
    confidence: torch.Tensor
    draft_lens: torch.Tensor
    phase_limits: torch.Tensor
    judged: torch.Tensor
    probed: torch.Tensor
    thresholds: torch.Tensor
    token_modes: torch.Tensor
    token_thresholds: torch.Tensor
    token_windows: torch.Tensor
    bounds: torch.Tensor


@dataclasses.dataclass
class _Group:
    """The parts of SGLang's GroupCoordinator TpSync reads."""

    world_size: int
    rank_in_group: int
    ranks: tuple = (0, 1)
    cpu_group: object = None
    device_group: object = None


def _rank_main(rank: int, init_file: str, fault: str, results) -> None:
    import torch.distributed as dist

    os.environ[FAULT_ENV] = fault
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    sync = TpSync(_Group(2, rank, cpu_group=dist.group.WORLD, device_group=dist.group.WORLD))
    plan = _Plan(
        drafts=torch.tensor([[5, 6, 7], [8, 9, 10]]) + 10 * rank,
        confidence=torch.tensor([[0.75, 0.5, 0.25], [0.125, 1.0, 0.0]]) / (rank + 1),
        draft_lens=torch.tensor([3, 2 - rank]),
        phase_limits=torch.tensor([3, 3 - rank]),
        judged=torch.tensor([True, rank == 0]),
        probed=torch.tensor([rank == 0, True]),
        thresholds=torch.tensor([0.3, 0.5 + rank]),
        token_modes=torch.tensor([0, 1 + rank]),
        token_thresholds=torch.tensor([0.25, 0.5]),
        token_windows=torch.tensor([4, 4 + rank]),
        bounds=torch.tensor([[2, 3, 0], [2, 0, 0]]),
    )
    shared = sync.share_plan(plan)
    accepted = sync.share_accepted(
        _Accepted(
            emitted=torch.tensor([[1, 2, 3], [4, 5, 6]]) * (rank + 1),
            lengths=torch.tensor([2 - rank, 1]),
            exact_tokens=torch.tensor([1, rank]),
        )
    )
    results[rank] = (
        shared is plan,
        {
            field.name: (getattr(shared, field.name).dtype, getattr(shared, field.name).tolist())
            for field in dataclasses.fields(shared)
        },
        {name: (value.dtype, value.tolist()) for name, value in dataclasses.asdict(accepted).items()},
    )
    dist.destroy_process_group()


def _two_ranks(tmp_path, fault: str) -> dict:
    import torch.multiprocessing as mp

    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank_main, args=(str(tmp_path / "init"), fault, results), nprocs=2)
        return dict(results)


def test_tp_sync_is_the_identity_on_one_rank():
    sync = TpSync(_Group(1, 0, ranks=(0,)))
    record = _Record(torch.tensor([1, 2]), torch.tensor([True]))
    assert sync.share_plan(record) is record and sync.share_accepted(record) is record


def test_broadcast_packed_keeps_shapes_and_dtypes(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        tensors = [
            torch.tensor([[1, -1], [3, 4]], dtype=torch.int32),
            torch.tensor([7, -2]),
            torch.tensor([True, False]),
            torch.tensor([0.1, 2.5e-8]),
            torch.zeros(2, 0, dtype=torch.int64),
        ]
        back = broadcast_packed(tensors, 0, dist.group.WORLD)
        assert [(t.dtype, t.shape, t.tolist()) for t in back] == [(t.dtype, t.shape, t.tolist()) for t in tensors]
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("fault", ["", "skew"])
def test_every_rank_gets_rank0s_plan_and_decisions(tmp_path, fault):
    results = _two_ranks(tmp_path, fault)
    (same0, plan0, acc0), (same1, plan1, acc1) = results[0], results[1]
    assert same0 and not same1  # rank 0 keeps its own objects; rank 1 takes rank 0's values
    assert (
        plan1
        == plan0
        == {
            "drafts": (torch.int64, [[5, 6, 7], [8, 9, 10]]),
            "confidence": (torch.float32, [[0.75, 0.5, 0.25], [0.125, 1.0, 0.0]]),
            "draft_lens": (torch.int64, [3, 2]),
            "phase_limits": (torch.int64, [3, 3]),
            "judged": (torch.bool, [True, True]),
            "probed": (torch.bool, [True, True]),
            "thresholds": (torch.float32, [0.30000001192092896, 0.5]),  # float32 bits travel exactly
            "token_modes": (torch.int64, [0, 1]),
            "token_thresholds": (torch.float32, [0.25, 0.5]),
            "token_windows": (torch.int64, [4, 4]),
            "bounds": (torch.int64, [[2, 3, 0], [2, 0, 0]]),
        }
    )
    assert (
        acc1
        == acc0
        == {
            "emitted": (torch.int64, [[1, 2, 3], [4, 5, 6]]),
            "lengths": (torch.int64, [2, 1]),
            "exact_tokens": (torch.int64, [1, 0]),
        }
    )


def test_drafts_unsynced_fault_skips_only_the_plan_broadcast(tmp_path):
    results = _two_ranks(tmp_path, "skew-drafts-unsynced")
    assert results[0][1]["drafts"][1] == [[5, 6, 7], [8, 9, 10]]
    assert results[1][1]["drafts"][1] == [[14, 15, 16], [17, 18, 19]]  # its own drafts, each id moved by one
    assert results[1][2] == results[0][2]  # decisions still rank 0's


# ----- real SGLang engines, TP=2 against TP=1 ------------------------------------------


@pytest.mark.sglang
def test_tp2_lossless_equals_target_greedy(tp2, target_greedy):
    assert ids(tp2["lossless"]) == target_greedy
    assert ids(tp2["cold"]) == target_greedy  # the sampling path, every rank on rank 0's samples
    stats = [parse for _, parse in tp2["lossless"]]
    assert sum(s["accepted_exact"] for s in stats) > 0 and sum(s["accepted_judged"] for s in stats) == 0


@pytest.mark.sglang
def test_tp2_judged_equals_tp1(tp1, tp2, target_greedy):
    assert ids(tp1["lossless"]) == target_greedy
    assert tp2["judged"] == tp1["judged"]  # tokens and every counter, request by request
    assert sum(parse["accepted_judged"] for _, parse in tp2["judged"]) > 0


@pytest.mark.sglang
def test_broadcasts_keep_skewed_ranks_equal(tp1, tp2_skewed, target_greedy):
    """Rank 1 disagrees with rank 0 on everything it decides; the broadcasts overrule it."""
    assert ids(tp2_skewed["lossless"]) == target_greedy and ids(tp2_skewed["cold"]) == target_greedy
    assert tp2_skewed["judged"] == tp1["judged"]


@pytest.mark.sglang
def test_tp2_tier0_decode_steps_equal_target_greedy(tp2_tier0, target_greedy):
    """Tier 0 at TP=2: both ranks run the same decode steps per round (their collectives
    match), and greedy and sampled outputs are the target's."""
    assert ids(tp2_tier0["lossless"]) == target_greedy and ids(tp2_tier0["cold"]) == target_greedy
    stats = [parse for _, parse in tp2_tier0["lossless"] + tp2_tier0["judged"]]
    assert all(s["draft_length"] == 0 and s["rounds"] == MAX_NEW - 1 for s in stats), stats


@pytest.mark.sglang
def test_tp2_copies_equal_target_greedy(tp2_copies, target_greedy):
    """Copies at TP=2, with no draft model round: greedy and sampled outputs are the target's."""
    assert ids(tp2_copies["lossless"]) == target_greedy and ids(tp2_copies["cold"]) == target_greedy
    stats = [parse for _, parse in tp2_copies["lossless"] + tp2_copies["judged"]]
    assert sum(s["copy_rounds"] for s in stats) > 0 and sum(s["copy_accepted"] for s in stats) > 0, stats
    assert all(s["accepted_exact"] + s["accepted_judged"] == s["copy_accepted"] for s in stats), stats


@pytest.mark.sglang
def test_without_the_plan_broadcast_skewed_ranks_diverge(tp1, tp2_drafts_unsynced, target_greedy):
    """The same kind of fault with the plan broadcast skipped: rank 1 verifies other draft
    tokens than rank 0 (its vocabulary shard embeds them), so rank 0's output is wrong."""
    lossless_wrong = sum(got != want for got, want in zip(ids(tp2_drafts_unsynced["lossless"]), target_greedy))
    judged_wrong = sum(got != want for got, want in zip(ids(tp2_drafts_unsynced["judged"]), ids(tp1["judged"])))
    half = len(TP_PROMPTS) // 2  # measured: 7 and 8 of 8 prompts differ
    assert lossless_wrong >= half and judged_wrong >= half, (lossless_wrong, judged_wrong)


# ----- what stays refused ---------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--pp-size", "2"], "--pp-size=2: allowed is 1"),
        (["--enable-dp-attention", "--dp-size", "2", "--tp-size", "2"], "--enable-dp-attention=True: allowed is off"),
        (["--attn-dp-size", "2", "--tp-size", "2"], "--enable-dp-attention=True: allowed is off"),
    ],
)
def test_pipeline_and_dp_attention_stay_refused(tiny_pair, cpu_runtime, argv, named):
    """Refused by name when the server arguments resolve, before any process starts
    (docs/serving.md, "Several GPUs", says what each would need)."""
    from sglang.srt.server_args import prepare_server_args

    from parse_sglang.plugin import register

    register()
    server_args = prepare_server_args([*parse_server_flags(*tiny_pair), "--device", "cpu", *argv])
    with pytest.raises(ValueError, match=re.escape(f"PARSE does not support {named}")):
        server_args.resolve_once()
