"""A trained synthetic target/draft pair ("model organism") that makes PARSE measurable offline.

    python -m support.synthetic build [--json] [--cache-dir DIR]
    python -m support.synthetic judge [--num-problems N] [--json]   # the judge's ROC AUC

WHAT IT IS: a synthetic stand-in, NOT evidence about large models. Two tiny Llama models are
trained on CPU in a few minutes on multi-step arithmetic word problems ("Mia has 7 apples. She
buys 5 more. She sells 3. How many apples does Mia have now?") whose solutions are one step
sentence per line with several equivalent wordings per step, and a last line "The answer is N.".
It reproduces, in miniature, the regime PARSE is for: a draft that is mostly right but words
things its own way (low token agreement with the target, high step accuracy), and a target that
is trained to judge whether the steps so far are right (it has not learnt to: see MEASURED). It
says nothing about how well a real model judges or how fast PARSE is on real models.

- The TARGET solves the problems greedily in its own preferred wording, and is trained to answer
  PARSE's own judge probe (`parse_sglang.judge.build_judge_probe(tokenizer).suffix_ids`, appended
  right after a partial assistant response) with "Yes" iff every step written so far is correct.
  Its judge training data are partial solutions cut at step ends and at arbitrary tokens, in its
  own and in other wordings, correct and with corrupted steps (wrong result, wrong amount, wrong
  running total, wrong operation, wrong final answer).
- The DRAFT is several times cheaper per token, prefers other wordings at every choice point of a
  step sentence (another deterministic preference than the target's), and gets a fixed ~10% of
  the arithmetic facts (operation, running total, amount) wrong by one, so its greedy solutions
  contain real step errors at a measurable rate.
- One tokenizer (byte-level BPE trained locally, numbers and words as whole tokens, ChatML chat
  template, EOS `<|im_end|>`) is shared by both; the directories are plain Hugging Face Llama
  checkpoints (config, safetensors, tokenizer, generation_config) that transformers and SGLang
  load as they are.

The pair is built deterministically from RECIPE (same recipe, same machine and software: the
same weights, bit for bit) into a cache directory, `~/.cache/parse-sglang/synthetic-<recipe
hash>/{target,draft}` (PARSE_SGLANG_CACHE or an argument override the root), and reused when
complete; training takes about 6 minutes on 2 CPU cores. Nothing is downloaded.
`problems(seed, n)` and `grade(problem, text)` are the task; TEST_SEED gives held-out problems
(training draws from other seeds).

MEASURED (60 held-out problems, tests/test_synthetic.py): target answer accuracy 0.98, draft
0.85; step accuracy target 0.99, draft 0.94; the draft's next-token agreement with the target
0.53. The probe judge is NOT competent: `python -m support.synthetic judge` (100 held-out
solutions per row, half with one false statement, 391 prefixes) gives ROC AUC 0.63 on the
training mix. It catches a wrong final answer (0.93: a copy of the last total, right before the
cut) but not a wrong step (0.64-0.68 for wrong results, amounts, totals, operations; 0.42-0.53,
chance, at the first cut after the wrong step): its scores follow how far into the solution the
cut is. What did not change that within the build budget (scratch experiments, recorded in
the closing notes of issue 10): longer judge training (300 to 700
steps, 3 to 8 probes per example, learning rates 3e-3 to 1e-2), a judge trained alone from
scratch, wrong results only, tied embeddings, and supervising the error directly ("No" as the
next token right after a wrong result, in solutions and in drills of single step lines). The
model learns to write y = x +/- a, not, in this budget, to check it.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Sequence

# ---------------------------------------------------------------------------------------------
# The task
# ---------------------------------------------------------------------------------------------

MAX_TOTAL = 15  # every true running total stays in 0..MAX_TOTAL
MAX_AMOUNT = 5  # each event adds or removes 1..MAX_AMOUNT
MAX_NUMBER = 30  # numbers the tokenizer holds as whole tokens (corrupted steps may leave 0..20)
MIN_EVENTS, MAX_EVENTS = 2, 4
TEST_SEED = 10_000  # held-out problems: problems(TEST_SEED, n); training uses seeds below it

NAMES = (
    ("Mia", "she"),
    ("Tom", "he"),
    ("Ana", "she"),
    ("Sam", "he"),
    ("Eva", "she"),
    ("Max", "he"),
    ("Lily", "she"),
    ("Ben", "he"),
)
ITEMS = ("apples", "pens", "cards", "coins", "books", "shells", "stamps", "eggs")
GAIN_VERBS = ("buys", "finds", "gets", "wins")
LOSS_VERBS = ("sells", "loses", "uses", "gives away")
ORDINALS = ("First", "Second", "Third", "Fourth")  # events are numbered in the prompt and the steps


@dataclass(frozen=True)
class Event:
    verb: str
    amount: int
    sign: int  # +1 gains, -1 loses


@dataclass(frozen=True)
class Problem:
    name: str
    pronoun: str
    item: str
    start: int
    events: tuple[Event, ...]

    @property
    def totals(self) -> tuple[int, ...]:
        """Running totals after each event (true arithmetic)."""
        out, total = [], self.start
        for e in self.events:
            total += e.sign * e.amount
            out.append(total)
        return tuple(out)

    @property
    def answer(self) -> int:
        return self.totals[-1]

    @property
    def prompt(self) -> str:
        lines = [f"{self.name} has {self.start} {self.item}."]
        for ordinal, e in zip(ORDINALS, self.events):
            more = " more" if e.sign > 0 else ""
            lines.append(f"{ordinal}, {self.pronoun} {e.verb} {e.amount}{more}.")
        lines.append(f"How many {self.item} does {self.name} have now?")
        return " ".join(lines)


def _problem(rng: random.Random) -> Problem:
    name, pronoun = rng.choice(NAMES)
    item = rng.choice(ITEMS)
    total = start = rng.randint(1, MAX_TOTAL)
    events = []
    for _ in range(rng.randint(MIN_EVENTS, MAX_EVENTS)):
        signs = [s for s, room in ((1, MAX_TOTAL - total), (-1, total)) if room >= 1]
        sign = rng.choice(signs)
        amount = rng.randint(1, min(MAX_AMOUNT, MAX_TOTAL - total if sign > 0 else total))
        events.append(Event(rng.choice(GAIN_VERBS if sign > 0 else LOSS_VERBS), amount, sign))
        total += sign * amount
    return Problem(name, pronoun, item, start, tuple(events))


def problems(seed: int, n: int) -> list[Problem]:
    """`n` problems drawn from `seed` (the same seed gives the same problems)."""
    rng = random.Random(f"parse-sglang-synthetic-problems-{seed}")
    return [_problem(rng) for _ in range(n)]


_ANSWER = re.compile(r"answer is (-?\d+)")


def final_answer(output_text: str) -> int | None:
    """The number after the last "answer is" in `output_text`, or None."""
    found = _ANSWER.findall(output_text)
    return int(found[-1]) if found else None


def grade(problem: Problem, output_text: str) -> bool:
    """True iff the final answer stated in output_text ("... answer is N") is the problem's answer."""
    return final_answer(output_text) == problem.answer


