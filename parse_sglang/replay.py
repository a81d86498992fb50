"""Exact replay of draft-length policies over recorded lossless traces, under a cost table (its
command: `python -m parse_sglang.tools.replay`).

With the judge off the target's output does not depend on the draft, and the draft's greedy chain
is a function of the committed text: a trace (`benchmarks/trace.py`) holds, at every output
position p, whether the draft's token matches the target's, so a round starting at p with L drafts
keeps min(run of matches from p, L, what the request may keep). `serve` runs the *same*
`DraftLengthPolicy` objects the worker runs (`AdaptiveDraftLength` on a simulated clock,
`FixedDraftLength`) through that arithmetic, each round priced by the `Machine` (at its requests'
mean context, where the machine was profiled at several): no noise, unless a `NoisyMachine` adds it.

Loads: a closed batch of B (all arrive at 0), prompts one by one (batch 1, in turn, the server's
policy state kept between them), an open loop (Poisson arrivals). Against: the target alone
(one decode step a round), every fixed L, and `oracle_seconds`, the least time any sequence of
rounds of the draft model can serve a request in alone (a bound at batch 1: no policy beats it
under the same costs without copies).

Retrieval's copies (docs/retrieval.md) are priced where the trace holds each request's token ids
(its prompt and the target's output) and the config retrieves (`retrieval` on an adaptive server):
each round the server's own `Retrieval` proposes over the running requests' text so far, the
controller chooses, and a verified copy keeps its run of agreement with the target's next tokens
(`_Copier`). The corpus of finished outputs starts empty at each `serve`.

What is not modelled: the target's prefill (the same for every policy; the draft's share of it is
priced as a catch-up), the judge (lossless only), and retrieval's own host time (about 9 µs a
request-round, docs/retrieval.md).
"""

from __future__ import annotations

import json
import math
import random
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from parse_sglang.cost_table import CostTable, interpolate
from parse_sglang.draft_length import DECODE, DraftLengthPolicy, FixedDraftLength, drafting
from parse_sglang.request_state import RequestPolicy, state_of
from parse_sglang.retrieval import Copy, Retrieval, copy_budgets, window_length
from parse_sglang.settings import ParseConfig

STOP, TOKEN = 1, 2  # the replay's token ids: where a trace's output ended at a stop token, and any other


@dataclass(frozen=True)
class TraceRequest:
    prompt_len: int
    match: str  # "1" where the draft's greedy token at that output position is the target's
    confidence: tuple  # per mille: the draft's top-1 probability there
    stopped: bool  # the output ended at a stop token (else at max_new_tokens)
    prompt_ids: Optional[tuple] = None  # [prompt_len] its prompt's token ids (None: not recorded)
    output_ids: Optional[tuple] = None  # [len(match)] the target's output token ids (None: not recorded)

    def run(self, p: int) -> int:
        """Draft tokens a round starting at output position p matches: the run of matches from p."""
        end = self.match.find("0", p)
        return (len(self.match) if end < 0 else end) - p


@dataclass
class Trace:
    pair: str
    max_new_tokens: int
    requests: list

    @property
    def has_ids(self) -> bool:
        """Every request holds its prompt's and output's token ids (what retrieval's copies need)."""
        return all(r.prompt_ids is not None and r.output_ids is not None for r in self.requests)

    @classmethod
    def load(cls, path) -> "Trace":
        """A trace `benchmarks/trace.py` wrote; errors name the file and the problem."""
        try:
            raw = json.loads(Path(path).read_text())
            requests = [
                TraceRequest(
                    int(r["prompt_len"]),
                    str(r["match"]),
                    tuple(r["confidence"]),
                    bool(r["stopped"]),
                    *(tuple(map(int, r[k])) if r.get(k) is not None else None for k in ("prompt_ids", "output_ids")),
                )
                for r in raw["requests"]
            ]
            trace = cls(str(raw["pair"]), int(raw["max_new_tokens"]), requests)
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ValueError(
                f"trace {path!r} is invalid ({type(err).__name__}: {err}): allowed is what benchmarks/trace.py writes"
            ) from None
        bad = [i for i, r in enumerate(requests) if not r.match or len(r.confidence) != len(r.match)]
        if bad:
            raise ValueError(
                f"trace {path!r} is invalid: request {bad[0]} has no output or a confidence per position missing"
            )
        bad = [
            i
            for i, r in enumerate(requests)
            if (r.prompt_ids is None) != (r.output_ids is None)
            or (r.prompt_ids is not None and (len(r.prompt_ids) != r.prompt_len or len(r.output_ids) != len(r.match)))
        ]
        if bad:
            raise ValueError(
                f"trace {path!r} is invalid: request {bad[0]}'s prompt_ids and output_ids are not both there with "
                "prompt_len and one output id per position: allowed is both (of those lengths) or neither"
            )
        return trace


