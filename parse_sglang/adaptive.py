"""Each round's draft length chosen by measured cost (`adaptive: true`): the design, its
settings and what it achieves are docs/adaptive.md.

- `cost_table.CostTable` (its own module): seconds of a round's draft part and of the rest, per
  (batch-size bucket, tier, verify rows), measured from the worker's own rounds or loaded from
  `profile_cost`.
- `KeepRate` / `PooledKeepRate`: each request's keep rate of a reached draft position, a
  Beta posterior whose prior is the server's pooled rate (one pair for PARSE's draft, one for an
  EAGLE-3 head's).
- `OutputEnds`: where finished requests' outputs ended: a draft token past a request's end is
  worth nothing.
- `AdaptiveDraftLength`: the `DraftLengthPolicy` choosing the tier with the most expected
  tokens per expected second (with retrieval: and the requests that verify their copy), probing
  out of tier 0 within a bounded loss. With an EAGLE-3 head
  (`eagle3_head`) the head tier `HEAD` is one more choice beside tier 0 and the drafting tiers,
  with its own cost cells and acceptance curves (docs/eagle3.md).
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from parse_sglang.acceptance import emitted_tokens
from parse_sglang.cost_table import SAMPLES, CostTable, bucket
from parse_sglang.draft_length import DECODE, HEAD, DraftLengthPolicy, Tier, drafting
from parse_sglang.request_state import state_of
from parse_sglang.retrieval import CopyKeep, window_length
from parse_sglang.target_phase import phase_room

logger = logging.getLogger(__name__)

# Every constant of the controller, each with its meaning (docs/adaptive.md says why these values).
DECAY = 0.9  # weight of the past, the prior included, per round of a request
POOLED_DECAY = 0.98  # weight of the past, per request-round, of the server's pooled estimate
PRIOR_WEIGHT = 8.0  # positions' worth of the pooled rate a new request starts with
PRIOR_WEIGHT_MIN = 0.05  # ... and what it keeps however long the request runs
PRIOR_KEEP = 0.5  # the pooled keep rate before any round (one position's worth)
PROBE_OVERHEAD = 0.02  # a probe out of tier 0 may lose this share of the seconds since its kind last ran
PROBE_BACKOFF_MAX = 32  # ... divided by 2 for each probe in a row that did not pay, down to 1 / PROBE_BACKOFF_MAX
ENDED_KEPT = 128  # finished requests whose output lengths say where outputs end
ENDED_PRIOR = 2.0  # requests' worth of an output that never ends, beside them


@dataclass
class PooledKeepRate:
    """The server's keep rate of a reached draft position, over every request's rounds: decayed
    counts (POOLED_DECAY per request-round), PRIOR_KEEP one position's worth before any; a new
    request's prior."""

    longest: int  # the longest tier: every request's curve covers every tier
    kept: float = PRIOR_KEEP
    reached: float = 1.0
    version: int = 0  # bumped by every observation: requests' curves made before are stale

    def rate(self) -> float:
        return self.kept / self.reached

    def observe(self, drafted: int, accepted: int, weight: float = 1.0) -> None:
        """A request-round that drafted `drafted` and kept `accepted` (its first min(accepted + 1,
        drafted) positions reached), counted as `weight` rounds: the request's prior weight over its
        first, so that a few long requests' many rounds do not outnumber the rest."""
        self.kept = POOLED_DECAY * self.kept + weight * accepted
        self.reached = POOLED_DECAY * self.reached + weight * min(accepted + 1, drafted)
        self.version += 1


