"""PARSE's judge probe: the suffix that asks the target "is the response so far correct?",
and the score read from the target's logits at the probe's last row.

The suffix is derived from the target's own chat template, never hand-written per model
family, so the probe continues a conversation exactly as the template would: close the
assistant turn, add a user turn with the question, open the assistant's answer. The score
needs only the logits of the answer tokens (the full-vocabulary normaliser cancels), which
is what lets the verify pass prune every probe row to `len(answer_ids)` lm_head columns.

The judge accepts draft tokens one at a time; a round keeps the longest prefix in which every
token is an exact match or accepted by its request's judge ("exact OR judged", AutoJudge), then the
bonus token. By judge_mode: "probe" — the tokens of the longest boundary-ending prefix whose probes
all answer P(yes)/(P(yes)+P(no)) >= τ; "likelihood" — a token whose target probability is >= λ
(read from the chain rows the verify computes anyway: no probe rows at all); "both" — both;
"divergence" — FLy's rule (`divergence_passes`); "head" — a judge head's P(harmful) <= its bound
(`parse_sglang.judge_head`). `judge_window` is the verdict on a whole round's window; the reference
generator (a batch of one) and the SGLang worker share the rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

DEFAULT_QUESTION = "Is the response so far correct? Answer Yes or No."

# Stand-ins rendered through the chat template; the response marker is located in the
# rendering and everything after it is the suffix. Plain ASCII words so that no template
# filter (trim, think-block stripping) changes them.
_USER_PLACEHOLDER = "PARSE_USER_PLACEHOLDER"
_RESPONSE_MARKER = "PARSE_RESPONSE_MARKER"

# Template variables passed to every rendering. Qwen3-style templates read enable_thinking:
# False makes the generation prompt open with an empty think block, so the first answer
# token is the verdict rather than "<think>". Templates that do not read it ignore it.
_TEMPLATE_KWARGS = {"enable_thinking": False}

# Used when the tokenizer has no chat template (base models): a plain-text question whose
# answer continues after "Answer:" with " Yes" / " No".
FALLBACK_SUFFIX = "\n\nQuestion: {question}\nAnswer:"


@dataclass(frozen=True)
class JudgeProbe:
    """Token ids of the judge suffix and of the answer tokens read at its last row."""

    suffix_ids: tuple[int, ...]
    yes_ids: tuple[int, ...]
    no_ids: tuple[int, ...]
    question: str

    @property
    def answer_ids(self) -> tuple[int, ...]:
        """yes_ids + no_ids: the only vocabulary columns a probe row needs."""
        return self.yes_ids + self.no_ids


def _render(tokenizer, messages: list[dict], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(
        messages,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        **_TEMPLATE_KWARGS,
    )


def _text_after_response(text: str, what: str) -> str:
    if text.count(_RESPONSE_MARKER) != 1:
        raise ValueError(
            f"chat template: the {what} rendering must contain the assistant response exactly "
            f"once, got {text.count(_RESPONSE_MARKER)} times in {text!r}"
        )
    return text.split(_RESPONSE_MARKER)[1]


def _suffix_text(tokenizer, question: str) -> str:
    """The text a chat template puts after an assistant response to ask `question`.

    Renders [user, assistant] (the turn as the template closes it) and [user, assistant,
    user: question] + generation prompt, and takes the text after the response in the
    second. The text *before* the response is not compared: templates may render the last
    assistant turn differently from earlier ones (Qwen3 adds an empty think block to the
    last one only), and the draft's real context comes from generation anyway. What must
    agree is the turn close: the second rendering's tail has to start with the first's.
    """
    if not getattr(tokenizer, "chat_template", None):
        return FALLBACK_SUFFIX.format(question=question)
    turn = [
        {"role": "user", "content": _USER_PLACEHOLDER},
        {"role": "assistant", "content": _RESPONSE_MARKER},
    ]
    close = _text_after_response(_render(tokenizer, turn, False), "[user, assistant]")
    asked = turn + [{"role": "user", "content": question}]
    suffix = _text_after_response(_render(tokenizer, asked, True), "[user, assistant, user]")
    if not suffix.startswith(close):
        raise ValueError(
            f"chat template closes the assistant turn as {close!r} when it is last but the "
            f"follow-up rendering continues with {suffix!r}; cannot derive a judge suffix"
        )
    if question.strip() not in suffix:
        raise ValueError(
            f"chat template dropped the judge question {question!r}: the text after the response is {suffix!r}"
        )
    return suffix


def _first_answer_ids(tokenizer, word: str) -> dict[int, str]:
    """First token of each spelling of `word` the model may start its answer with.

    Spellings: as given, lower-case, capitalised; each bare and after a space. A spelling
    whose first token is whitespace only is skipped: that token says nothing about the
    verdict (a small BPE may split " Yes" as " ", "Yes" and " No" as " ", "No").
    Returns {token id: spelling}.
    """
    found: dict[int, str] = {}
    for form in dict.fromkeys((word, word.lower(), word.capitalize())):
        for spelling in (form, " " + form):
            ids = tokenizer.encode(spelling, add_special_tokens=False)
            if ids and tokenizer.decode(ids[:1]).strip():
                found.setdefault(ids[0], spelling)
    return found


def build_judge_probe(
    tokenizer, question: str = DEFAULT_QUESTION, yes_word: str = "Yes", no_word: str = "No"
) -> JudgeProbe:
    """Derive the judge probe for `tokenizer`'s chat template (plain-text fallback without one)."""
    if not question or not question.strip():
        raise ValueError(f"judge question must be non-empty text, got {question!r}")
    suffix = _suffix_text(tokenizer, question)
    suffix_ids = tuple(tokenizer.encode(suffix, add_special_tokens=False))
    if not suffix_ids:
        raise ValueError(f"judge suffix {suffix!r} tokenizes to no tokens")
    yes, no = _first_answer_ids(tokenizer, yes_word), _first_answer_ids(tokenizer, no_word)
    for word, ids in ((yes_word, yes), (no_word, no)):
        if not ids:
            raise ValueError(f"judge answer word {word!r} has no spelling whose first token is not whitespace")
    shared = sorted(yes.keys() & no.keys())
    if shared:
        pairs = ", ".join(f"{yes[i]!r} / {no[i]!r} -> token {i} {tokenizer.decode([i])!r}" for i in shared)
        raise ValueError(
            f"judge answer words yes_word={yes_word!r} and no_word={no_word!r} collide: "
            f"they start with the same token ({pairs}); choose words whose first tokens differ"
        )
    return JudgeProbe(suffix_ids=suffix_ids, yes_ids=tuple(yes), no_ids=tuple(no), question=question)


