"""The replay's copies (`parse_sglang.replay`, docs/retrieval.md): over a trace with token ids it runs
the server's `Retrieval` and controller, prices copy rounds as the worker runs them, keeps a copy's
run of agreement with the target's output; a trace without ids replays as without retrieval; the
bench's replay column prices copies from the committed edit trace. Pure: no model, no engine."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import load_benchmark
from test_replay import DRAFT_STEP, HOST, ROW, STEP, machine

from parse_sglang.adaptive import AdaptiveDraftLength
from parse_sglang.cost_table import CostTable
from parse_sglang.draft_length import DECODE, DraftLengthPolicy, drafting
from parse_sglang.replay import Trace, TraceRequest, replay, serve
from parse_sglang.retrieval import CORPUS_MATCH
from parse_sglang.settings import ParseConfig

STOP_ID = 2  # the stop token of the traces below


def request(prompt: list, output: list, match: str, stopped: bool = True) -> TraceRequest:
    return TraceRequest(len(prompt), match, (900,) * len(output), stopped, tuple(prompt), tuple(output))


def repeating_trace() -> Trace:
    """4 requests of 80 distinct prompt tokens, each output two runs of its own prompt around 10 new
    tokens, then (but for the first) the last request's new tokens, then the stop token; the draft
    matches 3 of every 4 positions."""
    rng, requests, novel = random.Random(5), [], []
    for _ in range(4):
        prompt = rng.sample(range(100, 5000), 80)
        fresh = rng.sample(range(5000, 9000), 10)
        output = prompt[20:50] + fresh + prompt[50:70] + novel + [STOP_ID]
        requests.append(request(prompt, output, ("1110" * 40)[: len(output)]))
        novel = fresh
    return Trace("repeats", 128, requests)


def brute_copy(text: list, corpus: list, min_match: int, budget: int) -> tuple:
    """What followed the first occurrence of the longest suffix of `text` (at least min_match tokens)
    that ends earlier in `text`, or, where longer, in one of the `corpus` outputs (its last
    CORPUS_MATCH tokens matched), at most `budget` tokens; () where none."""

    def first(stream: list, suffix: list, before: int) -> int:  # the first end of `suffix` in stream[:before]
        n = len(suffix)
        return next((e for e in range(n - 1, before) if stream[e - n + 1 : e + 1] == suffix), -1)

    own = next((n for n in range(len(text) - 1, 0, -1) if first(text, text[-n:], len(text) - 1) >= 0), 0)
    best = (own, text[first(text, text[-own:], len(text) - 1) + 1 :][:budget]) if own >= min_match else (0, [])
    tail = text[-CORPUS_MATCH:]
    for n in range(len(tail), max(best[0], min_match - 1), -1):
        found = [(o, first(o, tail[-n:], len(o))) for o in corpus]
        found = [(o, e) for o, e in found if e >= 0]
        if found:
            o, e = found[0]  # the first occurrence: the oldest output that holds it
            best = (n, o[e + 1 :][:budget])
            break
    return tuple(best[1])


def cheap_rows():
    """The test machine with verify rows at half its cost: on the test machine itself a 32-token copy
    at the copies' prior keep rate does not pay, and the controller never tries one."""
    return machine(row=ROW / 2)


def adaptive_pass(trace: Trace, config: ParseConfig):
    """The package's controller over the trace one request at a time, after a warm-up pass."""
    clock = [0.0]
    policy = AdaptiveDraftLength(config.tiers, CostTable(), clock=lambda: clock[0])
    for _ in range(2):
        got = serve(policy, trace, cheap_rows(), config, [0.0] * len(trace.requests), 1, clock)
    return got


