"""The synthetic trained pair (support.synthetic, docs/testing.md §4): its task, its build and
cache, and the regime it stands in for (a draft that words things its own way but gets most
steps right). The pair is built once per test session into the cache (a few minutes on 2
cores the first time); the determinism check trains a cut-down recipe twice.
"""

from __future__ import annotations

import dataclasses

import pytest

from support import synthetic

EVAL_PROBLEMS = 60


@pytest.fixture(scope="session")
def synthetic_pair():
    return synthetic.build(log=lambda line: None)


@pytest.fixture(scope="session")
def loaded_pair(synthetic_pair):
    import torch

    torch.manual_seed(0)
    return synthetic.load_pair(*synthetic_pair)


def test_problems_are_deterministic_and_graded():
    first, again = synthetic.problems(synthetic.TEST_SEED, 20), synthetic.problems(synthetic.TEST_SEED, 20)
    assert first == again and first != synthetic.problems(synthetic.TEST_SEED + 1, 20)
    for problem in first:
        assert all(0 <= total <= synthetic.MAX_TOTAL for total in problem.totals)
        wordings = [synthetic.greedy_wording(synthetic.TARGET_PREFERS)] * (len(problem.events) + 1)
        solution = synthetic.write_solution(problem, wordings)
        assert solution.first_error is None and synthetic.grade(problem, solution.text)
        assert all(synthetic.step_results(problem, solution.text))
        wrong = synthetic.write_solution(problem, wordings, corrupt=(0, "result", 1))
        assert wrong.first_error is not None and not synthetic.grade(problem, wrong.text)
        assert synthetic.step_results(problem, wrong.text)[0] is False


def test_wordings_differ_but_say_the_same():
    problem = synthetic.problems(synthetic.TEST_SEED, 1)[0]
    texts = set()
    for prefers in (synthetic.TARGET_PREFERS, synthetic.DRAFT_PREFERS):
        wordings = [synthetic.greedy_wording(prefers)] * (len(problem.events) + 1)
        text = synthetic.write_solution(problem, wordings).text
        assert synthetic.grade(problem, text) and all(synthetic.step_results(problem, text))
        texts.add(text)
    assert len(texts) == 2


def test_roc_auc():
    assert synthetic.roc_auc([0.1, 0.2, 0.8, 0.9], [False, False, True, True]) == 1.0
    assert synthetic.roc_auc([0.5, 0.5], [True, False]) == 0.5
    assert synthetic.roc_auc([0.9, 0.1, 0.4], [False, True, True]) == 0.0
    with pytest.raises(ValueError, match="at least one positive and one negative"):
        synthetic.roc_auc([0.1], [True])


def test_build_is_deterministic_and_cached(tmp_path):
    """Same recipe -> the same weights, bit for bit; a complete build is reused, not retrained."""
    recipe = dataclasses.replace(synthetic.RECIPE, steps_scale=0.01)
    target_a, draft_a = synthetic.build(tmp_path / "a", recipe, log=lambda line: None)
    target_b, draft_b = synthetic.build(tmp_path / "b", recipe, log=lambda line: None)
    assert synthetic.weights_hash(target_a) == synthetic.weights_hash(target_b)
    assert synthetic.weights_hash(draft_a) == synthetic.weights_hash(draft_b)
    assert synthetic.weights_hash(target_a) != synthetic.weights_hash(draft_a)
    logged = []
    assert synthetic.build(tmp_path / "a", recipe, log=logged.append) == (target_a, draft_a)
    assert logged == []  # found in the cache: nothing trained
    other = dataclasses.replace(recipe, seed=1)
    assert synthetic.pair_dir(tmp_path / "a", other) != synthetic.pair_dir(tmp_path / "a", recipe)


def test_cli_prints_the_cached_directories(synthetic_pair, capsys):
    assert synthetic.main(["build", "--json"]) == 0
    import json

    printed = json.loads(capsys.readouterr().out)
    assert printed == {"target": str(synthetic_pair[0]), "draft": str(synthetic_pair[1])}


