"""Steps 2-5 of a PARSE round: what each request needs, where its probes go, and the batch's
verify window.

The host's share of a round (docs/gpu.md §9): the drafts come over once (their text places the
boundaries), the round's host decisions go back once, as ONE packed int32 tensor, and the
window itself is built on the device (`ParseVerifyInput.for_round`). The decisions
(`ProbePlan`) are what a tensor-parallel server's ranks take from rank 0 (`plan_window`'s
`share`, parse_sglang.tp_sync), so their windows are the same.

Every request of a batch gets K probes (SGLang needs one window length per batch): requests
with fewer real boundaries get padding probes at unused draft positions, whose scores are
never read. K is 0 when no request of the batch probes (the window is the L+1 chain rows),
else the batch's largest real count, or K_max when the window is fixed (the width a captured
CUDA graph replays).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional, Sequence

import torch
from sglang.srt.managers.schedule_batch import FINISH_ABORT

from parse_sglang.attention.window import FullMaskBuffer, ShapeConstants, WindowShape
from parse_sglang.boundaries import TokenTexts, probe_stride, select_boundaries
from parse_sglang.packing import fields_of, pack, unpack
from parse_sglang.request_state import RequestPolicy, ResolvedRequest, state_of
from parse_sglang.settings import ParseConfig, request_outputs, request_parse_config
from parse_sglang.target_phase import in_target_phase, phase_limit
from parse_sglang.verify_input import ParseVerifyInput


def resolve_request(req, server: ParseConfig) -> ResolvedRequest:
    """The request's `ResolvedRequest`, resolved on its first round; a bad custom_params
    (SamplingParams.verify already refuses those in the main process) aborts the request
    and serves it losslessly."""
    state = state_of(req)
    if state.resolved is not None:
        return state.resolved
    custom = req.sampling_params.custom_params
    try:
        config, outputs = request_parse_config(custom, server), request_outputs(custom)
    except ValueError as err:
        req.to_finish = FINISH_ABORT(str(err), 400, "BadRequestError")
        config, outputs = ParseConfig.from_dict({"judge": False}, base=server), frozenset()
    params = req.sampling_params
    stops = set()
    if not params.ignore_eos:
        stops = set(params.stop_token_ids or ()) | set(req.eos_token_ids or ())
        if req.tokenizer is not None and req.tokenizer.eos_token_id is not None:
            stops.add(req.tokenizer.eos_token_id)
    state.resolved = ResolvedRequest(config, outputs, frozenset(stops))
    return state.resolved


def request_policy(req, server: ParseConfig) -> RequestPolicy:
    """This round's policy for `req`."""
    settings = resolve_request(req, server)
    config, params = settings.config, req.sampling_params
    budget, left = config.draft_budget, None
    if params.max_new_tokens is not None:  # one token of what is left is the round's bonus
        left = params.max_new_tokens - len(req.output_ids)
        budget = min(budget, max(left - 1, 1))
    phase = in_target_phase(req)
    judged = config.judge and req.grammar is None and phase is None
    return RequestPolicy(config, budget, judged, settings.stop_ids, phase, left, len(req.output_ids))


def cut_at_stop(draft: Sequence[int], stop_ids: frozenset) -> int:
    """Length of `draft` up to and including its first stop token (the acceptable length)."""
    for j, token in enumerate(draft):
        if token in stop_ids:
            return j + 1
    return len(draft)


def with_padding_probes(bounds: list[int], count: int, length: int) -> list[int]:
    """`bounds` plus the smallest unused draft positions, sorted, `count` in all (≤ length)."""
    taken = set(bounds)
    extra = [b for b in range(1, length + 1) if b not in taken][: count - len(bounds)]
    return sorted(bounds + extra)


@dataclass(frozen=True)
class ProbePlan:
    """Steps 1-2 of a round as host data: the drafts and every decision taken on the host
    (the boundaries come from the draft's text), in widths that do not depend on the drafts,
    so that a tensor-parallel server can take every rank's from rank 0 (`tp_sync`)."""

    drafts: torch.Tensor  # [bs, L] int64, d_1..d_L
    confidence: torch.Tensor  # [bs, L] float32, the draft's top-1 probability at each d_j
    draft_lens: torch.Tensor  # [bs] int64, draft tokens that may be accepted (budget, stop token)
    phase_limits: torch.Tensor  # [bs] int64, most draft tokens a target phase lets it accept
    judged: torch.Tensor  # [bs] bool, the judge may extend this request's acceptance
    probed: torch.Tensor  # [bs] bool, its boundaries get probe rows (judge_mode "probe" / "both")
    thresholds: torch.Tensor  # [bs] float32 τ
    token_modes: torch.Tensor  # [bs] int64, its token judge (`judge.TOKEN_JUDGES`; 0: none)
    token_thresholds: torch.Tensor  # [bs] float32, its token judge's bound (λ, θ or P(harmful))
    token_windows: torch.Tensor  # [bs] int64, W of the divergence judge
    bounds: torch.Tensor  # [bs, L] int64, real boundaries b_1 < ... < b_K, then 0s
    copied: torch.Tensor  # [bs] bool, its drafts are its retrieved copy (parse_sglang/retrieval.py)

    def real_bounds(self) -> list[list[int]]:
        return [[b for b in row if b > 0] for row in self.bounds.tolist()]


