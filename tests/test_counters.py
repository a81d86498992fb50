"""PARSE's counters (parse_sglang/counters.py) without SGLang, and the package's import graph."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from parse_sglang import counters
from parse_sglang.acceptance import RoundResult
from parse_sglang.counters import COUNTERS, TOTALS, ServerTotals, record_round, record_round_stats
from parse_sglang.request_state import RequestState
from parse_sglang.settings import RETURN_PROBE_SCORES

PACKAGE = Path(counters.__file__).resolve().parent


class _Req:
    customized_info = None


class _Exporter:
    def __init__(self):
        self.passes = []

    def add_pass(self, counts, probe_scores):
        self.passes.append((counts, list(probe_scores)))


def test_request_and_server_counters_agree():
    reqs, totals = [_Req(), _Req()], ServerTotals()
    rounds = [  # per pass: its L, (draft tokens, exact, judged, judge probes) per request, probe scores
        (4, [(4, 2, 1, 2), (4, 0, 0, 1)], [0.9, 0.1, 0.2]),
        (8, [(4, 4, 0, 0), (3, 1, 2, 2)], [0.6, 0.7]),
    ]
    for length, per_req, scores in rounds:
        new = sum(record_round(req, length, *counts, None) for req, counts in zip(reqs, per_req))
        totals.add_pass(
            new,
            len(reqs),
            *(sum(c[k] for c in per_req) for k in range(3)),
            scores,
            graphed=True,
            verify_rows=2 * 9,
            draft_length=2 * length,
        )
    stats = [req.customized_info[counters.STATS_KEY][0] for req in reqs]
    assert stats[0] == dict(zip(COUNTERS, (2, 12, 8, 6, 1, 2, 0, 0, 0, 0))) and stats[1] == dict(
        zip(COUNTERS, (2, 12, 7, 1, 2, 3, 0, 0, 0, 0))
    )
    assert totals.requests == 2 and totals.verify_passes == totals.graph_passes == 2 and totals.rounds == 4
    for name in ("draft_length", "draft_tokens", "accepted_exact", "accepted_judged", "judge_probes"):
        assert getattr(totals, name) == sum(s[name] for s in stats), name
    summary = totals.summary()
    assert summary["emitted_tokens"] == 10 + 4 and summary["tokens_per_round"] == 14 / 4
    assert summary["judged_share"] == 3 / 10 and summary["verify_rows_per_round"] == 2 * 2 * 9 / 4
    assert summary["mean_draft_length"] == (2 * 4 + 2 * 8) / 4


def test_exporter_receives_every_pass(monkeypatch):
    exporter = _Exporter()
    monkeypatch.setattr(counters, "_exporter", None)
    counters.export_to(exporter)
    totals = ServerTotals()
    totals.add_pass(2, 2, 8, 3, 1, [0.25, 0.75], graphed=True, verify_rows=18, draft_length=8)
    totals.add_pass(0, 1, 4, 4, 0, [], graphed=False, verify_rows=5, draft_length=4)
    totals.add_pass(0, 1, 0, 0, 0, [], graphed=True, verify_rows=1, draft_length=0, passes=3)
    totals.add_pass(0, 2, 6, 5, 0, [], graphed=False, verify_rows=8, draft_length=6, head=True)
    assert [counts for counts, _ in exporter.passes] == [
        dict(zip(TOTALS, (2, 2, 1, 1, 1, 18, 8, 8, 3, 1, 2, 0, 0, 0, 0))),
        dict(zip(TOTALS, (0, 1, 1, 1, 0, 5, 4, 4, 4, 0, 0, 0, 0, 0, 0))),
        dict(zip(TOTALS, (0, 3, 3, 1, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0))),  # a tier-0 round of 3 decode steps
        dict(zip(TOTALS, (0, 2, 1, 1, 0, 8, 6, 6, 5, 0, 0, 2, 5, 0, 0))),  # a head round (k = 3) of 2 requests
    ]
    assert exporter.passes[0][1] == [0.25, 0.75]
    assert set(exporter.passes[0][0]) == set(TOTALS)
    for name in TOTALS:
        assert getattr(totals, name) == sum(counts[name] for counts, _ in exporter.passes)


def test_a_tier_zero_round_of_decode_steps_counts_each_step_as_a_round():
    """k decode steps in one worker round: k rounds of L = 0 per request (one target forward and
    one token each), k verify passes, one batch round."""
    reqs, totals = [_Req(), _Req()], ServerTotals()
    for req, outputs in zip(reqs, ((RETURN_PROBE_SCORES,), ())):
        req.parse = RequestState(resolved=SimpleNamespace(outputs=outputs))
    plan = SimpleNamespace(
        draft_lens=torch.zeros(2, dtype=torch.int64),
        bounds=torch.zeros(2, 0, dtype=torch.int64),
        probed=torch.zeros(2, dtype=torch.bool),
        token_modes=torch.zeros(2, dtype=torch.int64),
        drafts=torch.zeros(2, 0, dtype=torch.int64),
        confidence=torch.zeros(2, 0),
        copied=torch.zeros(2, dtype=torch.bool),
    )
    window = SimpleNamespace(plan=plan, shape=SimpleNamespace(draft_len=0, rows=1))
    result = RoundResult(
        emitted=[[5, 6, 7], [8, 9, 10]], lengths=[2, 2], exact_tokens=[2, 2], probe_scores=None, token_scores=None
    )
    record_round_stats(totals, reqs, window, result, graphed=True, steps=3)
    stats = [req.customized_info[counters.STATS_KEY][0] for req in reqs]
    assert [{k: s[k] for k in COUNTERS} for s in stats] == [dict(zip(COUNTERS, (3, 0, 0, 0, 0, 0, 0, 0, 0, 0)))] * 2
    entry = {
        "length": 0,
        "head": False,
        "draft": [],
        "confidence": [],
        "accepted": 0,
        "exact": 0,
        "copied": False,
        "probes": [],
        "tokens": [],
    }
    assert stats[0][counters.PROBE_SCORES] == [entry] * 3 and counters.PROBE_SCORES not in stats[1]
    summary = totals.summary()
    passes = (totals.requests, totals.rounds, totals.verify_passes, totals.batch_rounds, totals.graph_passes)
    assert passes == (2, 6, 3, 1, 3)
    assert summary["emitted_tokens"] == 6 and summary["tokens_per_round"] == 1.0
    assert summary["tokens_per_verify_pass"] == 2.0
    assert summary["mean_draft_length"] == 0.0 and totals.verify_rows == 6


def _imports(path: Path) -> set[str]:
    """parse_sglang modules `path` imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("parse_sglang"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("parse_sglang"))
    return found