@dataclass
class KeepRate:
    """A request's keep rate r of a reached draft position, unknown, Beta(a, b): a (b) its kept
    (rejected) positions decayed by DECAY per round, plus `prior_weight` positions' worth of the
    pooled rate. A round of L keeps its j-th token with E[r^j] = prod_{i<j} (a + i) / (a + b + i):
    the chance of a run, not the run of a mean chance (rounds that kept all they drafted value the
    positions past them by their own evidence)."""

    kept: float = 0.0
    rejected: float = 0.0
    prior_weight: float = PRIOR_WEIGHT  # positions' worth of the pooled rate, aged with the request's own
    _alive: list = field(default_factory=list)  # [1, S(1), ..., S(longest)]
    _sums: list = field(default_factory=list)  # E[accepted | L] for L = 0 .. longest
    _version: int = -1  # the pooled version the curve was made with

    def expected(self, length: int, pooled: PooledKeepRate) -> float:
        """E[draft tokens accepted] of a round drafting `length` tokens: the sum of S(1..length)."""
        self._update(pooled)
        return self._sums[min(max(length, 0), len(self._sums) - 1)]

    def alive(self, pooled: PooledKeepRate) -> list:
        """[1, S(1), S(2), ...] up to the longest tier: the chance that each draft position is kept."""
        self._update(pooled)
        return self._alive

    def _update(self, pooled: PooledKeepRate) -> None:
        if self._version != pooled.version:
            a = self.kept + self.prior_weight * pooled.rate()
            b = self.rejected + self.prior_weight * (1.0 - pooled.rate())
            alive = [1.0]
            for i in range(pooled.longest):
                alive.append(alive[-1] * (a + i) / (a + b + i))
            self._alive, self._sums = alive, [s - 1.0 for s in itertools.accumulate(alive)]
            self._version = pooled.version

    def observe(self, drafted: int, accepted: int) -> None:
        """A round of the request: what it has seen so far, the prior included, ages by DECAY."""
        self.kept = DECAY * self.kept + accepted
        self.rejected = DECAY * self.rejected + float(accepted < drafted)
        self.prior_weight = max(DECAY * self.prior_weight, PRIOR_WEIGHT_MIN)
        self._version = -1


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

    def mean_length(self) -> float:
        """The mean final length of the finished outputs (a cut one's as it was cut); inf before any."""
        return statistics.fmean(length for length, _ in self.finished) if self.finished else math.inf

    def remaining(self, policies) -> float:
        """E[tokens the requests (`RequestPolicy`s) still emit]: each one's chance to emit each of
        the tokens its max_new_tokens leaves it (`going`, summed in closed form over the curve's
        steps); every token left while no request ended at a stop; inf where one has no limit."""
        if any(p.left is None for p in policies):
            return math.inf
        lefts = torch.tensor([p.left for p in policies], dtype=torch.float64)  # [bs]
        if (curve := self._survival()) is None:
            return float(lefts.sum())
        times, beyond = curve
        starts = torch.nn.functional.pad(times, (1, 0))  # [T + 1] where each step of P(F > t) begins
        ends = torch.nn.functional.pad(times, (0, 1), value=math.inf)  # [T + 1]
        values = torch.nn.functional.pad(beyond, (1, 0), value=1.0)  # [T + 1]

        def area(x: torch.Tensor) -> torch.Tensor:  # [bs] sum of P(F > t) over t < x
            return ((torch.minimum(x[:, None], ends) - starts).clamp(min=0) * values).sum(dim=1)

        n = torch.tensor([p.output_len for p in policies], dtype=torch.float64)  # [bs]
        at_n = values[torch.searchsorted(times, n, right=True)]  # [bs] P(F > n)
        return float(((area(n + lefts) - area(n)) / at_n).sum())

    def _survival(self) -> Optional[tuple]:
        """(stop lengths [T], P(F > t) at each [T]), made once per change; None while no request
        ended at a stop."""
        if self._curve is None:
            ends = sorted({length for length, stopped in self.finished if stopped})
            if not ends:
                return None
            lengths, stopped = (torch.tensor(column, dtype=torch.float64) for column in zip(*self.finished))  # [n]
            times = torch.tensor(ends, dtype=torch.float64)  # [T]
            stops = ((lengths[:, None] == times) * stopped[:, None]).sum(dim=0)  # [T]
            at_risk = (lengths[:, None] >= times).sum(dim=0) + ENDED_PRIOR  # [T]
            self._curve = (times, torch.cumprod(1 - stops / at_risk, dim=0))
        return self._curve

    def going(self, output_lens: Sequence[int], horizon: int) -> Optional[torch.Tensor]:
        """[bs, horizon + 1] P(a running request n tokens out emits its (n + 1 + j)-th token),
        P(F > n + j) / P(F > n) for n in output_lens; None while no request ended at a stop."""
        if (curve := self._survival()) is None:
            return None
        times, beyond = curve
        at = torch.tensor(output_lens, dtype=torch.float64)[:, None] + torch.arange(horizon + 1)  # [bs, horizon + 1]
        survival = torch.nn.functional.pad(beyond, (1, 0), value=1.0)[torch.searchsorted(times, at, right=True)]
        return survival / survival[:, :1]