# ---------------------------------------------------------------------------------------------
# Wordings: each step sentence is a chain of choice points ("slots"); every option of a slot says
# the same thing. A model's style is a distribution over each slot's options; its greedy output
# takes its preferred option at every slot.
# ---------------------------------------------------------------------------------------------

SLOT_SIZES = {"opener": 3, "subject": 2, "amount": 3, "connector": 3, "result": 3, "unit": 3, "answer": 3}
TARGET_PREFERS = 0  # option index the target's training data favours at every slot
DRAFT_PREFERS = 1  # ... and the draft's


def style(prefers: int, other: int, other_weight: float) -> dict[str, tuple[float, ...]]:
    """Option weights per slot: 0.6 on `prefers`; of the rest, `other_weight` on option `other`
    (the other model's favourite) where a slot has three options, the remainder on the third."""
    out = {}
    for slot, n in SLOT_SIZES.items():
        w = [0.0] * n
        if n == 1:
            out[slot] = (1.0,)
            continue
        w[prefers] = 0.6
        if n == 2:
            w[1 - prefers] = 0.4
        else:  # three options
            w[other] = other_weight
            w[3 - prefers - other] = 0.4 - other_weight
        out[slot] = tuple(w)
    return out


# The target sees the draft's favourite wording often (it must judge and continue it); the draft
# sees the target's least (so that where the draft cannot take its favourite, it still differs).
TARGET_STYLE = style(TARGET_PREFERS, DRAFT_PREFERS, 0.25)
DRAFT_STYLE = style(DRAFT_PREFERS, TARGET_PREFERS, 0.1)
UNIFORM_STYLE = {slot: (1.0 / n,) * n for slot, n in SLOT_SIZES.items()}


def greedy_wording(prefers: int) -> dict[str, int]:
    return {slot: min(prefers, n - 1) for slot, n in SLOT_SIZES.items()}


def sample_wording(rng: random.Random, weights: dict[str, Sequence[float]]) -> dict[str, int]:
    return {slot: rng.choices(range(len(w)), weights=w)[0] for slot, w in weights.items()}


@dataclass(frozen=True)
class Stated:
    """The numbers one step sentence states: running total x, sign, amount a, result y."""

    x: int
    sign: int
    a: int
    y: int


def _step_pieces(problem: Problem, index: int, wording: dict[str, int], s: Stated) -> list[tuple[str, bool]]:
    """Pieces (each one pre-token: a word with its leading space, or punctuation) of step `index`,
    each flagged wrong where it states something false."""
    event = problem.events[index]
    prev = problem.start if index == 0 else problem.totals[index - 1]
    wrong_x, wrong_a = s.x != prev, s.a != event.amount
    wrong_sign, wrong_y = s.sign != event.sign, s.y != problem.totals[index]
    sym = ("+" if s.sign > 0 else "-", wrong_sign)
    op_word = ("plus" if s.sign > 0 else "minus", wrong_sign)
    x, a, y = (f" {s.x}", wrong_x), (f" {s.a}", wrong_a), (f" {s.y}", wrong_y)
    ordinal = ORDINALS[index]
    pieces = [[ordinal, ","], ["Step", f" {index + 1}", ":"], ["In", " the", " " + ordinal.lower(), " step", ","]][
        wording["opener"]
    ]
    pieces = [(p, False) for p in pieces] + [(" " + (problem.pronoun, problem.name)[wording["subject"]], False)]
    pieces += [(" " + word, False) for word in event.verb.split()]
    pieces += [a] + [
        (p, False)
        for p in (
            [" more"] if event.sign > 0 else [],
            [" " + problem.item],
            [" extra"] if event.sign > 0 else [" of", " them"],
        )[wording["amount"]]
    ]
    pieces += ([(",", False), (" so", False)], [(" and", False)], [(",", False), (" which", False), (" gives", False)])[
        wording["connector"]
    ]
    pieces += (
        [x, (" " + sym[0], sym[1]), a, (" =", False), y],
        [x, (" " + op_word[0], op_word[1]), a, (" is", False), y],
        [x, (" " + sym[0], sym[1]), a, (" makes", False), y],
    )[wording["result"]]
    pieces += [(p, False) for p in ([], [" " + problem.item], [" " + problem.item, " now"])[wording["unit"]]]
    return pieces + [(".", False), ("\n", False)]


