"""The bench of record: PARSE beside SGLang's own speculators and the target alone, in engines, on graded workloads.

    python benchmarks/compare.py --suite humaneval|gsm|edit [--first K] [--num-problems N]
        [--rows ROW ...] [--batch 1 8 32] [--repeats 3] [--fixed-L 8] [--max-new-tokens 256]
        [--dtype bfloat16|float32] --out FILE.jsonl
        [--open-loop RATE [--open-loop-dataset custom|random] [--open-loop-input-len 256] [--seed 0]]
        [--replay-trace TRACE.json [--replay-machine MACHINE.json]]
        [--target DIR --draft DIR [--prompts FILE]] [--cache-dir DIR]
    python benchmarks/compare.py --merge A.jsonl [B.jsonl ...] [--replay-trace TRACE.json [--replay-machine MACHINE.json]]

ROWS (--rows: a subset, pass 0 in the order given; default all), greedy, SGLang's radix cache off in every row:
  target_only         the target alone; every ratio is to it
  standalone_3/5/8    SGLang's STANDALONE with the same draft, topk 1, 3 / 5 / 8 steps a round
                      (num_draft_tokens = steps + 1); 3 is SGLang's default
  ngram               SGLang's NGRAM at its defaults (no draft model: its C++ n-gram corpus,
                      `sglang.srt.speculative.cpp_ngram`, built at start-up)
  parse_default       PARSE with no PARSE settings at all (no --parse-config, no --speculative-num-steps)
  parse_fixed_L       PARSE {"adaptive": false} at --speculative-num-steps L (--fixed-L, default 8)
  parse_no_retrieval  PARSE {"retrieval": false}, the package's defaults otherwise
SGLANG_SPECULATORS (standalone_*, ngram) are what each PARSE row is also compared with.

WORKLOADS: the Qwen2.5-Coder pair (`parse_sglang.models`: Qwen2.5-Coder-1.5B-Instruct, its 0.5B
sibling as draft; fetched when not cached), chat template applied, on support/problems.py's suites:
  humaneval  HumanEval problems, graded by their tests in their own process
  gsm        GSM-symbolic problems, graded by the answer's last number
  edit       HumanEval's canonical solutions given back with an instruction to change them a little
             (`problems.edit_problems`), graded by the edit being there and the tests
Problems --first K .. K + N - 1 (--num-problems N). No tuning used problems from FIRST_UNTUNED on
(the defaults of --first): the project's tables used HumanEval 0-39 and GSM-symbolic 0-59 and
300-329 (benchmarks/README.md); the edit suite's problems are HumanEval's, so it starts at 40 too.
Problems K + N .. K + N + B - 1 (not in the set; B the largest --batch) are every engine's warm-ups.
--target/--draft: another pair on the suite's problems, or with --prompts FILE (a JSON list of
strings, chat template applied, ungraded; the warm-ups are WARM_UPS).

LOADS: --batch 1 sends the prompts one by one (each after the last has finished); --batch B > 1
sends them in closed batches of B (one generate call each, waiting for all B; the last batch holds
N mod B where B does not divide N; N >= B). --open-loop RATE instead: per row a server is launched
(`support.servers`, `sglang_cpu.launch_server` on a CPU) and SGLang's own client,
`python -m sglang.benchmark.serving` (what `python -m sglang.bench_serving` runs), sends N requests
at RATE per second as Poisson arrivals (`--request-rate`, seeded by --seed: the same schedule for
every row), greedy, from `--dataset-name custom` (the workload's questions, chat template applied,
stopping at EOS, at most --max-new-tokens; outputs graded) or `random` (token ids cut from
benchmarks/prompts_sharegpt.json, --open-loop-input-len in, --max-new-tokens out, EOS ignored:
SGLang's usual throughput test; ungraded). Its JSON result (`--output-file`) is parsed.

NOISE. Rows are interleaved: the run is --repeats passes, and pass r runs every row once in the
order rotated by r (ABC, BCA, CAB, ...), one engine at a time: each engine is started, warmed up
on the first warm-up prompt (at --max-new-tokens), and before each closed batch of B > 1 also on B
distinct warm-up prompts at a quarter of --max-new-tokens (an adaptive server keeps its costs per
batch size, as a server under a steady load has them; copies of one prompt would fill retrieval's
corpus and its keep rates with copies that keep everything), timed over the workload at each load,
shut down. A
row's ratio to target-only is paired by pass (its tokens/s over target-only's in the same pass and
load) and reported as the median over the passes with their min and max; each PARSE row is also
paired with the best SGLang speculator row of each pass.

CELLS (--out, JSON lines). Each (row, pass, load) is one line, appended as soon as it is measured;
a rerun with the same --out skips cells already there (cells with an error are measured again).
Per cell: the workload (suite, first, num_problems, max_new_tokens, dtype, target, draft), `row`,
`L` (the steps of standalone_* and parse_fixed_L), `load` ("batch" or "open"), `batch` / `rate`,
`repeat` (the pass), `position` (its place in the pass) and `pass_order`; `wall_s`, `output_tokens`,
`tokens_per_s` (open loop: also `mean_latency_s`, `accept_length` as the client reports it,
`completed`, `errors`, `order_checked`); `target_forwards` (one prefill and one forward per decode step or verify pass,
from each response's meta_info: `spec_verify_ct`, else its completion tokens) and
`tokens_per_target_forward`; `verify_passes` (SGLang's per-request `spec_verify_ct`, summed);
`parse` (PARSE rows: the server totals the cell added, `get_server_info()["internal_states"][0]
["parse"]`, docs/serving.md "Counters") and `mean_L`; `output_ids` (open loop: `output_texts`) and
`correct`; `lossless` (whether the row's outputs must equal target-only's); `replay` (below);
`error` (null, or why the row could not run); `command` and `commit` (git HEAD, "+dirty" with
uncommitted changes).

--merge A.jsonl ...: the tables (markdown), one per (suite, dtype, max_new_tokens, load, batch or
rate). Cells of several files with the same setup but different problem ranges (shards by
--first / --num-problems) are summed per (row, pass) over the ranges every row of the table has
for that pass. Columns: tokens/s (median over passes), × target-only median (min-max), × the best
SGLang speculator (PARSE rows; which row that is, by median), tokens per target forward, mean L,
outputs equal to target-only's (same pass and load, counted over all passes), correct, and with a
replay column its prediction and prediction / engine. An open loop's table has the mean latency
in place of tokens/s and its ratios are of 1 / mean latency (every row serves the same arrivals,
so its tokens/s is about theirs while it keeps up). With --replay-trace, the PARSE cells of the
trace's problems have their replay column priced again under --replay-machine (a machine file
profiled after the run); the other cells keep theirs.

REPLAY (--replay-trace TRACE --replay-machine MACHINE, default benchmarks/machines/cpu-qwen.json):
beside each PARSE cell, `parse_sglang.replay`'s predicted ratio to target-only for the row's
ParseConfig at the cell's load (batch 1: "one_by_one", batch B: "batch:B", open loop: "open:F" at
the same arrival rate), warmed up as the engine is: the trace's first request alone, then a pass of
the load (`replay(first_alone=True)`). The trace must be of the same problems (benchmarks/trace.py --pair
qwen-humaneval|qwen-gsm|qwen-edit --first K --count N --max-new-tokens M); --prompts has none. The
replay prices PARSE's rounds, retrieval's copies among them where the trace holds token ids (what
trace.py records; an older trace without them predicts a row with retrieval on as without it, and
its cell says so); no STANDALONE or NGRAM rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Iterable, Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this checkout's parse_sglang and support

from parse_sglang.demo import chat_prompt_ids, engine_kwargs, target_forwards  # noqa: E402
from parse_sglang.settings import ParseConfig, server_parse_config  # noqa: E402

ROWS = (
    "target_only",
    "standalone_3",
    "standalone_5",
    "standalone_8",
    "ngram",
    "parse_default",
    "parse_fixed_L",
    "parse_no_retrieval",
)
SGLANG_SPECULATORS = ("standalone_3", "standalone_5", "standalone_8", "ngram")
PARSE_ROWS = ("parse_default", "parse_fixed_L", "parse_no_retrieval")
SUITES = ("humaneval", "gsm", "edit")
FIRST_UNTUNED = {"humaneval": 40, "gsm": 60, "edit": 40}
WARM_UPS = tuple(  # --prompts' warm-ups, cycled where a batch is larger
    f"Write a Python function that returns {what}."
    for what in (
        "the n-th Fibonacci number",
        "the greatest common divisor of two integers",
        "whether a string is a palindrome",
        "the words of a sentence in reverse order",
        "the prime factors of an integer",
        "the running sums of a list",
        "the number of vowels in a string",
        "a list with its duplicates removed, in order",
    )
)
WINDOW_ROOM = 128  # KV slots a request needs beyond its prompt and output: the widest draft window
SETUP = ("suite", "first", "num_problems", "max_new_tokens", "dtype", "target", "draft")
DEFAULT_MACHINE = HERE / "machines" / "cpu-qwen.json"


def in_repo(path: str) -> str:
    """A file's path as a cell records it: relative to the checkout where it lies in it (no
    machine's paths in committed cells), else as given."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(HERE.parent)) if resolved.is_relative_to(HERE.parent) else str(path)


