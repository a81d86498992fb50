"""The replay (`parse_sglang.replay`): a fixed L's replay and the oracle are the trace's arithmetic and
follow the cost table, the oracle is never beaten at batch 1, the adaptive controller replays
deterministically, bad files are refused by name;
and the trace recorder (`benchmarks/trace.py`) on the synthetic pair in real SGLang engines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from parse_sglang import replay as replay_module
from parse_sglang.adaptive import AdaptiveDraftLength, OutputEnds
from parse_sglang.cost_table import CostTable
from parse_sglang.draft_length import FixedDraftLength
from parse_sglang.replay import (
    Machine,
    NoisyMachine,
    Trace,
    TraceRequest,
    as_the_bench,
    oracle_seconds,
    replay,
    serve,
    serve_as_the_bench,
)
from parse_sglang.settings import ParseConfig
from parse_sglang.tools import replay as tools_replay

ROOT = Path(__file__).resolve().parent.parent
TRACES = sorted((ROOT / "benchmarks" / "traces").glob("*.json"))
DRAFT_STEP, ROW, STEP, HOST = 0.003, 0.001, 0.010, 0.002  # the test machine: seconds, linear in L and rows


def machine(catch_up_fixed=0.004, catch_up_per_token=0.0005, draft_step=DRAFT_STEP, row=ROW) -> Machine:
    """A machine whose round costs are exact lines: draft part HOST + draft_step * (L + 1) (tier 0:
    HOST), a verify pass STEP + row * rows, the same at every batch size (each bucket holds them)."""
    draft, rest = [], []
    for b in (1, 2, 4, 8, 16, 32):
        draft += [{"bucket": b, "L": L, "seconds": HOST + (draft_step * (L + 1) if L else 0.0)} for L in (0, 1, 32)]
        rest += [{"bucket": b, "rows": r, "seconds": STEP + row * r} for r in (1, 2, 33)]
    return Machine(CostTable.from_json({"draft": draft, "rest": rest}, "test"), catch_up_fixed, catch_up_per_token)


def test_the_machine_is_the_lines_it_was_made_of():
    m = machine()
    assert m.draft(1, 8) == pytest.approx(HOST + 9 * DRAFT_STEP) and m.draft(5, 0) == pytest.approx(HOST)
    assert m.rest(1, 8, 9) == pytest.approx(STEP + 9 * ROW) and m.rest(7, 0, 1) == pytest.approx(STEP + ROW)
    assert m.catch_up(0) == 0.0 and m.catch_up(10) == pytest.approx(0.004 + 0.005)


def test_a_batch_line_prices_sizes_between_the_measured_ones(tmp_path):
    """Cells at batch 1 and 8 (and 32): with "batch_sizes": "line" a batch of 5 costs 4/7 of the way
    from 1's to 8's, 40 the line from 8 on past 32; by default (buckets) 5 costs 8's."""
    cost = {1: (0.1, 0.2), 8: (0.8, 0.4), 32: (2.4, 1.0)}  # batch -> (draft part at L = 4, verify of 5 rows)
    table = {
        "draft": [{"bucket": b, "L": 4, "seconds": d} for b, (d, _) in cost.items()],
        "rest": [{"bucket": b, "rows": 5, "seconds": r} for b, (_, r) in cost.items()],
    }
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"table": table, "batch_sizes": "line"}))
    line, buckets = Machine.load(path), Machine(CostTable.from_json(table, "test"))
    assert line.draft(5, 4) == pytest.approx(0.1 + 0.7 * 4 / 7)
    assert line.rest(5, 4, 5) == pytest.approx(0.2 + 0.2 * 4 / 7)
    assert line.draft(8, 4) == pytest.approx(0.8) and line.draft(40, 4) == pytest.approx(0.8 + 1.6 * 32 / 24)
    assert buckets.draft(5, 4) == pytest.approx(0.8) and buckets.rest(5, 4, 5) == pytest.approx(0.4)
    path.write_text(json.dumps({"table": table, "batch_sizes": "linear"}))
    with pytest.raises(ValueError, match="batch_sizes='linear'; allowed: bucket, line"):
        Machine.load(path)
    (tmp_path / "t.json").write_text(json.dumps(table))  # the machine command's way to a line
    made = tmp_path / "made.json"
    tool = ["machine", "--tables", str(tmp_path / "t.json"), "--catch-up", "0", "0.001", "--source", "test"]
    assert tools_replay.main([*tool, "--out", str(made), "--batch-sizes", "line"]) == 0
    assert Machine.load(made).draft(5, 4) == pytest.approx(line.draft(5, 4))


