"""Judge probe derivation from chat templates, and probe scoring."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from parse_sglang.judge import (
    DEFAULT_QUESTION,
    FALLBACK_SUFFIX,
    JudgeProbe,
    build_judge_probe,
    judge_scores,
    score_from_answer_logits,
)
from support.tiny_models import build_tokenizer

# Qwen3-style ChatML: earlier assistant turns lose their <think> block, the assistant turn
# after the last user message keeps one (empty when there was none), and the generation
# prompt opens with an empty think block when enable_thinking is false.
QWEN3_STYLE_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}"
    "{%- set content = m.content %}{%- set reasoning = '' %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{%- if loop.index0 > ns.last_user %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content"
    " + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)

EXPECTED_SUFFIX = {
    "chatml": "<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n",
    "llama3": (
        "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n{q}<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    ),
    "qwen3": ("<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    "plain": FALLBACK_SUFFIX.replace("{question}", "{q}"),
}
TEMPLATED = ["chatml", "llama3", "qwen3"]
RESPONSES = [
    "The sum is four.",
    "Step one: add two and two.\n\nSo the total is four.\n",
]
PROMPT = "What is two plus two?"


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    root = tmp_path_factory.mktemp("judge_tokenizers")
    for template in ("chatml", "llama3", None):
        build_tokenizer(root / str(template), template=template)
    qwen3 = AutoTokenizer.from_pretrained(root / "chatml")
    qwen3.chat_template = QWEN3_STYLE_TEMPLATE
    return {
        "chatml": AutoTokenizer.from_pretrained(root / "chatml"),
        # Real Llama-3 tokenizers prepend BOS on encode; the suffix must not pick one up.
        "llama3": AutoTokenizer.from_pretrained(root / "llama3", add_bos_token=True),
        "qwen3": qwen3,
        "plain": AutoTokenizer.from_pretrained(root / "None"),
    }


def _render_with_question(tokenizer, response: str, question: str) -> str:
    messages = [
        {"role": "user", "content": PROMPT},
        {"role": "assistant", "content": response},
        {"role": "user", "content": question},
    ]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)


@pytest.mark.parametrize("name", ["chatml", "llama3", "qwen3", "plain"])
@pytest.mark.parametrize("question", [DEFAULT_QUESTION, "Is every step so far right?"])
def test_suffix_is_the_templates_turn_close_question_and_answer_opening(tokenizers, name, question):
    tok = tokenizers[name]
    probe = build_judge_probe(tok, question)
    assert probe.question == question
    assert tok.decode(probe.suffix_ids) == EXPECTED_SUFFIX[name].format(q=question)
    assert probe.suffix_ids == tuple(tok.encode(EXPECTED_SUFFIX[name].format(q=question), add_special_tokens=False))


def test_llama3_suffix_carries_no_bos(tokenizers):
    tok = tokenizers["llama3"]
    assert tok.encode("hi")[0] == tok.bos_token_id  # the tokenizer does add BOS on encode
    assert tok.bos_token_id not in build_judge_probe(tok).suffix_ids


def test_qwen3_style_template_renders_last_assistant_turn_differently(tokenizers):
    """The case the derivation must survive: the response's preamble depends on position."""
    tok = tokenizers["qwen3"]
    turn = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": "R"}]
    last = tok.apply_chat_template(turn, tokenize=False)
    earlier = _render_with_question(tok, "R", DEFAULT_QUESTION)
    assert last.split("R<|im_end|>")[0].endswith("<think>\n\n</think>\n\n")
    assert earlier.split("R<|im_end|>")[0].endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("name", TEMPLATED)
@pytest.mark.parametrize("response", RESPONSES)
def test_probe_continues_the_conversation_as_the_template_would(tokenizers, name, response):
    """ids(history + response) + suffix == ids(template's own rendering with the question)."""
    tok = tokenizers[name]
    question = "Is every step so far right?"
    probe = build_judge_probe(tok, question)
    rendered = _render_with_question(tok, response, question)
    history = rendered[: rendered.index(response)]
    drafted = tok.encode(history + response, add_special_tokens=False)
    assert drafted + list(probe.suffix_ids) == tok.encode(rendered, add_special_tokens=False)


@pytest.mark.parametrize("response", ["The sum is four.", "Done. ", "x = 4"])
def test_plain_fallback_continues_the_text(tokenizers, response):
    tok = tokenizers["plain"]
    probe = build_judge_probe(tok)
    text = response + FALLBACK_SUFFIX.format(question=DEFAULT_QUESTION)
    joined = tok.encode(response, add_special_tokens=False) + list(probe.suffix_ids)
    assert joined == tok.encode(text, add_special_tokens=False)


def test_plain_fallback_after_newline_keeps_the_text(tokenizers):
    """A response ending in a newline merges with the suffix's leading "\\n\\n" when the
    whole text is re-tokenized, so only the decoded text (not the ids) agrees there."""
    tok = tokenizers["plain"]
    probe = build_judge_probe(tok)
    response = "x = 4\n"
    joined = tok.encode(response, add_special_tokens=False) + list(probe.suffix_ids)
    assert tok.decode(joined) == response + FALLBACK_SUFFIX.format(question=DEFAULT_QUESTION)