@dataclasses.dataclass
class Workload:
    """What every row serves: the pair, the prompts (chat-templated ids), the warm-up prompts, a grader."""

    suite: str | None  # None: --prompts
    first: int
    target: str
    draft: str
    dtype: str
    questions: list[str]
    prompt_ids: list[list[int]]
    warm_up_ids: list[list[int]]  # distinct prompts outside the set, at least the largest batch's (`warm_up_batch`)
    grade: Callable[[int, str], bool] | None  # (problem index, answer text) -> correct


def load_workload(args) -> Workload:
    """The pair (--target/--draft, else the Qwen2.5-Coder pair in --dtype) on --suite's problems or --prompts."""
    from transformers import AutoTokenizer

    if args.target:
        target, draft = args.target, args.draft
    else:
        from parse_sglang import models

        target, draft = (str(p) for p in models.pair_checkpoints("qwen2.5-coder", args.dtype, args.cache_dir))
    warm_ups = max(args.batch)
    if args.prompts:
        questions, grade = read_prompts(args.prompts), None
        warm_up = list(WARM_UPS)
    else:
        from support import problems

        texts, grade = problems.suite(args.suite, args.first, args.num_problems + warm_ups, args.cache_dir)
        if len(texts) < args.num_problems + warm_ups:
            raise ValueError(
                f"--first={args.first} --num-problems={args.num_problems} is invalid: {args.suite} has "
                f"{args.first + len(texts)} problems and the {warm_ups} past the set are the warm-ups"
            )
        questions, warm_up = texts[: args.num_problems], texts[args.num_problems :]
    ids = chat_prompt_ids(AutoTokenizer.from_pretrained(target), [*questions, *warm_up])
    suite = None if args.prompts else args.suite
    n = len(questions)
    return Workload(suite, args.first, target, draft, args.dtype, questions, ids[:n], ids[n:], grade)