def test_a_machine_of_several_contexts_prices_each_round_at_its_requests_mean_context(tmp_path):
    """Tables profiled at 100, 200 and 300 tokens of context, the last's cells twice the others':
    a cell's price is the least-squares line through the three, (4/3 + (c - 200) / 200) times the
    first's (a line through the nearest two would give 1x at 200); with no context the first's; a
    target-alone request of prompt 100 and 4 tokens pays its steps at 100, 101, 102, 103."""
    paths = []
    for context, scale in ((100, 1.0), (200, 1.0), (300, 2.0)):
        table = {
            "draft": [{"bucket": 1, "L": 0, "seconds": 0.0}, {"bucket": 1, "L": 4, "seconds": 0.1 * scale}],
            "rest": [{"bucket": 1, "rows": r, "seconds": s * scale} for r, s in ((1, 0.01), (5, 0.2))],
        }
        paths.append(tmp_path / f"t{context}.json")
        paths[-1].write_text(json.dumps(table))
    made = tmp_path / "m.json"
    tool = ["machine", "--tables", *map(str, paths), "--catch-up", "0", "0", "--source", "test", "--out", str(made)]
    assert tools_replay.main([*tool, "--context-tokens", "100", "200", "300"]) == 0
    m = Machine.load(made)
    scale = lambda c: 4 / 3 + (c - 200) / 200  # noqa: E731
    assert m.draft(1, 4, 200) == pytest.approx(0.1 * scale(200)) and m.rest(1, 4, 5, 500) == pytest.approx(
        0.2 * scale(500)
    )
    assert m.draft(1, 4) == pytest.approx(0.1) and m.rest(1, 0, 1, 100) == pytest.approx(0.01 * scale(100))
    req = TraceRequest(prompt_len=100, match="1111", confidence=(900,) * 4, stopped=False)
    target = serve(FixedDraftLength(0), Trace("t", 4, [req]), m, ParseConfig(), [0.0], 1, target_only=True)
    assert target.seconds == pytest.approx(sum(0.01 * scale(c) for c in (100, 101, 102, 103)))
    with pytest.raises(ValueError, match="--context-tokens 100 is invalid for 3 tables: allowed is one context"):
        tools_replay.make_machine(list(map(str, paths)), 0.0, 0.0, "test", contexts=[100])
    one = json.loads(made.read_text())
    one["tables"] = one["tables"][:1]
    made.write_text(json.dumps(one))
    with pytest.raises(ValueError, match=r"tables holds 1 context; allowed: two or more"):
        Machine.load(made)


def test_a_fixed_L_replays_as_the_trace_arithmetic():
    """L = 4 over one request of 12 tokens (stopped: its last is the stop token), matches
    1111 0 1 0 0 1111: rounds start at 0 (keeps 4, +5), 5 (run 1: +2), 7 (run 0: +1), 8 (run 4,
    the stop token last: ends) -> 4 rounds of L = 4."""
    req = TraceRequest(prompt_len=10, match="111101001111", confidence=(900,) * 12, stopped=True)
    trace = Trace("t", 64, [req])
    m, config = machine(), ParseConfig.from_dict({"adaptive": False, "draft_budget": 4})
    got = serve(FixedDraftLength(4), trace, m, config, [0.0], 1)
    round_s = HOST + 5 * DRAFT_STEP + STEP + 5 * ROW
    assert got.tokens == 12 and got.rounds == 4
    assert got.seconds == pytest.approx(0.0005 * 10 + 4 * round_s)  # the draft's prefill, then 4 rounds
    target = serve(FixedDraftLength(0), trace, m, config, [0.0], 1, target_only=True)
    assert target.rounds == 12 and target.seconds == pytest.approx(12 * (STEP + ROW))


