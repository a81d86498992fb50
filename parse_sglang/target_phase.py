"""after_rejection="target_to_delimiter": after the judge rejects a draft, the target writes
on its own to the next segment end before drafting resumes (as SpecReason / HoVer do).

A request in a target phase is drafted and verified as usual with its judge off, so the
round's exact-match run d_1..d_exact, t_exact is what the target writes; the run is cut
right after the token that ends the phase (`target_phase_stop`), exactly where the
reference's own target decode stops. The phase's tokens so far live on the request
(`req.parse_target_phase`, None outside a phase).
"""

from __future__ import annotations

from typing import Optional

import torch

from parse_sglang.boundaries import delimiter_ends
from parse_sglang.config import ParseConfig


def in_target_phase(req) -> Optional[list]:
    """Tokens a request has emitted in its current target phase; None outside one."""
    return getattr(req, "parse_target_phase", None)


def target_phase_stop(tokenizer, done: list, run: list, config: ParseConfig) -> Optional[int]:
    """How many tokens of `run` a target phase keeps before it ends (None: it goes on).

    The phase, after `done` tokens, ends after the first token that completes a segment
    (`delimiter_ends` of the phase's text so far) or that is its probe_stride-th token.
    """
    texts = tokenizer.batch_decode([[tok] for tok in done + run])
    for count in range(len(done) + 1, len(done) + len(run) + 1):
        if count >= config.probe_stride or count in delimiter_ends(texts[:count], config.delimiters):
            return count - len(done)
    return None


def target_phase_limits(tokenizer, reqs, configs, drafts: torch.Tensor, exact: torch.Tensor, predict: torch.Tensor):
    """[bs] most draft tokens each request may accept this round: L, except in a target phase,
    where the run d_1..d_exact, t_exact is cut right after the token that ends the phase.

    drafts [bs, L]; exact [bs] exact-match lengths; predict [bs, L+1] the target's tokens."""
    limits = torch.full_like(exact, drafts.shape[1])
    phases = [(i, in_target_phase(req)) for i, req in enumerate(reqs) if in_target_phase(req) is not None]
    if not phases:
        return limits
    exact_host, predict_host, drafts_host = exact.tolist(), predict.tolist(), drafts.tolist()
    for i, done in phases:
        run = drafts_host[i][: exact_host[i]] + [predict_host[i][exact_host[i]]]
        stop = target_phase_stop(tokenizer, done, run, configs[i])
        if stop is not None:
            limits[i] = stop - 1
    return limits


def update_target_phases(tokenizer, reqs, configs, judged: list, draft_lens: list, accepted: list, emitted: list) -> None:
    """Enter a target phase after a judged rejection; leave it where its run was cut.

    Per request (host lists): whether the judge ran, its acceptable draft length, the draft
    tokens it accepted, and the tokens it emitted this round (accepted drafts + bonus)."""
    for req, config, judge, draft_len, a, tokens in zip(reqs, configs, judged, draft_lens, accepted, emitted):
        if config.after_rejection != "target_to_delimiter":
            continue
        done = in_target_phase(req)
        if done is not None:
            run = tokens[: a + 1]
            stop = target_phase_stop(tokenizer, done, run, config)
            req.parse_target_phase = None if stop is not None else done + run
        elif judge and a < draft_len:
            req.parse_target_phase = []