def _answer_pieces(problem: Problem, wording: dict[str, int], stated: int) -> list[tuple[str, bool]]:
    y = (f" {stated}", stated != problem.answer)
    lead = (["The"], ["So", " the"], ["In", " total", ",", " the"])[wording["answer"]]
    return [(w, False) for w in lead] + [(" answer", False), (" is", False), y, (".", False)]


def true_arithmetic(x: int, sign: int, a: int) -> int:
    return x + sign * a


@dataclass(frozen=True)
class Solution:
    """A written solution: its text, where its first false statement starts (character offset,
    None if it has none) and where each line ends (offset just after each "\\n")."""

    text: str
    first_error: int | None
    line_ends: tuple[int, ...]
    stated: tuple[Stated, ...]


CORRUPTIONS = ("result", "amount", "total", "operation", "answer")


def write_solution(
    problem: Problem,
    wordings: Sequence[dict[str, int]],
    arithmetic=true_arithmetic,
    corrupt: tuple[int, str, int] | None = None,
) -> Solution:
    """The solution of `problem` with wordings[i] for step i and wordings[-1] for the answer line
    (one more than the events), each step's result computed by `arithmetic(x, sign, a)` from the running total the
    previous step stated (so one error carries forward, as a model's would).

    corrupt = (step, kind, delta): state something false at `step` (kind "answer": the final line).
    "result" adds delta to y; "amount" to a (and y follows); "total" to x (and y follows);
    "operation" flips the sign (delta unused). Raises ValueError if a stated number leaves
    0..MAX_NUMBER or the corruption changes nothing.
    """
    if len(wordings) != len(problem.events) + 1:
        raise ValueError(f"{len(problem.events)} steps and an answer line need {len(problem.events) + 1} wordings")
    pieces: list[tuple[str, bool]] = []
    stated, x = [], problem.start
    for i, event in enumerate(problem.events):
        sign, a = event.sign, event.amount
        kind, delta = (corrupt[1], corrupt[2]) if corrupt is not None and corrupt[0] == i else (None, 0)
        if kind == "amount":
            a += delta
        elif kind == "total":
            x += delta
        elif kind == "operation":
            sign = -sign
        y = arithmetic(x, sign, a) + (delta if kind == "result" else 0)
        s = Stated(x, sign, a, y)
        if not all(0 <= v <= MAX_NUMBER for v in (x, y)) or not 1 <= a <= MAX_NUMBER:
            raise ValueError(f"stated numbers {s} leave 0..{MAX_NUMBER}")
        stated.append(s)
        pieces += _step_pieces(problem, i, wordings[i], s)
        x = y
    final = x + (corrupt[2] if corrupt is not None and corrupt[1] == "answer" else 0)
    if not 0 <= final <= MAX_NUMBER:
        raise ValueError(f"stated answer {final} leaves 0..{MAX_NUMBER}")
    pieces += _answer_pieces(problem, wordings[-1], final)
    text, first_error, line_ends, offset = "", None, [], 0
    for piece, wrong in pieces:
        if wrong and first_error is None:
            first_error = offset
        offset += len(piece)
        if piece == "\n":
            line_ends.append(offset)
    text = "".join(p for p, _ in pieces)
    if corrupt is not None and first_error is None:
        raise ValueError(f"corruption {corrupt} states nothing false")
    return Solution(text, first_error, tuple(line_ends), tuple(stated))


# ---------------------------------------------------------------------------------------------
# Tokenizer: byte-level BPE trained on the task's own text, so every word and number 0..MAX_NUMBER
# is one token (anything else still encodes, byte by byte).
# ---------------------------------------------------------------------------------------------

EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = (PAD_TOKEN, "<|im_start|>", EOS_TOKEN)


def _tokenizer_corpus(seed: int) -> list[str]:
    from parse_sglang.judge import DEFAULT_QUESTION

    rng = random.Random(f"parse-sglang-synthetic-tokenizer-{seed}")
    texts = []
    for problem in [_problem(rng) for _ in range(400)]:
        wordings = [sample_wording(rng, UNIFORM_STYLE) for _ in range(len(problem.events) + 1)]
        texts += [problem.prompt, write_solution(problem, wordings).text]
    numbers = [str(n) for n in range(MAX_NUMBER + 1)]
    words = [w for name, pron in NAMES for w in (name, pron, pron.capitalize())] + list(ITEMS)
    texts += [" ".join(numbers), "\n".join(numbers), " ".join(words), "\n".join(["system", "user", "assistant", ""])]
    texts += [DEFAULT_QUESTION, "Yes No yes no Correct Incorrect correct incorrect"] * 20
    return texts * 4