def test_a_closed_batch_pays_each_round_once_for_the_batch():
    """Two requests at L = 2, all matching, 6 tokens each: rounds of +3 each -> 2 rounds."""
    reqs = [TraceRequest(4, "111111", (990,) * 6, True), TraceRequest(4, "111111", (990,) * 6, True)]
    config = ParseConfig.from_dict({"adaptive": False, "draft_budget": 2})
    got = serve(FixedDraftLength(2), Trace("t", 64, reqs), machine(), config, [0.0, 0.0], 2)
    assert got.rounds == 2 and got.tokens == 12 and got.request_rounds == 4


def _trace(path):
    trace = Trace.load(path)
    return Trace(trace.pair, trace.max_new_tokens, trace.requests[:6])


def test_the_oracle_is_the_hand_computed_best_and_its_costs_move_it():
    """8 tokens, all matching, at most 8 new, prompt of 10: the best is the draft's prefill (10 x
    0.0005 s) and one round of L = 7 (the budget: 7 drafts + the bonus token), (HOST + 8 DRAFT_STEP)
    + (STEP + 8 ROW) = 0.044 s; two rounds of L = 3 take 0.056, tier 0 alone 2 x HOST + 8 x
    (STEP + ROW) = 0.092. Fixed L = 7 attains it. With drafting 10x dearer (0.03 s a step) no
    drafting round pays: the best is tier 0 alone, 0.092 s."""
    req = TraceRequest(prompt_len=10, match="11111111", confidence=(900,) * 8, stopped=False)
    config = ParseConfig.from_dict({"adaptive": True})
    assert oracle_seconds(req, machine(), config, range(1, 33), 8) == pytest.approx(0.005 + 0.044, abs=1e-12)
    fixed = ParseConfig.from_dict({"adaptive": False, "draft_budget": 7})
    got = serve(FixedDraftLength(7), Trace("t", 8, [req]), machine(), fixed, [0.0], 1)
    assert (got.tokens, got.rounds) == (8, 1) and got.seconds == pytest.approx(0.049, abs=1e-12)
    dear = machine(draft_step=0.03)
    assert oracle_seconds(req, dear, config, range(1, 33), 8) == pytest.approx(0.092, abs=1e-12)
    assert oracle_seconds(req, machine(), config, [], 8) == pytest.approx(0.092, abs=1e-12)  # no drafting tier


@pytest.mark.parametrize("path", TRACES, ids=[p.stem for p in TRACES])
def test_no_policy_beats_the_oracle_at_batch_1(path):
    """Each request served alone: adaptive and every fixed L take at least the oracle's seconds
    (test_the_oracle_is_the_hand_computed_best...: the oracle's own values). Retrieval off: the
    oracle knows the draft model's rounds only."""
    trace, m = _trace(path), machine()
    config = ParseConfig.from_dict({"adaptive": True, "retrieval": False})
    for req in trace.requests:
        one = Trace(trace.pair, trace.max_new_tokens, [req])
        best = oracle_seconds(req, m, config, range(1, 33), trace.max_new_tokens)
        for L in (1, 4, 8, 32):
            fixed = ParseConfig.from_dict({"adaptive": False, "draft_budget": L})
            assert serve(FixedDraftLength(L), one, m, fixed, [0.0], 1).seconds >= best - 1e-12, (req, L)
        clock = [0.0]
        adaptive = AdaptiveDraftLength(config.tiers, CostTable(), clock=lambda: clock[0])
        assert serve(adaptive, one, m, config, [0.0], 1, clock).seconds >= best - 1e-12


