"""Each round's draft length chosen by measured cost (`adaptive: true`): the design, its
settings and what it achieves are docs/adaptive.md.

- `CostTable`: seconds of a round's draft part and of the rest, per (batch-size bucket, tier,
  verify rows), measured from the worker's own rounds or loaded from `profile_cost`.
- `Acceptance` / `PooledAcceptance`: each request's survival curve of its accepted length, its
  prior the server's pooled curve (one pair for PARSE's draft, one for an EAGLE-3 head's).
- `Calibration`: P(a draft token is kept | the draft's confidence in it), over every request's
  unjudged rounds.
- `OutputEnds`: where finished requests' outputs ended: a draft token past a request's end is
  worth nothing.
- `AdaptiveDraftLength`: the `DraftLengthPolicy` choosing the tier with the most expected
  tokens per second, probing out of tier 0 when a drafting round may pay again, and, once the
  drafts are on the host, where their verify stops (`verify_length`). With an EAGLE-3 head
  (`eagle3_head`) the head tier `HEAD` is one more choice beside tier 0 and the drafting tiers,
  with its own cost cells and acceptance curves (docs/eagle3.md).
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import torch

from parse_sglang.acceptance import emitted_tokens
from parse_sglang.draft_length import DraftLengthPolicy
from parse_sglang.request_state import state_of
from parse_sglang.target_phase import phase_room

logger = logging.getLogger(__name__)

DECAY = 0.6  # weight of the past, the prior included, per round of a request
POOLED_DECAY = 0.98  # weight of the past, per request-round, of the server's pooled estimate
PRIOR_WEIGHT = 2.0  # rounds' worth of the pooled estimate a new request starts with
PRIOR_WEIGHT_MIN = 0.05  # ... and what it keeps however long the request runs
SAMPLES = 5  # a cost cell is the median of its last SAMPLES rounds (robust to a busy machine's spikes)
EXPLORE_SAMPLES = 2  # rounds that make a tier's cost in a bucket measured (after its warm-up)
EXPLORE_MARGIN = 0.95  # a tier priced from other cells is measured where it is this close to the best
# A measured cell not sampled for STALE_ROUNDS rounds of its bucket is stale: its tier is measured
# again where its rate is at least RECHECK_MARGIN of the best and what that round may lose against
# the best is at most PROBE_OVERHEAD of the bucket's rounds' seconds since the cell's last sample;
# its sample replaces the old ones. Otherwise a tier priced too high is never run, so never priced
# right: in the synthetic pair's open loop at batch 8 (CPU), L = 8 at batch 4 kept its price from two
# rounds of the server's first minute (63 and 68 ms) where its rounds take 47-51 ms, and the batch
# ran L = 32 there (136-144 ms priced, 167-185 measured) in place of L = 8, 0.83x fixed L = 8 over
# the run. Counted in the server's rounds, every cell of a bucket that other batch sizes had kept
# busy went stale between two visits: the synthetic bar's closed batch of 8 re-checked L = 32 at its
# first round and tier 0 at a later one in every run (its 32 rounds had been spent at batch 32 and
# in open loops), and the L = 32 round left a straggler that ran alone at batch 1-2.
STALE_ROUNDS = 32
RECHECK_MARGIN = 0.75
PRIOR_KEEP = 0.5  # the pooled keep rate of the first draft position before any round
# What probes out of tier 0 may cost, as a share of the seconds of the rounds between them (each
# priced at its own batch size). A server whose draft never pays runs at most this far below the
# target alone for good (plus its start-up's exploration, once): at 5%, that budget alone is the
# whole margin of a 0.95x bar. Counted in decode steps of any batch size, a batch of 1's cheap
# steps had paid for a batch of 32's probes, each step for one of the bigger batch's.
PROBE_OVERHEAD = 0.02
PROBE_AFTER = 8  # decode steps of the batch between probes while a probe's cost is not known
PROBE_BACKOFF_MAX = 32  # probes that keep finding nothing space out up to this factor
# Requests the pooled curve must have heard from (each request's first drafting round) before it
# alone keeps a new request from drafting, on a server that measures its costs online: one
# request's text is no population. SGLang's warm-up request ("The capital city of France is", 8
# tokens), of which the synthetic draft keeps 1, 0 and 0 in the start-up's exploration, had kept a
# server of batch-1 requests at tier 0 through a whole benchmark run (0.94x target-only; L = 32 1.78x).
POOL_HEARD = 4
# A round that starts this long after the last one ended (the server idled, or ran a long prefill)
# is no sample of its tier's cost. On the synthetic pair (CPU, batch 32), the first tier-0 round
# after an idle server took 81-140 ms (median 114 of 8) where such a round takes 83 ms; with such
# rounds in its cell, tier 0 was priced at 147 ms, and the batch ran L = 32 instead (828 ms for 403
# tokens). A catch-up it held still prices catch-ups: a batch's first round after its prompts'
# long prefill is where the draft first catches up over them.
IDLE_S = 1.0
# A longer drafting tier is chosen over a shorter one only where its expected rate is at least
# LONGER_MARGIN times the shorter's. Its estimate errs more (more positions, fewer rounds reach
# them), and its kept counts spread wider across the batch, which the rate does not price: the
# synthetic pair's closed batch of 8 (CPU) chose L = 32 at 1.03x L = 8's rate, kept 32 for seven
# requests and 14 for one, and ended with that one alone at batch 1-2. Without the margin (its
# cells aging per bucket), it ran L = 32 first in five of six runs, 0.89x fixed L = 8's twin
# (median); with it, L = 8 throughout in 9 of 11, 1.02x, and in a later run L = 32 again where its
# measured rate beat L = 8's by more than the margin (benchmarks/README.md).
LONGER_MARGIN = 1.10
HEAD = -1  # the tier of a head round (`eagle3_head`): the head's k drafts, a chain-only verify
ENDED_KEPT = 128  # finished requests whose output lengths say where outputs end
ENDED_PRIOR = 2.0  # requests' worth of an output that never ends, beside them
# Tokens of each request's output ahead that a catch-up is spread over (`_catch_up_share`): once
# caught up, the draft drafts on without one. Charged whole to its first round, a catch-up over a
# prompt (the real pair at batch 1, CPU: 0.2-0.35 s on a ~1.25 s L = 8 round) kept 5 of 6 GSM
# requests at tier 0 from first token to last, where fixed L = 4 ran 1.14x the target alone.
CATCH_UP_HORIZON = 256


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


def _scaled_down(b: int, other: int) -> float:
    """What bucket b takes of bucket `other`'s costs: a larger bucket's in proportion to the batch
    (a round costs a request no less in a smaller batch, so this prices it low: it is tried, and
    so measured), a smaller one's whole (low already)."""
    return min(b / other, 1.0)