def build_tokenizer(seed: int = 0):
    """The pair's tokenizer (a transformers PreTrainedTokenizerFast with the ChatML template)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from support.tiny_models import CHAT_TEMPLATES

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2048,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tokenizer_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN, unk_token=None)
    fast.chat_template = CHAT_TEMPLATES["chatml"]
    return fast


# ---------------------------------------------------------------------------------------------
# Training examples: a chat-templated prompt, a solution (+ EOS) and judge probes at cuts of it,
# laid out exactly as PARSE's verify pass lays them out (reference.verify_inputs).
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Example:
    context: tuple[int, ...]  # the chat-templated prompt, assistant turn opened
    chain: tuple[int, ...]  # solution tokens + EOS
    lm_tokens: int  # chain[:lm_tokens] are trained as next tokens
    cuts: tuple[int, ...]  # probe after chain[:cut] ...
    labels: tuple[bool, ...]  # ... answered "Yes" (True) or "No"


class Encoder:
    """Token ids of prompts and solutions for one tokenizer, with where a solution's first error
    and line ends fall in tokens."""

    def __init__(self, tokenizer):
        from parse_sglang.judge import build_judge_probe

        self.tokenizer = tokenizer
        self.probe = build_judge_probe(tokenizer)
        self.eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
        self.yes_id, self.no_id = (tokenizer.encode(w, add_special_tokens=False)[0] for w in ("Yes", "No"))
        if self.yes_id not in self.probe.yes_ids or self.no_id not in self.probe.no_ids:
            raise ValueError("the tokenizer's 'Yes' / 'No' are not the judge probe's answer tokens")

    def prompt_ids(self, problem: Problem) -> list[int]:
        ids = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": problem.prompt}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        return list(ids["input_ids"] if isinstance(ids, dict) else ids)

    def solution_ids(self, solution: Solution) -> tuple[list[int], int | None, list[int]]:
        """(token ids + EOS, index of the first wrong token or None, token counts ending each line)."""
        ids = self.tokenizer.encode(solution.text, add_special_tokens=False)
        ends, offset = [], 0
        for piece in self.tokenizer.batch_decode([[i] for i in ids]):
            offset += len(piece)
            ends.append(offset)
        if offset != len(solution.text):
            raise ValueError(f"tokens do not decode to the solution text {solution.text!r}")
        error = (
            None if solution.first_error is None else next(i for i, e in enumerate(ends) if e > solution.first_error)
        )
        lines = [ends.index(e) + 1 for e in solution.line_ends]
        return ids + [self.eos_id], error, lines


def arithmetic_facts() -> list[tuple[int, int, int]]:
    """Every (sign, x, a) a true solution can meet: x in 0..MAX_TOTAL, result in 0..MAX_TOTAL."""
    return [
        (sign, x, a)
        for sign in (1, -1)
        for x in range(MAX_TOTAL + 1)
        for a in range(1, MAX_AMOUNT + 1)
        if 0 <= x + sign * a <= MAX_TOTAL
    ]


def draft_bad_facts(seed: int, share: float) -> frozenset[tuple[int, int, int]]:
    """The fixed subset of facts the draft is taught wrong (its result off by one)."""
    facts = arithmetic_facts()
    return frozenset(random.Random(f"parse-sglang-synthetic-bad-{seed}").sample(facts, round(share * len(facts))))


def draft_arithmetic(bad: frozenset[tuple[int, int, int]]):
    def arithmetic(x: int, sign: int, a: int) -> int:
        y = x + sign * a
        if (sign, x, a) in bad:
            return y + 1 if y < MAX_TOTAL else y - 1
        return y

    return arithmetic


def _corrupt(rng: random.Random, problem: Problem, kind: str | None = None) -> tuple[int, str, int]:
    """One false statement: of `kind`, or of a kind drawn with the training mix."""
    if kind is None:
        kind = rng.choices(CORRUPTIONS, weights=(0.45, 0.15, 0.15, 0.1, 0.15))[0]
    step = len(problem.events) if kind == "answer" else rng.randrange(len(problem.events))
    size = rng.choices((1, 2, 3, rng.randint(4, 8)), weights=(0.55, 0.2, 0.1, 0.15))[0]
    return step, kind, rng.choice((-1, 1)) * size


def _maybe_corrupt(rng: random.Random, problem: Problem, kind: str | None = None) -> tuple[int, str, int] | None:
    """Half of the solutions get one false statement."""
    return _corrupt(rng, problem, kind) if rng.random() < 0.5 else None


def _first_valid(attempt):
    """attempt() again until it does not raise ValueError (a draw whose stated numbers leave
    0..MAX_NUMBER)."""
    while True:
        try:
            return attempt()
        except ValueError:
            continue


def target_example(rng: random.Random, enc: Encoder, probes: int) -> Example:
    """A solution for the target: in its own style (trained as text) or another (judged only);
    half of them with one false statement; `probes` judge cuts, the first error's two sides first."""
    problem = _problem(rng)
    own = rng.random() < 0.6
    weights = TARGET_STYLE if own else rng.choice((DRAFT_STYLE, UNIFORM_STYLE))
    wordings = [sample_wording(rng, weights) for _ in range(len(problem.events) + 1)]
    solution = _first_valid(lambda: write_solution(problem, wordings, corrupt=_maybe_corrupt(rng, problem)))
    chain, error, lines = enc.solution_ids(solution)
    n = len(chain)
    cuts = {error, error + 1} if error is not None else set()
    candidates = sorted(set(lines) | {n - 1, n} | {rng.randint(1, n) for _ in range(probes)})
    rng.shuffle(candidates)
    for cut in candidates:
        if len(cuts) >= probes:
            break
        cuts.add(cut)
    cuts = sorted(c for c in cuts if c >= 1)
    labels = tuple(error is None or cut <= error for cut in cuts)
    lm_tokens = (n if error is None else error) if own else 0
    return Example(tuple(enc.prompt_ids(problem)), tuple(chain), lm_tokens, tuple(cuts), labels)