def test_copies_of_a_repeating_output_are_the_longest_match_and_serve_it_faster():
    """With retrieval the controller verifies copies (each the brute-force longest-match
    continuation, its kept length the run the output agrees with) and serves the trace in fewer
    priced seconds than with retrieval off, the same tokens."""
    trace = repeating_trace()
    on = ParseConfig.from_dict({"adaptive": True})
    off = ParseConfig.from_dict({"adaptive": True, "retrieval": False})
    with_copies, without = adaptive_pass(trace, on), adaptive_pass(trace, off)
    assert with_copies.tokens == without.tokens == sum(len(r.match) for r in trace.requests)
    assert without.copies == [] and len(with_copies.copies) >= 8
    assert with_copies.seconds < 0.8 * without.seconds
    corpus_copies = 0
    for rid, n, tokens, kept in with_copies.copies:
        req = trace.requests[rid]
        text, corpus = list(req.prompt_ids + req.output_ids[:n]), [list(r.output_ids) for r in trace.requests[:rid]]
        budget = min(on.draft_budget, max(trace.max_new_tokens - n - 1, 1))
        assert tokens == brute_copy(text, corpus, on.retrieval_min_match, budget), (rid, n)
        own = brute_copy(text, [], on.retrieval_min_match, budget)
        corpus_copies += tokens != own
        ahead = req.output_ids[n:]
        assert kept == next((j for j, (c, t) in enumerate(zip(tokens, ahead)) if c != t), min(len(tokens), len(ahead)))
    assert corpus_copies >= 1  # a later request copied an earlier one's new tokens from the corpus


def test_a_trace_without_ids_replays_as_without_retrieval():
    """Ids stripped, retrieval on: the replay row is the one with retrieval off (and the ids'), to
    the last bit, the oracle included; with ids and retrieval on it differs and has no oracle."""
    trace = repeating_trace()
    bare = Trace(
        trace.pair,
        trace.max_new_tokens,
        [dataclasses.replace(r, prompt_ids=None, output_ids=None) for r in trace.requests],
    )
    on = ParseConfig.from_dict({"adaptive": True})
    off = ParseConfig.from_dict({"adaptive": True, "retrieval": False})
    rows = [replay(t, cheap_rows(), "one_by_one", c, [4, 8]) for t, c in ((bare, on), (bare, off), (trace, off))]
    assert rows[0] == rows[1] == rows[2] and rows[0]["adaptive"]["copy_rounds"] == 0 and "oracle" in rows[0]
    priced = replay(trace, cheap_rows(), "one_by_one", on, [4, 8])
    assert priced["adaptive"]["copy_rounds"] > 0 and "oracle" not in priced
    assert priced["adaptive"]["x_target"] > rows[0]["adaptive"]["x_target"]
    assert priced["fixed 4"] == rows[0]["fixed 4"]  # a fixed L never retrieves (an adaptive server's choice)


def test_token_ids_of_the_wrong_length_are_refused_by_name(tmp_path):
    path = tmp_path / "t.json"
    one = {"prompt_len": 2, "match": "11", "confidence": [1, 1], "stopped": True, "prompt_ids": [5, 6]}
    for bad in ({**one, "output_ids": [7]}, one):  # one output id for two positions; prompt ids alone
        path.write_text(json.dumps({"pair": "p", "max_new_tokens": 8, "requests": [bad]}))
        with pytest.raises(
            ValueError, match=r"t\.json.* is invalid: request 0's prompt_ids and output_ids are not both"
        ):
            Trace.load(path)
    path.write_text(json.dumps({"pair": "p", "max_new_tokens": 8, "requests": [{**one, "output_ids": [7, 2]}]}))
    assert Trace.load(path).requests[0].output_ids == (7, 2) and Trace.load(path).has_ids


class CopyElseDraft2(DraftLengthPolicy):
    """A round of copies alone wherever a request has a copy, else the draft model at L = 2; `seen`:
    each round's (verify rows, the plan's draft lengths, kept lengths, verify passes) as
    `after_round` hands them to a controller's `observe`."""

    def __init__(self):
        self.seen = []

    def choose(self, reqs, policies, rows_of, steps, copies=None):
        self.copying = [c is not None for c in copies] if copies and any(copies) else ()
        return DECODE if self.copying else drafting(2)

    def after_round(self, reqs, window, result, steps):
        self.seen.append((window.shape.rows, window.plan.draft_lens.tolist(), result.lengths, steps))