@dataclass
class Machine:
    """What a round costs on the replayed machine: a fixed `CostTable` (`profile_cost`'s, or one made
    from recorded figures) and the draft's catch-up over tokens it missed (fixed + per token).
    Batch sizes between the table's measured ones: priced at their bucket's (`CostTable.cost`), or
    with `batch_line` on a line through the two nearest measured sizes (a closed batch drains: its
    last 5-7 requests' rounds cost less than 8's). Contexts: with `contexts` (tables profiled at two
    or more context lengths) a round is priced at its requests' mean context on the least-squares
    line through the contexts' prices (a profile's cell moves ±20% between runs on this CPU: a
    line through the nearest two would follow that noise); without, `table` prices every context."""

    table: CostTable
    catch_up_fixed: float = 0.0  # seconds of a catch-up, whatever its length
    catch_up_per_token: float = 0.0  # ... and per token it extends the draft over (summed over the batch)
    source: str = ""  # what was measured and what is interpolated
    batch_line: bool = False  # between measured batch sizes: a line (True) or the bucket's cost
    # {context tokens a request: CostTable profiled there}, `table` the shortest's; empty: `table` alone
    contexts: dict = field(default_factory=dict)

    @classmethod
    def load(cls, path) -> "Machine":
        """A machine file: {"table": profile_cost's JSON, or "tables": [{"context_tokens": N, "table":
        profile_cost's JSON at N}, ...] (two or more), "catch_up_fixed", "catch_up_per_token",
        "batch_sizes": "bucket" (the default) or "line", "source"}."""
        try:
            raw = json.loads(Path(path).read_text())
            where = f"machine {str(path)!r}"
            contexts = {
                int(t["context_tokens"]): CostTable.from_json(
                    t["table"], f"{where}: its table at {t['context_tokens']}"
                )
                for t in raw.get("tables", ())
            }
            if "tables" in raw and len(contexts) < 2:
                raise ValueError(f"{where} is invalid: tables holds {len(contexts)} context; allowed: two or more")
            table = contexts[min(contexts)] if contexts else CostTable.from_json(raw["table"], f"{where}: its table")
            between = raw.get("batch_sizes", "bucket")
            if between not in ("bucket", "line"):
                raise ValueError(f"{where} is invalid: batch_sizes={between!r}; allowed: bucket, line")
            return cls(
                table,
                float(raw.get("catch_up_fixed", 0.0)),
                float(raw.get("catch_up_per_token", 0.0)),
                str(raw.get("source", "")),
                between == "line",
                contexts,
            )
        except (OSError, KeyError, TypeError) as err:
            raise ValueError(
                f"machine {str(path)!r} is invalid ({type(err).__name__}: {err}): allowed is JSON with "
                '"table" (profile_cost\'s) or "tables" ([{"context_tokens", "table"}, ...]), "catch_up_fixed", '
                '"catch_up_per_token"'
            ) from None

    def draft(self, bs: int, length: int, context: Optional[float] = None) -> float:
        """Seconds of a round's draft part at the draft model's L = `length` (0: a decode round's,
        the host's share before its steps), its requests at `context` tokens on average (None: `table`'s)."""
        return self._at(bs, context, lambda t, b: t.cost(b, drafting(length), length + 1, steps=0))

    def rest(self, bs: int, length: int, rows: int, context: Optional[float] = None) -> float:
        """Seconds of one verify pass of `rows` rows a request (and the result to the host) at L = `length`."""
        tier = drafting(length)
        return self._at(bs, context, lambda t, b: t.cost(b, tier, rows, steps=1) - t.cost(b, tier, rows, steps=0))

    def _at(self, bs: int, context: Optional[float], price: Callable[[CostTable, int], float]) -> float:
        """price(table, bs) on a line in the context through the `contexts` profiled (`table` alone
        where there are none or context is None), each with `batch_line` a line through the
        measured batch sizes (those beside bs, else the two at that end)."""

        def at_batch(table: CostTable) -> float:
            sizes = {b for b, _ in table.draft} & {b for b, _ in table.rest}
            if not self.batch_line or len(sizes) < 2:
                return price(table, bs)
            return interpolate({b: price(table, b) for b in sizes}, bs)

        if context is None or len(self.contexts) < 2:
            return at_batch(self.table)
        slope, intercept = statistics.linear_regression(
            list(self.contexts), [at_batch(t) for t in self.contexts.values()]
        )
        return max(intercept + slope * context, 0.0)

    def catch_up(self, tokens: int) -> float:
        return self.catch_up_fixed + self.catch_up_per_token * tokens if tokens else 0.0