def base_example(rng: random.Random, enc: Encoder) -> Example:
    """A correct solution in any wording (every option equally likely), trained as text: what the
    draft and the target both start from."""
    problem = _problem(rng)
    wordings = [sample_wording(rng, UNIFORM_STYLE) for _ in range(len(problem.events) + 1)]
    chain, _, _ = enc.solution_ids(write_solution(problem, wordings))
    return Example(tuple(enc.prompt_ids(problem)), tuple(chain), len(chain), (), ())


def draft_example(rng: random.Random, enc: Encoder, arithmetic) -> Example:
    """A solution in the draft's style with the draft's arithmetic, trained as text."""

    def attempt():
        problem = _problem(rng)
        wordings = [sample_wording(rng, DRAFT_STYLE) for _ in range(len(problem.events) + 1)]
        return problem, write_solution(problem, wordings, arithmetic=arithmetic)

    problem, solution = _first_valid(attempt)
    chain, _, _ = enc.solution_ids(solution)
    return Example(tuple(enc.prompt_ids(problem)), tuple(chain), len(chain), (), ())


# ---------------------------------------------------------------------------------------------
# Models and training
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """A Llama's size. Head dimension 64 (what GPU attention kernels support); even head and KV-head
    counts, so tensor parallelism 2 splits them."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    head_dim: int = 64


def llama_config(shape: Shape, tokenizer):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=1024,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(EOS_TOKEN),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN),
        dtype="float32",
    )


def pack(examples: Sequence[Example], suffix: Sequence[int], yes_id: int, no_id: int, row_len: int):
    """Lay examples out as PARSE's verify pass does (one block each: prompt, solution, probes) and
    pack the blocks into rows of at most row_len tokens. Returns (input_ids [R, T], positions
    [R, T], attention bias [R, 1, T, T], loss rows [n, 2] (row, column), loss targets [n],
    is-judge [n])."""
    import torch

    from support.reference import verify_inputs_batch

    blocks = []
    layouts = verify_inputs_batch([(ex.context, ex.chain, ex.cuts, suffix if ex.cuts else ()) for ex in examples])
    for ex, inputs in zip(examples, layouts):
        rows = inputs.chain_rows[: ex.lm_tokens].tolist() + inputs.probe_rows.tolist()
        targets = list(ex.chain[: ex.lm_tokens]) + [yes_id if y else no_id for y in ex.labels]
        judge = [False] * ex.lm_tokens + [True] * len(ex.labels)
        blocks.append((inputs, rows, targets, judge))
    rows_of: list[list[int]] = []
    fill: list[int] = []
    for i, (inputs, *_rest) in enumerate(blocks):
        size = len(inputs.input_ids)
        if size > row_len:
            raise ValueError(f"an example of {size} tokens does not fit a row of {row_len}")
        if not fill or fill[-1] + size > row_len:
            rows_of.append([])
            fill.append(0)
        rows_of[-1].append(i)
        fill[-1] += size
    width = max(fill)
    ids = torch.zeros(len(rows_of), width, dtype=torch.long)
    pos = torch.zeros(len(rows_of), width, dtype=torch.long)
    allowed = torch.eye(width, dtype=torch.bool).repeat(len(rows_of), 1, 1)  # padding sees itself
    loss_rows, targets, judge = [], [], []
    for r, members in enumerate(rows_of):
        start = 0
        for i in members:
            inputs, rows, tgt, jdg = blocks[i]
            size = len(inputs.input_ids)
            ids[r, start : start + size] = inputs.input_ids
            pos[r, start : start + size] = inputs.positions
            allowed[r, start : start + size, start : start + size] = inputs.allowed
            loss_rows += [(r, start + row) for row in rows]
            targets += tgt
            judge += jdg
            start += size
    bias = torch.zeros(allowed.shape).masked_fill_(~allowed, torch.finfo(torch.float32).min)[:, None]
    return ids, pos, bias, torch.tensor(loss_rows), torch.tensor(targets), torch.tensor(judge)


def train(model, batches, steps: int, lr: float, judge_weight: float = 1.0, log=None) -> None:
    """AdamW with linear warm-up and cosine decay to zero; `batches(step)` gives pack()'s output."""
    import math

    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = max(1, steps // 20)
    model.train()
    for step in range(steps):
        scale = (
            (step + 1) / warmup if step < warmup else 0.5 * (1 + math.cos(math.pi * (step - warmup) / (steps - warmup)))
        )
        for group in opt.param_groups:
            group["lr"] = lr * scale
        ids, pos, bias, rows, targets, judge = batches(step)
        hidden = model.model(input_ids=ids, position_ids=pos, attention_mask=bias).last_hidden_state
        logits = model.lm_head(hidden[rows[:, 0], rows[:, 1]])
        losses = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
        lm = losses[~judge].mean() if (~judge).any() else losses.new_zeros(())
        jl = losses[judge].mean() if judge.any() else losses.new_zeros(())
        loss = lm + judge_weight * jl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if log is not None:
            log(step, float(lm.detach()), float(jl.detach()))
    model.eval()


# ---------------------------------------------------------------------------------------------
# Measuring a pair
# ---------------------------------------------------------------------------------------------

_NUMBER = re.compile(r"\d+")
_STEP_NUMBER = re.compile(r"^\s*Step \d+:")


def step_results(problem: Problem, output_text: str) -> list[bool]:
    """Per step line of output_text (lines before the answer line): whether it is arithmetically
    right. A step line states, in every wording, the amount a, then x, the operation and a again,
    then the result y; it is right iff a is the event's amount, the operation the event's, x the
    total the previous line stated (the start for the first) and y = x +/- a. Lines beyond the
    problem's events count as wrong."""
    results, prev = [], problem.start
    lines = [line for line in output_text.split("\n") if line.strip() and final_answer(line) is None]
    for i, line in enumerate(lines):
        nums = [int(n) for n in _NUMBER.findall(_STEP_NUMBER.sub("", line))]
        sign = 1 if (" + " in line or " plus " in line) else -1 if (" - " in line or " minus " in line) else 0
        ok = (
            i < len(problem.events)
            and len(nums) == 4
            and nums[0] == nums[2] == problem.events[i].amount
            and sign == problem.events[i].sign
            and nums[1] == prev
            and nums[3] == nums[1] + sign * nums[2]
        )
        results.append(ok)
        if nums:
            prev = nums[-1]
    return results


def greedy_ids(
    model, enc: Encoder, items: Sequence[Problem], max_new_tokens: int = 96, batch: int = 64
) -> list[list[int]]:
    """Greedy solution token ids of `items` (up to and with EOS), batched with left padding."""
    import torch

    pad = enc.tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    solutions = []
    for start in range(0, len(items), batch):
        prompts = [enc.prompt_ids(p) for p in items[start : start + batch]]
        width = max(map(len, prompts))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=enc.eos_id,
                pad_token_id=pad,
            )
        for generated in out[:, width:].tolist():
            solutions.append(generated[: generated.index(enc.eos_id) + 1] if enc.eos_id in generated else generated)
    return solutions


