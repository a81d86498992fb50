"""The adaptive controller's costs (parse_sglang/adaptive.py, docs/adaptive.md): seconds of a
round's draft part and of the rest, per (batch-size bucket, tier, verify rows), measured from the
worker's own rounds or loaded from a table `python -m parse_sglang.tools.profile_cost` wrote."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from parse_sglang.draft_length import DECODE, HEAD, Tier, drafting

SAMPLES = 5  # a cost cell is the median of its last SAMPLES rounds (robust to a busy machine's spikes)
EXPLORE_SAMPLES = 2  # rounds that make a tier's cost in a bucket measured (after its warm-up)


def bucket(batch_size: int) -> int:
    """The batch-size bucket costs are kept for: the next power of two."""
    return 1 << max(batch_size - 1, 0).bit_length()


def interpolate(points: dict[float, float], x: float) -> Optional[float]:
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


def _scaled_down(b: int, other: int) -> float:
    """What bucket b takes of bucket `other`'s costs: a larger bucket's in proportion to the batch
    (a round costs a request no less in a smaller batch, so this prices it low: it is tried, and
    so measured), a smaller one's whole (low already)."""
    return min(b / other, 1.0)


def _estimate(points_of, x: int, nearest: list) -> Optional[float]:
    """y at x from the first bucket of `nearest` (the batch's) or, where its points cannot
    estimate x, the nearest bucket's that can (points_of(bucket) -> {x: y}); where the batch's
    bucket holds one point, the other bucket's curve scaled to it: one cell gives the batch's
    level, the fuller bucket the slope; where it holds none, the other bucket's `_scaled_down`
    (unscaled, a large batch's round priced every smaller batch out of drafting for good)."""
    own = points_of(nearest[0])
    for b in nearest:
        points = points_of(b)
        value = interpolate(points, x)
        if value is None:
            continue
        if b != nearest[0] and len(own) == 1:
            ((x0, y0),) = own.items()
            reference = interpolate(points, x0)
            if reference:
                value *= y0 / reference
        elif not own:
            value *= _scaled_down(nearest[0], b)
        return value
    return None