def score_from_answer_logits(answer_logits: torch.Tensor, probe: JudgeProbe) -> torch.Tensor:
    """[..., len(answer_ids)] logits -> P(yes) / (P(yes) + P(no)) in fp32, shape [...].

    P(yes) sums the softmax over yes_ids; the full-vocabulary normaliser cancels in the
    ratio, so the score is sigmoid(logsumexp(yes logits) - logsumexp(no logits)).
    """
    n_answers = len(probe.answer_ids)
    if answer_logits.shape[-1] != n_answers:
        raise ValueError(
            f"answer_logits last dimension must be len(probe.answer_ids)={n_answers}, "
            f"got shape {tuple(answer_logits.shape)}"
        )
    logits = answer_logits.float()
    n_yes = len(probe.yes_ids)
    margin = torch.logsumexp(logits[..., :n_yes], dim=-1) - torch.logsumexp(logits[..., n_yes:], dim=-1)
    return torch.sigmoid(margin)


def judge_scores(logits: torch.Tensor, probe: JudgeProbe) -> torch.Tensor:
    """Full-vocabulary logits [..., V] -> judge score [...] (see score_from_answer_logits)."""
    vocab = logits.shape[-1]
    if max(probe.answer_ids) >= vocab:
        raise ValueError(
            f"logits last dimension (vocabulary) is {vocab} but probe.answer_ids reach "
            f"{max(probe.answer_ids)}; pass full-vocabulary logits of the probe's tokenizer"
        )
    return score_from_answer_logits(logits.index_select(-1, answer_columns(probe, logits.device)), probe)


def answer_columns(probe: JudgeProbe, device) -> torch.Tensor:
    """The vocabulary columns a probe row is scored from (`probe.answer_ids`), as a tensor made
    once per worker."""
    return torch.tensor(probe.answer_ids, dtype=torch.int64, device=device)