def warm_up_batch(work: Workload, batch: int) -> list[list[int]]:
    """The prompts of a batch's warm-up: `batch` distinct ones (--prompts' WARM_UPS cycled past 8)."""
    return [work.warm_up_ids[i % len(work.warm_up_ids)] for i in range(batch)]


def read_prompts(path: str) -> list[str]:
    prompts = json.loads(Path(path).read_text())
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise ValueError(f"--prompts {path} is invalid: allowed is a JSON list of strings")
    return prompts


# ---- rows ----------------------------------------------------------------------------------------


def row_steps(row: str, fixed_L: int) -> int | None:
    """The L a row is named by: standalone's steps, parse_fixed_L's --fixed-L; None for the others."""
    if row.startswith("standalone_"):
        return int(row.split("_")[1])
    return fixed_L if row == "parse_fixed_L" else None


def row_parse_config(row: str, fixed_L: int) -> dict | None:
    """A PARSE row's --parse-config (None: none given, or not a PARSE row)."""
    return {"parse_fixed_L": {"adaptive": False}, "parse_no_retrieval": {"retrieval": False}}.get(row)


def row_settings(row: str, draft: str, fixed_L: int) -> dict:
    """The speculative part of a row's engine settings."""
    steps = row_steps(row, fixed_L)
    if row.startswith("standalone_"):
        return dict(
            speculative_algorithm="STANDALONE",
            speculative_draft_model_path=draft,
            speculative_num_steps=steps,
            speculative_eagle_topk=1,
            speculative_num_draft_tokens=steps + 1,
        )
    if row == "ngram":
        return dict(speculative_algorithm="NGRAM")
    if row in PARSE_ROWS:
        settings = dict(speculative_algorithm="PARSE", speculative_draft_model_path=draft)
        if steps is not None:
            settings["speculative_num_steps"] = steps
        config = row_parse_config(row, fixed_L)
        return {**settings, "parse_config": config} if config else settings
    return {}


def resolved_config(row: str, fixed_L: int) -> ParseConfig:
    """The ParseConfig a PARSE row's server resolves its settings to (the server's own resolution)."""
    config = row_parse_config(row, fixed_L)
    server = SimpleNamespace(_parse_config=json.dumps(config) if config else None)
    return server_parse_config(server, row_steps(row, fixed_L))


def row_lossless(row: str, fixed_L: int) -> bool:
    """Whether the row's greedy outputs must equal target-only's (in fp32): every row but a judging PARSE row."""
    return row not in PARSE_ROWS or not resolved_config(row, fixed_L).judge


def rotated(rows: Sequence[str], repeat: int) -> list[str]:
    """Pass `repeat`'s order: the rows rotated left by repeat (ABC, BCA, CAB, ...)."""
    k = repeat % len(rows)
    return [*rows[k:], *rows[:k]]


def base_settings(work: Workload, requests: int, max_new_tokens: int, cuda: bool) -> dict:
    """Engine settings every row shares: the target, its dtype, room for `requests` at once."""
    kwargs = engine_kwargs(work.target, cuda)
    longest = max(len(ids) for ids in [*work.prompt_ids, *work.warm_up_ids])
    kwargs.update(dtype=work.dtype, disable_radix_cache=True, max_running_requests=requests)
    if not cuda:
        kwargs["max_total_tokens"] = max(8192, requests * (longest + max_new_tokens + WINDOW_ROOM))
    return kwargs


# ---- measuring -----------------------------------------------------------------------------------


def parse_totals(info: dict) -> dict:
    return info["internal_states"][0].get("parse") or {}


def counters_added(before: dict, after: dict) -> dict:
    """The integer server counters a cell added (after - before)."""
    counted = {k: v for k, v in after.items() if isinstance(v, int) and not isinstance(v, bool) and k != "dp_rank"}
    return {k: v - before.get(k, 0) for k, v in counted.items()}


def measure_closed(engine, work: Workload, batch: int, max_new_tokens: int, clock=time.perf_counter) -> dict:
    """The prompts one by one (batch 1) or in closed batches of `batch`: outputs, counters, wall time."""
    sampling = {"temperature": 0.0, "max_new_tokens": max_new_tokens}
    before = parse_totals(engine.get_server_info())
    outs, start = [], clock()
    for i in range(0, len(work.prompt_ids), batch):
        if batch == 1:
            outs.append(engine.generate(input_ids=work.prompt_ids[i], sampling_params=sampling))
        else:
            outs += engine.generate(input_ids=work.prompt_ids[i : i + batch], sampling_params=sampling)
    wall = clock() - start
    added = counters_added(before, parse_totals(engine.get_server_info()))
    metas = [o["meta_info"] for o in outs]
    tokens, forwards = sum(m["completion_tokens"] for m in metas), sum(target_forwards(m) for m in metas)
    return {
        "wall_s": wall,
        "output_tokens": tokens,
        "tokens_per_s": tokens / wall if wall > 0 else None,
        "target_forwards": forwards,
        "tokens_per_target_forward": tokens / forwards if forwards else None,
        "verify_passes": sum(m.get("spec_verify_ct", 0) for m in metas),
        "parse": added or None,
        "mean_L": added["draft_length"] / added["rounds"] if added.get("rounds") else None,
        "output_ids": [o["output_ids"] for o in outs],
        "correct": grade_all(work, [o["text"] for o in outs]),
    }


