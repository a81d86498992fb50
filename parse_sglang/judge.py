"""PARSE's judge probe: the suffix that asks the target "is the response so far correct?",
and the score read from the target's logits at the probe's last row.

The suffix is derived from the target's own chat template, never hand-written per model
family, so the probe continues a conversation exactly as the template would: close the
assistant turn, add a user turn with the question, open the assistant's answer. The score
needs only the logits of the answer tokens (the full-vocabulary normaliser cancels), which
is what lets the verify pass prune every probe row to `len(answer_ids)` lm_head columns.

The judge's rule for a boundary-ending prefix d_1..d_{b_k} (`prefix_passes`), by judge_mode:
"probe" — the target's answer to the judge probe after it, P(yes)/(P(yes)+P(no)) >= τ;
"likelihood" — every draft token of it has target probability >= λ under the chain rows
the verify pass computes anyway (no probe rows at all); "both" — both. `judge_window` is the
verdict on a whole round's window; the reference generator (a batch of one) and the SGLang
worker share the rule.
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


# Rows of logits a `token_probabilities` step reads at once: bounds its logsumexp temporary
# (rows x vocabulary fp32) to 64 MiB, whatever the batch.
_LOGSUMEXP_ELEMENTS = 1 << 24


def token_probabilities(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """[..., n] P(tokens[..., j]) under logits[..., j, :], read as exp(gather - logsumexp):
    no full-vocabulary softmax is materialised (a bounded number of rows at a time)."""
    flat = logits.reshape(-1, logits.shape[-1])
    picked = flat.gather(1, tokens.reshape(-1, 1).to(torch.int64)).squeeze(1).float()
    step = max(1, _LOGSUMEXP_ELEMENTS // flat.shape[1])
    starts = range(0, max(flat.shape[0], 1), step)  # one (empty) chunk for a round without drafts
    norm = torch.cat([torch.logsumexp(flat[i : i + step].float(), dim=-1) for i in starts])
    return torch.exp(picked - norm).view(tokens.shape)


def likelihood_scores(token_probs: torch.Tensor, boundaries: torch.Tensor) -> torch.Tensor:
    """[B, K] the smallest target probability among d_1..d_{b_k} (0 where b_k is padding).

    token_probs [B, L]: p_j = P_target(d_j | c_n d_1..d_{j-1}); boundaries [B, K] (0-padded)."""
    if token_probs.shape[1] == 0:  # a round without drafts (an adaptive server's tier 0)
        return torch.zeros(boundaries.shape, device=boundaries.device)
    running_min = token_probs.float().cummin(dim=1).values
    picked = running_min.gather(1, (boundaries - 1).clamp(min=0))
    return torch.where(boundaries > 0, picked, torch.zeros_like(picked))


def prefix_passes(
    probe_scores: torch.Tensor,
    threshold: torch.Tensor,
    likelihood: torch.Tensor,
    likelihood_threshold: torch.Tensor,
    uses_probe: torch.Tensor,
    uses_likelihood: torch.Tensor,
) -> torch.Tensor:
    """[B, K] whether each boundary-ending prefix passes its request's judge (module doc).

    probe_scores, likelihood [B, K] (`likelihood_scores`); threshold τ, likelihood_threshold
    λ [B]; uses_probe, uses_likelihood [B] bool (judge_mode "probe", "likelihood", "both")."""
    probe_ok = probe_scores >= threshold[:, None]
    likely_ok = likelihood >= likelihood_threshold[:, None]
    return (probe_ok | ~uses_probe[:, None]) & (likely_ok | ~uses_likelihood[:, None])


@dataclass(frozen=True)
class Verdict:
    """The judge's verdict on one round's window, at each request's real boundaries [bs, K']."""

    probe_scores: Optional[torch.Tensor]  # P(yes)/(P(yes)+P(no)) (None: no probe rows this round)
    likelihood: Optional[torch.Tensor]  # smallest target probability of d_1..d_{b_k} (None: not asked)
    passed: torch.Tensor  # bool, the prefix ending at b_k passes its request's judge


def judge_window(
    window,
    chain_logits: torch.Tensor,
    probe_logits: torch.Tensor,
    probe: Optional[JudgeProbe],
    columns: Optional[torch.Tensor],
) -> Verdict:
    """A round's verdict: chain_logits [bs, L+1, V], probe_logits [bs, K, V] of its verify pass;
    `window` is the round's `window_plan.Window`; columns: `answer_columns(probe)`. The
    likelihood is computed only when a request of the batch asks for it (a host-known fact)."""
    planned = window.on_device
    bounds = planned.boundaries
    zeros = torch.zeros(bounds.shape, device=bounds.device)
    probe_scores = likelihood = None
    if window.shape.num_probes:
        answers = score_from_answer_logits(probe_logits.index_select(-1, columns), probe)
        probe_scores = answers.gather(1, planned.probe_slots)
    if window.any_likelihood:
        drafts = window.chain_tokens[:, 1:]
        likelihood = likelihood_scores(token_probabilities(chain_logits[:, :-1], drafts), bounds)
    passed = prefix_passes(
        probe_scores if probe_scores is not None else zeros,
        planned.thresholds,
        likelihood if likelihood is not None else zeros,
        planned.likelihood_thresholds,
        planned.probed,
        planned.likelihood,
    )
    return Verdict(probe_scores, likelihood, passed)
