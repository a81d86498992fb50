"""Each round's draft length chosen by measured cost (`adaptive: true` in the PARSE settings).

A round costs its draft chain (L + 1 draft steps) and one verify pass, whatever it accepts, so a
long L pays only while enough of it is kept. With `adaptive`, each round runs at one of a few
tiers (`adaptive_tiers`, default {0, 4, 8, 16, 32} up to the server's L, and L itself): tier 0
is a plain decode step for the batch (one draft step keeps the draft's KV current, the verify
window is c_n alone); every tier has its own draft-chain and verify graphs on a GPU.

- `CostTable`: seconds of a round's draft part (its start to the drafts on the host) and of the
  rest (plan, verify pass, acceptance, the result on the host) per (tier, verify rows, batch-size
  bucket), measured by the worker from its own rounds at the host/device crossings it has anyway
  (no extra sync), as the median of its last `SAMPLES` rounds; a cell's first round is a warm-up
  (first allocations, kernels compiled on first use) and is not counted. A tier not measured in a bucket is interpolated from
  the measured ones (draft cost linear in the L + 1 steps, the rest linear in the verify rows), and a
  bucket with too few cells borrows the nearest bucket's (a profiled table covers batch 1, 8 and 32);
  until some bucket has two measured tiers the server explores (the longest tier, then tier 0,
  each for `EXPLORE_SAMPLES` rounds after its warm-up); later buckets borrow and then measure
  whatever tiers they run (a batch shrinking as requests finish passes through several). A table
  written by `python -m parse_sglang.profile_cost` can be loaded instead (`cost_table`): it is
  then fixed, and the choice a deterministic function of the acceptance seen.
- `Acceptance` (per request, seeded by the server's pooled estimate): decayed counts of draft
  tokens kept by exact match and of rounds stopped short (a geometric survival model: the next
  draft token survives with probability α), and for a judged request of boundaries passed and of
  rounds stopped at a boundary (the judge, or the exact match, passes the next boundary with
  probability β). E[accepted | L] = max(Σ_{j≤L} α^j, Σ_k β^k (b_k − b_{k−1})), boundaries every Δ.
- The choice: the tier maximising Σ_requests (1 + E[accepted | min(tier, its budget)]) over the
  tier's cost at this batch size; ties go to the shorter tier. A request kept at tier 0 shows no
  acceptance; after `PROBE_AFTER` tier-0 rounds in a row (doubling while probes keep failing,
  up to `PROBE_AFTER_MAX`) the batch runs its smallest positive tier once.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

logger = logging.getLogger(__name__)

DECAY = 0.8  # weight of the past, per round of a request
POOLED_DECAY = 0.98  # weight of the past, per request-round, of the server's pooled estimate
PRIOR_WEIGHT = 2.0  # rounds' worth of the pooled estimate a new request starts with
SAMPLES = 5  # a cost cell is the median of its last SAMPLES rounds (robust to a busy machine's spikes)
EXPLORE_SAMPLES = 3  # rounds a bucket measures its first two tiers on before it chooses
PROBE_AFTER, PROBE_AFTER_MAX = 8, 256


def bucket(batch_size: int) -> int:
    """The batch-size bucket costs are kept for: the next power of two."""
    return 1 << max(batch_size - 1, 0).bit_length()


def _interpolate(points: dict[int, float], x: int) -> Optional[float]:
    """Piecewise-linear through measured (x, y) points, extended linearly past the ends (at
    least 0); None without two points unless x itself was measured."""
    if x in points:
        return points[x]
    xs = sorted(points)
    if len(xs) < 2:
        return None
    lo = max([p for p in xs if p < x], default=None)
    hi = min([p for p in xs if p > x], default=None)
    if lo is None:
        lo, hi = xs[0], xs[1]
    elif hi is None:
        lo, hi = xs[-2], xs[-1]
    slope = (points[hi] - points[lo]) / (hi - lo)
    return max(points[lo] + slope * (x - lo), 0.0)


@dataclass
class CostTable:
    """Measured seconds per round part (module docstring); `fixed`: loaded, never updated."""

    draft: dict = field(default_factory=dict)  # (bucket, L) -> seconds to the drafts on the host
    rest: dict = field(default_factory=dict)  # (bucket, verify rows) -> seconds to the result on the host
    fixed: bool = False
    _samples: dict = field(default_factory=dict)  # (cells, key) -> [warm-up, the last SAMPLES seconds]

    def observe(self, batch_size: int, tier: int, rows: int, draft_s: float, rest_s: float) -> None:
        if self.fixed:
            return
        b = bucket(batch_size)
        for cells, key, value in ((self.draft, (b, tier), draft_s), (self.rest, (b, rows), rest_s)):
            samples = self._samples.setdefault((id(cells), key), [])
            samples.append(value)
            if len(samples) == 1:  # the warm-up round: not counted
                continue
            del samples[1 : max(1, len(samples) - SAMPLES)]  # the warm-up marker and the last SAMPLES rounds
            cells[key] = statistics.median(samples[1:])

    def cost(self, batch_size: int, tier: int, rows: int) -> Optional[float]:
        """Seconds of a round at this tier and verify rows, from the batch's bucket or, where
        that cannot estimate it, the nearest bucket that can (the larger on a tie); None where
        no bucket can yet."""
        b = bucket(batch_size)
        for bb in sorted({bb for bb, _ in self.draft} | {b}, key=lambda bb: (abs(bb.bit_length() - b.bit_length()), -bb)):
            draft = _interpolate({L + 1: s for (c, L), s in self.draft.items() if c == bb}, tier + 1)
            rest = _interpolate({r: s for (c, r), s in self.rest.items() if c == bb}, rows)
            if draft is not None and rest is not None:
                return draft + rest
        return None

    def measured_tiers(self, batch_size: int) -> set[int]:
        """Tiers whose draft cost in this bucket rests on at least EXPLORE_SAMPLES rounds (all
        of a loaded table's)."""
        b = bucket(batch_size)
        return {L for (bb, L) in self.draft if bb == b and (
            self.fixed or len(self._samples.get((id(self.draft), (bb, L)), ())) > EXPLORE_SAMPLES)}

    def explored(self) -> bool:
        """Some bucket has two measured tiers (every bucket can then borrow its costs)."""
        buckets = {b for b, _ in self.draft}
        return any(len(self.measured_tiers(b)) >= 2 for b in buckets)

    def to_json(self) -> dict:
        return {
            "draft": [{"bucket": b, "L": L, "seconds": s} for (b, L), s in sorted(self.draft.items())],
            "rest": [{"bucket": b, "rows": r, "seconds": s} for (b, r), s in sorted(self.rest.items())],
        }

    @classmethod
    def load(cls, path: str) -> "CostTable":
        """A table `to_json` wrote (`profile_cost`), fixed; errors name the file and the problem."""
        try:
            raw = json.loads(Path(path).read_text())
            table = cls(
                draft={(int(c["bucket"]), int(c["L"])): float(c["seconds"]) for c in raw["draft"]},
                rest={(int(c["bucket"]), int(c["rows"])): float(c["seconds"]) for c in raw["rest"]},
                fixed=True,
            )
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ValueError(
                f"cost_table={path!r} is invalid ({type(err).__name__}: {err}): allowed is the JSON file "
                "`python -m parse_sglang.profile_cost` writes"
            ) from None
        if not table.draft or not table.rest:
            raise ValueError(f"cost_table={path!r} is invalid: it holds no measured cells")
        return table

    def describe(self) -> str:
        """One line per bucket: seconds of the draft part per L and of the rest per verify rows."""
        lines = []
        for b in sorted({bb for bb, _ in self.draft} | {bb for bb, _ in self.rest}):
            draft = ", ".join(f"L={L}: {s * 1e3:.1f}" for (bb, L), s in sorted(self.draft.items()) if bb == b)
            rest = ", ".join(f"{r} rows: {s * 1e3:.1f}" for (bb, r), s in sorted(self.rest.items()) if bb == b)
            lines.append(f"batch <= {b}: draft ms [{draft}]; verify and the rest ms [{rest}]")
        return "\n".join(lines) or "(no cell measured yet)"


@dataclass
class Survival:
    """Decayed counts of a geometric survival: survived steps, and stops before the end."""

    kept: float = 0.0
    stopped: float = 0.0

    @property
    def rate(self) -> float:
        total = self.kept + self.stopped
        return self.kept / total if total else 0.0

    def observe(self, kept: int, stopped: bool, decay: float) -> None:
        self.kept = decay * self.kept + kept
        self.stopped = decay * self.stopped + float(stopped)


@dataclass
class Acceptance:
    """A request's estimates (module docstring)."""

    exact: Survival
    boundary: Survival

    def expected(self, length: int, stride: int, judged: bool) -> float:
        """E[draft tokens accepted] of a round drafting `length` tokens."""
        if length <= 0:
            return 0.0
        a = min(self.exact.rate, 1.0)
        exact = float(length) if a >= 1.0 else a * (1 - a**length) / (1 - a)
        if not judged:
            return exact
        b, judged_len, start, k = self.boundary.rate, 0.0, 0, 1
        while start < length:
            end = min(start + stride, length)
            judged_len += b**k * (end - start)
            start, k = end, k + 1
        return max(exact, judged_len)


class AdaptiveDraftLength:
    """The per-round tier choice and what it learns from (module docstring)."""

    def __init__(self, tiers: Sequence[int], costs: CostTable):
        self.tiers = sorted(set(tiers))
        self.costs = costs
        self.pooled = Acceptance(Survival(1.0, 1.0), Survival(1.0, 1.0))  # α = β = 0.5 before any round
        self._zero_streak = 0
        self._probe_after = PROBE_AFTER
        self._clock = {}  # this round's host times at its crossings (its measured costs)

    @classmethod
    def of(cls, config) -> "AdaptiveDraftLength":
        """The controller of an adaptive server's `ParseConfig`: its tiers, and its cost table
        (loaded from `cost_table`, else measured online), logged."""
        costs = CostTable.load(config.cost_table) if config.cost_table else CostTable()
        logger.info("PARSE adaptive draft length, tiers %s; costs %s:\n%s", list(config.tiers),
                    "loaded from " + config.cost_table if costs.fixed else "measured online", costs.describe())
        return cls(config.tiers, costs)

    def acceptance(self, req) -> Acceptance:
        estimate = getattr(req, "parse_acceptance", None)
        if estimate is None:
            w = PRIOR_WEIGHT
            pooled = self.pooled
            estimate = req.parse_acceptance = Acceptance(
                Survival(w * pooled.exact.rate, w * (1 - pooled.exact.rate)),
                Survival(w * pooled.boundary.rate, w * (1 - pooled.boundary.rate)),
            )
        return estimate

    def choose(self, reqs, policies, rows_of) -> int:
        """The tier of this round: reqs and their `RequestPolicy`s; rows_of(tier) -> the verify
        rows of the batch at that tier."""
        self._clock = {"start": time.perf_counter()}
        bs = len(reqs)
        measured = self.costs.measured_tiers(bs)
        if not self.costs.fixed and len(measured) < 2 and not self.costs.explored():
            return self.tiers[-1] if self.tiers[-1] not in measured else self.tiers[0]  # the longest, then 0
        if self.tiers[0] == 0 and self._zero_streak >= self._probe_after:
            return min(t for t in self.tiers if t > 0)
        best, best_rate = self.tiers[0], -1.0
        for tier in self.tiers:
            cost = self.costs.cost(bs, tier, rows_of(tier))
            if cost is None or cost <= 0:
                continue
            tokens = sum(
                1 + self.acceptance(req).expected(min(tier, p.budget), p.config.probe_stride, p.judged)
                for req, p in zip(reqs, policies)
            )
            if tokens / cost > best_rate * (1 + 1e-9):
                best, best_rate = tier, tokens / cost
        return best

    def drafts_on_host(self) -> None:
        """The round's drafts reached the host: its draft part ends here (`choose` started it)."""
        self._clock["drafts"] = time.perf_counter()

    def observe_round(self, reqs, tier: int, rows: int, plan, result) -> None:
        """`observe` with the round's times from the controller's clock (the result is on the host)."""
        start, drafts = self._clock["start"], self._clock["drafts"]
        self.observe(reqs, tier, rows, plan, result, drafts - start, time.perf_counter() - drafts)

    def observe(self, reqs, tier: int, rows: int, plan, result, draft_s: float, rest_s: float) -> None:
        """After a round: its costs, and each request's acceptance (host plan and result)."""
        self.costs.observe(len(reqs), tier, rows, draft_s, rest_s)
        if tier == 0:
            self._zero_streak += 1
            return
        probing = self._zero_streak >= self._probe_after
        self._zero_streak = 0
        draft_lens = plan.draft_lens.tolist()
        bounds = plan.real_bounds()
        judged = plan.judged.tolist()
        kept = 0
        for req, n, e, a, b, j in zip(reqs, draft_lens, result.exact_tokens, result.lengths, bounds, judged):
            if n == 0:
                continue
            estimate = self.acceptance(req)
            estimate.exact.observe(e, e < n, DECAY)
            self.pooled.exact.observe(e, e < n, POOLED_DECAY)
            if j and b:
                passed = sum(1 for x in b if x <= a)
                estimate.boundary.observe(passed, passed < len(b), DECAY)
                self.pooled.boundary.observe(passed, passed < len(b), POOLED_DECAY)
            kept += a
        if probing:  # a re-probe out of tier 0: back off while they keep finding nothing
            self._probe_after = PROBE_AFTER if kept else min(2 * self._probe_after, PROBE_AFTER_MAX)