def greedy_outputs(
    model, enc: Encoder, items: Sequence[Problem], max_new_tokens: int = 96, batch: int = 64
) -> list[str]:
    """Greedy solutions (text, special tokens dropped) of `items`."""
    return enc.tokenizer.batch_decode(greedy_ids(model, enc, items, max_new_tokens, batch), skip_special_tokens=True)


def roc_auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """Area under the ROC curve: P(score of a positive > score of a negative), ties counting half."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    if not pos or not neg:
        raise ValueError("ROC AUC needs at least one positive and one negative label")
    ranked = sorted([(s, 1) for s in pos] + [(s, 0) for s in neg])
    # Average ranks over ties (Mann-Whitney U).
    rank_sum, i = 0.0, 0
    while i < len(ranked):
        j = i
        while j < len(ranked) and ranked[j][0] == ranked[i][0]:
            j += 1
        rank_sum += (i + j + 1) / 2 * sum(flag for _, flag in ranked[i:j])
        i = j
    return (rank_sum - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg))


def load_pair(target_dir, draft_dir):
    """(Encoder, target, draft) loaded with transformers in fp32, eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    enc = Encoder(AutoTokenizer.from_pretrained(target_dir))
    models = [AutoModelForCausalLM.from_pretrained(d, dtype="float32").eval() for d in (target_dir, draft_dir)]
    return enc, *models


def token_agreement(target, draft, enc: Encoder, items: Sequence[Problem]) -> float:
    """Share of the target's greedy output tokens that the draft's greedy next token equals,
    teacher-forced on the target's output (what exact-match speculative decoding accepts)."""
    import torch

    agree = total = 0
    for problem, text in zip(items, greedy_outputs(target, enc, items)):
        prompt = enc.prompt_ids(problem)
        out = enc.tokenizer.encode(text, add_special_tokens=False) + [enc.eos_id]
        ids = torch.tensor([prompt + out])
        with torch.no_grad():
            guess = draft(input_ids=ids).logits[0, len(prompt) - 1 : -1].argmax(-1)
        agree += int((guess == ids[0, len(prompt) :]).sum())
        total += len(out)
    return agree / total


def step_accuracy(texts: Sequence[str], items: Sequence[Problem]) -> float:
    """Share of step lines of `texts` (solutions of `items`) that are right (step_results)."""
    results = [ok for problem, text in zip(items, texts) for ok in step_results(problem, text)]
    return sum(results) / max(len(results), 1)


def judged_prefixes(
    seed: int, n: int, enc: Encoder, kind: str | None = None
) -> list[tuple[Problem, list[int], list[int], list[bool]]]:
    """`n` held-out solutions to judge: in the draft's or any wording, half with one false
    statement (of `kind`, one of CORRUPTIONS, or of the training mix); each as (problem, solution
    ids + EOS, cuts at its line ends and its end, label per cut: no false statement before the cut)."""
    if kind is not None and kind not in CORRUPTIONS:
        raise ValueError(f"kind={kind!r} is invalid: allowed is None or one of {CORRUPTIONS}")
    rng = random.Random(f"parse-sglang-synthetic-judged-{seed}")
    out = []
    for problem in problems(seed, n):
        weights = rng.choice((DRAFT_STYLE, UNIFORM_STYLE))
        wordings = [sample_wording(rng, weights) for _ in range(len(problem.events) + 1)]
        solution = _first_valid(lambda: write_solution(problem, wordings, corrupt=_maybe_corrupt(rng, problem, kind)))
        chain, error, lines = enc.solution_ids(solution)
        cuts = sorted(set(lines) | {len(chain) - 1})
        out.append((problem, chain, cuts, [error is None or cut <= error for cut in cuts]))
    return out