def test_the_replay_row_is_the_trace_arithmetic_and_follows_its_costs():
    """A closed batch of 2, at most 8 new tokens: A (prompt 4) matches all 8, B (prompt 6) only its
    first 3. Fixed L = 4: round 1 keeps 4 (A, n = 5) and 3 (B, n = 4); round 2 A's budget is 2
    (keeps 2 and ends), B misses (n = 5); B alone then gains 1 a round, 3 more rounds (its budget
    2, then 1, 1; every round priced at L = 4). 5 rounds of (HOST + 5 DRAFT_STEP) + (STEP + 5 ROW)
    = 0.032 s, after the draft's prefill of 10 prompt tokens (0.005 s): 0.165 s for 16 tokens, 28
    draft tokens in 7 request-rounds. The target alone: 8 rounds of STEP + ROW = 0.088 s. With ROW
    doubled: rounds of 0.037 s (0.190 s), the target's of 0.012 s (0.096 s)."""
    reqs = [TraceRequest(4, "11111111", (900,) * 8, False), TraceRequest(6, "11100000", (900,) * 8, False)]
    trace, config = Trace("t", 8, reqs), ParseConfig.from_dict({"adaptive": True})
    for m, fixed_s, target_s in ((machine(), 0.165, 0.088), (machine(row=2 * ROW), 0.190, 0.096)):
        row = replay(trace, m, "batch:2", config, [4], oracle=False)
        assert row["target_only"]["seconds"] == pytest.approx(target_s, abs=1e-12)
        assert row["target_only"]["speed"] == pytest.approx(16 / target_s)
        assert row["fixed 4"]["speed"] == pytest.approx(16 / fixed_s) and row["fixed 4"]["rounds"] == 5
        assert row["fixed 4"]["x_target"] == pytest.approx(target_s / fixed_s) and row["fixed 4"]["mean_L"] == 4.0
        assert row["best_fixed"] == "fixed 4"


@pytest.mark.parametrize("path", TRACES, ids=[p.stem for p in TRACES])
def test_the_replay_is_deterministic(path):
    """Two replays of the adaptive controller (its costs measured online on the simulated clock)
    give the same figures to the last bit; every policy emits the target's tokens."""
    trace, m = _trace(path), machine()
    config = ParseConfig.from_dict({"adaptive": True})
    first, second = (replay(trace, m, "batch:4", config, [4, 8]) for _ in range(2))
    assert first == second
    assert first["adaptive"]["x_target"] > 0 and first["best_fixed"] in ("fixed 4", "fixed 8")


MACHINES = sorted((ROOT / "benchmarks" / "machines").glob("*.json"))


@pytest.mark.parametrize("path", MACHINES, ids=[p.stem for p in MACHINES])
def test_the_controller_keeps_close_to_the_best_fixed_L_on_every_committed_trace(path):
    """A regression guard, exact (no clock): closed batches of 8 over each committed trace under
    each committed machine, after a warm-up pass. Bound: the package's controller within 0.85 of
    the best fixed L of {4, 8, 16, 32}, and never below 0.8 of the target alone (docs/adaptive.md
    has the whole grid: 0.907 at its worst cell). Negative control: fixed L = 32 falls below 0.85 of
    the best fixed L on some trace of every machine."""
    machine, config = Machine.load(path), ParseConfig.from_dict({"adaptive": True})
    worst_32 = 1.0
    for trace_path in TRACES:
        row = replay(Trace.load(trace_path), machine, "batch:8", config, [4, 8, 16, 32], oracle=False)
        assert row["adaptive_x_best_fixed"] >= 0.85 and row["adaptive"]["x_target"] >= 0.8, (trace_path.stem, row)
        worst_32 = min(worst_32, row["fixed 32"]["speed"] / row[row["best_fixed"]]["speed"])
    assert worst_32 < 0.85


@pytest.mark.parametrize("pair", ["qwen-humaneval", "qwen-gsm"])
def test_where_the_draft_does_not_pay_the_controller_keeps_the_targets_speed(pair, monkeypatch):
    """The real pair at batch 32 on the development CPU (`cpu-qwen`), where drafting about breaks
    even: after a warm-up pass the package's controller serves the trace at >= 0.97 of the target
    alone. Negative control: with the draft prefilled for every admitted request
    (`prefills_draft` always true, and every pass as after a drafting round) it pays those
    prefills and falls below 0.97 on HumanEval."""
    trace = Trace.load(ROOT / "benchmarks" / "traces" / f"{pair}.json")
    machine, config = Machine.load(ROOT / "benchmarks" / "machines" / "cpu-qwen.json"), ParseConfig()
    row = replay(trace, machine, "batch:32", config, [8], oracle=False)
    assert row["adaptive"]["x_target"] >= 0.97, row
    if pair == "qwen-humaneval":
        monkeypatch.setattr(AdaptiveDraftLength, "prefills_draft", lambda self, *args: True)
        monkeypatch.setattr(replay_module, "serve", lambda *args, **kw: serve(*args, **{**kw, "drafting": True}))
        row = replay(trace, machine, "batch:32", config, [8], oracle=False)
        assert row["adaptive"]["x_target"] < 0.97, row