@pytest.mark.parametrize("name", ["chatml", "llama3", "qwen3", "plain"])
def test_answer_ids_are_yes_and_no_word_starts_and_disjoint(tokenizers, name):
    tok = tokenizers[name]
    probe = build_judge_probe(tok)
    yes = [tok.decode([i]) for i in probe.yes_ids]
    no = [tok.decode([i]) for i in probe.no_ids]
    # This tiny BPE has no whole "Yes"/"No" token; first tokens: "Y", "y", " yes" / "N", "n", " n".
    assert sorted(yes) == sorted(["Y", "y", " yes"])
    assert sorted(no) == sorted(["N", "n", " n"])
    assert all(t.strip() and "yes".startswith(t.strip().lower()) for t in yes)
    assert all(t.strip() and "no".startswith(t.strip().lower()) for t in no)
    assert not set(probe.yes_ids) & set(probe.no_ids)
    assert probe.answer_ids == probe.yes_ids + probe.no_ids
    # " Yes" and " No" both start with a bare " " token here: it must be in neither set.
    space = tok.encode(" ", add_special_tokens=False)[0]
    assert tok.encode(" Yes", add_special_tokens=False)[0] == space
    assert space not in probe.answer_ids


def _reference_scores(logits: torch.Tensor, probe: JudgeProbe) -> torch.Tensor:
    probs = torch.softmax(logits.double(), dim=-1)
    p_yes = probs[..., list(probe.yes_ids)].sum(-1)
    p_no = probs[..., list(probe.no_ids)].sum(-1)
    return (p_yes / (p_yes + p_no)).float()


PROBE = JudgeProbe(suffix_ids=(1, 2), yes_ids=(3, 7), no_ids=(5,), question="q")


def test_equal_yes_and_no_logits_score_one_half():
    balanced = JudgeProbe(suffix_ids=(1,), yes_ids=(3, 7), no_ids=(5, 11), question="q")
    logits = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    logits[:, [3, 7, 5, 11]] = 2.5
    assert torch.equal(judge_scores(logits, balanced), torch.full((4,), 0.5))


@pytest.mark.parametrize("shape", [(6, 32), (3, 5, 32)])
def test_scores_match_full_vocabulary_softmax(shape):
    logits = 4 * torch.randn(shape, generator=torch.Generator().manual_seed(1))
    scores = judge_scores(logits, PROBE)
    assert scores.shape == shape[:-1] and scores.dtype == torch.float32
    torch.testing.assert_close(scores, _reference_scores(logits, PROBE), atol=1e-6, rtol=0)
    answer_logits = logits[..., list(PROBE.answer_ids)]
    assert torch.equal(score_from_answer_logits(answer_logits, PROBE), scores)


def test_known_score_value():
    logits = torch.zeros(1, 10)
    logits[0, 3], logits[0, 7], logits[0, 5] = 1.0, 0.0, 2.0  # yes: e + 1, no: e^2
    expected = (torch.e + 1) / (torch.e + 1 + torch.e**2)
    assert judge_scores(logits, PROBE).item() == pytest.approx(expected, abs=1e-6)


def test_scores_are_fp32_and_stable_for_extreme_and_bf16_logits():
    answer = torch.tensor([[1000.0, -1000.0, -1000.0], [-1000.0, -1000.0, 1000.0]])
    assert torch.equal(score_from_answer_logits(answer, PROBE), torch.tensor([1.0, 0.0]))
    logits = torch.randn(4, 32, generator=torch.Generator().manual_seed(2)).bfloat16()
    scores = judge_scores(logits, PROBE)
    assert scores.dtype == torch.float32
    torch.testing.assert_close(scores, _reference_scores(logits.float(), PROBE), atol=1e-6, rtol=0)


@pytest.mark.parametrize("question", ["", "   \n"])
def test_empty_question_is_rejected(tokenizers, question):
    with pytest.raises(ValueError, match="judge question must be non-empty"):
        build_judge_probe(tokenizers["chatml"], question)


@pytest.mark.parametrize("no_word", ["yes", "Yesterday"])
def test_colliding_answer_words_are_rejected(tokenizers, no_word):
    with pytest.raises(ValueError, match=rf"yes_word='Yes' and no_word='{no_word}' collide"):
        build_judge_probe(tokenizers["chatml"], yes_word="Yes", no_word=no_word)


def test_template_repeating_the_response_is_rejected(tokenizers):
    tok = AutoTokenizer.from_pretrained(tokenizers["chatml"].name_or_path)
    tok.chat_template = "{% for m in messages %}{{ m.content + m.content }}{% endfor %}"
    with pytest.raises(ValueError, match="exactly once, got 2 times"):
        build_judge_probe(tok)


def test_logit_shapes_are_checked():
    with pytest.raises(ValueError, match=r"len\(probe.answer_ids\)=3"):
        score_from_answer_logits(torch.zeros(2, 4), PROBE)
    with pytest.raises(ValueError, match="vocabulary"):
        judge_scores(torch.zeros(2, 7), PROBE)