# Rows of logits a `chain_statistics` step reads at once: bounds its fp32 temporaries (rows x
# vocabulary) to 64 MiB each, whatever the batch.
_LOGSUMEXP_ELEMENTS = 1 << 24


# The token judges' codes (`ProbePlan.token_modes`); 0: none (judge off, or the probe alone).
TOKEN_JUDGES = {"likelihood": 1, "divergence": 2, "head": 3}


@dataclass(frozen=True)
class ChainStats:
    """What the token judges read of a verify's chain rows; draft token d_j is column j - 1."""

    top_tokens: torch.Tensor  # [B, L+1] the target's own token after c_n d_1..d_j (argmax of row j)
    draft_probs: torch.Tensor  # [B, L] P_target(d_j) at row j-1
    top_probs: torch.Tensor  # [B, L] P_target(its own top token) at row j-1
    entropy: torch.Tensor  # [B, L] the target's entropy at row j-1, nats


def chain_statistics(logits: torch.Tensor, drafts: torch.Tensor) -> ChainStats:
    """logits [B, L+1, V], drafts [B, L] -> ChainStats, a bounded number of rows at a time (no
    full-vocabulary temporary beyond `_LOGSUMEXP_ELEMENTS`)."""
    batch, rows, vocab = logits.shape
    flat = logits.reshape(-1, vocab)
    tokens = torch.nn.functional.pad(drafts.to(torch.int64), (0, 1)).reshape(-1, 1)  # row L reads no draft
    step = max(1, _LOGSUMEXP_ELEMENTS // vocab)
    parts = []
    for i in range(0, max(flat.shape[0], 1), step):
        x = flat[i : i + step].float()
        norm = torch.logsumexp(x, dim=-1)
        top, top_ids = x.max(dim=-1)
        entropy = norm - (torch.softmax(x, dim=-1) * x).sum(dim=-1)
        picked = x.gather(1, tokens[i : i + step]).squeeze(1)
        parts.append(torch.stack([top_ids.float(), torch.exp(picked - norm), torch.exp(top - norm), entropy]))
    top_ids, draft_probs, top_probs, entropy = torch.cat(parts, dim=1).view(4, batch, rows)
    return ChainStats(top_ids.to(torch.int64), draft_probs[:, :-1], top_probs[:, :-1], entropy[:, :-1])


def divergence_passes(
    matches: torch.Tensor, entropy: torch.Tensor, theta: torch.Tensor, window: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """[B, L] FLy's rule (arXiv 2511.22972) for d_j: the target's entropy where d_j was drafted is
    >= θ and the next W draft tokens all equal the target's own (read after d_j, so the target
    has taken d_j up); never within the last W positions of the draft (nothing to read there).
    matches [B, L] (d_j equals the target's token), entropy [B, L]; theta, window, lengths [B]."""
    batch, length = matches.shape
    counts = torch.nn.functional.pad(matches.long().cumsum(dim=1), (1, 0))  # [B, L+1] matches before column c
    steps = torch.arange(length, device=matches.device)
    end = (steps[None, :] + 1 + window[:, None]).clamp(max=length)  # column just past the W after d_j
    ahead = counts.gather(1, end) - counts[:, 1:]  # matches in columns j+1 .. j+W
    room = steps[None, :] + window[:, None] < lengths[:, None]
    return (entropy >= theta[:, None]) & (ahead == window[:, None]) & room


def token_passes(
    stats: ChainStats,
    matches: torch.Tensor,
    lengths: torch.Tensor,
    modes: torch.Tensor,
    thresholds: torch.Tensor,
    windows: torch.Tensor,
    harm: Optional[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, L] whether each draft token passes its request's token judge, [B, L] the score it read).
    modes [B] (`TOKEN_JUDGES`; 0: no token judge, every token passes), thresholds [B] (λ, θ or the
    head's P(harmful) bound), windows [B] (W); harm [B, L] the head's P(harmful) (None: no head)."""
    mode = modes[:, None]
    likely = stats.draft_probs >= thresholds[:, None]
    divergent = divergence_passes(matches, stats.entropy, thresholds, windows, lengths)
    score = torch.where(mode == TOKEN_JUDGES["divergence"], stats.entropy, stats.draft_probs)
    passes = torch.where(mode == TOKEN_JUDGES["likelihood"], likely, mode != TOKEN_JUDGES["divergence"])
    passes = torch.where(mode == TOKEN_JUDGES["divergence"], divergent, passes)
    if harm is not None:
        is_head = mode == TOKEN_JUDGES["head"]
        passes = torch.where(is_head, harm <= thresholds[:, None], passes)
        score = torch.where(is_head, harm, score)
    return passes, score


def probe_reach(probe_scores: torch.Tensor, threshold: torch.Tensor, boundaries: torch.Tensor) -> torch.Tensor:
    """[B] the longest boundary-ending prefix whose probe and every earlier one pass (P(yes) >= τ):
    probe_scores [B, K], threshold [B], boundaries [B, K] (0-padded)."""
    passed = (probe_scores >= threshold[:, None]) & (boundaries > 0)
    count = passed.long().cumprod(dim=1).sum(dim=1)  # the first failing probe stops it
    reach = boundaries.gather(1, (count - 1).clamp(min=0)[:, None]).squeeze(1).long()
    return torch.where(count > 0, reach, torch.zeros_like(reach))


def judged_tokens(
    length: int, judged: torch.Tensor, probed: torch.Tensor, reach: torch.Tensor, token_ok: torch.Tensor
) -> torch.Tensor:
    """[B, L] the draft tokens a request's judge accepts: its judge is on, they lie within the
    prefix its probes passed (requests that probe) and they pass its token judge."""
    steps = torch.arange(length, device=judged.device)
    in_reach = (steps[None, :] < reach[:, None]) | ~probed[:, None]
    return judged[:, None] & in_reach & token_ok


@dataclass(frozen=True)
class Verdict:
    """The judge's verdict on one round's window."""

    probe_scores: Optional[torch.Tensor]  # [bs, K'] P(yes)/(P(yes)+P(no)) at the real boundaries (None: no probe rows)
    token_scores: Optional[torch.Tensor]  # [bs, L] the score each token judge read (None: no token judge asked)
    passed: torch.Tensor  # [bs, L] bool: the judge accepts d_j (an exact match needs no judge)
    top_tokens: Optional[torch.Tensor]  # [bs, L+1] the target's own token after c_n d_1..d_j (argmax; None: not judged)


def judge_window(
    window,
    chain_logits: torch.Tensor,
    probe_logits: torch.Tensor,
    probe: Optional[JudgeProbe],
    columns: Optional[torch.Tensor],
    hidden: Optional[torch.Tensor] = None,
    head=None,
) -> Verdict:
    """A round's verdict: chain_logits [bs, L+1, V], probe_logits [bs, K, V] of its verify pass;
    `window` is the round's `window_plan.Window`; columns: `answer_columns(probe)`; hidden [bs, L+1, H]
    the target's final hidden state of the chain rows and head the server's `judge_head.JudgeHead`
    (None: no head on this server)."""
    planned = window.on_device
    drafts = window.chain_tokens[:, 1:]
    probe_scores = None
    reach = torch.zeros_like(planned.draft_lens)
    if window.shape.num_probes:
        answers = score_from_answer_logits(probe_logits.index_select(-1, columns), probe)
        probe_scores = answers.gather(1, planned.probe_slots)
        reach = probe_reach(probe_scores, planned.thresholds, planned.boundaries)
    if not window.any_token_judge:  # the probe alone: only the target's own tokens are read
        top_tokens = chain_logits.argmax(dim=-1)
        passed = judged_tokens(
            drafts.shape[1], planned.judged, planned.probed, reach, torch.ones_like(drafts, dtype=torch.bool)
        )
        return Verdict(probe_scores, None, passed, top_tokens)
    stats = chain_statistics(chain_logits, drafts)
    harm = None
    if head is not None and hidden is not None:
        harm = head.harm(hidden[:, 1:], stats.draft_probs.log(), stats.top_probs.log())
    matches = drafts == stats.top_tokens[:, :-1]
    token_ok, scores = token_passes(
        stats, matches, planned.draft_lens, planned.token_modes, planned.token_thresholds, planned.token_windows, harm
    )
    passed = judged_tokens(drafts.shape[1], planned.judged, planned.probed, reach, token_ok)
    return Verdict(probe_scores, scores, passed, stats.top_tokens)