@dataclass
class CostTable:
    """Measured seconds per round part (module docstring); `fixed`: loaded, never updated."""

    draft: dict = field(default_factory=dict)  # (bucket, L) -> seconds to the drafts on the host (L = 0: DECODE)
    rest: dict = field(default_factory=dict)  # (bucket, verify rows) -> seconds to the result on the host
    head: dict = field(default_factory=dict)  # bucket -> seconds of a head round's draft part (its tier HEAD)
    fixed: bool = False
    _samples: dict = field(default_factory=dict)  # (cells, key) -> [warm-up, the last SAMPLES seconds]
    _measured: set = field(default_factory=set)  # (cells, key) that have had EXPLORE_SAMPLES counted samples

    def observe(
        self, batch_size: int, tier: Tier, rows: int, draft_s: Optional[float], rest_s: Optional[float]
    ) -> None:
        """A round's seconds: its draft part and the rest (None: no sample of that cell, though
        it may be the cell's uncounted warm-up round)."""
        if self.fixed:
            return
        b = bucket(batch_size)
        drafted = (self.head, b) if tier == HEAD else (self.draft, (b, tier.length))
        for cells, key, value in ((*drafted, draft_s), (self.rest, (b, rows), rest_s)):
            cell = (id(cells), key)
            samples = self._samples.setdefault(cell, [])
            if value is None and samples:  # no sample of the tier's cost, unless as its warm-up round
                continue
            samples.append(value)
            if len(samples) == 1:  # the warm-up round: not counted
                continue
            del samples[1 : max(1, len(samples) - SAMPLES)]  # the warm-up marker and the last SAMPLES rounds
            cells[key] = statistics.median(samples[1:])
            if len(samples) > EXPLORE_SAMPLES:
                self._measured.add(cell)

    def cost(self, batch_size: int, tier: Tier, rows: int, steps: int = 1) -> Optional[float]:
        """Seconds of a round at this tier and verify rows (`steps` verify passes: a tier-0
        round's decode steps), from the batch's bucket or, where that cannot estimate it, the
        nearest bucket that can (the smaller on a tie: a tier priced low is tried, and so
        measured; one priced high never is); None where no bucket can yet.
        - Tier 0 (decode steps) from tier-0 rounds only, the nearest bucket's that ran one: a
          drafting round's fixed work (chain launch, the drafts' trip) is no part of a decode step.
        - Drafting tiers from drafting cells (tier-0 cells only while no bucket holds two): a line
          through a decode step's cell misprices long drafts. A bucket with one drafting cell takes
          the nearest fuller bucket's curve, scaled to that cell (`_estimate`).
        - The head tier from head rounds, the nearest bucket's; before any, as a tier-0 round of its
          rows (its cheapest: a price that lets it be tried).
        Another bucket's cells are `_scaled_down` to the batch."""
        b = bucket(batch_size)
        nearest = sorted(
            {bb for bb, _ in self.draft} | {bb for bb, _ in self.rest} | {b},
            key=lambda bb: (abs(bb.bit_length() - b.bit_length()), bb),
        )
        if tier == HEAD:
            for bb in sorted(self.head, key=lambda bb: (abs(bb.bit_length() - b.bit_length()), bb)):
                rest = interpolate(self._rest_points(bb), rows)
                if rest is not None:
                    head = self.head[bb]
                    return (head + rest) * _scaled_down(b, bb)
            tier = DECODE
        if tier == DECODE:
            ran = next((bb for bb in nearest if (bb, 0) in self.draft and (bb, rows) in self.rest), None)
            if ran == b:
                return self.draft[b, 0] + steps * self.rest[b, rows]
            if ran is not None:
                return (self.draft[ran, 0] + steps * self.rest[ran, rows]) * _scaled_down(b, ran)
        for decode in (False, True):  # tier-0 cells only where no bucket holds two drafting ones (exploring)
            draft = _estimate(lambda bb: self._draft_points(bb, decode), tier.length + 1, nearest)
            rest = _estimate(lambda bb: self._rest_points(bb, decode), rows, nearest)
            if draft is not None and rest is not None:
                return draft + steps * rest
        return None

    def _draft_points(self, b: int, decode: bool = False) -> dict:
        """{L + 1: seconds} of the bucket's drafting rounds' draft part (decode: tier 0's too)."""
        return {L + 1: s for (c, L), s in self.draft.items() if c == b and (L > 0 or decode)}

    def _rest_points(self, b: int, decode: bool = False) -> dict:
        """{verify rows: seconds} of the bucket's rounds with drafts (decode: a decode step's one row too)."""
        return {r: s for (c, r), s in self.rest.items() if c == b and (r > 1 or decode)}

    def measured_tiers(self, batch_size: int) -> set[Tier]:
        """Tiers whose draft cost in this bucket has rested on at least EXPLORE_SAMPLES rounds
        (all of a loaded table's), HEAD among them."""
        return {tier for cell, tier in self._draft_cells(batch_size) if self.fixed or cell in self._measured}

    def priced_tiers(self, batch_size: int) -> set[Tier]:
        """Tiers whose draft cost in this bucket rests on at least one of its own rounds (all of a
        loaded table's), HEAD among them: priced from no other bucket's."""
        return {tier for _, tier in self._draft_cells(batch_size)}

    def _draft_cells(self, batch_size: int) -> list:
        """[((cells, key), tier)] of the bucket's draft cells, the head's among them."""
        b = bucket(batch_size)
        cells = [((id(self.draft), (bb, L)), drafting(L)) for (bb, L) in self.draft if bb == b]
        return cells + ([((id(self.head), b), HEAD)] if b in self.head else [])

    def explored(self) -> bool:
        """Some bucket has two measured tiers (every bucket can then borrow its costs)."""
        buckets = {b for b, _ in self.draft}
        return any(len(self.measured_tiers(b)) >= 2 for b in buckets)

    def to_json(self) -> dict:
        return {
            "draft": [{"bucket": b, "L": L, "seconds": s} for (b, L), s in sorted(self.draft.items())],
            "rest": [{"bucket": b, "rows": r, "seconds": s} for (b, r), s in sorted(self.rest.items())],
            "head": [{"bucket": b, "seconds": s} for b, s in sorted(self.head.items())],
        }

    @classmethod
    def load(cls, path: str) -> "CostTable":
        """A table `to_json` wrote (`profile_cost`), fixed; errors name the file and the problem."""
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, ValueError) as err:
            raise ValueError(
                f"cost_table={path!r} is invalid ({type(err).__name__}: {err}): allowed is the JSON file "
                "`python -m parse_sglang.tools.profile_cost` writes"
            ) from None
        return cls.from_json(raw, f"cost_table={path!r}")

    @classmethod
    def from_json(cls, raw, origin: str) -> "CostTable":
        """A fixed table from `to_json`'s dict; errors name `origin` and the problem."""
        try:
            table = cls(
                draft={(int(c["bucket"]), int(c["L"])): float(c["seconds"]) for c in raw["draft"]},
                rest={(int(c["bucket"]), int(c["rows"])): float(c["seconds"]) for c in raw["rest"]},
                head={int(c["bucket"]): float(c["seconds"]) for c in raw.get("head", ())},
                fixed=True,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(
                f"{origin} is invalid ({type(err).__name__}: {err}): allowed is the JSON file "
                "`python -m parse_sglang.tools.profile_cost` writes"
            ) from None
        if not table.draft or not table.rest:
            raise ValueError(f"{origin} is invalid: it holds no measured cells")
        return table

    def describe(self) -> str:
        """One line per bucket: seconds of the draft part per L and of the rest per verify rows."""
        lines = []
        for b in sorted({bb for bb, _ in self.draft} | {bb for bb, _ in self.rest}):
            draft = ", ".join(f"L={L}: {s * 1e3:.1f}" for (bb, L), s in sorted(self.draft.items()) if bb == b)
            rest = ", ".join(f"{r} rows: {s * 1e3:.1f}" for (bb, r), s in sorted(self.rest.items()) if bb == b)
            head = f"; head draft ms {self.head[b] * 1e3:.1f}" if b in self.head else ""
            lines.append(f"batch <= {b}: draft ms [{draft}]; verify and the rest ms [{rest}]{head}")
        return "\n".join(lines) or "(no cell measured yet)"