def test_a_batch_warmed_up_as_the_bench_drafts_though_its_prompts_wait_on_the_warm_ups_last_round(monkeypatch):
    """GSM in a closed batch of 8 on the real pair's costs (`cpu-qwen-ctx288`), warmed up as
    compare.py warms an engine (`as_the_bench`), each round's costs noisy (`NoisyMachine`, sigma
    0.2, seeds 0-5): where the warm-up's last round did not draft, the batch's draft prefills are
    deferred (the worker's `_defers_draft`, carried from pass to pass by `Served.drafted_last`),
    and the batch drafts all the same (>= 1.15x the target alone every seed). Negative control:
    a deferred prompt's catch-up borne whole by the round that pays it (`OutputEnds.remaining`
    nothing), some seed never drafts (< 1.0x), as an engine did (0.92x)."""
    trace = Trace.load(ROOT / "benchmarks" / "traces" / "qwen-gsm.json")
    machine, config = Machine.load(ROOT / "benchmarks" / "machines" / "cpu-qwen-ctx288.json"), ParseConfig()
    alone, warm, timed = as_the_bench(trace, 8)
    assert [len(r.match) for r in warm.requests] == [64] * 8 and timed.requests == trace.requests[:8]

    assert min(_noisy_bench_x_target(trace, machine, config, 6)) >= 1.15
    monkeypatch.setattr(OutputEnds, "remaining", lambda self, policies: 0.0)
    assert min(_noisy_bench_x_target(trace, machine, config, 6)) < 1.0


def _noisy_bench_x_target(trace: Trace, machine: Machine, config: ParseConfig, seeds: int) -> list[float]:
    """Per seed of a `NoisyMachine` (sigma 0.2): the controller's tokens/s over the target alone's
    on the trace's closed batch of 8, warmed up as the bench (`serve_as_the_bench`)."""
    timed, got = as_the_bench(trace, 8)[2], []
    for seed in range(seeds):
        clock = [0.0]
        policy = AdaptiveDraftLength(config.tiers, CostTable(), clock=lambda: clock[0])
        served = serve_as_the_bench(policy, trace, NoisyMachine.of(machine, 0.2, seed), config, 8, clock)
        target = serve(
            FixedDraftLength(0), timed, NoisyMachine.of(machine, 0.2, seed), config, [0.0] * 8, 8, target_only=True
        )
        got.append(served.tokens_per_s / target.tokens_per_s)
    return got


def test_a_batch_that_went_to_tier_0_on_a_noisy_measure_drafts_again(monkeypatch):
    """GSM in a closed batch of 8 on the profiled machine of the engine cells (`cpu-qwen-contexts`),
    warmed up as the bench, noisy (sigma 0.2, seeds 0-9): a batch that a noisy measure sends to
    tier 0 drafts again, its catch-up over what tier 0 committed priced in the share of what is
    left (>= 1.05x the target alone every seed). Negative control: every catch-up borne whole by
    the round that pays it (`OutputEnds.remaining` nothing), which grows with the seconds at tier
    0, some seed stays there (< 1.0x), as two engine passes of nine did (1.02x)."""
    trace = Trace.load(ROOT / "benchmarks" / "traces" / "qwen-gsm.json")
    machine, config = Machine.load(ROOT / "benchmarks" / "machines" / "cpu-qwen-contexts.json"), ParseConfig()
    assert min(_noisy_bench_x_target(trace, machine, config, 10)) >= 1.05
    monkeypatch.setattr(OutputEnds, "remaining", lambda self, policies: 0.0)
    assert min(_noisy_bench_x_target(trace, machine, config, 10)) < 1.0