@dataclass
class NoisyMachine(Machine):
    """A `Machine` whose every priced part (a draft part, a verify pass, a catch-up) is multiplied by
    exp(N(0, sigma)) drawn from `rng`: a busy machine's rounds, as the controller measures them."""

    sigma: float = 0.0
    rng: random.Random = field(default_factory=random.Random)

    @classmethod
    def of(cls, machine: Machine, sigma: float, seed: int) -> "NoisyMachine":
        return cls(
            **{f: getattr(machine, f) for f in Machine.__dataclass_fields__}, sigma=sigma, rng=random.Random(seed)
        )

    def _noise(self) -> float:
        return math.exp(self.rng.gauss(0.0, self.sigma))

    def draft(self, bs: int, length: int, context: Optional[float] = None) -> float:
        return super().draft(bs, length, context) * self._noise()

    def rest(self, bs: int, length: int, rows: int, context: Optional[float] = None) -> float:
        return super().rest(bs, length, rows, context) * self._noise()

    def catch_up(self, tokens: int) -> float:
        return super().catch_up(tokens) * self._noise()


class SimRequest:
    """A request being replayed: what a policy reads of it is its `parse` state (`state_of`), and
    what `Retrieval` reads: `rid`, `origin_input_ids`, `output_ids` (the target's output so far:
    the text up to the round's input) and `finished()`."""

    def __init__(self, trace: TraceRequest, arrival: float, rid: int):
        self.trace, self.arrival, self.rid = trace, arrival, rid
        self.n = 0  # output tokens emitted
        self.finished_at: Optional[float] = None

    @property
    def origin_input_ids(self) -> tuple:
        return self.trace.prompt_ids

    @property
    def output_ids(self) -> tuple:
        return self.trace.output_ids[: self.n]

    def finished(self) -> bool:
        return self.finished_at is not None


@dataclass
class Served:
    tokens: int = 0
    seconds: float = 0.0  # from the first arrival to the last finish
    rounds: int = 0
    drafted_tokens: int = 0  # the draft model's, summed over requests (mean L = drafted / request-rounds)
    request_rounds: int = 0
    latencies: list = field(default_factory=list)
    copies: list = field(default_factory=list)  # (request index, output position, copy tokens, kept) verified
    drafted_last: bool = True  # its last round drafted (what the next `serve` starts from: the worker's `_drafting`)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def speed(self, load: str) -> float:
        """What a load is scored by: tokens/s over a closed load's makespan; an open loop's makespan is
        set by its arrivals, so 1 / its mean latency."""
        return len(self.latencies) / sum(self.latencies) if load.startswith("open:") else self.tokens_per_s


@dataclass(frozen=True)
class _Window:  # what a policy's after_round reads of the worker's window
    shape: object
    plan: object


@dataclass(frozen=True)
class _Shape:
    rows: int


@dataclass(frozen=True)
class _Plan:
    draft_lens: torch.Tensor  # [bs]
    judged: torch.Tensor  # [bs] bool


@dataclass(frozen=True)
class _Result:
    emitted: list  # [bs][k + 1]
    lengths: list  # [bs]