def grade_all(work: Workload, texts: Sequence[str]) -> list[bool] | None:
    return None if work.grade is None else [bool(work.grade(i, text)) for i, text in enumerate(texts)]


@contextlib.contextmanager
def engine_of(settings: dict):
    """An in-process sglang.Engine with `settings`, shut down on exit."""
    import sglang

    engine = sglang.Engine(**settings)
    try:
        yield engine
    finally:
        engine.shutdown()


@contextlib.contextmanager
def server_of(settings: dict, log_dir: str, cuda: bool):
    """A launched server with `settings` (`support.servers`), stopped on exit."""
    from support.servers import ServedEngine, launch, sigterm_exits, stop, wait_healthy

    module = "sglang.launch_server" if cuda else "sglang_cpu.launch_server"
    log = Path(log_dir) / "server.log"
    with sigterm_exits():
        proc, url = launch([sys.executable, "-m", module], {**settings, "log_level_http": "info"}, log, timeout=600)
        try:
            wait_healthy(proc, url, log, timeout=600)
            yield ServedEngine(url)
        finally:
            stop(proc)


def open_loop_command(url: str, work: Workload, args, data: str, out: str) -> list[str]:
    """`python -m sglang.benchmark.serving` against `url`: N requests at --open-loop per second."""
    command = [
        sys.executable,
        "-m",
        "sglang.benchmark.serving",
        "--backend",
        "sglang",
        "--base-url",
        url,
        "--tokenizer",
        work.target,
        "--num-prompts",
        str(len(work.prompt_ids)),
        "--request-rate",
        str(args.open_loop),
        "--seed",
        str(args.seed),
        "--output-file",
        out,
        "--output-details",
        "--warmup-requests",
        "0",
        "--disable-tqdm",
        "--dataset-name",
        args.open_loop_dataset,
    ]
    if args.open_loop_dataset == "custom":
        return command + [
            "--dataset-path",
            data,
            "--apply-chat-template",
            "--sharegpt-output-len",
            str(args.max_new_tokens),
            "--disable-ignore-eos",
        ]
    return command + [
        "--dataset-path",
        str(HERE / "prompts_sharegpt.json"),
        "--random-input-len",
        str(args.open_loop_input_len),
        "--random-output-len",
        str(args.max_new_tokens),
        "--random-range-ratio",
        "1",
    ]


def custom_order(count: int, seed: int) -> list[int]:
    """The problems in the order `--dataset-name custom` sends them: its rows shuffled by
    `random.shuffle` right after `random.seed(--seed)` (sglang.benchmark.serving)."""
    order = list(range(count))
    random.Random(seed).shuffle(order)
    return order


def measure_open(server, work: Workload, args, folder: str) -> dict:
    """One open-loop run of sglang.benchmark.serving against `server`, its JSON result and PARSE's counters."""
    data, out = Path(folder) / "custom.jsonl", Path(folder) / "result.jsonl"
    data.write_text(
        "".join(
            json.dumps({"conversations": [{"role": "user", "content": q}, {"role": "assistant", "content": "-"}]})
            + "\n"
            for q in work.questions
        )
    )
    out.unlink(missing_ok=True)
    before = parse_totals(server.get_server_info())
    done = subprocess.run(
        open_loop_command(server.url, work, args, str(data), str(out)),
        capture_output=True,
        text=True,
        timeout=24 * 3600,
    )
    if done.returncode != 0 or not out.is_file():
        raise RuntimeError(f"sglang.benchmark.serving exited with {done.returncode}: {done.stderr[-3000:]}")
    result = json.loads(out.read_text().splitlines()[-1])
    added = counters_added(before, parse_totals(server.get_server_info()))
    texts, order = result["generated_texts"], custom_order(len(work.questions), args.seed)
    # The order is checked against the prompt lengths the client counted (the chat template's ids).
    in_order = args.open_loop_dataset == "custom" and result["input_lens"] == [len(work.prompt_ids[i]) for i in order]
    correct = None
    if in_order and work.grade is not None:
        correct = [False] * len(texts)
        for text, i in zip(texts, order):
            correct[i] = bool(work.grade(i, text))
    return {
        "wall_s": result["duration"],
        "output_tokens": result["total_output_tokens"],
        "tokens_per_s": result["output_throughput"],
        "completed": result["completed"],
        "mean_latency_s": result["mean_e2e_latency_ms"] / 1000,
        "accept_length": result.get("accept_length"),
        "parse": added or None,
        "mean_L": added["draft_length"] / added["rounds"] if added.get("rounds") else None,
        "output_texts": texts,  # in the client's order, the same for every row (same --seed)
        "order_checked": in_order,  # custom: the client's prompt lengths are those of custom_order's problems
        "correct": correct,
        "errors": [e for e in result.get("errors", []) if e],
    }


# ---- the replay column ---------------------------------------------------------------------------