def test_a_copy_keeps_its_agreement_with_the_output_and_is_priced_as_its_window():
    """Negative control on the kept length. A: prompt 100..119 then 100 101 102 (its suffix matched
    at 0..2), output 103..107 999 998 997 (8 = max_new_tokens, not stopped). Round 1 copies 103..109
    (budget 7): it agrees for 5 and keeps exactly 5, +6 tokens, priced as one verify of the 8-tier
    window (9 rows) and tier 0's host part; round 2 (no copy: 999 is new) drafts L = 2 with budget 1,
    matches, +2, after a catch-up over the 6 tokens the copy round committed. B: its copy starts
    with the stop token the output ends at: its plan drafts 1 (cut at the stop), keeps 1, ends."""
    a = request([*range(100, 120), 100, 101, 102], [103, 104, 105, 106, 107, 999, 998, 997], "00000011", False)
    b = request([*range(300, 303), STOP_ID, 400, 401, 300, 301, 302], [STOP_ID], "0")
    config = ParseConfig.from_dict({"adaptive": True})
    policy = CopyElseDraft2()
    got = serve(policy, Trace("t", 8, [a, b]), machine(), config, [0.0, 0.0], 1)
    assert got.copies == [(0, 0, (103, 104, 105, 106, 107, 108, 109), 5), (1, 0, (STOP_ID, 400, 401, 300, 301, 302), 1)]
    assert (got.tokens, got.rounds) == (9, 3)
    assert policy.seen == [(9, [7], [5], 1), (3, [1], [1], 1), (9, [1], [1], 1)]
    copy_round = HOST + STEP + 9 * ROW
    draft_round = HOST + 3 * DRAFT_STEP + (0.004 + 0.0005 * 6) + STEP + 3 * ROW
    prefills = 0.0005 * (len(a.prompt_ids) + len(b.prompt_ids))
    assert got.seconds == pytest.approx(prefills + 2 * copy_round + draft_round, abs=1e-12)


EDIT_TRACE = Path(__file__).resolve().parent.parent / "benchmarks" / "traces" / "qwen-edit-40.json"


def test_the_bench_predicts_retrievals_rows_from_the_edit_trace(tmp_path):
    """compare.py's replay column on the committed edit trace (HumanEval 40-45's edits, token ids
    recorded) under the CPU machine, prompts one by one: PARSE with no settings (copies priced) is
    predicted at least 1.5x PARSE without retrieval (engines measured 3.50x against 1.61x the target
    alone, benchmarks/README.md), with no note; the same trace without ids says retrieval is not
    modelled and predicts both rows alike."""
    compare = load_benchmark("compare", "compare_replay")
    args = SimpleNamespace(first=40, num_problems=6, max_new_tokens=256)
    work = SimpleNamespace(suite="edit")
    column = compare.ReplayColumn(str(EDIT_TRACE), str(compare.DEFAULT_MACHINE), work, args)
    default, off = (column.predict(row, 8, 1, None) for row in ("parse_default", "parse_no_retrieval"))
    assert default["note"] is None and off["note"] is None
    assert default["x_target"] >= 1.5 * off["x_target"] > 1.0
    raw = json.loads(EDIT_TRACE.read_text())
    for r in raw["requests"]:
        del r["prompt_ids"], r["output_ids"]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(raw))
    column = compare.ReplayColumn(str(bare), str(compare.DEFAULT_MACHINE), work, args)
    default = column.predict("parse_default", 8, 1, None)
    assert "retrieval not modelled" in default["note"]
    assert default["x_target"] == column.predict("parse_no_retrieval", 8, 1, None)["x_target"]