def _policy(req: SimRequest, config: ParseConfig, max_new: int) -> RequestPolicy:
    left = max_new - req.n
    budget = min(config.draft_budget, max(left - 1, 1))
    stops = frozenset({STOP}) if req.trace.stopped else frozenset()
    return RequestPolicy(config, budget, False, stops, None, left, req.n)


def _token(req: SimRequest, p: int) -> int:
    return STOP if req.trace.stopped and p == len(req.trace.match) - 1 else TOKEN


class _Copier:
    """Retrieval in a replay: the worker's `_copies` (the server's `Retrieval` over the running
    requests, each copy at most its budget) and what a verified copy keeps against the target's
    output. Stop tokens: the last output ids of the trace's requests that stopped."""

    def __init__(self, config: ParseConfig, trace: Trace):
        self.retrieval = Retrieval(config.retrieval_min_match, config.retrieval_corpus)
        self.stops = frozenset(r.output_ids[-1] for r in trace.requests if r.stopped)

    @classmethod
    def of(cls, config: ParseConfig, trace: Trace, target_only: bool) -> Optional["_Copier"]:
        """A copier where the worker would retrieve (`retrieval` on an adaptive server) and the
        trace holds token ids; else None (no copies, as without retrieval)."""
        retrieves = config.retrieval and config.adaptive and not target_only
        return cls(config, trace) if retrieves and trace.has_ids else None

    def propose(self, running: list, policies: list) -> list[Optional[Copy]]:
        return self.retrieval.propose(running, copy_budgets(policies))

    def kept(self, req: SimRequest, copy: Copy) -> tuple[int, int]:
        """(copied, kept) of a round verifying `copy` at req's output position: its tokens up to and
        including a stop token (the plan's draft length), and the run of them the target's next
        output tokens agree with."""
        copied = next((j + 1 for j, t in enumerate(copy.tokens) if t in self.stops), len(copy.tokens))
        ahead = req.trace.output_ids[req.n : req.n + copied]
        return copied, next((j for j, (c, t) in enumerate(zip(copy.tokens, ahead)) if c != t), len(ahead))