def test_target_solves_and_draft_is_in_parses_regime(loaded_pair):
    """The target answers held-out problems; the draft gets most steps right (step accuracy
    >= 0.8) while agreeing with the target's next token at most 60% of the time."""
    enc, target, draft = loaded_pair
    items = synthetic.problems(synthetic.TEST_SEED, EVAL_PROBLEMS)
    target_texts = synthetic.greedy_outputs(target, enc, items)
    draft_texts = synthetic.greedy_outputs(draft, enc, items)
    target_accuracy = sum(map(synthetic.grade, items, target_texts)) / len(items)
    assert target_accuracy >= 0.9
    assert synthetic.step_accuracy(draft_texts, items) >= 0.8
    assert synthetic.step_accuracy(draft_texts, items) < synthetic.step_accuracy(target_texts, items)
    assert synthetic.token_agreement(target, draft, enc, items) <= 0.6


def test_models_load_as_plain_checkpoints(synthetic_pair):
    """Both directories are Llama checkpoints with the chat template, EOS and the shared
    tokenizer SGLang needs; the draft is several times cheaper per token."""
    from transformers import AutoConfig, AutoTokenizer

    target_cfg, draft_cfg = (AutoConfig.from_pretrained(d) for d in synthetic_pair)
    tokenizers = [AutoTokenizer.from_pretrained(d) for d in synthetic_pair]
    assert target_cfg.model_type == draft_cfg.model_type == "llama"
    assert target_cfg.vocab_size == draft_cfg.vocab_size == len(tokenizers[0])
    assert tokenizers[0].get_vocab() == tokenizers[1].get_vocab() and tokenizers[0].chat_template
    assert target_cfg.eos_token_id == tokenizers[0].convert_tokens_to_ids(synthetic.EOS_TOKEN)

    def per_token(cfg):  # matmul weights touched per token (embedding lookup excluded)
        layer = (
            2 * cfg.hidden_size * cfg.num_attention_heads * cfg.head_dim
            + 2 * cfg.hidden_size * cfg.num_key_value_heads * cfg.head_dim
            + 3 * cfg.hidden_size * cfg.intermediate_size
        )
        return cfg.num_hidden_layers * layer + cfg.hidden_size * cfg.vocab_size

    assert per_token(target_cfg) >= 3 * per_token(draft_cfg)


def test_judged_prefixes_of_one_kind(loaded_pair):
    """Held-out solutions to judge can carry one kind of false statement only: a wrong final
    answer makes only the last cut wrong; a wrong step makes every cut after it wrong."""
    enc = loaded_pair[0]
    answer = synthetic.judged_prefixes(synthetic.TEST_SEED, 40, enc, "answer")
    wrong = [labels for *_, labels in answer if not all(labels)]
    assert wrong and all(labels[:-1] == [True] * (len(labels) - 1) and not labels[-1] for labels in wrong)
    result = synthetic.judged_prefixes(synthetic.TEST_SEED, 40, enc, "result")
    wrong = [labels for *_, labels in result if not all(labels)]
    assert wrong and all(labels == sorted(labels, reverse=True) for labels in wrong)
    assert any(labels.count(False) > 1 for labels in wrong)
    with pytest.raises(ValueError, match="kind='size' is invalid: allowed is None or one of"):
        synthetic.judged_prefixes(synthetic.TEST_SEED, 4, enc, "size")


def test_judge_cli_reports_each_kind(loaded_pair, capsys):
    """`python -m support.synthetic judge`: one row for the training mix and one per kind,
    each over every cut of judged_prefixes."""
    import json

    assert synthetic.main(["judge", "--num-problems", "12", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["kind"] for row in rows] == ["mix", *synthetic.CORRUPTIONS]
    for row in rows:
        kind = None if row["kind"] == "mix" else row["kind"]
        cuts = sum(
            len(cuts) for _, _, cuts, _ in synthetic.judged_prefixes(synthetic.TEST_SEED, 12, loaded_pair[0], kind)
        )
        assert row["prefixes"] == cuts
    # A wrong final answer makes only the last cut wrong, so "at the error" keeps every cut.
    answer = rows[-1]
    assert answer["kind"] == "answer" and answer["auc_at_error"] == answer["auc"]
    with pytest.raises(SystemExit):
        synthetic.main(["judge", "--num-problems", "1"])