@dataclass(frozen=True)
class JudgeAuc:
    """How well the probe separates correct from incorrect prefixes (judge_auc)."""

    auc: float  # over every cut
    prefixes: int
    auc_at_error: float  # negatives: only the first cut after each error (is it seen where it is written?)


def judge_auc(target, enc: Encoder, seed: int, n: int, kind: str | None = None) -> JudgeAuc:
    """ROC AUC of the target's judge score (PARSE's probe, scored by ONE parallel_verify forward
    per solution) on judged_prefixes(seed, n, kind)."""
    import torch

    from parse_sglang.judge import judge_scores
    from support.reference import parallel_verify

    scores, labels, at_error = [], [], []
    for problem, chain, cuts, cut_labels in judged_prefixes(seed, n, enc, kind):
        with torch.no_grad():
            _, probe_logits = parallel_verify(target, enc.prompt_ids(problem), chain, cuts, enc.probe.suffix_ids)
        scores += judge_scores(probe_logits, enc.probe).tolist()
        first_wrong = cut_labels.index(False) if False in cut_labels else None
        at_error += [ok or i == first_wrong for i, ok in enumerate(cut_labels)]
        labels += cut_labels
    kept = [(score, ok) for score, ok, keep in zip(scores, labels, at_error) if keep]
    return JudgeAuc(roc_auc(scores, labels), len(scores), roc_auc(*zip(*kept)))


def grow(base, shape: Shape, tokenizer):
    """A deeper, wider Llama computing exactly what `base` computes: base's layers first (their MLPs
    widened with units whose output weights are zero), then new layers whose attention and MLP
    output projections are zero (so each adds nothing until trained)."""
    import torch
    from transformers import LlamaForCausalLM

    config = base.config
    if (shape.hidden, shape.heads, shape.kv_heads, shape.head_dim) != (
        config.hidden_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
    ):
        raise ValueError(f"grow keeps the hidden size and heads of the base model, got {shape}")
    model = LlamaForCausalLM(llama_config(shape, tokenizer))
    inner = config.intermediate_size
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(base.model.embed_tokens.weight)
        model.model.norm.weight.copy_(base.model.norm.weight)
        model.lm_head.weight.copy_(base.lm_head.weight)
        for i, layer in enumerate(model.model.layers):
            if i < len(base.model.layers):
                old = base.model.layers[i]
                for name in (
                    "self_attn.q_proj",
                    "self_attn.k_proj",
                    "self_attn.v_proj",
                    "self_attn.o_proj",
                    "input_layernorm",
                    "post_attention_layernorm",
                ):
                    layer.get_submodule(name).weight.copy_(old.get_submodule(name).weight)
                layer.mlp.gate_proj.weight[:inner].copy_(old.mlp.gate_proj.weight)
                layer.mlp.up_proj.weight[:inner].copy_(old.mlp.up_proj.weight)
                layer.mlp.down_proj.weight.zero_()
                layer.mlp.down_proj.weight[:, :inner].copy_(old.mlp.down_proj.weight)
            else:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
    return model


@dataclass(frozen=True)
class Recipe:
    """Everything the pair is built from; the cache directory is named by its hash.

    A BASE model (the draft's shape) learns the task as text in every wording with correct
    arithmetic. The DRAFT is the base fine-tuned on its own style with its wrong facts. The TARGET
    is the base grown (grow) to more layers and wider MLPs and fine-tuned on its own style plus
    the judge probe. steps_scale multiplies every phase's steps (tests use a small value for the
    determinism check only)."""

    seed: int = 0
    draft: Shape = Shape(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128)
    target: Shape = Shape(layers=6, hidden=64, heads=4, kv_heads=2, intermediate=256)
    base_steps: int = 1000
    draft_steps: int = 200
    target_steps: int = 300
    batch: int = 16
    base_lr: float = 1e-2
    draft_lr: float = 3e-3
    target_lr: float = 3e-3
    probes: int = 3
    bad_share: float = 0.1
    threads: int = 2
    steps_scale: float = 1.0
    version: int = 1  # bump when the task, the data or the training code changes

    def steps(self, phase: str) -> int:
        return max(1, round(getattr(self, f"{phase}_steps") * self.steps_scale))


def _phase_batches(recipe: Recipe, phase: str, make, enc: Encoder):
    rng = random.Random(f"parse-sglang-synthetic-{phase}-{recipe.seed}")

    def batches(step: int):
        return pack([make(rng) for _ in range(recipe.batch)], enc.probe.suffix_ids, enc.yes_id, enc.no_id, 512)

    return batches