def serve(
    policy: DraftLengthPolicy,
    trace: Trace,
    machine: Machine,
    config: ParseConfig,
    arrivals: Sequence[float],
    concurrency: int,
    clock: Optional[list] = None,
    target_only: bool = False,
    drafting: bool = True,
) -> Served:
    """Replay the trace's requests (request i arriving at arrivals[i], at most `concurrency` in the
    batch, admitted in order) under `policy`; clock: [seconds], the policy's simulated clock (its
    `clock` reads clock[0]), shared so that a policy's state runs on across calls; drafting: the
    server's last round before drafted (a previous call's `Served.drafted_last`: after a round
    that did not, the worker defers a prefill's draft, `ParseWorker._defers_draft`; a fresh
    worker's is False, the replay's first call's True). target_only: every round one plain
    decode step, priced as a 1-row verify (SGLang's own decode). Copies as the module docstring
    says (`_Copier`)."""
    clock = clock if clock is not None else [0.0]
    start = clock[0] = max(clock[0], min(arrivals))
    waiting = [SimRequest(r, start + a - min(arrivals), i) for i, (r, a) in enumerate(zip(trace.requests, arrivals))]
    running, served, last_bs = [], Served(), 0
    # the worker defers a draft's prefill on an adaptive server only
    adaptive = not isinstance(policy, FixedDraftLength)
    copier = _Copier.of(config, trace, target_only)
    rows_of = lambda L: L + 1  # noqa: E731 (lossless: the chain's rows, no probes)
    while waiting or running:
        admitted = []
        while waiting and len(running) + len(admitted) < concurrency and waiting[0].arrival <= clock[0]:
            admitted.append(waiting.pop(0))
        # the worker's `_defers_draft`: after a tier-0 round, or where the joined batch is expected not to draft
        prompts = sum(r.trace.prompt_len for r in admitted)
        deferred = adaptive and (not drafting or not policy.prefills_draft(last_bs + len(admitted), prompts, rows_of))
        for req in admitted:
            state_of(req).draft_behind = req.trace.prompt_len if deferred else 0
            if not deferred and not target_only:  # the draft's prefill beside the target's
                clock[0] += machine.catch_up_per_token * req.trace.prompt_len
            running.append(req)
        if not running:
            clock[0] = waiting[0].arrival
            continue
        bs, policies = len(running), [_policy(r, config, trace.max_new_tokens) for r in running]
        # tokens a request attends to, on average (what `Machine.contexts` prices by)
        context = sum(r.trace.prompt_len + r.n for r in running) / bs
        longest = max(p.left for p in policies)
        steps = max(min(config.tier0_steps, config.draft_budget + 1, longest), 1)
        copies = copier.propose(running, policies) if copier else None
        tier = DECODE if target_only else policy.choose(running, policies, rows_of, steps, copies)
        copying = list(policy.copying) or [False] * bs
        width = window_length(config.tiers, tier.length, copies, copying) if any(copying) else tier.length
        if width == 0:  # tier 0: plain decode steps
            if target_only:
                steps = 1
            else:
                clock[0] += machine.draft(bs, 0, context)
            policy.drafts_on_host(0)  # (the worker's first step plans its window: the round's host part ends)
            clock[0] += steps * machine.rest(bs, 0, 1, context)
            emitted = [[_token(r, r.n + j) for j in range(steps)] for r in running]
            lengths, window = [steps - 1] * bs, _Window(_Shape(1), None)
            for r in running:
                state_of(r).draft_behind += steps
        else:  # one verify of `width` rows: the draft model's L = tier.length drafts (none at tier 0), copies
            behind = sum(state_of(r).draft_behind for r in running) if tier.length else 0
            clock[0] += machine.draft(bs, tier.length, context) + machine.catch_up(behind)
            policy.drafts_on_host(behind)
            clock[0] += machine.rest(bs, tier.length, rows_of(width), context)
            lens, lengths, emitted = [], [], []
            for r, p, copy, used in zip(running, policies, copies or [None] * bs, copying):
                if used:
                    drafted, kept = copier.kept(r, copy)
                    served.copies.append((r.rid, r.n, copy.tokens, kept))
                else:
                    drafted = min(tier.length, p.budget)
                    run = r.trace.run(r.n)  # a stop token the draft matched ends its draft (`cut_at_stop`)
                    stop_at = next((j + 1 for j in range(min(run, drafted)) if _token(r, r.n + j) == STOP), drafted)
                    drafted = min(drafted, stop_at)
                    kept = min(run, drafted)
                if tier.length:  # the draft caught up over the batch; a copy's tokens it then missed
                    state_of(r).draft_behind = kept + 1 if used else 0
                else:
                    state_of(r).draft_behind += kept + 1
                lens.append(drafted)
                lengths.append(kept)
                emitted.append([_token(r, r.n + j) for j in range(kept + 1)])
                served.drafted_tokens += tier.length
            window = _Window(_Shape(rows_of(width)), _Plan(torch.tensor(lens), torch.zeros(bs, dtype=torch.bool)))
        if not target_only:
            policy.after_round(running, window, _Result(emitted, lengths), steps if width == 0 else 1)
        drafting, last_bs = tier.kind == "draft", bs
        served.rounds += 1
        served.request_rounds += bs
        for r, out in zip(running, emitted):
            gained = min(len(out), len(r.trace.match) - r.n)
            r.n += gained
            served.tokens += gained
            if r.n >= len(r.trace.match):
                r.finished_at = clock[0]
                served.latencies.append(clock[0] - r.arrival)
        running = [r for r in running if r.finished_at is None]
    served.seconds, served.drafted_last = clock[0] - start, drafting
    return served