class ReplayColumn:
    """parse_sglang.replay's predicted ratio to target-only for a PARSE row's config at a cell's load."""

    def __init__(self, trace_path: str, machine_path: str, work: Workload, args):
        from parse_sglang.replay import Machine, Trace

        wanted = {"humaneval": "qwen-humaneval", "gsm": "qwen-gsm", "edit": "qwen-edit"}.get(work.suite)
        raw = json.loads(Path(trace_path).read_text())
        record = (
            f"benchmarks/trace.py --pair {wanted or 'qwen-humaneval|qwen-gsm|qwen-edit'} --first {args.first} --count "
            f"{args.num_problems} --max-new-tokens {args.max_new_tokens}"
        )
        if wanted is None:
            raise ValueError(
                f"--replay-trace {trace_path}: the replay needs a trace of the same problems, which "
                f"benchmarks/trace.py records for the suites only ({record}); this workload "
                "has none: run without --replay-trace"
            )
        got = (raw.get("pair"), raw.get("first"), len(raw.get("requests", [])), raw.get("max_new_tokens"))
        if got != (wanted, args.first, args.num_problems, args.max_new_tokens):
            raise ValueError(
                f"--replay-trace {trace_path} is of pair {got[0]}, problems {got[1]} .. "
                f"{(got[1] or 0) + got[2] - 1}, {got[3]} new tokens: allowed is a trace of these "
                f"cells' problems, recorded with {record}"
            )
        self.trace, self.machine = Trace.load(trace_path), Machine.load(machine_path)
        self.paths, self.cache = {"trace": in_repo(trace_path), "machine": in_repo(machine_path)}, {}

    def predict(self, row: str, fixed_L: int, batch: int | None, rate: float | None) -> dict | None:
        if row not in PARSE_ROWS:
            return None
        key = (row, fixed_L, batch, rate)
        if key not in self.cache:
            from parse_sglang.replay import open_rate, replay

            config = resolved_config(row, fixed_L)
            if rate is not None:
                per_f = open_rate(self.trace, self.machine, "open:1", config)  # arrivals a second at F = 1
                load = f"open:{rate / per_f}"
            else:
                load = "one_by_one" if batch == 1 else f"batch:{batch}"
            L = config.draft_budget
            policy = "adaptive" if config.adaptive else f"fixed {L}"
            retrieves = config.adaptive and getattr(config, "retrieval", False)  # retrieval is an adaptive server's
            unpriced = retrieves and not self.trace.has_ids  # copies need the trace's token ids
            note = "retrieval not modelled (a trace without token ids): predicted without it" if unpriced else None
            try:
                row = replay(self.trace, self.machine, load, config, [L], oracle=False, first_alone=True)
                x_target = row[policy]["x_target"]
            except Exception as err:  # noqa: BLE001 (the replay failing on a config is the cell's to report)
                x_target, note = None, f"the replay failed: {type(err).__name__}: {err}"
            self.cache[key] = {**self.paths, "load": load, "policy": policy, "x_target": x_target, "note": note}
        return self.cache[key]


def repriced(cells: list[dict], trace_path: str, machine_path: str) -> list[dict]:
    """`cells` with the replay column of each PARSE cell of the trace's problems priced under
    `machine_path` (copies; the other cells as they are)."""
    columns, out = {}, []
    for cell in cells:
        setup = (cell["suite"], cell["first"], cell["num_problems"], cell["max_new_tokens"])
        if cell["row"] in PARSE_ROWS and cell.get("error") is None and setup not in columns:
            shape = SimpleNamespace(first=cell["first"], num_problems=cell["num_problems"], max_new_tokens=setup[3])
            try:
                columns[setup] = ReplayColumn(trace_path, machine_path, SimpleNamespace(suite=setup[0]), shape)
            except ValueError:  # a trace of other problems: not these cells'
                columns[setup] = None
        column = columns.get(setup) if cell["row"] in PARSE_ROWS else None
        if column is not None:
            cell = {**cell, "replay": column.predict(cell["row"], cell["L"], cell["batch"], cell["rate"])}
        out.append(cell)
    return out


# ---- a run ---------------------------------------------------------------------------------------