class PlanOnDevice(NamedTuple):
    """The plan as the window reads it on the device, from its one host-to-device copy:
    ProbePlan's per-request fields (as they are), then its boundaries as the judge and the
    window read them."""

    drafts: torch.Tensor  # [bs, L]
    draft_lens: torch.Tensor  # [bs]
    phase_limits: torch.Tensor  # [bs]
    judged: torch.Tensor  # [bs] bool
    probed: torch.Tensor  # [bs] bool
    thresholds: torch.Tensor  # [bs] τ
    token_modes: torch.Tensor  # [bs]
    token_thresholds: torch.Tensor  # [bs]
    token_windows: torch.Tensor  # [bs]
    boundaries: torch.Tensor  # [bs, K'] real boundaries, padded with 0
    probe_slots: torch.Tensor  # [bs, K'] each boundary's probe among the request's window probes
    probe_bounds: torch.Tensor  # [bs, K] the boundaries of the window's K probes (padding ones included)


AS_PLANNED = PlanOnDevice._fields[:9]  # the fields copied from the ProbePlan unchanged


def place_probes(
    drafts_host: torch.Tensor,
    confidence_host: torch.Tensor,
    policies: Sequence[RequestPolicy],
    texts: TokenTexts,
    drafted: Optional[Sequence[int]] = None,
    copied: Optional[Sequence[bool]] = None,
) -> ProbePlan:
    """Each request's acceptable draft length, target-phase limit and real probe boundaries;
    drafted: each request's real drafts (the rest of its row is padding; None: all L); copied:
    which rows are retrieved copies (None: none)."""
    rows = drafts_host.tolist()
    bs, length = drafts_host.shape
    drafted = drafted or [length] * bs
    draft_lens = [cut_at_stop(row[: min(p.budget, n)], p.stop_ids) for row, p, n in zip(rows, policies, drafted)]
    bounds = torch.zeros(bs, length, dtype=torch.int64)
    limits = []
    for i, (row, n, p) in enumerate(zip(rows, draft_lens, policies)):
        if p.judged and n:
            found = select_boundaries(texts(row[:n]), probe_stride(p.config.probe_stride, length), p.config.delimiters)
            bounds[i, : len(found)] = torch.tensor(found)
        limits.append(length if p.phase is None else phase_limit(texts, p.phase, row[:n], p.config))

    def flags(value) -> torch.Tensor:
        return torch.tensor([value(p) for p in policies], dtype=torch.bool)

    return ProbePlan(
        drafts=drafts_host.to(torch.int64),
        confidence=confidence_host.to(torch.float32),
        draft_lens=torch.tensor(draft_lens, dtype=torch.int64),
        phase_limits=torch.tensor(limits, dtype=torch.int64),
        judged=flags(lambda p: p.judged),
        probed=flags(lambda p: p.judged and p.config.uses_probe),
        thresholds=torch.tensor([p.config.threshold for p in policies], dtype=torch.float32),
        token_modes=torch.tensor([p.config.token_judge if p.judged else 0 for p in policies], dtype=torch.int64),
        token_thresholds=torch.tensor([p.config.token_threshold for p in policies], dtype=torch.float32),
        token_windows=torch.tensor([p.config.divergence_window for p in policies], dtype=torch.int64),
        bounds=bounds,
        copied=torch.tensor(copied or [False] * bs, dtype=torch.bool),
    )


def nothing_drafted(bs: int, device) -> tuple[ProbePlan, PlanOnDevice]:
    """The plan of a round with nothing drafted (an adaptive server's tier 0), on the host and
    as `plan_window`'s device fields: no draft token may be accepted, no boundary, nothing
    judged or probed. The same for every such round of `bs` requests (cached per shape)."""
    host = ProbePlan(
        drafts=torch.zeros(bs, 0, dtype=torch.int64),
        confidence=torch.zeros(bs, 0, dtype=torch.float32),
        draft_lens=torch.zeros(bs, dtype=torch.int64),
        phase_limits=torch.zeros(bs, dtype=torch.int64),
        judged=torch.zeros(bs, dtype=torch.bool),
        probed=torch.zeros(bs, dtype=torch.bool),
        thresholds=torch.zeros(bs, dtype=torch.float32),
        token_modes=torch.zeros(bs, dtype=torch.int64),
        token_thresholds=torch.zeros(bs, dtype=torch.float32),
        token_windows=torch.zeros(bs, dtype=torch.int64),
        bounds=torch.zeros(bs, 0, dtype=torch.int64),
        copied=torch.zeros(bs, dtype=torch.bool),
    )
    no_boundary = torch.zeros(bs, 1, dtype=torch.int64)  # boundaries and probe slots: one column of 0s
    fields = [getattr(host, name) for name in AS_PLANNED] + [no_boundary, no_boundary, host.bounds]
    return host, PlanOnDevice(*(t.to(device) for t in fields))


