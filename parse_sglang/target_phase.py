"""after_rejection="target_to_delimiter": after the judge rejects a draft, the target writes
on its own to the next segment end before drafting resumes (as SpecReason / HoVer do).

A request in a target phase is drafted and verified as usual with its judge off, so the
round's exact-match run d_1..d_exact, t_exact is what the target writes; the run is cut
right after the token that ends the phase (`target_phase_stop`), exactly where the
reference's own target decode stops. The cut is known before the verify: a phase that ends
inside the accepted run ends at a draft token (the run's tokens up to t_exact are drafts), so
the host places it from the draft's text with the round's boundaries (`phase_limit`). The
phase's tokens so far live on the request (`req.parse.target_phase`, None outside a phase).
"""

from __future__ import annotations

from typing import Optional, Sequence

from parse_sglang.boundaries import TokenTexts, complete_delimiter_ends
from parse_sglang.request_state import state_of
from parse_sglang.settings import ParseConfig


def in_target_phase(req) -> Optional[list]:
    """Tokens a request has emitted in its current target phase; None outside one."""
    return state_of(req).target_phase


def target_phase_stop(texts: TokenTexts, done: Sequence[int], run: Sequence[int], config: ParseConfig) -> Optional[int]:
    """How many tokens of `run` a target phase keeps before it ends (None: it goes on).

    The phase, after `done` tokens, ends after the first token that completes a segment (a
    delimiter wholly within the phase's text so far) or that is its probe_stride-th token.
    """
    ends = complete_delimiter_ends(texts([*done, *run]), config.delimiters)
    for count in range(len(done) + 1, len(done) + len(run) + 1):
        if count >= config.probe_stride or count in ends:
            return count - len(done)
    return None


def phase_room(done: Sequence[int], config: ParseConfig) -> int:
    """Most draft tokens a round can keep in a target phase of `done` tokens so far, whatever the
    drafts: the phase ends by its probe_stride-th token (`target_phase_stop`), and the round's
    bonus is one of its tokens."""
    return max(config.probe_stride - len(done) - 1, 0)


def phase_limit(texts: TokenTexts, done: Sequence[int], draft: Sequence[int], config: ParseConfig) -> int:
    """Most draft tokens a request in a target phase (`done` tokens so far) may accept this
    round: len(draft), unless the phase ends at draft token j: then j - 1 (the target's bonus
    after d_{j-1} is d_j itself when the run gets that far, so the round emits exactly the
    phase's tokens; a run that stops earlier is cut by its exact match anyway)."""
    stop = target_phase_stop(texts, done, draft, config)
    return len(draft) if stop is None else stop - 1


def update_target_phases(texts: TokenTexts, reqs, configs, judged, draft_lens, accepted, emitted) -> None:
    """Enter a target phase after a judged rejection; leave it where its run was cut.

    Per request (host lists): whether the judge ran, its acceptable draft length, the draft
    tokens it accepted, and the tokens it emitted this round (accepted drafts + bonus)."""
    for req, config, judge, draft_len, a, tokens in zip(reqs, configs, judged, draft_lens, accepted, emitted):
        if config.after_rejection != "target_to_delimiter":
            continue
        done = in_target_phase(req)
        if done is not None:
            run = tokens[: a + 1]
            stop = target_phase_stop(texts, done, run, config)
            state_of(req).target_phase = None if stop is not None else done + run
        elif judge and a < draft_len:
            state_of(req).target_phase = []
