"""What PARSE keeps on one SGLang request, across its rounds: `req.parse`, one `RequestState`
(SGLang's `Req` has no slot for an algorithm's own state, so it is one attribute). Plain data,
no SGLang import: the SGLang-free modules (counters, adaptive) read it too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from parse_sglang.settings import ParseConfig


@dataclass(frozen=True)
class ResolvedRequest:
    """What a request brings to every round, resolved on its first (`window_plan.resolve_request`)."""

    config: ParseConfig  # the server's, with custom_params["parse"] applied
    outputs: frozenset  # the output options it switched on (settings.REQUEST_OUTPUTS)
    stop_ids: frozenset  # token ids that end the output (EOS, stop_token_ids); empty: ignore_eos


@dataclass
class RequestState:
    resolved: Optional[ResolvedRequest] = None  # None until its first round
    stats: Optional[dict] = None  # its meta_info["parse"] counters (counters.py); None until its first round
    keep_rate: Optional[object] = None  # adaptive.KeepRate: its kept drafts so far (an adaptive server's)
    head_keep_rate: Optional[object] = None  # adaptive.KeepRate of its head rounds (`eagle3_head`)
    target_phase: Optional[list] = None  # tokens of its current target phase (target_phase.py); None: not in one
    draft_behind: int = 0  # committed tokens whose draft KV tier-0 rounds skipped (draft_chain.py)
    draft_tail: bool = False  # its last round kept its last draft, whose draft KV the next writes (draft_chain.py)
    text_index: Optional[object] = None  # retrieval.SuffixAutomaton of its prompt and output (retrieval.py)


@dataclass(frozen=True)
class RequestPolicy:
    """What a round needs to know about one request (resolved on the host, O(1) each)."""

    config: ParseConfig
    budget: int  # draft tokens worth writing (L, capped by the output left)
    judged: bool  # the judge may extend this request's acceptance (its config says how)
    stop_ids: frozenset  # token ids that end the output (EOS, stop_token_ids); empty: ignore_eos
    phase: Optional[list] = None  # tokens of its target phase so far (target_phase.py); None: not in one
    left: Optional[int] = None  # output tokens it may still emit (max_new_tokens); None: no limit
    output_len: int = 0  # output tokens it has emitted


def state_of(req) -> RequestState:
    """`req.parse`, made on first use."""
    state = getattr(req, "parse", None)
    if state is None:
        state = req.parse = RequestState()
    return state