def oracle_seconds(
    req: TraceRequest, machine: Machine, config: ParseConfig, lengths: Sequence[int], max_new: int
) -> float:
    """The least seconds any sequence of rounds at batch 1 serves `req` in after its prompt (the
    draft's prefill of it priced as a catch-up without the fixed part, as `serve` does): tier-0
    rounds of 1..tier0_steps steps, drafting rounds of any L in `lengths` (with the catch-up over
    what the draft missed), every round priced at the request's mean context (its prompt and
    half its output). Exact dynamic programming: a
    catch-up is fixed + per token, so from position p with the draft b tokens behind the best is
    min(Z(p), fixed + per_token * b + H(p)) (b > 0), Z: tier 0 to the end, H: the best whose next
    drafting round comes after k more tier-0 tokens (each then caught up too)."""
    T, S = len(req.match), config.tier0_steps
    context = req.prompt_len + T / 2
    step, draft0 = machine.rest(1, 0, 1, context), machine.draft(1, 0, context)
    c0, c1 = machine.catch_up_fixed, machine.catch_up_per_token

    def tier0(k: int) -> float:  # k tokens in the fewest rounds of at most S steps
        return math.ceil(k / S) * draft0 + k * step

    drafting = {L: machine.draft(1, L, context) + machine.rest(1, L, L + 1, context) for L in lengths if L > 0}
    F = [0.0] * (T + 1)  # the best from p with the draft caught up
    H = [0.0] * (T + 1)  # the best from p whose next round after k >= 0 tier-0 tokens drafts
    D = [math.inf] * (T + 1)
    for p in range(T - 1, -1, -1):
        left = T - p
        budget = min(config.draft_budget, max(max_new - p - 1, 1))
        run = req.run(p)
        D[p] = min((cost + F[min(p + min(run, L, budget) + 1, T)] for L, cost in drafting.items()), default=math.inf)
        H[p] = min(tier0(k) + c1 * k + (c0 if k else 0.0) + D[p + k] for k in range(0, left))
        F[p] = min(tier0(left), H[p])
    return min(tier0(T), c1 * req.prompt_len + F[0])  # the draft's prefill now, or never (deferring it costs c0 more)