def git_commit() -> str | None:
    """HEAD of this checkout, with "+dirty" where tracked files differ from it (a run's own untracked
    outputs, its cells and traces, are not a change of the code); None outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True, check=True)
        status = ["git", "status", "--porcelain", "--untracked-files=no"]
        dirty = subprocess.run(status, cwd=HERE, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def read_cells(paths: Iterable[str]) -> list[dict]:
    return [
        json.loads(line)
        for path in paths
        if Path(path).is_file()
        for line in Path(path).read_text().splitlines()
        if line.strip()
    ]


def cell_key(cell: dict) -> tuple:
    return (
        *(cell[k] for k in SETUP),
        cell["row"],
        cell["L"],
        cell["load"],
        cell["batch"],
        cell["rate"],
        cell["repeat"],
    )


def loads_of(args) -> list[tuple[str, int | None, float | None]]:
    """(load, batch, rate) of every cell a row gets in a pass."""
    if args.open_loop is not None:
        return [("open", None, args.open_loop)]
    return [("batch", b, None) for b in args.batch]


def workload_setup(args, work: Workload) -> dict:
    """The settings of a cell that name its workload: suite, problems (first, count),
    max_new_tokens and dtype (main's table keeps the cells of --out with these)."""
    return dict(
        suite=work.suite,
        first=work.first,
        num_problems=len(work.prompt_ids),
        max_new_tokens=args.max_new_tokens,
        dtype=work.dtype,
    )


def run(args, work: Workload, progress=lambda line: print(line, file=sys.stderr, flush=True)) -> list[dict]:
    """Every pass, every row once in the pass's rotated order, each cell not already in --out
    measured and appended there at once; returns the cells measured."""
    import torch

    cuda = torch.cuda.is_available()
    done = {cell_key(c) for c in read_cells([args.out]) if c.get("error") is None}
    replay_column = ReplayColumn(args.replay_trace, args.replay_machine, work, args) if args.replay_trace else None
    requests = len(work.prompt_ids) if args.open_loop is not None else max(args.batch)
    base = base_settings(work, requests, args.max_new_tokens, cuda)
    setup = dict(workload_setup(args, work), target=Path(work.target).name, draft=Path(work.draft).name)
    common = dict(command=args.command, commit=git_commit())
    measured = []
    for repeat in range(args.repeats):
        order = rotated(args.rows, repeat)
        for position, row in enumerate(order):
            L = row_steps(row, args.fixed_L)
            cells = [
                dict(
                    setup,
                    row=row,
                    L=L,
                    load=load,
                    batch=batch,
                    rate=rate,
                    repeat=repeat,
                    position=position,
                    pass_order=order,
                )
                for load, batch, rate in loads_of(args)
            ]
            cells = [c for c in cells if cell_key(c) not in done]
            if not cells:
                continue
            progress(f"pass {repeat + 1}/{args.repeats}, row {position + 1}/{len(order)}: {row}")
            for cell in measure_row(row, cells, base, work, args, cuda, progress):
                cell.update(common, lossless=None, replay=None)
                if cell.get("error") is None:
                    cell["lossless"] = row_lossless(row, args.fixed_L)
                    if replay_column is not None:
                        cell["replay"] = replay_column.predict(row, args.fixed_L, cell["batch"], cell["rate"])
                with open(args.out, "a") as out:
                    out.write(json.dumps(cell) + "\n")
                measured.append(cell)
    return measured


def measure_row(row: str, cells: list[dict], base: dict, work: Workload, args, cuda: bool, progress) -> list[dict]:
    """One engine (or server, for the open loop) of `row`: started, warmed up, each cell timed, shut
    down. Where the row cannot run, each cell records why."""
    settings = {**base, **row_settings(row, work.draft, args.fixed_L)}
    warm = {"temperature": 0.0, "max_new_tokens": args.max_new_tokens}
    out = []
    try:
        with contextlib.ExitStack() as stack:
            if args.open_loop is not None:
                folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="compare-"))
                engine = stack.enter_context(server_of(settings, folder, cuda))
            else:
                engine = stack.enter_context(engine_of(settings))
            engine.generate(input_ids=work.warm_up_ids[0], sampling_params=warm)
            for cell in cells:
                if args.open_loop is not None:
                    got = measure_open(engine, work, args, folder)
                else:
                    if cell["batch"] > 1:
                        short = {**warm, "max_new_tokens": max(args.max_new_tokens // 4, 1)}
                        engine.generate(input_ids=warm_up_batch(work, cell["batch"]), sampling_params=short)
                    got = measure_closed(engine, work, cell["batch"], args.max_new_tokens)
                out.append(dict(cell, **got, error=None))
                progress(
                    f"  {row} {cell['load']} {cell['batch'] or cell['rate']}: {got['tokens_per_s'] or 0:.2f} "
                    f"tokens/s, {got['output_tokens']} tokens in {got['wall_s']:.1f} s"
                )
    except Exception as err:  # noqa: BLE001 (a row that cannot run here is a result: its cells say why)
        error = f"{type(err).__name__}: {err}"[-2000:]
        progress(f"  {row} failed: {error}")
        out += [dict(cell, error=error) for cell in cells[len(out) :]]
    return out


# ---- tables --------------------------------------------------------------------------------------


def row_name(cell: dict) -> str:
    return f"parse_fixed_{cell['L']}" if cell["row"] == "parse_fixed_L" else cell["row"]


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def combine(cells: list[dict]) -> dict:
    """One (row, pass) over several problem ranges: totals added, per-problem lists joined in range order."""
    cells = sorted(cells, key=lambda c: c["first"])
    joined = dict(cells[0])
    for key in ("wall_s", "output_tokens", "target_forwards"):
        values = [c.get(key) for c in cells]
        joined[key] = None if None in values else sum(values)
    for key in ("output_ids", "output_texts", "correct"):
        values = [c.get(key) for c in cells]
        joined[key] = None if None in values else [x for v in values for x in v]
    parse = [c.get("parse") or {} for c in cells]
    joined["parse"] = {k: sum(p.get(k, 0) for p in parse) for k in parse[0]} or None
    joined["mean_L"] = (
        joined["parse"]["draft_length"] / joined["parse"]["rounds"]
        if joined["parse"] and joined["parse"].get("rounds")
        else None
    )
    # (open loops of several ranges ran apart: their throughput is the tokens over the summed durations)
    joined["tokens_per_s"] = joined["output_tokens"] / joined["wall_s"] if joined["wall_s"] else None
    joined["tokens_per_target_forward"] = (
        joined["output_tokens"] / joined["target_forwards"] if joined.get("target_forwards") else None
    )
    if all(c.get("mean_latency_s") is not None and c.get("completed") for c in cells):  # open loops: per request
        done = sum(c["completed"] for c in cells)
        joined["mean_latency_s"] = sum(c["mean_latency_s"] * c["completed"] for c in cells) / done
    joined["ranges"] = [(c["first"], c["num_problems"]) for c in cells]
    return joined


def speed(cell: dict) -> float:
    """What a row's ratios compare: tokens/s in closed batches; in an open loop, whose throughput is
    its arrivals' while the server keeps up, 1 / mean latency."""
    return 1.0 / cell["mean_latency_s"] if cell["load"] == "open" else cell["tokens_per_s"]


def group_cells(cells: list[dict]) -> dict:
    """{table key: {row name: {repeat: cell over the table's problem ranges}}} (errors kept apart)."""
    tables: dict = {}
    for cell in cells:
        table = (cell["suite"], cell["dtype"], cell["max_new_tokens"], cell["load"], cell["batch"], cell["rate"])
        name = row_name(cell)
        runs = tables.setdefault(table, {}).setdefault(name, {}).setdefault(cell["repeat"], {})
        runs.setdefault((cell["first"], cell["num_problems"]), cell)  # a duplicate of a cell: the first kept
    out = {}
    for table, rows in tables.items():
        out[table] = {}
        for name, repeats in rows.items():
            out[table][name] = {}
            for repeat, ranges in repeats.items():
                good = [c for c in ranges.values() if c.get("error") is None]
                if not good:
                    out[table][name][repeat] = {"error": next(iter(ranges.values()))["error"], "ranges": list(ranges)}
                    continue
                out[table][name][repeat] = dict(ranges=sorted(ranges), cells=good)
    for rows in out.values():
        for repeats in rows.values():
            for repeat, entry in repeats.items():
                if "cells" in entry:
                    repeats[repeat] = combine(entry["cells"])
    return out


def table_rows(rows: dict) -> list[dict]:
    """Each row's figures over the passes every row it is paired with has (same problem ranges)."""
    order = sorted(rows, key=lambda n: (ROWS.index(n) if n in ROWS else ROWS.index("parse_fixed_L"), n))
    base = rows.get("target_only", {})
    out = []
    for name in order:
        repeats = rows[name]
        good = {r: c for r, c in repeats.items() if c.get("error") is None}
        entry = {"row": name, "passes": len(good), "error": None}
        if not good:
            entry["error"] = next(iter(repeats.values()))["error"]
            out.append(entry)
            continue
        cells = [good[r] for r in sorted(good)]
        entry["tokens_per_s"] = [c["tokens_per_s"] for c in cells]
        paired = [
            (c, base[r])
            for r, c in sorted(good.items())
            if r in base and base[r].get("error") is None and base[r]["ranges"] == c["ranges"]
        ]
        entry["x_target"] = [speed(c) / speed(b) for c, b in paired]
        if cells[0]["load"] == "open":
            entry["mean_latency_s"] = [c["mean_latency_s"] for c in cells]
        equal = same = 0
        for c, b in paired:
            for key in ("output_ids", "output_texts"):
                if c.get(key) is not None and b.get(key) is not None:
                    equal += sum(x == y for x, y in zip(c[key], b[key]))
                    same += len(c[key])
        entry["outputs_equal"] = f"{equal}/{same}" if same else "-"
        correct = [x for c in cells if c.get("correct") is not None for x in c["correct"]]
        entry["correct"] = f"{sum(correct)}/{len(correct)}" if correct else "-"
        tpf = [c["tokens_per_target_forward"] for c in cells if c.get("tokens_per_target_forward")]
        entry["tokens_per_target_forward"] = statistics.median(tpf) if tpf else None
        mean_L = [c["mean_L"] for c in cells if c.get("mean_L") is not None]
        entry["mean_L"] = statistics.median(mean_L) if mean_L else None
        entry["x_best_sglang"], entry["best_sglang"] = None, None
        if name.startswith("parse_"):
            sglang = {n: rows[n] for n in rows if n in SGLANG_SPECULATORS}
            ratios, best = [], {}
            for r, c in sorted(good.items()):
                peers = {
                    n: s[r]
                    for n, s in sglang.items()
                    if r in s and s[r].get("error") is None and s[r]["ranges"] == c["ranges"]
                }
                if peers:
                    top = max(peers, key=lambda n: speed(peers[n]))
                    best[top] = best.get(top, 0) + 1
                    ratios.append(speed(c) / speed(peers[top]))
            entry["x_best_sglang"] = ratios
            entry["best_sglang"] = max(best, key=best.get) if best else None
        replay = [c["replay"]["x_target"] for c in cells if c.get("replay") and c["replay"]["x_target"] is not None]
        entry["replay_x_target"] = statistics.median(replay) if replay else None
        entry["replay_note"] = next((c["replay"]["note"] for c in cells if c.get("replay")), None)
        out.append(entry)
    return out


TABLE_COLUMNS = (
    "row",
    "passes",
    "tokens/s",
    "× target-only",
    "× best SGLang",
    "best SGLang row",
    "tokens / target forward",
    "mean L",
    "outputs = target-only",
    "correct",
    "replay × target-only",
    "replay / engine",
)


def fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def markdown(cells: list[dict]) -> str:
    """Every table of `cells` (module docstring, --merge), markdown."""
    parts = []
    for (suite, dtype, new, load, batch, rate), rows in sorted(group_cells(cells).items(), key=str):
        ranges = sorted({rng for repeats in rows.values() for c in repeats.values() for rng in c["ranges"]})
        problems = ", ".join(f"{f}-{f + n - 1}" for f, n in ranges)
        shown = f"batch {batch}" if load == "batch" else f"open loop at {rate} requests/s (ratios by mean latency)"
        parts.append(f"### {suite or 'prompts'}, {shown} ({dtype}, problems {problems}, at most {new} new tokens)\n")
        columns = TABLE_COLUMNS if load == "batch" else ("row", "passes", "mean latency s", *TABLE_COLUMNS[3:])
        parts.append("| " + " | ".join(columns) + " |\n|" + " --- |" * len(columns))
        notes = []
        for e in table_rows(rows):
            if e["error"]:
                parts.append(
                    f"| {e['row']} | 0 | could not run: {e['error'][:300]} |" + " - |" * (len(TABLE_COLUMNS) - 3)
                )
                continue
            engine = statistics.median(e["x_target"]) if e["x_target"] else None
            replay = e["replay_x_target"]
            cells_ = [
                e["row"],
                e["passes"],
                fmt(statistics.median(e.get("mean_latency_s") or e["tokens_per_s"])),
                spread(e["x_target"]) if e["row"] != "target_only" else "1.000",
                spread(e["x_best_sglang"]) if e["x_best_sglang"] else "-",
                e["best_sglang"] or "-",
                fmt(e["tokens_per_target_forward"]),
                fmt(e["mean_L"]),
                e["outputs_equal"],
                e["correct"],
                fmt(replay, 3),
                fmt(replay / engine, 3) if replay and engine else "-",
            ]
            parts.append("| " + " | ".join(map(str, cells_)) + " |")
            if e["replay_note"]:
                notes.append(f"{e['row']}: replay {e['replay_note']}")
        parts.append("\n".join(f"- {n}" for n in notes) + ("\n" if notes else ""))
    return "\n".join(parts)


# ---- command line --------------------------------------------------------------------------------


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python benchmarks/compare.py", description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="humaneval", help=f"allowed: {', '.join(SUITES)}")
    parser.add_argument("--first", type=int, help="the first problem (default: FIRST_UNTUNED, no tuning used it)")
    parser.add_argument("--num-problems", type=int, default=16)
    parser.add_argument("--rows", nargs="+", default=list(ROWS), help=f"allowed: {', '.join(ROWS)}")
    parser.add_argument("--batch", nargs="+", type=int, default=[1], help="1: one by one; B: closed batches of B")
    parser.add_argument("--repeats", type=int, default=3, help="passes, each row once a pass in rotated order")
    parser.add_argument("--fixed-L", type=int, default=8, help="parse_fixed_L's --speculative-num-steps")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--dtype", default="bfloat16", help="allowed: bfloat16, float32")
    parser.add_argument("--out", help="the cells, JSON lines (appended; a rerun skips those already there)")
    parser.add_argument("--open-loop", type=float, metavar="RATE", help="requests/s of a Poisson open loop")
    parser.add_argument("--open-loop-dataset", default="custom", help="allowed: custom, random")
    parser.add_argument("--open-loop-input-len", type=int, default=256, help="prompt tokens (random dataset)")
    parser.add_argument("--seed", type=int, default=0, help="the open loop's seed (arrivals, order)")
    parser.add_argument("--replay-trace", help="a trace of the same problems (benchmarks/trace.py)")
    parser.add_argument("--replay-machine", default=str(DEFAULT_MACHINE), help="the replay's machine file")
    parser.add_argument("--target", help="another target (with --draft)")
    parser.add_argument("--draft")
    parser.add_argument("--prompts", help="a JSON list of prompts instead of a suite (with --target/--draft)")
    parser.add_argument("--cache-dir", help="cache root of fetched models and problems")
    parser.add_argument("--merge", nargs="+", metavar="JSONL", help="run nothing: print the tables of these cells")
    args = parser.parse_args(argv)
    args.command = " ".join(["python benchmarks/compare.py", *(sys.argv[1:] if argv is None else argv)])
    if args.merge:
        return args
    for flag, value, allowed in (
        ("suite", [args.suite], SUITES),
        ("rows", args.rows, ROWS),
        ("dtype", [args.dtype], ("bfloat16", "float32")),
        ("open-loop-dataset", [args.open_loop_dataset], ("custom", "random")),
    ):
        for v in value:
            if v not in allowed:
                parser.error(f"--{flag}={v} is invalid: allowed is one of {', '.join(allowed)}")
    args.rows = list(dict.fromkeys(args.rows))
    if args.first is None:
        args.first = 0 if args.prompts else FIRST_UNTUNED[args.suite]
    for flag, value, low in (
        ("num-problems", args.num_problems, 1),
        ("repeats", args.repeats, 1),
        ("fixed-L", args.fixed_L, 1),
        ("max-new-tokens", args.max_new_tokens, 4),
        ("first", args.first, 0),
        ("open-loop-input-len", args.open_loop_input_len, 2),
        *(("batch", b, 1) for b in args.batch),
    ):
        if value < low:
            parser.error(f"--{flag}={value} is invalid: allowed is an integer >= {low}")
    if args.open_loop is not None and args.open_loop <= 0:
        parser.error(f"--open-loop={args.open_loop} is invalid: allowed is a rate > 0 (requests per second)")
    if not args.out:
        parser.error("--out is required (the cells' JSON lines; a rerun resumes there)")
    if (args.target is None) != (args.draft is None) or (args.prompts and not args.target):
        parser.error("--target and --draft go together, and --prompts needs them")
    args.batch = sorted(set(args.batch))
    if args.prompts:
        args.num_problems = len(read_prompts(args.prompts))
    if args.open_loop is None and max(args.batch) > args.num_problems:
        parser.error(
            f"--batch={max(args.batch)} is invalid: allowed is at most --num-problems ({args.num_problems}): "
            "a closed batch of B needs B prompts"
        )
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.merge:
        cells = read_cells(args.merge)
        print(markdown(repriced(cells, args.replay_trace, args.replay_machine) if args.replay_trace else cells))
        return 0
    import torch

    if not torch.cuda.is_available():
        import sglang_cpu

        sglang_cpu.enable()
    work = load_workload(args)
    try:
        run(args, work)
    except ValueError as err:  # a replay trace that does not fit the cells
        print(f"error: {err}", file=sys.stderr)
        return 2
    setup = workload_setup(args, work)
    print(markdown([c for c in read_cells([args.out]) if all(c[k] == v for k, v in setup.items())]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