def _estimate(points_of, x: int, nearest: list) -> Optional[float]:
    """y at x from the first bucket of `nearest` (the batch's) or, where its points cannot
    estimate x, the nearest bucket's that can (points_of(bucket) -> {x: y}); where the batch's
    bucket holds one point, the other bucket's curve scaled to it: one cell gives the batch's
    level, the fuller bucket the slope; where it holds none, the other bucket's `_scaled_down`.
    Unscaled, batch 60's L = 8 round (5.4 s) priced the real pair's batches of 13-32 for the rest
    of their run, and they never drafted."""
    own = points_of(nearest[0])
    for b in nearest:
        points = points_of(b)
        value = _interpolate(points, x)
        if value is None:
            continue
        if b != nearest[0] and len(own) == 1:
            ((x0, y0),) = own.items()
            reference = _interpolate(points, x0)
            if reference:
                value *= y0 / reference
        elif not own:
            value *= _scaled_down(nearest[0], b)
        return value
    return None


@dataclass
class CostTable:
    """Measured seconds per round part (module docstring); `fixed`: loaded, never updated."""

    draft: dict = field(default_factory=dict)  # (bucket, L) -> seconds to the drafts on the host
    rest: dict = field(default_factory=dict)  # (bucket, verify rows) -> seconds to the result on the host
    head: dict = field(default_factory=dict)  # bucket -> seconds of a head round's draft part (its tier HEAD)
    fixed: bool = False
    _samples: dict = field(default_factory=dict)  # (cells, key) -> [warm-up, the last SAMPLES seconds]
    _sizes: dict = field(default_factory=dict)  # (cells, key) -> the batch sizes of its counted samples
    _measured: set = field(default_factory=set)  # (cells, key) that have had EXPLORE_SAMPLES counted samples
    _sampled: dict = field(default_factory=dict)  # (cells, key) -> (bucket, _rounds, _seconds there) at its last sample
    _rounds: dict = field(default_factory=collections.Counter)  # bucket -> rounds observed
    _seconds: dict = field(default_factory=lambda: collections.defaultdict(float))  # bucket -> their seconds

    def observe(self, batch_size: int, tier: int, rows: int, draft_s: Optional[float], rest_s: Optional[float],
                seconds: float = 0.0) -> None:  # fmt: skip
        """A round's seconds: its draft part and the rest (None: no sample of that cell, though
        it may be the cell's uncounted warm-up round); `seconds`: the whole round's (its bucket's clock)."""
        if self.fixed:
            return
        b = bucket(batch_size)
        self._rounds[b] += 1
        self._seconds[b] += seconds
        drafted = (self.head, b) if tier == HEAD else (self.draft, (b, tier))
        for cells, key, value in ((*drafted, draft_s), (self.rest, (b, rows), rest_s)):
            cell = (id(cells), key)
            samples = self._samples.setdefault(cell, [])
            if value is None and samples:  # no sample of the tier's cost, unless as its warm-up round
                continue
            sizes = self._sizes.setdefault(cell, collections.deque(maxlen=SAMPLES))
            if self._stale(cell):  # its samples are no measure of the cell any more: this one replaces them
                del samples[1:]
                sizes.clear()
            samples.append(value)
            if len(samples) == 1:  # the warm-up round: not counted
                continue
            del samples[1 : max(1, len(samples) - SAMPLES)]  # the warm-up marker and the last SAMPLES rounds
            cells[key] = statistics.median(samples[1:])
            sizes.append(batch_size)
            self._sampled[cell] = (b, self._rounds[b], self._seconds[b])
            if len(samples) > EXPLORE_SAMPLES:
                self._measured.add(cell)

    def _stale(self, cell) -> bool:
        """The cell's last counted sample is more than STALE_ROUNDS rounds of its bucket old."""
        if cell not in self._sampled:
            return False
        b, rounds, _ = self._sampled[cell]
        return self._rounds[b] - rounds > STALE_ROUNDS

    def _at(self, cells: dict, key, batch_size: int) -> float:
        """A measured cell's seconds at `batch_size`: its bucket's cell holds rounds of any size
        in the bucket, so between the mean size of its samples and that of the same cell in the
        neighbouring bucket on batch_size's side, the two cells' seconds interpolated (never
        beyond them); the cell itself where that neighbour has none (a loaded table's cells have
        no sizes). Priced by its bucket's cell, a round low in its bucket had cost ~20% less than
        priced and one high in it ~20% more, unequally per tier (each cell was measured at the
        sizes its tier ran at): in the synthetic pair's open loop at batch 32 (CPU) L = 8 was
        priced 25% dearer against L = 32 low in a bucket than it was, and L = 32 ran there."""
        value, size = cells[key], self._mean_size(cells, key)
        if size is None or batch_size == size:
            return value
        b, rest = (key[0], key[1:]) if isinstance(key, tuple) else (key, ())
        other = (b // 2 if batch_size < size else 2 * b, *rest)
        other = other if rest else other[0]
        other_size = self._mean_size(cells, other) if other in cells else None
        if other_size is None:
            return value
        # the neighbour's sizes lie beyond the bucket's, batch_size within it: a weight in (0, 1]
        return value + (batch_size - size) / (other_size - size) * (cells[other] - value)

    def _mean_size(self, cells: dict, key) -> Optional[float]:
        sizes = self._sizes.get((id(cells), key))
        return statistics.fmean(sizes) if sizes else None

    def cost(self, batch_size: int, tier: int, rows: int, steps: int = 1) -> Optional[float]:
        """Seconds of a round at this tier and verify rows (`steps` verify passes: a tier-0
        round's decode steps), from the batch's bucket or, where that cannot estimate it, the
        nearest bucket that can (the smaller on a tie: a tier priced low is tried, and so
        measured; one priced high never is); None where no bucket can yet. Tier 0 (decode
        steps) is priced from tier-0 rounds only, the nearest bucket's that ran one: drafting
        rounds carry a draft chain, a judge and the drafts' trip that a decode step lacks, so
        extrapolating their cells down to L = 0 and one row priced it at several times its cost.
        The head tier is priced from head rounds, the nearest bucket's that ran one; before any
        ran, as a tier-0 round of its rows (a head round's cheapest: a cost that lets it be tried).
        Another bucket's cells are `_scaled_down` to the batch, every tier's alike.
        Conversely, drafting rounds are never priced from tier-0 cells (L = 0, one row): a line
        from a decode step's 0.6 ms through L = 4's 7.3 ms priced L = 32 at batch 1 at 76 ms where
        it costs 40 (the synthetic pair on CPU), and its batch of 1 ran tier 0. A bucket with one
        drafting cell takes the nearest fuller bucket's curve, scaled to that cell (`_estimate`).
        The batch's own bucket's cells are read at its size (`_at`)."""
        b = bucket(batch_size)
        nearest = sorted({bb for bb, _ in self.draft} | {bb for bb, _ in self.rest} | {b},
                         key=lambda bb: (abs(bb.bit_length() - b.bit_length()), bb))  # fmt: skip
        if tier == HEAD:
            for bb in sorted(self.head, key=lambda bb: (abs(bb.bit_length() - b.bit_length()), bb)):
                rest = _interpolate(self._rest_points(bb, size=batch_size if bb == b else None), rows)
                if rest is not None:
                    head = self._at(self.head, bb, batch_size) if bb == b else self.head[bb]
                    return (head + rest) * _scaled_down(b, bb)
            tier = 0
        if tier == 0:
            ran = next((bb for bb in nearest if (bb, 0) in self.draft and (bb, rows) in self.rest), None)
            if ran == b:
                return self._at(self.draft, (b, 0), batch_size) + steps * self._at(self.rest, (b, rows), batch_size)
            if ran is not None:
                return (self.draft[ran, 0] + steps * self.rest[ran, rows]) * _scaled_down(b, ran)
        for decode in (False, True):  # tier-0 cells only where no bucket holds two drafting ones (exploring)
            draft = _estimate(
                lambda bb: self._draft_points(bb, decode, batch_size if bb == b else None), tier + 1, nearest
            )
            rest = _estimate(lambda bb: self._rest_points(bb, decode, batch_size if bb == b else None), rows, nearest)
            if draft is not None and rest is not None:
                return draft + steps * rest
        return None

    def _draft_points(self, b: int, decode: bool = False, size: Optional[int] = None) -> dict:
        """{L + 1: seconds} of the bucket's drafting rounds' draft part (decode: tier 0's too),
        at batch size `size` (`_at`; None: the cells as they are)."""
        return {L + 1: self._at(self.draft, (c, L), size) if size else s
                for (c, L), s in self.draft.items() if c == b and (L > 0 or decode)}  # fmt: skip

    def _rest_points(self, b: int, decode: bool = False, size: Optional[int] = None) -> dict:
        """{verify rows: seconds} of the bucket's rounds with drafts (decode: a decode step's one
        row too), at batch size `size` (`_at`; None: the cells as they are)."""
        return {r: self._at(self.rest, (c, r), size) if size else s
                for (c, r), s in self.rest.items() if c == b and (r > 1 or decode)}  # fmt: skip

    def measured_tiers(self, batch_size: int) -> set[int]:
        """Tiers whose draft cost in this bucket has rested on at least EXPLORE_SAMPLES rounds
        (all of a loaded table's), HEAD among them."""
        return {tier for cell, tier in self._draft_cells(batch_size) if self.fixed or cell in self._measured}

    def stale_tiers(self, batch_size: int) -> dict[int, float]:
        """{tier: seconds of the bucket's rounds since its last sample} of the measured tiers whose
        draft cost in this bucket is stale (`STALE_ROUNDS`; never a loaded table's)."""
        b = bucket(batch_size)
        return {tier: self._seconds[b] - self._sampled[cell][2]
                for cell, tier in self._draft_cells(batch_size) if cell in self._measured and self._stale(cell)}  # fmt: skip

    def _draft_cells(self, batch_size: int) -> list:
        """[((cells, key), tier)] of the bucket's draft cells, the head's among them."""
        b = bucket(batch_size)
        cells = [((id(self.draft), (bb, L)), L) for (bb, L) in self.draft if bb == b]
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
            table = cls(
                draft={(int(c["bucket"]), int(c["L"])): float(c["seconds"]) for c in raw["draft"]},
                rest={(int(c["bucket"]), int(c["rows"])): float(c["seconds"]) for c in raw["rest"]},
                head={int(c["bucket"]): float(c["seconds"]) for c in raw.get("head", ())},
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
            head = f"; head draft ms {self.head[b] * 1e3:.1f}" if b in self.head else ""
            lines.append(f"batch <= {b}: draft ms [{draft}]; verify and the rest ms [{rest}]{head}")
        return "\n".join(lines) or "(no cell measured yet)"


@dataclass
class Survival:
    """Decayed counts per draft position j = 1, 2, ...: of rounds that reached j (drafted it and
    kept every token before it), and of those that kept j too. Both a request's curve and the
    server's pooled one are `fade`d whole every round they observe (`Acceptance.observe`,
    `PooledAcceptance.observe`): a request's text changes as it goes, and what no round reaches
    any more must not outlive what the rounds do reach."""

    reached: list = field(default_factory=list)
    kept: list = field(default_factory=list)

    def fade(self, factor: float) -> None:
        """Every count times `factor`: the rounds seen so far weigh less than the next."""
        self.reached = [factor * r for r in self.reached]
        self.kept = [factor * k for k in self.kept]

    def observe(self, drafted: int, accepted: int, weight: float = 1.0) -> None:
        """A round that drafted `drafted` and kept `accepted`, counted as `weight` rounds."""
        reach = min(accepted + 1, drafted)
        missing = reach - len(self.reached)
        if missing > 0:
            self.reached += [0.0] * missing
            self.kept += [0.0] * missing
        for j in range(reach):
            self.reached[j] += weight
            self.kept[j] += weight * float(j < accepted)

    def counts(self, j: int, prior: float, weight: float) -> tuple[float, float]:
        """(kept, reached) of position j + 1, with `weight` rounds' worth of `prior` added."""
        reached, kept = (self.reached[j], self.kept[j]) if j < len(self.reached) else (0.0, 0.0)
        return kept + weight * prior, reached + weight

    def keep_rate(self, j: int, prior: float, weight: float) -> float:
        """P(position j + 1 is kept | it is reached): the ratio of its `counts`."""
        kept, reached = self.counts(j, prior, weight)
        return kept / reached


CONFIDENCE_BINS = 10  # buckets of the draft's top-1 probability, [k/10, (k+1)/10)
CONFIDENCE_DECAY = 0.995  # weight of the past per reached draft position, server-wide
CALIBRATED = 64  # reached draft positions (decayed) the calibration needs before a verify is cut


@dataclass
class Calibration:
    """P(a reached draft position is kept | the draft's confidence there): decayed counts per
    confidence bucket over every request's rounds, each bucket's prior its own midpoint (one
    position's worth). A position is reached when every draft token before it was kept."""

    reached: list = field(default_factory=lambda: [0.0] * CONFIDENCE_BINS)
    kept: list = field(default_factory=lambda: [0.0] * CONFIDENCE_BINS)

    @staticmethod
    def bin(confidence: float) -> int:
        return min(int(confidence * CONFIDENCE_BINS), CONFIDENCE_BINS - 1)

    def observe(self, confidence: torch.Tensor, drafted, accepted) -> None:
        """A round's requests at once: confidence [n, L] on the host, drafted and accepted [n]
        each; request i reached its first min(accepted + 1, drafted) positions and kept the first
        accepted. Each reached position, in request-then-position order, decays its bucket's
        counts by CONFIDENCE_DECAY and adds itself (the same as one position at a time: a
        position with r later ones in its bucket this round weighs CONFIDENCE_DECAY ** r)."""
        drafted, accepted = torch.as_tensor(drafted), torch.as_tensor(accepted)
        column = torch.arange(confidence.shape[1])
        reached = column < torch.minimum(accepted + 1, drafted)[:, None]  # [n, L]
        if not reached.any():
            return
        bins = (confidence[reached].double() * CONFIDENCE_BINS).long().clamp(0, CONFIDENCE_BINS - 1)  # [m]
        kept = (column < accepted[:, None])[reached].double()  # [m]
        seen = torch.nn.functional.one_hot(bins, CONFIDENCE_BINS).double()  # [m, bins]
        per_bin = seen.sum(dim=0)  # [bins]
        later = per_bin[bins] - seen.cumsum(dim=0).gather(1, bins[:, None]).squeeze(1)  # [m]
        weight = CONFIDENCE_DECAY**later
        fade = CONFIDENCE_DECAY**per_bin
        added = torch.zeros(CONFIDENCE_BINS, dtype=torch.float64).index_add_(0, bins, weight)
        added_kept = torch.zeros(CONFIDENCE_BINS, dtype=torch.float64).index_add_(0, bins, weight * kept)
        self.reached = (fade * torch.tensor(self.reached, dtype=torch.float64) + added).tolist()
        self.kept = (fade * torch.tensor(self.kept, dtype=torch.float64) + added_kept).tolist()

    def keep_rates(self) -> torch.Tensor:
        """[CONFIDENCE_BINS] each bucket's keep rate."""
        reached, kept = torch.tensor(self.reached), torch.tensor(self.kept)
        midpoints = (torch.arange(CONFIDENCE_BINS) + 0.5) / CONFIDENCE_BINS
        return (kept + midpoints) / (reached + 1.0)

    def keep_rate(self, confidence: float) -> float:
        return float(self.keep_rates()[self.bin(confidence)])

    def expected(self, confidence: torch.Tensor, budgets: Optional[Sequence[int]] = None) -> torch.Tensor:
        """[bs, L + 1] E[kept | length] for length = 0 .. L, confidence [bs, L] on the host: sums
        of the survival S(j), the product of the calibrated keep rates up to j, a request's
        positions past its budget (budgets [bs]) kept by none."""
        bins = (confidence.double() * CONFIDENCE_BINS).long().clamp(0, CONFIDENCE_BINS - 1)  # as `bin` does
        alive = self.keep_rates()[bins].cumprod(dim=1)  # [bs, L]
        if budgets is not None:
            alive = alive * (torch.arange(confidence.shape[1]) < torch.tensor(budgets)[:, None])
        return torch.nn.functional.pad(alive.cumsum(dim=1), (1, 0))


@dataclass
class Acceptance:
    """A request's survival curve of accepted draft tokens, its prior the server's pooled one."""

    survival: Survival = field(default_factory=Survival)
    prior_weight: float = PRIOR_WEIGHT  # rounds' worth of the pooled curve, aged with the request's own
    _alive: list = field(default_factory=list)  # S(j) for j = 0 .. the longest tier, S(0) = 1
    _sums: list = field(default_factory=list)  # E[accepted | L] for L = 0 .. the longest tier
    _version: int = -1  # the pooled curve's version the sums were made with

    def expected(self, length: int, pooled: "PooledAcceptance") -> float:
        """E[draft tokens accepted] of a round drafting `length` tokens: Σ_{j ≤ length} S(j),
        S(j) the product of the keep rates up to j (made once per change of either curve). A
        position beyond the furthest this request has reached (its frontier f) keeps at least
        the rate of the one before it: rounds that kept all they drafted say nothing of what lies
        beyond, and the pooled rate there (other requests' text) kept such a request at a short
        tier. Every such position keeps at one unknown rate r, the frontier's, so the chance of
        keeping k of them is E[r^k], not E[r]^k: with the frontier's counts (a kept of n reached,
        its prior's share included) position f + k + 1 keeps at (a + k) / (n + k) once the k
        before it were kept (Laplace's rule of succession; the positions up to f have rates of
        their own, each its own evidence, and their means multiply). As E[r]^k, a request that
        kept 8 of 8 in 3 rounds had its 32nd position valued at 0.37 of E[r^k]: the longer tiers
        of a request that keeps all it drafts were undervalued while its own evidence was thin."""
        self._update(pooled)
        return self._sums[min(max(length, 0), len(self._sums) - 1)]

    def alive(self, pooled: "PooledAcceptance") -> list:
        """[1, S(1), S(2), ...] up to the longest tier: the chance that each draft position is kept."""
        self._update(pooled)
        return self._alive

    def _update(self, pooled: "PooledAcceptance") -> None:
        if self._version != pooled.version:
            alive, rate, priors, f = [1.0], 0.0, pooled.keep_rates(), len(self.survival.reached)
            if 0 < f <= len(priors):  # the frontier's counts, its prior's share included
                kept, reached = self.survival.counts(f - 1, priors[f - 1], self.prior_weight)
            for j, prior in enumerate(priors):
                if 0 < f <= j:  # beyond the frontier: its rate, by succession (`expected`)
                    prior = max(prior, rate, (kept + j - f) / (reached + j - f))
                rate = self.survival.keep_rate(j, prior, self.prior_weight)
                alive.append(alive[-1] * rate)
            self._alive, self._sums = alive, [s - 1.0 for s in itertools.accumulate(alive)]
            self._version = pooled.version

    def observe(self, drafted: int, accepted: int) -> None:
        """A round of the request: all it has seen so far, the prior included, ages by DECAY."""
        self.survival.fade(DECAY)
        self.prior_weight = max(DECAY * self.prior_weight, PRIOR_WEIGHT_MIN)
        self.survival.observe(drafted, accepted)
        self._version = -1


@dataclass
class PooledAcceptance:
    """The server's survival curve over every request's rounds: a new request's prior (and the
    weight of evidence a request's own rounds must outweigh)."""

    longest: int  # the longest tier: every request's sums cover every tier
    survival: Survival = field(default_factory=Survival)
    version: int = 0  # bumped by every observation: requests' sums made before are stale
    _rates: tuple = (-1, [])

    def keep_rates(self) -> list:
        """Keep rates per position, each shrunk towards the one before it (one round's worth;
        the first towards PRIOR_KEEP): a position no round reached keeps its predecessor's rate,
        so that a tier longer than any run so far is valued by the rate seen furthest out."""
        if self._rates[0] != self.version:
            rates, prior = [], PRIOR_KEEP
            for j in range(self.longest):
                prior = self.survival.keep_rate(j, prior, 1.0)
                rates.append(prior)
            self._rates = (self.version, rates)
        return self._rates[1]

    def observe(self, drafted: int, accepted: int, weight: float = 1.0) -> None:
        """A request-round, counted as `weight` rounds: the request's prior weight over its first
        (1, 0.6, 0.36, ... down to PRIOR_WEIGHT_MIN / PRIOR_WEIGHT), so that the curve says what a
        new request keeps. Counted alike, the slowest requests' many rounds outnumbered the rest:
        the synthetic pair's closed batch of 32 ended in ~50 rounds of its few stragglers, and the
        next request, a batch of 1 that keeps all of L = 32, started at L = 4 from them.
        The whole curve ages by POOLED_DECAY per request-round, whatever its weight, positions this
        round did not reach included: otherwise a failure seen further out than the rounds now
        reach never ages, and prices the longer tiers out for good (one cause of the batch-1
        lock-in at L = 8)."""
        self.survival.fade(POOLED_DECAY)
        self.survival.observe(drafted, accepted, weight)
        self.version += 1


@dataclass
class OutputEnds:
    """Where outputs end: the final lengths of the last ENDED_KEPT finished requests, each ended
    by a stop token or cut at its max_new_tokens (censored: it would have gone on), as a
    product-limit (Kaplan-Meier) estimate beside ENDED_PRIOR requests' worth of an output that
    never ends. A draft token the request's output would not have reached is worth nothing:
    without this, a closed batch of the synthetic pair (answers of 35-64 tokens) drafted L = 32
    at output token 17 for requests whose answers end 20 tokens later."""

    finished: collections.deque = field(default_factory=lambda: collections.deque(maxlen=ENDED_KEPT))
    _curve: Optional[tuple] = None  # (stop lengths [T], P(F > t) at each [T]): made once per change

    def observe_round(self, policies, result) -> None:
        """Each request of a round (its `RequestPolicy` and what the round emitted) that finished:
        at a stop token, or at its max_new_tokens."""
        for p, emitted, accepted in zip(policies, result.emitted, result.lengths):
            cap = p.left if p.left is not None else accepted + 2  # no max_new_tokens: never cut
            tokens, finished = emitted_tokens(emitted[:accepted], accepted, emitted[accepted], p.stop_ids, cap)
            if finished:
                self.finished.append((p.output_len + len(tokens), tokens[-1] in p.stop_ids))
                self._curve = None

    def going(self, output_lens: Sequence[int], horizon: int) -> Optional[torch.Tensor]:
        """[bs, horizon + 1] P(a running request n tokens out emits its (n + 1 + j)-th token),
        P(F > n + j) / P(F > n) for n in output_lens; None while no request ended at a stop."""
        if self._curve is None:
            ends = sorted({length for length, stopped in self.finished if stopped})
            if not ends:
                return None
            lengths, stopped = (torch.tensor(column, dtype=torch.float64) for column in zip(*self.finished))  # [n]
            times = torch.tensor(ends, dtype=torch.float64)  # [T]
            stops = ((lengths[:, None] == times) * stopped[:, None]).sum(dim=0)  # [T]
            at_risk = (lengths[:, None] >= times).sum(dim=0) + ENDED_PRIOR  # [T]
            self._curve = (times, torch.cumprod(1 - stops / at_risk, dim=0))
        times, beyond = self._curve
        at = torch.tensor(output_lens, dtype=torch.float64)[:, None] + torch.arange(horizon + 1)  # [bs, horizon + 1]
        survival = torch.nn.functional.pad(beyond, (1, 0), value=1.0)[torch.searchsorted(times, at, right=True)]
        return survival / survival[:, :1]


class AdaptiveDraftLength(DraftLengthPolicy):
    """The per-round tier choice and what it learns from (docs/adaptive.md)."""

    per_round = True

    def __init__(self, tiers: Sequence[int], costs: CostTable, head_steps: Optional[int] = None):
        self.tiers = sorted(set(tiers))
        self.costs = costs
        self.pooled = PooledAcceptance(longest=self.tiers[-1])
        self.head_steps = head_steps  # k of an EAGLE-3 head (the tier HEAD); None: no head
        self.head_pooled = PooledAcceptance(longest=head_steps or 0)  # the head's pooled curve
        self._zero_streak = 0.0  # seconds of tier-0 and head rounds since the last round that drafted (priced)
        self._head_streak = 0.0  # seconds of tier-0 rounds since the last head round (priced)
        self._backoff = 1  # probes out of tier 0 space out by this factor while they do not pay
        self._head_backoff = 1  # ... and the head's probes out of tier 0
        self._kept = None  # (tier, draft tokens a request kept) of the last round, if it drafted and paid
        self._heard = 0  # requests whose drafting rounds the pooled curve has heard from
        self._break_even = None  # tokens per request this round must emit to beat tier 0 in its time
        self._typical = Acceptance()  # no rounds of its own: the pooled curve's expectations
        self._clock = {}  # this round's host times at its crossings (its measured costs)
        self._last_end = None  # when the last round ended (a round after an idle gap is no cost sample)
        self._tier = 0  # this round's drafted tier (what its draft part cost)
        self._zero_steps = 1  # the decode steps of this round were it tier 0 (`running_steps`)
        self.calibration = Calibration()  # P(kept | the draft's confidence), every request's rounds
        self.ends = OutputEnds()  # where the outputs of finished requests ended
        self._policies = ()  # this round's RequestPolicy per request
        self._catch_ups = {}  # bucket of tokens caught up -> the last SAMPLES (batch size, tier, draft part s, tokens)

    @classmethod
    def of(cls, config) -> "AdaptiveDraftLength":
        """The controller of an adaptive server's `ParseConfig`: its tiers (and the head's, with
        `eagle3_head`), and its cost table (loaded from `cost_table`, else measured online), logged."""
        costs = CostTable.load(config.cost_table) if config.cost_table else CostTable()
        logger.info(
            "PARSE adaptive draft length, tiers %s%s; costs %s:\n%s",
            list(config.tiers),
            f" and head rounds of {config.eagle3_steps}" if config.eagle3_head else "",
            "loaded from " + config.cost_table if costs.fixed else "measured online",
            costs.describe(),
        )
        return cls(config.tiers, costs, config.eagle3_steps if config.eagle3_head else None)

    def acceptance(self, req) -> Acceptance:
        """The request's curve of PARSE's draft."""
        state = state_of(req)
        if state.acceptance is None:
            state.acceptance = Acceptance()
        return state.acceptance

    def head_acceptance(self, req) -> Acceptance:
        """The request's curve of the head's drafts."""
        state = state_of(req)
        if state.head_acceptance is None:
            state.head_acceptance = Acceptance()
        return state.head_acceptance

    def choose(self, reqs, policies, rows_of, steps: int = 1) -> int:
        """The tier of this round (HEAD: a head round): reqs and their `RequestPolicy`s;
        rows_of(tier) -> the verify rows of the batch at a drafting tier; steps: the decode steps
        a tier-0 round of it would run."""
        start = time.perf_counter()
        self._clock = {"start": start, "cold": self._last_end is not None and start - self._last_end > IDLE_S}
        self._policies = policies
        going = self.ends.going([p.output_len for p in policies], max(self.tiers[-1], self.head_steps or 0, steps))
        self._zero_steps = running_steps(going, steps)
        self._tier = tier = self._best_tier(reqs, policies, rows_of, self._zero_steps, going)
        self._break_even = self._break_even_of(len(reqs), tier, rows_of) if tier else None
        return tier

    def decode_steps(self, steps: int) -> int:
        """A tier-0 round's decode steps: `choose`'s `running_steps` of the batch."""
        return min(steps, self._zero_steps)

    def verify_length(self, policies, confidence, rows_of) -> int:
        """The tier (at most the drafted L) whose verify gives the batch the most expected tokens
        per second of the whole round: the draft part is spent, the rest is priced per verify rows;
        each request's expected kept tokens are sums of its calibrated confidences' products (one
        global choice: every request of a batch verifies the same rows)."""
        bs, drafted = confidence.shape
        shorter = [t for t in self.tiers if 0 < t < drafted]
        if not shorter or sum(self.calibration.reached) < CALIBRATED or any(p.judged for p in policies):
            return drafted  # a judge keeps text the draft was unsure of: confidence does not predict it
        tokens = bs + self.calibration.expected(confidence, [p.budget for p in policies]).sum(dim=0)  # [L + 1]
        best, best_rate = drafted, 0.0
        for length in [drafted, *reversed(shorter)]:  # ties: the longer
            cost = self.costs.cost(bs, drafted, rows_of(length))
            if cost is None or cost <= 0:
                return drafted
            rate = float(tokens[length]) / cost
            if rate > best_rate:
                best, best_rate = length, rate
        return best

    def _rows(self, tier: int, rows_of) -> int:
        """Verify rows per request at a tier: a head round's are its k + 1 chain rows."""
        return self.head_steps + 1 if tier == HEAD else rows_of(tier)

    def _expected_tokens(self, tier: int, reqs, policies, steps: int, going: Optional[torch.Tensor]) -> float:
        """Tokens the batch emits in a round at `tier` (a tier-0 round's `steps` decode steps), by
        each request's acceptance curve, its drafts capped at what it can keep (`reach`); going
        [bs, >= the round's tokens]: the chance that each token of the round is one the request's
        output still reaches (`OutputEnds.going`; None: every one)."""
        if tier == 0:
            counts = [steps if p.left is None else min(steps, p.left) for p in policies]
            if going is None:
                return sum(counts)
            return float((going[:, :steps] * (torch.arange(steps) < torch.tensor(counts)[:, None])).sum())
        curve, pooled, k = (
            (self.head_acceptance, self.head_pooled, self.head_steps)
            if tier == HEAD
            else (self.acceptance, self.pooled, tier)
        )
        if going is None:
            return sum(1 + curve(req).expected(reach(p, k), pooled) for req, p in zip(reqs, policies))
        alive = torch.tensor([curve(req).alive(pooled)[: k + 1] for req in reqs], dtype=torch.float64)  # [bs, k + 1]
        return _emitted(alive, policies, k, going)

    def _best_tier(self, reqs, policies, rows_of, steps: int, going: Optional[torch.Tensor]) -> int:
        bs = len(reqs)
        measured = self.costs.measured_tiers(bs)
        if not self.costs.fixed and len(measured) < 2 and not self.costs.explored():
            # The shortest drafting tier, then 0: the longest first had cost a fresh server at batch 60
            # two rounds of 33 x 60 verify rows on the real pair (0.64x target-only over 96 tokens).
            first = next((t for t in self.tiers if t > 0), self.tiers[0])
            return first if first not in measured else self.tiers[0]
        # A drafting round first catches the draft up over what the batch committed without it, and
        # is priced with it: at a tier this bucket measured, with the share its tokens are of what
        # the batch has left (`_catch_up_share`); at a tier priced from other cells, whole (that
        # price is no evidence the rounds after it pay). Unpriced, the real pair (CPU) ran L = 8 at
        # batch 32 behind 8,192 tokens (~9 s) on batch 60's cells scaled down; and at batch 60, where
        # L = 8 was measured and a drifting machine priced tier 0 up past it, behind 7,680 tokens (35 s
        # for the round's ~470 tokens: spread, still ~7 s on a ~2 s round). Charged whole to a measured
        # tier, the catch-up over a prompt kept most of the real pair's requests at batch 1 at tier 0
        # to their end. Leaving tier 0 over a long stretch is a probe's (its loss bounded).
        behind = sum(state_of(req).draft_behind for req in reqs)
        catch_up = self._catch_up_seconds(behind)
        left = 0.0  # tokens the batch is expected to still emit, CATCH_UP_HORIZON ahead at most
        if catch_up:  # only a round that catches up reads so far ahead
            ahead = self.ends.going([p.output_len for p in policies], CATCH_UP_HORIZON)
            left = self._expected_tokens(0, reqs, policies, CATCH_UP_HORIZON, ahead)

        def carried(tier: int, tokens: float) -> float:  # the catch-up's seconds a round at `tier` bears
            return _catch_up_share(catch_up, tokens, left if tier in measured else 0.0) if tier > 0 else 0.0

        rates, seconds = {}, {}  # tier -> expected tokens per second, and seconds of its round
        for tier in self.tiers + ([HEAD] if self.head_steps else []):
            cost = self.costs.cost(bs, tier, self._rows(tier, rows_of), steps if tier == 0 else 1)
            if cost is not None and cost > 0:
                tokens = self._expected_tokens(tier, reqs, policies, steps, going)
                seconds[tier] = cost + carried(tier, tokens)
                rates[tier] = tokens / seconds[tier]
        best = max(rates, key=lambda t: (rates[t], -t)) if rates else self.tiers[0]  # ties: the shorter tier
        shorter = [t for t in rates if 0 < t < best and LONGER_MARGIN * rates[t] >= rates[best]]
        best = max(shorter, key=lambda t: (rates[t], -t)) if shorter else best
        if best == 0 and self._kept is not None and 0 in rates:
            # The last round drafted and paid: what it kept is this batch's latest evidence. Valued as
            # any tier (budgets, where outputs end, the catch-up, its cost), again where it beats tier 0.
            # Else a request's own rounds outweigh a pooled curve that SGLang's warm-up request set
            # only after ~4 rounds (its prior's weight), and probes came ~250 decode steps apart (the
            # synthetic pair, batch 1).
            tier, kept = self._kept
            cost = self.costs.cost(bs, tier, rows_of(tier))
            alive = (torch.arange(tier + 1) <= kept).double().expand(bs, -1)  # [bs, tier + 1]
            emitted = _emitted(alive, policies, tier, going)
            if cost and emitted / (cost + carried(tier, emitted)) > rates[0]:
                return tier
        if best <= 0:  # a probe replaces a round that drafts nothing; it first catches up over what the draft missed
            first = next((t for t in self.tiers if t > 0), 0)
            new = (  # one that can draft in it: each such round hears from one at least, so at most POOL_HEARD come
                not self.costs.fixed
                and self._heard < POOL_HEARD
                and any(not self.acceptance(r).survival.reached and reach(p, first) for r, p in zip(reqs, policies))
            )
            probe = self._probe_due(policies, rows_of, best, catch_up, new)
            if probe is not None:
                return probe
        # A tier priced from other cells that comes close to the best: measure it here. Not a drafting
        # tier in place of tier 0: its round first catches the draft up over every token the batch
        # committed without it (the real pair, CPU: 5,440 tokens at batch 16, ~6 s), priced above at
        # the least it can cost (nothing before a catch-up was measured), so a rate within the margin
        # is no sign it pays; a probe (above), its loss bounded by PROBE_OVERHEAD, leaves tier 0. Nor in
        # a round that catches up: its draft part is no sample of the tier (`drafts_on_host`), which
        # stays unmeasured and is explored again: the synthetic pair's closed batches of 8 (CPU), their
        # prefills' drafts deferred, explored L = 32 at each batch's first round, three visits in a row
        # without a sample.
        drafts_sampled = best > 0 and not behind  # a drafting tier here is a sample of its draft part
        close = [
            t
            for t in rates
            if t not in measured and rates[t] >= EXPLORE_MARGIN * rates[best] and (t <= 0 or drafts_sampled)
        ]
        # A measured tier whose price went stale, and may be too high: measured again where that may lose
        # little (`STALE_ROUNDS`): its round less the best tier's time for as many tokens. Not a drafting
        # tier in place of tier 0 (probes leave it, their loss bounded alike), nor in a catch-up.
        close += [
            t
            for t, since in self.costs.stale_tiers(bs).items()
            if t in rates and t != best and (t <= 0 or drafts_sampled) and rates[t] >= RECHECK_MARGIN * rates[best]
            and seconds[t] * (1 - rates[t] / rates[best]) <= PROBE_OVERHEAD * since
        ]  # fmt: skip
        return max(close, key=lambda t: (rates[t], -t)) if close and not self.costs.fixed else best

    def _probe_due(self, policies, rows_of, best: int = 0, catch_up: float = 0.0, new: bool = False) -> Optional[int]:
        """A probe, in place of a round that drafts nothing (tier 0, or a head round: `best`) for
        the batch of `policies`: the shortest drafting tier
        - at once where `new`: the batch has a request that has not drafted and can, and the pooled curve
          that keeps it from drafting has heard from fewer than POOL_HEARD requests (with costs
          measured online: the start-up's exploration goes on to the first requests' acceptance);
        - once such rounds have run long enough that the loss of one round of it (its cost in
          the batch's decode steps less the tokens per request it emits if it keeps what the pooled
          curve expects, plus its `catch_up`: seconds over the tokens the draft missed) is at most
          PROBE_OVERHEAD of their seconds since the last drafting round (each round priced at its
          own batch size; times the backoff): a request kept at tier 0 shows no acceptance, and
          drafts improve, or a bad stretch of text ends;
        - never where the batch, keeping all it can (its budgets), would emit no more than tier
          0 in the probe's time: it could not pay, and spaced the next ones out (the synthetic
          pair's batch of 1 on CPU, at tier 0 after SGLang's warm-up request: a probe came at a
          request's last 2 tokens, kept both and, emitting 3 where about 6 paid, doubled the spacing).
        The catch-up grows with the stretch: where it alone costs more than PROBE_OVERHEAD of the
        decode steps it follows, no probe is due while the stretch is within the catch-ups
        measured (the real pair on CPU, batch 60: 66 ms of catch-up per 0.61 s decode step; its
        probes, each over the whole stretch, had lost ~8% of the server's time); past the
        largest, its price stays what that one took (`_catch_up_seconds`). From tier 0 a head
        round is probed the same way (its own streak and backoff, nothing to catch up)."""
        drafting = [t for t in self.tiers if t > 0]
        candidates = []
        if self.tiers[0] == 0 and drafting:
            candidates.append(
                (drafting[0], self._zero_streak, self._backoff, self._typical.expected(drafting[0], self.pooled))
            )
        if best == 0 and self.head_steps:
            candidates.append(
                (HEAD, self._head_streak, self._head_backoff, self._typical.expected(self.head_steps, self.head_pooled))
            )
        due = {}  # tier -> how many times over its probe is due
        bs = len(policies)
        zero = self.costs.cost(bs, 0, rows_of(0))  # a decode step's seconds
        if not zero:
            return None  # nothing to weigh the streak against: tier 0 runs, and is priced
        for tier, streak, backoff, keeps in candidates:
            break_even = self._break_even_of(bs, tier, rows_of)
            if break_even is None:
                steps = PROBE_AFTER
            elif sum(1 + reach(p, self.head_steps if tier == HEAD else tier) for p in policies) <= bs * break_even:
                continue  # kept whole, it could not pay
            else:
                behind = 0.0 if tier == HEAD else catch_up / zero  # the catch-up in decode steps
                steps = math.ceil(max(break_even - 1 - keeps + behind, 0) / PROBE_OVERHEAD)  # the loss in decode steps
            due[tier] = math.inf if new and tier != HEAD else streak / zero / (max(steps, 1) * backoff)
        tier = max(due, key=due.get, default=None)  # the most overdue: one kind's probes never starve the other's
        return tier if tier is not None and due[tier] >= 1 - 1e-9 else None  # (a sum of prices against a product)

    def _catch_up_seconds(self, tokens: int) -> float:
        """Seconds a drafting round's catch-up over `tokens` takes, from the last catch-ups over a
        count nearest to it (`bucket`s of tokens: the smaller on a tie): the median of what each
        took (its draft part less its tier's measured one) times min(1, tokens / its count), the
        least that fixed work plus work per token can cost. A catch-up priced low is run, and so
        measured; one priced high never is. Per token from a small one, the synthetic pair's
        batch of 32 (CPU) priced its prompts' catch-up, ~13 ms, at 0.56 s from batch 1's 21 tokens
        at 0.45 ms each, and never drafted. 0 until one is known, and with a loaded table (its
        cells are no measure of this run's chain)."""
        if self.costs.fixed or not tokens:
            return 0.0
        extras = {}  # count bucket -> [(seconds beyond its tier's draft part, tokens)]
        for b, samples in self._catch_ups.items():
            known = [(max(seconds - self.costs.draft[bucket(bs), tier], 0.0), count)
                     for bs, tier, seconds, count in samples if (bucket(bs), tier) in self.costs.draft]  # fmt: skip
            if known:
                extras[b] = known
        if not extras:
            return 0.0
        nearest = min(extras, key=lambda b: (abs(b.bit_length() - bucket(tokens).bit_length()), b))
        return statistics.median(extra * min(1.0, tokens / count) for extra, count in extras[nearest])

    def _caught_up(self, batch_size: int, tier: int, seconds: float, tokens: int) -> None:
        """A round at `tier` whose draft part (`seconds`) held a catch-up over `tokens` tokens."""
        samples = self._catch_ups.setdefault(bucket(tokens), collections.deque(maxlen=SAMPLES))
        samples.append((batch_size, tier, seconds, tokens))

    def _break_even_of(self, bs: int, tier: int, rows_of) -> Optional[float]:
        """Tokens per request a round at `tier` must emit to beat tier 0's decode steps in its
        time: its cost in decode steps (None while either cost is unknown)."""
        zero, cost = self.costs.cost(bs, 0, rows_of(0)), self.costs.cost(bs, tier, self._rows(tier, rows_of))
        return cost / zero if zero and cost else None

    def drafts_on_host(self, caught_up: int = 0) -> None:
        """The round's drafts reached the host: its draft part ends here (`choose` started it);
        caught_up > 0: that part is no sample of its tier's cost (`Draft.caught_up`: it held a
        catch-up over that many tokens the draft missed) but one of what a catch-up over as many
        costs (`_catch_up_seconds`). A deferred prefill's catch-up (the draft over whole prompts) had added 13 ms
        to a 39 ms L = 8 draft part at batch 32 (the synthetic pair on CPU), and a closed batch's
        first round is the one that pays it: priced from it, L = 8 went from 66 to 81 ms a round and
        the batch of 32 ran L = 4."""
        self._clock.setdefault("drafts", time.perf_counter())
        self._clock.setdefault("caught_up", caught_up)

    def after_round(self, reqs, window, result, steps: int) -> None:
        """`observe` with the round's times from the controller's clock (the result is on the host);
        a round after an idle gap (`IDLE_S`) is no sample of its tier's draft part or its rest."""
        self.ends.observe_round(self._policies, result)
        start, drafts, caught_up = self._clock["start"], self._clock["drafts"], self._clock["caught_up"]
        cold, end = self._clock["cold"], time.perf_counter()
        if caught_up:
            self._caught_up(len(reqs), self._tier, drafts - start, caught_up)
        draft_s = None if caught_up or cold else drafts - start
        rest_s = None if cold else end - drafts
        self.observe(reqs, self._tier, window.shape.rows, window.plan, result, draft_s, rest_s, steps)
        self._last_end = time.perf_counter()

    def server_state(self) -> dict:
        stopped = sum(stop for _, stop in self.ends.finished)
        return {"cost_table": self.costs.to_json(),
                "output_ends": {"stopped": stopped, "cut": len(self.ends.finished) - stopped}}  # fmt: skip

    def observe(self, reqs, tier: int, rows: int, plan, result, draft_s: Optional[float], rest_s: Optional[float],
                steps: int = 1) -> None:  # fmt: skip
        """After a round (of `steps` verify passes: a tier-0 round's decode steps; HEAD: a head
        round): its costs (draft_s None: its draft part is no cost of its tier; rest_s None: its
        rest no cost either), the rest per pass, and each request's acceptance (host plan and result)."""
        took = (draft_s or 0.0) + (rest_s or 0.0)
        self.costs.observe(len(reqs), tier, rows, draft_s, None if rest_s is None else rest_s / steps, took)
        self._kept = None
        if tier == 0:
            seconds = self._priced(len(reqs), tier, rows, steps, took)
            self._zero_streak += seconds
            self._head_streak += seconds
            return
        curve, pooled = (self.head_acceptance, self.head_pooled) if tier == HEAD else (self.acceptance, self.pooled)
        emitted = []
        for req, drafted, accepted in zip(reqs, plan.draft_lens.tolist(), result.lengths):
            if drafted:
                own = curve(req)
                self._heard += tier != HEAD and not own.survival.reached  # the request's first drafting round
                pooled.observe(drafted, accepted, own.prior_weight / PRIOR_WEIGHT)  # (its weight before this round)
                own.observe(drafted, accepted)
                emitted.append(1 + accepted)
        paid = emitted and statistics.mean(emitted) > (self._break_even or 1.0)
        if paid and tier != HEAD and self._break_even is not None:  # (a known price only)
            self._kept = (tier, int(statistics.mean(emitted)) - 1)
        if tier == HEAD:  # a round that drafts nothing of PARSE's: the drafting probes' streak goes on
            self._head_backoff = 1 if paid else min(2 * self._head_backoff, PROBE_BACKOFF_MAX)
            self._zero_streak += self._priced(len(reqs), tier, rows, 1, took)
            self._head_streak = 0.0
            return
        exact = ~plan.judged  # what exact match keeps (what the verify's cut predicts): unjudged rounds
        self.calibration.observe(plan.confidence[exact], plan.draft_lens[exact], torch.tensor(result.lengths)[exact])
        if paid:
            self._backoff = 1  # drafting paid for itself: a batch that falls to tier 0 next probes soon
        elif self._zero_streak:  # a round after tier 0 (a probe, or a new batch's) that did not: probes space out
            self._backoff = min(2 * self._backoff, PROBE_BACKOFF_MAX)
        self._zero_streak = 0.0

    def _priced(self, batch_size: int, tier: int, rows: int, steps: int, took: float) -> float:
        """A round's seconds at its batch size, for the probes' budgets (`_probe_due`): its price
        (a fixed table's too), else (its cells not counted yet) what it `took`."""
        price = self.costs.cost(batch_size, tier, rows, steps)
        return took if price is None else price


def _emitted(alive: torch.Tensor, policies, k: int, going: Optional[torch.Tensor]) -> float:
    """Tokens a batch emits in a round of k draft tokens a request: alive [bs, k + 1], the chance
    that each of a request's round tokens (its bonus first) is emitted if reached, within what it
    can keep (`reach`), each weighed by `going` [bs, >= k + 1] (None: every one)."""
    reached = torch.arange(k + 1) <= torch.tensor([reach(p, k) for p in policies])[:, None]  # [bs, k + 1]
    return float((alive * reached * (1.0 if going is None else going[:, : k + 1])).sum())


def _catch_up_share(catch_up: float, tokens: float, left: float) -> float:
    """The seconds of a `catch_up` one drafting round bears: the share its `tokens` are of the
    `left` tokens the batch is expected to emit within CATCH_UP_HORIZON (each request's budget,
    weighed by where outputs end). The catch-up is paid once for every drafting round after it;
    a round that emits all that is left bears it whole."""
    return catch_up * min(1.0, tokens / left) if left > 0 else catch_up


def running_steps(going: Optional[torch.Tensor], steps: int) -> int:
    """The decode steps of a tier-0 round of at most `steps`: up to the first whose token the batch
    more likely than not does not need (every request's output more likely ended before it, by
    `OutputEnds.going` [bs, > steps]; None: all `steps`). A step past the end of every request's
    output is a whole step of waste at batch 1 (SGLang cuts the tokens after a stop): with 4 steps
    a round, by arithmetic, 1.5 steps a request on average, 3% of the synthetic pair's answers."""
    if going is None:
        return steps
    anyone = 1 - torch.prod(1 - going[:, :steps], dim=0)  # [steps] P(some request emits step j's token)
    return max(int((anyone >= 0.5).sum()), 1)  # non-increasing in j: the leading run


def reach(policy, tier: int) -> int:
    """Draft tokens a request can keep in a round of `tier`: its budget, and in a target phase
    at most what is left of the phase (`target_phase.phase_room`)."""
    keep = min(tier, policy.budget)
    return keep if policy.phase is None else min(keep, phase_room(policy.phase, policy.config))