@dataclass(frozen=True)
class Window:
    """The verify window of a round and what acceptance needs to read it (device tensors,
    from the one packed plan), with the host plan they came from."""

    verify_input: ParseVerifyInput
    shape: WindowShape
    plan: ProbePlan  # host; what the round's bookkeeping reads after acceptance
    chain_tokens: torch.Tensor  # [bs, L+1] c_n, d_1..d_L
    on_device: PlanOnDevice  # the plan as acceptance and the judge read it
    configs: list  # [bs] ParseConfig
    any_judged: bool  # some request's judge may extend its acceptance (host-known)
    any_token_judge: bool  # some request is judged by a token judge (host-known)

    @property
    def chain_rows(self) -> int:
        """L + 1: c_n, d_1..d_L."""
        return self.shape.chain_rows


def upload_plan(plan: ProbePlan, fixed_probes: Optional[int], device) -> tuple[int, PlanOnDevice]:
    """(K, the window's probe count; the plan's device fields in one host-to-device copy):
    the plan's tensors, then each request's real boundaries and their probe slots (as wide as
    the most boundaries), and the boundaries of its K window probes (padding probes included)."""
    bs, length = plan.drafts.shape
    bounds = plan.real_bounds()
    probed = [b if p else [] for b, p in zip(bounds, plan.probed.tolist())]
    num_probes = 0
    if any(probed):
        num_probes = max(map(len, probed)) if fixed_probes is None else fixed_probes
    window_bounds = [with_padding_probes(b, num_probes, length) for b in probed]
    # Same width as the boundaries; a request judged without probes reads none (uses_probe off).
    probe_slots = [[wb.index(b) for b in p] if p else [0] * len(b) for b, p, wb in zip(bounds, probed, window_bounds)]
    real_width = max(1, max(map(len, bounds)))

    def rows(values: list[list[int]], width: int) -> torch.Tensor:
        return torch.tensor([v + [0] * (width - len(v)) for v in values], dtype=torch.int64).view(bs, width)

    host = [getattr(plan, name) for name in AS_PLANNED] + [
        rows(bounds, real_width),
        rows(probe_slots, real_width),
        rows(window_bounds, num_probes),
    ]
    return num_probes, PlanOnDevice(*unpack(pack(host).to(device), fields_of(host)))


def plan_window(
    *,
    drafts_host: torch.Tensor,
    confidence_host: torch.Tensor,
    last_tokens: torch.Tensor,
    prefix_lens: torch.Tensor,
    prefix_sum: int,
    policies: Sequence[RequestPolicy],
    texts: TokenTexts,
    suffix_ids: Optional[torch.Tensor],
    fixed_probes: Optional[int],
    constants: ShapeConstants,
    mask_buffer: Optional[FullMaskBuffer],
    share: Callable[[ProbePlan], ProbePlan] = lambda plan: plan,
    drafted: Optional[Sequence[int]] = None,
    copied: Optional[Sequence[bool]] = None,
) -> Window:
    """drafts_host [bs, L] and confidence_host [bs, L] on the host; last_tokens / prefix_lens [bs] and suffix_ids [m] on
    the device (suffix_ids None: no probe on this server); fixed_probes: K_max for a fixed
    window, None for the batch's own K; constants: the per-shape cache; mask_buffer: the FULL
    mask buffer (None: the QLEN_ONLY form); share: the plan every rank builds its window
    from (`TpSync.share_plan`: rank 0's); drafted, copied: `place_probes`'. The one host-to-device
    copy of the round is here."""
    device = last_tokens.device
    bs, length = drafts_host.shape
    if length == 0:  # tier 0: nothing to place, judge or upload (every rank's length is rank 0's)
        plan, on_device = constants.cached(("nothing_drafted", bs), lambda: nothing_drafted(bs, device))
        num_probes = 0
    else:
        plan = share(place_probes(drafts_host, confidence_host, policies, texts, drafted, copied))
        num_probes, on_device = upload_plan(plan, fixed_probes, device)
    shape = WindowShape(length, num_probes, len(suffix_ids) if num_probes else 0)
    chain_tokens = torch.cat([last_tokens[:, None].to(torch.int64), on_device.drafts], dim=1)
    verify_input = ParseVerifyInput.for_round(
        shape,
        prefix_lens=prefix_lens,
        prefix_sum=prefix_sum,
        chain_tokens=chain_tokens,
        boundaries=on_device.probe_bounds,
        suffix_ids=suffix_ids if num_probes else None,
        logits_rows=constants.logits_rows(bs, shape),
        mask_buffer=mask_buffer,
    )
    return Window(
        verify_input=verify_input,
        shape=shape,
        plan=plan,
        chain_tokens=chain_tokens,
        on_device=on_device,
        configs=[p.config for p in policies],
        any_judged=bool(plan.judged.any()),
        any_token_judge=bool(plan.token_modes.any()),
    )