class AdaptiveDraftLength(DraftLengthPolicy):
    """Each round, the tier with the most expected tokens per expected second (docs/adaptive.md):
    tokens from each request's keep rate (`KeepRate`) within where outputs end (`OutputEnds`),
    seconds from the cost table plus a drafting round's catch-up (`_catch_up_seconds`). Exploration
    (`_explore`): the shortest drafting tier, then tier 0, until both are measured; after that a
    probe out of tier 0 where what it may lose fits in PROBE_OVERHEAD of the seconds since that
    kind of round last ran. With an EAGLE-3 head the tier HEAD is one more choice (docs/eagle3.md)."""

    per_round = True

    def __init__(
        self, tiers: Sequence[int], costs: CostTable, head_steps: Optional[int] = None, clock=time.perf_counter
    ):
        self.clock = clock  # seconds, what the round's costs are measured by (`parse_sglang.replay`: simulated)
        self.tiers = [drafting(L) for L in sorted(set(tiers))]  # DECODE first where the server has tier 0
        self.lengths = sorted(set(tiers))  # the draft model's L of each tier
        self.costs = costs
        self.pooled = PooledKeepRate(longest=self.lengths[-1])
        self.head_steps = head_steps  # k of an EAGLE-3 head (the tier HEAD); None: no head
        self._head = [HEAD] if head_steps else []  # the head tier, where the server has a head
        self.head_pooled = PooledKeepRate(longest=head_steps or 0)  # the head's pooled curve
        self.copy_keep = CopyKeep()  # P(kept | a copy's match length), every request's copies (`retrieval`)
        self.copying = ()  # [bs] this round's requests that verify their copy (`choose`)
        self._copies = None  # this round's `retrieval.Copy` per request
        self.ends = OutputEnds()  # where the outputs of finished requests ended
        self._since = {"draft": 0.0, "head": 0.0}  # seconds of rounds (priced) since each kind last ran
        self._backoff = {"draft": 1, "head": 1}  # each kind's probes in a row that did not pay, as a factor
        self._probe = None  # (kind, tokens it must emit to pay) of this round, if a probe
        self._catch_ups = collections.deque(maxlen=SAMPLES)  # (batch size, L, draft part s, tokens caught up)
        self._clock = {}  # this round's times at its host crossings (its measured costs)
        self._policies = ()  # this round's RequestPolicy per request
        self._tier = DECODE  # this round's tier

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

    def keep_rate(self, req) -> KeepRate:
        """The request's curve of PARSE's draft."""
        state = state_of(req)
        if state.keep_rate is None:
            state.keep_rate = KeepRate()
        return state.keep_rate

    def head_keep_rate(self, req) -> KeepRate:
        """The request's curve of the head's drafts."""
        state = state_of(req)
        if state.head_keep_rate is None:
            state.head_keep_rate = KeepRate()
        return state.head_keep_rate

    def choose(self, reqs, policies, rows_of, steps: int = 1, copies=None) -> Tier:
        """The tier of this round: reqs and their `RequestPolicy`s; rows_of(L) -> the verify rows
        of the batch at a drafting tier's L; steps: the decode steps a `DECODE` round of it would
        run; copies: each request's `retrieval.Copy` or None (None: no retrieval). Sets `copying`:
        the requests whose copy the round verifies."""
        self._clock = {"start": self.clock()}
        self._policies, self._probe, self._copies = policies, None, copies
        self.copying = ()
        going = self.ends.going([p.output_len for p in policies], max(self.lengths[-1], self.head_steps or 0, steps))
        self._tier = self._best_tier(reqs, policies, rows_of, steps, going)
        return self._tier

    def prefills_draft(self, batch_size: int, prefill_tokens: int, rows_of) -> bool:
        """Whether the draft's prefill of `prefill_tokens` (requests joining a batch of `batch_size`)
        is expected to repay itself: the seconds the best drafting tier saves per output position
        against tier 0 at that size, each request at the pooled keep rate, times the mean output
        length (`OutputEnds.mean_length`) beat the catch-up line's seconds for those tokens
        (`_catch_up_seconds`); True while tier 0 and a drafting tier are not both measured there.
        Replayed, a closed batch of 24 HumanEval prompts at batch 32 on this CPU, where drafting
        about breaks even, spent 11% of the target alone's time on the draft's prefills."""
        decode = self.costs.cost(batch_size, DECODE, self._rows(DECODE, rows_of))
        alive = KeepRate().alive(self.pooled)  # [longest + 1] a request's chance to keep each position
        measured = self.costs.measured_tiers(batch_size)  # (an estimate borrowed from another bucket may be far off)
        per_position = [
            cost / sum(alive[: tier.length + 1])
            for tier in self.tiers
            if tier.kind == "draft"
            and tier in measured
            and (cost := self.costs.cost(batch_size, tier, self._rows(tier, rows_of)))
        ]
        if DECODE not in measured or not decode or not per_position:
            return True
        saved = (decode - min(per_position)) * self.ends.mean_length()
        return saved > self._catch_up_seconds(prefill_tokens)

    def _rows(self, tier: Tier, rows_of) -> int:
        """Verify rows per request at a tier: a head round's are its k + 1 chain rows."""
        return self.head_steps + 1 if tier == HEAD else rows_of(tier.length)

    def _expected_tokens(self, tier: Tier, reqs, policies, steps: int, going: Optional[torch.Tensor]) -> torch.Tensor:
        """[bs] tokens each request emits in a round at `tier` (a `DECODE` round's `steps` decode
        steps), by its acceptance curve, its drafts capped at what it can keep (`reach`); going
        [bs, >= the round's tokens]: the chance that each token of the round is one the request's
        output still reaches (`OutputEnds.going`; None: every one)."""
        if tier == DECODE:
            counts = torch.tensor([steps if p.left is None else min(steps, p.left) for p in policies])
            ones = torch.ones(len(policies), steps, dtype=torch.float64) if going is None else going[:, :steps]
            return (ones * (torch.arange(steps) < counts[:, None])).sum(dim=1)
        curve, pooled, k = (
            (self.head_keep_rate, self.head_pooled, self.head_steps)
            if tier == HEAD
            else (self.keep_rate, self.pooled, tier.length)
        )
        alive = torch.tensor([curve(req).alive(pooled)[: k + 1] for req in reqs], dtype=torch.float64)  # [bs, k + 1]
        return _emitted(alive, policies, k, going)

    def _copy_tokens(self, policies, copies, going: Optional[torch.Tensor]) -> torch.Tensor:
        """[bs] tokens each request emits in a round that verifies its copy (`retrieval.Copy`; its
        bonus alone where it has none), by the copies' keep rate at their match length."""
        k = max(len(c.tokens) if c else 0 for c in copies)
        alive = torch.zeros(len(copies), k + 1, dtype=torch.float64)
        alive[:, 0] = 1.0
        for i, c in enumerate(copies):
            if c:
                alive[i, : len(c.tokens) + 1] = torch.tensor(self.copy_keep.alive(c.match, len(c.tokens)))
        return _emitted(alive, policies, k, going)

    def _with_copies(self, tier: Tier, drafted: torch.Tensor, copied: torch.Tensor, copies, bs: int, rows_of, charged):
        """(tokens, seconds, copying) of a round at `tier` (`DECODE`: no draft model) in which each
        request verifies its copy where that emits more (`drafted`, `copied`: [bs] expected tokens);
        charged(tier, tokens): the seconds of the catch-up a round of those tokens is charged."""
        copying = (copied > drafted).tolist()
        width = window_length(self.lengths, tier.length, copies, copying)
        cost = self.costs.cost(bs, tier, rows_of(width))
        if cost is None or cost <= 0:
            return None
        emitted = float(torch.maximum(drafted, copied).sum())
        return emitted, cost + charged(tier, emitted), copying

    def _best_tier(self, reqs, policies, rows_of, steps: int, going: Optional[torch.Tensor]) -> Tier:
        bs = len(reqs)
        if not self.costs.fixed and not self.costs.explored():  # start-up: measure a drafting tier and tier 0
            first = next((t for t in self.tiers if t.kind == "draft"), self.tiers[0])
            return first if first not in self.costs.measured_tiers(bs) else self.tiers[0]
        behind = sum(state_of(req).draft_behind for req in reqs)
        catch_up = self._catch_up_seconds(behind)
        left = self.ends.remaining(policies) if behind else math.inf  # tokens the batch is expected to emit still
        own = self.costs.priced_tiers(bs)

        def charged(tier: Tier, emitted: float) -> float:
            """A drafting round's catch-up (the draft extended over what tier-0 rounds committed and over
            prompts whose draft prefill was deferred) in the share `emitted` is of what is left, as
            `prefills_draft` prices a prefill, where the tier is priced from the batch's bucket's own
            rounds; else whole (another bucket's estimate may be far off). Once caught up the draft
            drafts on: borne whole by one round, a catch-up that grows with the seconds at tier 0 kept
            a batch that went there on a noisy measure there."""
            if tier.kind != "draft" or not behind:
                return 0.0
            return catch_up * emitted / left if tier in own and emitted < left else catch_up

        per_request, tokens, seconds, rate = {}, {}, {}, {}
        for tier in self.tiers + self._head:
            cost = self.costs.cost(bs, tier, self._rows(tier, rows_of), steps if tier == DECODE else 1)
            if cost is not None and cost > 0:
                per_request[tier] = self._expected_tokens(tier, reqs, policies, steps, going)
                tokens[tier] = float(per_request[tier].sum())
                seconds[tier] = cost + (catch_up if tier.kind == "draft" else 0.0)  # what a probe risks
                rate[tier] = tokens[tier] / (cost + charged(tier, tokens[tier]))
        if not tokens:
            return self.tiers[0]
        best = max(rate, key=lambda t: (rate[t], t == HEAD, -t.length))  # ties: the head, then the shorter tier
        if self._copies is not None and any(self._copies):  # each drafting tier (and none) with copies
            copied = self._copy_tokens(policies, self._copies, going)
            one_pass = self._expected_tokens(DECODE, reqs, policies, 1, going)  # a round of copies alone: one verify
            best_rate, copy_tier, copying = rate[best], None, ()
            for tier in [DECODE] + [t for t in self.tiers if t.kind == "draft" and t in per_request]:
                drafted = per_request[tier] if tier != DECODE else one_pass
                option = self._with_copies(tier, drafted, copied, self._copies, bs, rows_of, charged)
                if option is not None and any(option[2]) and option[0] / option[1] > best_rate:
                    best_rate, copy_tier, copying = option[0] / option[1], tier, option[2]
            if copy_tier is not None:
                self.copying = copying
                return copy_tier
        return best if best.kind == "draft" else self._explore(best, rate, tokens, seconds)

    def _explore(self, best: Tier, rate: dict, tokens: dict, seconds: dict) -> Tier:
        """In place of a round that drafts nothing of PARSE's (`DECODE` or `HEAD`: `best`), a probe of
        the shortest drafting tier (or, from tier 0, of the head) where what it may lose against
        `best` for its expected tokens fits in PROBE_OVERHEAD of the seconds since that kind of
        round last ran, over its backoff (doubled by each probe in a row that did not pay): a
        request at tier 0 shows no acceptance, and a draft's text gets better."""
        probes = [next((t for t in self.tiers if t.kind == "draft"), None)] + (self._head if best == DECODE else [])
        due = []
        for tier in filter(None, probes):
            kind = tier.kind
            loss = seconds[tier] - tokens[tier] / rate[best] if tier in seconds else math.inf  # seconds
            if loss <= PROBE_OVERHEAD * self._since[kind] / self._backoff[kind]:
                due.append((self._since[kind], -seconds[tier], kind == "draft", tier))
        if not due:
            return best
        *_, tier = max(due)  # the kind that ran longest ago (one never starves the other), then the cheaper
        self._probe = (tier.kind, rate[best] * seconds[tier])  # the tokens it must beat
        return tier

    def _catch_up_seconds(self, tokens: int) -> float:
        """Seconds of a catch-up over `tokens`: a line (fixed + per token) through the last catch-ups'
        seconds beyond their tier's measured draft part, or with one size known, that catch-up's
        seconds times min(1, tokens / its size) (the least a line through it can give); 0 before any,
        and with a loaded table (its cells are no measure of this run's draft part)."""
        if self.costs.fixed or not tokens:
            return 0.0
        points = [
            (count, max(seconds - self.costs.draft[bucket(bs), tier], 0.0))
            for bs, tier, seconds, count in self._catch_ups
            if (bucket(bs), tier) in self.costs.draft
        ]
        if not points:
            return 0.0
        counts = [c for c, _ in points]
        if len(set(counts)) < 2:
            return statistics.median(extra * min(1.0, tokens / count) for count, extra in points)
        slope, intercept = statistics.linear_regression(counts, [e for _, e in points])
        return max(intercept + slope * tokens, 0.0)

    def drafts_on_host(self, caught_up: int = 0) -> None:
        """The round's drafts reached the host: its draft part ends here (`choose` started it);
        caught_up > 0: that part is no sample of its tier's cost (`Draft.caught_up`: it held a
        catch-up over that many tokens the draft missed) but one of what a catch-up costs."""
        self._clock.setdefault("drafts", self.clock())
        self._clock.setdefault("caught_up", caught_up)

    def after_round(self, reqs, window, result, steps: int) -> None:
        """`observe` with the round's times from the controller's clock (the result is on the host)."""
        self.ends.observe_round(self._policies, result)
        start, drafts, caught_up, end = (
            self._clock["start"],
            self._clock["drafts"],
            self._clock["caught_up"],
            self.clock(),
        )
        if caught_up:
            self._catch_ups.append((len(reqs), self._tier.length, drafts - start, caught_up))
        self.observe(
            reqs,
            self._tier,
            window.shape.rows,
            window.plan,
            result,
            None if caught_up else drafts - start,
            end - drafts,
            steps,
        )

    def server_state(self) -> dict:
        stopped = sum(stop for _, stop in self.ends.finished)
        return {
            "cost_table": self.costs.to_json(),
            "output_ends": {"stopped": stopped, "cut": len(self.ends.finished) - stopped},
        }

    def observe(
        self, reqs, tier: Tier, rows: int, plan, result, draft_s: Optional[float], rest_s: float, steps: int = 1
    ) -> None:
        """After a round at `tier` (of `steps` verify passes: a `DECODE` round's decode steps):
        its costs (draft_s None: its draft part is no cost of its tier), the rest per pass, the
        seconds since each kind of round last ran, and each request's acceptance."""
        self.costs.observe(len(reqs), tier, rows, draft_s, rest_s / steps)
        price = self.costs.cost(len(reqs), tier, rows, steps)  # (priced: a busy machine's spike counts as usual)
        for kind in self._since:
            self._since[kind] += price if price is not None else (draft_s or 0.0) + rest_s
        copying = list(self.copying) or [False] * len(reqs)
        if any(copying):
            for copy, used, drafted, accepted in zip(self._copies, copying, plan.draft_lens.tolist(), result.lengths):
                if used:
                    self.copy_keep.observe(copy.match, drafted, accepted)
        if tier == DECODE:
            return
        kind = tier.kind
        self._since[kind] = 0.0
        if self._probe is not None:  # a probe that did not pay spaces the next one out
            paid = sum(1 + a for a, n in zip(result.lengths, plan.draft_lens.tolist()) if n) > self._probe[1]
            self._backoff[kind] = 1 if paid else min(2 * self._backoff[kind], PROBE_BACKOFF_MAX)
        else:
            self._backoff[kind] = 1
        curve, pooled = (self.head_keep_rate, self.head_pooled) if tier == HEAD else (self.keep_rate, self.pooled)
        for req, drafted, accepted, used in zip(reqs, plan.draft_lens.tolist(), result.lengths, copying):
            if drafted and not used:
                own = curve(req)
                pooled.observe(drafted, accepted, own.prior_weight / PRIOR_WEIGHT)  # (its weight before this round)
                own.observe(drafted, accepted)


def _emitted(alive: torch.Tensor, policies, k: int, going: Optional[torch.Tensor]) -> torch.Tensor:
    """[bs] tokens each request emits in a round of k draft tokens a request: alive [bs, k + 1],
    the chance that each of a request's round tokens (its bonus first) is emitted if reached,
    within what it can keep (`reach`), each weighed by `going` [bs, >= k + 1] (None: every one)."""
    reached = torch.arange(k + 1) <= torch.tensor([reach(p, k) for p in policies])[:, None]  # [bs, k + 1]
    return (alive * reached * (1.0 if going is None else going[:, : k + 1])).sum(dim=1)


def reach(policy, tier: int) -> int:
    """Draft tokens a request can keep in a round of `tier`: its budget, and in a target phase
    at most what is left of the phase (`target_phase.phase_room`)."""
    keep = min(tier, policy.budget)
    return keep if policy.phase is None else min(keep, phase_room(policy.phase, policy.config))