def test_ablation_against_another_run_matches_cells_and_refuses_another_grid(tmp_path, capsys):
    """`benchmarks/ablation.py --against`: each cell's full over the same cell of another run's
    --json lines; against its own lines every cell is 1.000; lines of another grid are refused by
    name."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import ablation

    grid = ["--traces", str(ROOT / "benchmarks" / "traces" / "synthetic.json")]
    grid += ["--machines", str(ROOT / "benchmarks" / "machines" / "cpu-synthetic.json"), "--only"]
    assert ablation.main([*grid, "--loads", "one_by_one", "batch:8", "--json"]) == 0
    lines = tmp_path / "before.jsonl"
    lines.write_text(capsys.readouterr().out)
    assert ablation.main([*grid, "--loads", "one_by_one", "batch:8", "--json", "--against", str(lines)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["load"] for r in rows] == ["one_by_one", "batch:8"] and all(r["against"] == 1.0 for r in rows)
    with pytest.raises(SystemExit, match="--against .*line 1 .*one_by_one.*batch:32"):
        ablation.main([*grid, "--loads", "batch:32", "--against", str(lines)])


def test_a_first_request_alone_lets_a_batch_price_copies():
    """compare.py warms an engine up on one prompt before a closed batch; replayed the same way
    (`first_alone`), the edit trace at batch 8 verifies copies, as its engines did (55-60
    request-rounds a pass). Negative control: warmed up on the batch only, the controller never
    prices a copy round and verifies none."""
    trace = Trace.load(ROOT / "benchmarks" / "traces" / "qwen-edit-40x8.json")
    machine, config = Machine.load(ROOT / "benchmarks" / "machines" / "cpu-qwen.json"), ParseConfig()
    alone = replay(trace, machine, "batch:8", config, [8], oracle=False, first_alone=True)["adaptive"]
    batch_only = replay(trace, machine, "batch:8", config, [8], oracle=False)["adaptive"]
    assert alone["copy_rounds"] >= 20 and batch_only["copy_rounds"] == 0, (alone, batch_only)
    assert alone["x_target"] > batch_only["x_target"]


def test_bad_files_are_refused_by_name(tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match=r"trace .*t\.json.* is invalid \(KeyError"):
        Trace.load(bad)
    short = {"prompt_len": 3, "match": "11", "confidence": [1], "stopped": True}  # one confidence for two positions
    bad.write_text(json.dumps({"pair": "p", "max_new_tokens": 8, "requests": [short]}))
    with pytest.raises(ValueError, match="request 0 has no output or a confidence per position missing"):
        Trace.load(bad)
    bad.write_text(json.dumps({"table": {"draft": [], "rest": []}}))
    with pytest.raises(ValueError, match=r"machine .*t\.json.*: its table is invalid: it holds no measured cells"):
        Machine.load(bad)


def test_the_traces_in_the_repository_load():
    assert {p.stem for p in TRACES} >= {"synthetic", "useless", "smollm2"}
    for path in TRACES:
        trace = Trace.load(path)
        assert trace.requests and all(set(r.match) <= {"0", "1"} for r in trace.requests)
    useless = Trace.load(ROOT / "benchmarks" / "traces" / "useless.json").requests  # random weights: almost no match
    assert sum(r.match.count("1") for r in useless) < 0.01 * sum(len(r.match) for r in useless)


@pytest.mark.sglang
def test_the_recorder_reads_the_synthetic_pair_in_sglang(tmp_path):
    """benchmarks/trace.py, 2 problems: the target reads its own greedy outputs back as its top-1 at
    every position (fp32: exactly), so the recorder's positions line up; the draft matches some."""
    out = tmp_path / "trace.json"
    argv = [
        sys.executable,
        str(ROOT / "benchmarks" / "trace.py"),
        "--pair",
        "synthetic",
        "--count",
        "2",
        "--max-new-tokens",
        "24",
        "--batch",
        "2",
        "--out",
        str(out),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    raw = json.loads(out.read_text())
    assert raw["self_match"] == 1.0 and raw["pair"] == "synthetic" and len(raw["requests"]) == 2
    trace = Trace.load(out)
    assert all(0 < len(r.match) <= 24 and r.prompt_len > 0 for r in trace.requests)
    assert trace.has_ids and [list(r.output_ids) for r in trace.requests] != [[]] * 2  # what prices copies
    assert 0 < sum(r.match.count("1") for r in trace.requests) < sum(len(r.match) for r in trace.requests)
