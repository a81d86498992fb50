"""docs/gpu.md §9's budget for a round, counted in a real SGLang engine on CPU: per round at
most one device-to-host read before the verify (the drafts), one host-to-device copy (the
packed plan) and one device-to-host read after acceptance (the packed result).

`support/round_probe/sitecustomize.py` runs in the engine's scheduler and counts every other
round with `support.sync_counter.SyncCounter` (which tells device tensors from host tensors on
a CPU by how they were made). The counter itself is checked on code that syncs the way the
round used to (`.any()` branches, `torch.tensor(list, device=...)`, `.tolist()` of device
tensors): it counts each one, so the budget test can fail.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from conftest import BATCH_PROMPTS, probe_config
from parse_sglang.settings import parse_engine_kwargs
from parse_sglang.settings import ParseConfig
from support.sync_counter import SyncCounter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JUDGED = probe_config(draft_budget=6, probe_stride=2, threshold=0.3)
MAX_NEW = 20


def test_counter_counts_what_would_sync_on_a_gpu():
    """Negative control: each of these would block the host on a GPU, and is counted once;
    device-only work, host-only work and factories on the device are not."""
    device = torch.device("cpu")
    drafts = torch.arange(12, device=device).view(3, 4)  # a device tensor
    with SyncCounter() as counter:
        lengths = torch.tensor([1, 2, 3], device=device)  # host data -> device: 1
        if bool((drafts > 10).any()):  # a device read: 1
            pass
        rows = drafts.tolist()  # 2
        host = torch.tensor(rows)[:, :2] * 2  # host work: 0
        mixed = drafts[:, :2] + host  # a host tensor mixed into device ones: 2
        kept = drafts[drafts > 4]  # an output sized by device values: 3
        steps = torch.arange(4, device=device) + lengths[:, None]  # device work: 0
        total = int(steps.sum())  # 4
    assert counter.counts("sglang") == {"device_to_host": 4, "host_to_device": 2}, counter.events
    assert [e.what for e in counter.events if e.direction == "host_to_device"] == [
        "_VariableFunctionsClass.tensor",
        "TensorBase.add (a host tensor mixed into device ones)",
    ]
    assert mixed.shape == (3, 2) and kept.numel() == 7 and total > 0


def assert_three_crossings(records) -> None:
    """Every counted round (at least 5, batches above 4 among them): PARSE's code reads the
    device in `_plan_window` (the drafts) and `_record` (the result), and copies to it in
    `_plan_window` (the plan), once each."""
    counted = [r for r in records if r["kind"] == "count"]
    assert len(counted) >= 5 and max(r["batch_size"] for r in counted) > 4
    for r in counted:
        crossings = sorted((direction, step) for direction, step, *_ in r["parse"])
        assert crossings == [
            ("device_to_host", "_plan_window"),
            ("device_to_host", "_record"),
            ("host_to_device", "_plan_window"),
        ], r["parse"]


def serve_probed(engine_factory, tiny_pair, config: ParseConfig, params, out):
    """BATCH_PROMPTS served by a PARSE engine whose rounds the round probe records: (the
    outputs, the per-round records, the server's totals)."""
    path = os.pathsep.join(
        filter(None, [os.path.join(ROOT, "support", "round_probe"), ROOT, os.environ.get("PYTHONPATH")])
    )
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PARSE_ROUND_PROBE_OUT", str(out))
        env.setenv("PYTHONPATH", path)
        with engine_factory(tiny_pair[0], **parse_engine_kwargs(tiny_pair[1], config)) as engine:
            outs = engine.generate(BATCH_PROMPTS, params)
            totals = engine.get_server_info()["internal_states"][0]["parse"]
    return outs, json.loads(out.read_text()), totals


@pytest.fixture(scope="module")
def probe_records(tiny_pair, engine_factory, tmp_path_factory):
    """Per-round records of a judged PARSE engine serving a mixed batch: the probe judge,
    the likelihood judge, judge off, probe scores returned."""
    settings = [
        {},
        {"judge_mode": "likelihood", "likelihood_threshold": 0.02},
        {"judge": False},
        {"return_probe_scores": True, "threshold": 0.1},
    ]
    params = [
        {"max_new_tokens": MAX_NEW, "temperature": 0.0, "custom_params": {"parse": settings[i % 4]}}
        for i in range(len(BATCH_PROMPTS))
    ]
    out = tmp_path_factory.mktemp("probe") / "rounds.json"
    outs, records, totals = serve_probed(engine_factory, tiny_pair, JUDGED, params, out)
    assert all(len(o["output_ids"]) == MAX_NEW for o in outs)
    return records, totals


def test_three_host_device_crossings_per_round(probe_records):
    """Every counted round: PARSE's own code reads the device once before the verify (in
    `_plan_window`, the drafts) and once after acceptance (in `_record`, the result), and
    copies to the device once (in `_plan_window`, the plan); batches of 1 to 11 requests."""
    records, totals = probe_records
    assert_three_crossings(records)
    assert totals["accepted_judged"] > 0 and totals["judge_probes"] > 0  # the judge did run


def test_tier0_round_plans_without_crossing(cpu_runtime):
    """An adaptive tier-0 round (nothing drafted) has nothing to place or judge: after its batch
    size's first round, its window is planned with no host-device copy at all, while a round
    with drafts uploads its plan once (the control)."""
    from parse_sglang.attention.window import ShapeConstants
    from parse_sglang.window_plan import RequestPolicy, plan_window

    constants = ShapeConstants(torch.device("cpu"))
    policies = [RequestPolicy(probe_config(draft_budget=4), budget=4, judged=False, stop_ids=frozenset())] * 2

    last_tokens, prefix_lens = torch.tensor([5, 6]), torch.tensor([3, 4])  # made outside a counter: device tensors

    def plan(length: int, counter: SyncCounter):
        drafts = torch.arange(2 * length, dtype=torch.int64).view(2, length)
        counter.mark_host(drafts)
        return plan_window(
            drafts_host=drafts,
            confidence_host=drafts.float(),
            last_tokens=last_tokens,
            prefix_lens=prefix_lens,
            prefix_sum=7,
            policies=policies,
            texts=None,
            suffix_ids=None,
            fixed_probes=None,
            constants=constants,
            mask_buffer=None,
        )

    with SyncCounter() as first:
        cached = plan(0, first).plan  # the first round of the batch size makes its constants
    for length, crossings in ((0, {}), (2, {"host_to_device": 1})):
        with SyncCounter() as counter:
            counter.mark_host(list(vars(cached).values()))  # the cached host plan, made under `first`
            window = plan(length, counter)
        assert counter.counts() == crossings, (length, counter.events)
        assert window.shape.rows == length + 1 and window.chain_tokens[:, 0].tolist() == [5, 6]
    tier0 = plan(0, first)
    assert tier0.on_device.draft_lens.tolist() == [0, 0] and tier0.plan.draft_lens.tolist() == [0, 0]
    assert (
        not tier0.on_device.judged.any()
        and not tier0.on_device.probed.any()
        and tier0.verify_input.positions.tolist() == [3, 4]
    )


def test_tier0_decode_steps_read_the_device_once_per_round(tiny_pair, engine_factory, tmp_path):
    """An adaptive server whose costs make tier 0 win every round (a draft step priced at 1 s):
    each round runs up to 4 decode steps, each step's token the next one's input on the device;
    PARSE's code reads the device once per round (the result, in `_record`) and copies nothing
    to it after a batch size's first round (which makes the tier-0 plan it keeps), however many
    steps the round ran."""
    costs = tmp_path / "costs.json"
    costs.write_text(
        json.dumps(
            {
                "draft": [{"bucket": 16, "L": L, "seconds": float(L)} for L in (0, 4)],
                "rest": [{"bucket": 16, "rows": r, "seconds": 1e-3} for r in (1, 5)],
            }
        )
    )
    config = probe_config(
        draft_budget=4, adaptive=True, adaptive_tiers=[0], cost_table=str(costs), judge=False, retrieval=False
    )  # decode steps alone (copies: test_sglang_retrieval.py)
    params = {"max_new_tokens": MAX_NEW, "temperature": 0.0}
    outs, records, totals = serve_probed(engine_factory, tiny_pair, config, params, tmp_path / "rounds.json")
    assert all(len(o["output_ids"]) == MAX_NEW for o in outs)
    assert totals["mean_draft_length"] == 0.0 and totals["verify_passes"] >= 3 * totals["batch_rounds"], totals
    first = {r["batch_size"]: i for i, r in reversed(list(enumerate(records)))}
    counted = [r for i, r in enumerate(records) if r["kind"] == "count" and first[r["batch_size"]] != i]
    assert len(counted) >= 2 and max(r["batch_size"] for r in counted) > 4
    for r in counted:
        assert [(direction, step) for direction, step, *_ in r["parse"]] == [("device_to_host", "_record")], r["parse"]


def test_head_rounds_cross_three_times(tiny_pair, engine_factory, tmp_path):
    """A server whose only choices are an EAGLE-3 head's rounds and a drafting tier priced out
    (a draft step at 1 s, no tier 0 to probe from): every round is a head round, and PARSE's
    code crosses as a drafting round does, the head's chain and extend (graph replays on a GPU)
    apart: the drafts read once, the plan copied once, the result read once."""
    from support.eagle3_head import build_random_head

    head = build_random_head(tmp_path / "head", tiny_pair[0])
    costs = tmp_path / "costs.json"
    costs.write_text(
        json.dumps(
            {
                "draft": [{"bucket": 16, "L": 4, "seconds": 1.0}],
                "rest": [{"bucket": 16, "rows": r, "seconds": 1e-3} for r in (4, 5)],
                "head": [{"bucket": 16, "seconds": 0.0}],
            }
        )
    )
    config = probe_config(
        draft_budget=4, adaptive=True, adaptive_tiers=[4], cost_table=str(costs), judge=False, eagle3_head=str(head)
    )
    params = {"max_new_tokens": MAX_NEW, "temperature": 0.0}
    outs, records, totals = serve_probed(engine_factory, tiny_pair, config, params, tmp_path / "rounds.json")
    assert all(len(o["output_ids"]) == MAX_NEW for o in outs)
    assert totals["head_rounds"] == totals["rounds"] > 0 and totals["mean_draft_length"] == 3.0, totals
    assert_three_crossings(records)