def train_pair(recipe: Recipe, log=print):
    """(tokenizer, target, draft) trained from `recipe` (deterministic for a given machine and
    software: fixed seeds, fixed thread count, deterministic algorithms)."""
    import time

    import torch
    from transformers import LlamaForCausalLM

    start = time.time()

    def phase_log(name: str, steps: int):
        def report(step: int, lm: float, judge: float):
            if step == steps - 1 or (step + 1) % max(1, steps // 4) == 0:
                judge_text = f", judge loss {judge:.3f}" if judge else ""
                log(
                    f"[synthetic] {name} step {step + 1}/{steps}: text loss {lm:.3f}{judge_text} "
                    f"({time.time() - start:.0f} s)"
                )

        return report

    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(recipe.threads)
    torch.use_deterministic_algorithms(True)
    try:
        tokenizer = build_tokenizer(recipe.seed)
        enc = Encoder(tokenizer)
        log(f"[synthetic] tokenizer: {len(tokenizer)} tokens ({time.time() - start:.0f} s)")
        torch.manual_seed(recipe.seed)
        base = LlamaForCausalLM(llama_config(recipe.draft, tokenizer))
        steps = recipe.steps("base")
        train(
            base,
            _phase_batches(recipe, "base", lambda rng: base_example(rng, enc), enc),
            steps,
            recipe.base_lr,
            log=phase_log("base", steps),
        )
        torch.manual_seed(recipe.seed + 1)
        target = grow(base, recipe.target, tokenizer)
        draft = base
        arithmetic = draft_arithmetic(draft_bad_facts(recipe.seed, recipe.bad_share))
        steps = recipe.steps("draft")
        train(
            draft,
            _phase_batches(recipe, "draft", lambda rng: draft_example(rng, enc, arithmetic), enc),
            steps,
            recipe.draft_lr,
            log=phase_log("draft", steps),
        )
        steps = recipe.steps("target")
        train(
            target,
            _phase_batches(recipe, "target", lambda rng: target_example(rng, enc, recipe.probes), enc),
            steps,
            recipe.target_lr,
            log=phase_log("target", steps),
        )
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    return tokenizer, target, draft


RECIPE = Recipe()
PAIR_PREFIX = "synthetic"
WEIGHTS_FILE = "model.safetensors"


def save_model(model, tokenizer, out) -> None:
    """A plain Hugging Face checkpoint (safetensors, config, tokenizer with its chat template)
    that transformers and SGLang load as it is; greedy generation stops at EOS."""
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(
        eos_token_id=model.config.eos_token_id, pad_token_id=model.config.pad_token_id
    )
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def _recipe_record(recipe: Recipe) -> dict:
    """What the cache folder is built from: the recipe and the software that trains it."""
    import dataclasses
    import importlib.metadata

    return {
        "pair": PAIR_PREFIX,
        "recipe": dataclasses.asdict(recipe),
        "torch": importlib.metadata.version("torch"),
        "transformers": importlib.metadata.version("transformers"),
    }


def pair_dir(cache_dir=None, recipe: Recipe = RECIPE):
    """The cache folder of `recipe`'s pair (it holds target/ and draft/)."""
    import hashlib
    import json

    from parse_sglang.model_cache import cache_root

    digest = hashlib.sha256(json.dumps(_recipe_record(recipe), sort_keys=True).encode()).hexdigest()[:12]
    return cache_root(cache_dir) / f"{PAIR_PREFIX}-{digest}"


def build(cache_dir=None, recipe: Recipe = RECIPE, log=print):
    """(target_dir, draft_dir) of `recipe`'s pair, trained once into the cache and reused after."""
    from parse_sglang.model_cache import build_once

    def train_and_save(out):
        tokenizer, target, draft = train_pair(recipe, log=log)
        save_model(target, tokenizer, out / "target")
        save_model(draft, tokenizer, out / "draft")

    folder = build_once(pair_dir(cache_dir, recipe), _recipe_record(recipe), train_and_save)
    return folder / "target", folder / "draft"


def weights_hash(model_dir) -> str:
    """sha256 of a checkpoint's weights file (what the determinism check compares)."""
    import hashlib
    from pathlib import Path

    return hashlib.sha256((Path(model_dir) / WEIGHTS_FILE).read_bytes()).hexdigest()


def judge_report(target, enc: Encoder, num_problems: int) -> list[dict]:
    """judge_auc of `target` on held-out solutions with the training mix of false statements and
    with each kind alone."""
    rows = []
    for kind in (None, *CORRUPTIONS):
        measured = judge_auc(target, enc, TEST_SEED, num_problems, kind)
        rows.append(
            {
                "kind": kind or "mix",
                "auc": round(measured.auc, 3),
                "auc_at_error": round(measured.auc_at_error, 3),
                "prefixes": measured.prefixes,
            }
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    import json
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m support.synthetic", description="Build (or find in the cache) the synthetic target/draft pair."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("build", help="train the pair once into the cache; print the target and draft directories")
    judge = sub.add_parser("judge", help="ROC AUC of the target's probe judge, per kind of false statement")
    judge.add_argument("--num-problems", type=int, default=100, help="held-out solutions per kind (half wrong)")
    for each in (cmd, judge):
        each.add_argument("--cache-dir", help="cache root (default: $PARSE_SGLANG_CACHE or ~/.cache/parse-sglang)")
    cmd.add_argument("--json", action="store_true", help='print {"target": DIR, "draft": DIR}')
    judge.add_argument("--json", action="store_true", help="one JSON object per kind")
    args = parser.parse_args(argv)
    if args.command == "judge" and args.num_problems < 2:
        parser.error(f"--num-problems={args.num_problems} is invalid: allowed is an integer >= 2")
    target, draft = build(args.cache_dir, log=lambda line: print(line, file=sys.stderr, flush=True))
    if args.command == "judge":
        enc, target_model, _ = load_pair(target, draft)
        rows = judge_report(target_model, enc, args.num_problems)
        from parse_sglang.demo import table

        print(
            "\n".join(json.dumps(row) for row in rows)
            if args.json
            else table(list(rows[0]), [[str(v) for v in row.values()] for row in rows])
        )
    elif args.json:
        print(json.dumps({"target": str(target), "draft": str(draft)}))
    else:
        print(f"target: {target}\ndraft:  {draft}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