def test_package_has_no_import_circle():
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        if "standin_" in str(path):
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph = {name: {m for m in _imports(path) if m in modules and m != name} for name, path in modules.items()}
    # A package's own __init__ is imported before its submodules: an edge from it is fine, not one to it.
    graph = {name: {m for m in deps if not name.startswith(m + ".")} for name, deps in graph.items()}
    state: dict[str, int] = {}

    def visit(name, trail):
        if state.get(name) == 1:
            pytest.fail("import circle: " + " -> ".join([*trail[trail.index(name) :], name]))
        if state.get(name) == 2:
            return
        state[name] = 1
        for dep in sorted(graph[name]):
            visit(dep, [*trail, name])
        state[name] = 2

    for name in sorted(graph):
        visit(name, [])
    assert "parse_sglang.worker" in graph["parse_sglang.spec_algo"]  # the graph does see imports inside functions
    assert "parse_sglang.counters" in graph["parse_sglang.worker"]


def test_decode_log_line_shows_head_rounds_only_on_a_server_that_ran_them(cpu_runtime):
    from parse_sglang.scheduler_patches.decode_log import totals_line  # imports SGLang: after the CPU runtime

    before = ServerTotals(rounds=10, head_rounds=4, head_accepted=9)
    now = ServerTotals(rounds=16, head_rounds=7, head_accepted=15)
    assert totals_line(now, before, 40).endswith(", 7 head rounds keeping 15 (last batches: 3, 6)")
    assert "head" not in totals_line(ServerTotals(rounds=16), ServerTotals(rounds=10), 40)