def as_the_bench(trace: Trace, batch: int) -> tuple[Trace, Trace, Trace]:
    """(alone, warm-up, timed): a closed batch of `batch` served as `benchmarks/compare.py` serves
    it on an engine, first one warm-up prompt alone, then `batch` others cut at a quarter of
    max_new_tokens (censored there), then the timed batch: here the trace's first `batch` requests
    timed and its last `batch` + 1 the warm-ups."""
    if len(trace.requests) < 2 * batch + 1:
        raise ValueError(
            f"trace {trace.pair!r} has {len(trace.requests)} requests: a bench's batch of {batch} needs {2 * batch + 1}"
        )
    q = max(trace.max_new_tokens // 4, 1)
    cut = [
        replace(
            r,
            match=r.match[:q],
            confidence=r.confidence[:q],
            stopped=r.stopped and len(r.match) <= q,
            output_ids=r.output_ids[:q] if r.output_ids is not None else None,
        )
        for r in trace.requests[-batch:]
    ]
    alone = replace(trace, requests=[trace.requests[-batch - 1]])
    return alone, replace(trace, max_new_tokens=q, requests=cut), replace(trace, requests=trace.requests[:batch])


def serve_as_the_bench(
    policy: DraftLengthPolicy, trace: Trace, machine: Machine, config: ParseConfig, batch: int, clock: list
) -> Served:
    """The timed batch of `as_the_bench`, served after its warm-ups by the same policy and clock,
    the worker's deferral carried from each to the next (`Served.drafted_last`)."""
    alone, warm, timed = as_the_bench(trace, batch)
    drafted = serve(policy, alone, machine, config, [0.0], 1, clock).drafted_last
    drafted = serve(policy, warm, machine, config, [0.0] * batch, batch, clock, drafting=drafted).drafted_last
    return serve(policy, timed, machine, config, [0.0] * batch, batch, clock, drafting=drafted)


def arrivals_of(load: str, count: int, rate: float = 0.0, seed: int = 0) -> tuple[list, int]:
    """(arrival times, concurrency) of a load: "batch:B", "one_by_one", "open:F" (Poisson at `rate`/s)."""
    if load == "one_by_one":
        return [0.0] * count, 1
    if load.startswith("batch:"):
        return [0.0] * count, int(load.split(":")[1])
    if not load.startswith("open:"):
        raise ValueError(f"load={load!r} is invalid: allowed are one_by_one, batch:B, open:F")
    rng, t, times = random.Random(seed), 0.0, []
    for _ in range(count):
        times.append(t)
        t += rng.expovariate(rate)
    return times, 64


def policies(config: ParseConfig, fixed: Sequence[int]) -> dict[str, Callable[[list], DraftLengthPolicy]]:
    """name -> a new policy on the clock [seconds]: "adaptive" (the worker's `AdaptiveDraftLength`, its
    costs measured online on the simulated clock) and "fixed L" for each L."""
    from parse_sglang.adaptive import AdaptiveDraftLength

    made = {"adaptive": lambda clock: AdaptiveDraftLength(config.tiers, CostTable(), clock=lambda: clock[0])}
    for L in fixed:
        made[f"fixed {L}"] = lambda clock, L=L: FixedDraftLength(L)
    return made


def open_rate(trace: Trace, machine: Machine, load: str, config: ParseConfig) -> float:
    """Arrivals per second of "open:F": F times the requests per second the target alone serves in
    closed batches of 8 (0.0 for a closed load)."""
    if not load.startswith("open:"):
        return 0.0
    closed = serve(
        FixedDraftLength(0), trace, machine, config, *arrivals_of("batch:8", len(trace.requests)), target_only=True
    )
    return float(load.split(":")[1]) * len(trace.requests) / closed.seconds


def replay(
    trace: Trace,
    machine: Machine,
    load: str,
    config: ParseConfig,
    fixed: Sequence[int],
    oracle: bool = True,
    warm_up: int = 1,
    first_alone: bool = False,
) -> dict:
    """Every policy and the target alone over the trace at `load` (`open_rate` for an open loop):
    each one's `Served.speed` and its ratio to the target alone's (module docstring), and the
    request-rounds that verified a copy; oracle: the batch-1 bound with one_by_one, where no copies
    are priced (it knows the draft model's rounds only); warm_up: runs of the load each policy
    serves first, its state kept (the controller's start-up exploration is paid there); first_alone:
    before those, the trace's first request alone, as `benchmarks/compare.py` warms an engine up on
    one prompt first (a controller that priced copy rounds at one request borrows that price in a
    batch; one warmed up in batches only never tried them: the edit trace at batch 8, 0 copies)."""
    arrivals, concurrency = arrivals_of(load, len(trace.requests), open_rate(trace, machine, load, config))
    row = {"pair": trace.pair, "load": load}
    target = serve(FixedDraftLength(0), trace, machine, config, arrivals, concurrency, target_only=True)
    row["target_only"] = {"speed": target.speed(load), "seconds": target.seconds}
    for name, make in policies(config, fixed).items():
        clock = [0.0]
        cfg = (
            config
            if name == "adaptive"
            else ParseConfig.from_dict({"adaptive": False, "draft_budget": int(name.split()[1])}, base=config)
        )
        policy, drafted = make(clock), True
        if first_alone:
            alone = replace(trace, requests=trace.requests[:1])
            drafted = serve(policy, alone, machine, cfg, [0.0], 1, clock).drafted_last
        for _ in range(warm_up):  # as the benchmarks time a server: after warm-up runs of the same load
            drafted = serve(policy, trace, machine, cfg, arrivals, concurrency, clock, drafting=drafted).drafted_last
        got = serve(policy, trace, machine, cfg, arrivals, concurrency, clock, drafting=drafted)
        row[name] = {
            "speed": got.speed(load),
            "x_target": got.speed(load) / target.speed(load),
            "mean_L": got.drafted_tokens / max(got.request_rounds, 1),
            "rounds": got.rounds,
            "copy_rounds": len(got.copies),
        }
        assert got.tokens == target.tokens, (name, got.tokens, target.tokens)
    if oracle and load == "one_by_one" and _Copier.of(config, trace, False) is None:
        lengths = range(1, max(config.tiers) + 1)
        best = sum(oracle_seconds(r, machine, config, lengths, trace.max_new_tokens) for r in trace.requests)
        row["oracle"] = {"speed": target.tokens / best, "x_target": target.seconds / best}
    fixed_best = max((v["speed"], k) for k, v in row.items() if k.startswith("fixed"))
    row["best_fixed"] = fixed_best[1]
    row["adaptive_x_best_fixed"] = row["adaptive"]["speed"] / fixed_best[0]
    return row
