"""SGLang tier: SGLang's own tools with `--speculative-algorithm PARSE`, their commands unchanged,
and PARSE's counters where SGLang reports its own (`/metrics`, stream chunks, the decode log).

What makes the commands work unchanged is the start-up hook (`parse_sglang_startup`, a .pth
installed with the package), so they run in a Python that has it for this checkout: this one
if its installation of the package is this checkout (scripts/setup.sh: `pip install -e .`),
else a throwaway virtual environment that sees this machine's packages and into which this
checkout is installed in editable mode, offline (`pip install --no-deps --no-build-isolation
--no-index -e .`). Either way an editable install shipped the hook. Nothing is downloaded: the
benchmarks' `random` dataset takes its token ids from benchmarks/prompts_sharegpt.json
(`--dataset-path`; without it SGLang fetches ShareGPT from the hub) and `HF_HUB_OFFLINE=1`
turns any attempt into an error. The CPU runtime comes from `SGLANG_USE_CPU_ENGINE=1`.

- a fresh interpreter that imports only `sglang.srt.server_args` resolves
  `--speculative-algorithm PARSE --parse-config ...` without `load_plugins()`; `python -c pass`
  imports neither SGLang nor parse_sglang;
- `python -m sglang.benchmark.offline_throughput` (an in-process Engine): its result table, and
  each of SGLang's decode-log "accept len" figures equals PARSE's own for the same batches;
- one `python -m sglang.launch_server ... --enable-metrics --decode-log-interval 1` (PARSE, judge
  on): `python -m sglang.benchmark.serving --backend sglang --dataset-name random` against it
  reports the accept length of the server's PARSE totals; `/metrics` carries PARSE's counters
  and probe-score histogram, which grow by the requests' `meta_info["parse"]`; a stream's last
  chunk carries `meta_info["parse"]`; `benchmarks/semantic.py --url` measures its per-request rows
  paired, with a user's problems and grader.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from http_server import clean_env, launched_server

from conftest import CPU_FLAGS, parse_server_flags, probe_config
from parse_sglang.counters import COUNTERS, TOTALS
from parse_sglang.settings import parse_engine_kwargs

pytestmark = pytest.mark.sglang

REPO = Path(__file__).resolve().parents[1]
PROMPTS_JSON = REPO / "benchmarks" / "prompts_sharegpt.json"
CONFIG = probe_config(draft_budget=4, probe_stride=2, threshold=0.3)  # judge on: probes, judged tokens
NUM_PROMPTS, INPUT_LEN, OUTPUT_LEN = 4, 32, 24
TIMEOUT = 400  # seconds for one tool run; other jobs may share this machine's two cores
TOOL_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1"}

DECODE_LINE = re.compile(r"Decode batch, #running-req: (\d+),.* accept len: ([\d.]+),")
PARSE_LINE = re.compile(
    r"PARSE last 1 decode batches: (\d+) rounds, accept len ([\d.]+) .*\| since start: (\d+) requests, "
    r"(\d+) rounds, (\d+) tokens,"
)
RESULT_LINE = re.compile(r"^(Successful requests|Total generated tokens|Accept length):\s+(\S+)", re.M)


HOOK_CHECK = (
    "import sys; print('parse_sglang_startup' in sys.modules); import parse_sglang; print(parse_sglang.__file__)"
)


@pytest.fixture(scope="module")
def hook_python(tmp_path_factory) -> str:
    """A Python with this checkout installed in editable mode, start-up hook included."""
    venv = tmp_path_factory.mktemp("hook_venv")
    check = subprocess.run(
        [sys.executable, "-c", HOOK_CHECK], cwd=venv, env=clean_env(), capture_output=True, text=True
    )
    if check.stdout.split() == ["True", str(REPO / "parse_sglang" / "__init__.py")]:
        return sys.executable
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    install = [
        python,
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "-e",
        str(REPO),
        "-e",
        str(REPO / "cpu_runtime"),
    ]
    subprocess.run(install, check=True, capture_output=True, timeout=TIMEOUT)
    return python


def run_tool(python: str, args: list[str], cwd: Path) -> str:
    """`python <args>` from a clean environment plus TOOL_ENV; its stdout and stderr."""
    proc = subprocess.run(
        [python, *args], cwd=cwd, env=clean_env(**TOOL_ENV), capture_output=True, text=True, timeout=TIMEOUT
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    return output


def cpu_flags(target, draft) -> list[str]:
    """The tiny pair with PARSE on CPU, as command-line flags (what the README shows)."""
    return [
        *parse_server_flags(target, draft),
        "--speculative-num-steps",
        str(CONFIG.draft_budget),
        "--parse-config",
        json.dumps(parse_engine_kwargs(draft, CONFIG)["parse_config"]),
        *CPU_FLAGS,
        "--dtype",
        "float32",
        "--max-total-tokens",
        "4096",
        "--mem-fraction-static",
        "0.5",
        "--decode-log-interval",
        "1",
    ]


def random_dataset_flags() -> list[str]:
    return [
        "--dataset-name",
        "random",
        "--dataset-path",
        str(PROMPTS_JSON),
        "--num-prompts",
        str(NUM_PROMPTS),
        "--random-input-len",
        str(INPUT_LEN),
        "--random-output-len",
        str(OUTPUT_LEN),
        "--random-range-ratio",
        "1",
    ]


def result_table(output: str) -> dict:
    return {name: float(value) for name, value in RESULT_LINE.findall(output)}


# ----- registration in a fresh interpreter ------------------------------------------------

RESOLVE = """
import json, sys
from sglang.srt.server_args import prepare_server_args
from sglang.srt.arg_groups.overrides import resolving_view
import sglang.srt.plugins
server_args = prepare_server_args(sys.argv[1:])
server_args.resolve_once()
cfg = resolving_view(server_args)
print(json.dumps({
    "algorithm": cfg.speculative_algorithm, "num_draft_tokens": cfg.speculative_num_draft_tokens,
    "parse_config": server_args._parse_config, "plugins_loaded": sglang.srt.plugins._plugins_loaded,
    "half_imported_targets": [m for m in ("sglang.srt.managers.scheduler", "sglang.srt.managers.tokenizer_manager")
                              if m in sys.modules],
}))
"""


def test_fresh_interpreter_resolves_parse_without_load_plugins(hook_python, tiny_pair, tmp_path):
    out = run_tool(hook_python, ["-c", RESOLVE, *cpu_flags(*tiny_pair)], tmp_path)
    resolved = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    assert resolved["algorithm"] == "PARSE"
    assert resolved["num_draft_tokens"] == CONFIG.draft_budget + 1  # ParseSpecAlgo.handle_server_args ran
    assert json.loads(resolved["parse_config"]) == parse_engine_kwargs(tiny_pair[1], CONFIG)["parse_config"]
    assert json.loads(resolved["parse_config"])["threshold"] == 0.3
    assert resolved["plugins_loaded"] is False
    assert resolved["half_imported_targets"] == []  # nothing but server arguments was imported for PARSE

    # The hooks (the plug-in's and the CPU runtime's) import nothing else at start-up.
    ours = (
        "import sys; print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'sglang', 'parse_sglang', 'parse_sglang_startup', 'sglang_cpu', 'sglang_cpu_startup', 'torch'}))"
    )
    last = run_tool(hook_python, ["-c", ours], tmp_path).strip().splitlines()[-1]
    assert last == "['parse_sglang_startup', 'sglang_cpu_startup']"


# ----- python -m sglang.benchmark.offline_throughput --------------------------------------


def test_offline_throughput_reports_parse(hook_python, tiny_pair, tmp_path):
    args = [
        "-m",
        "sglang.benchmark.offline_throughput",
        *cpu_flags(*tiny_pair),
        *random_dataset_flags(),
        "--skip-warmup",
    ]
    out = run_tool(hook_python, args, tmp_path)
    table = result_table(out)
    assert table["Successful requests"] == NUM_PROMPTS
    assert table["Total generated tokens"] == NUM_PROMPTS * OUTPUT_LEN  # ignore_eos: every request ran to the end

    decode = DECODE_LINE.findall(out)
    parse = PARSE_LINE.findall(out)
    assert len(decode) == len(parse) > 1, out[-4000:]
    for (running, sglang_len), (rounds, parse_len, *_) in zip(decode, parse):
        assert (int(running), sglang_len) == (int(rounds), parse_len)  # the same batches, the same accept length
    requests_, rounds_, tokens = map(int, parse[-1][2:])
    assert requests_ == NUM_PROMPTS and rounds_ == sum(int(r) for r, *_ in parse)
    # Each request: the prefill's token, then the rounds' (the last round may overshoot max_new_tokens).
    generated = NUM_PROMPTS * OUTPUT_LEN
    assert generated <= requests_ + tokens < generated + NUM_PROMPTS * (CONFIG.draft_budget + 1)


# ----- one server: sglang.benchmark.serving, /metrics, streams -----------------------------


@pytest.fixture(scope="module")
def server(hook_python, tiny_pair, tmp_path_factory):
    target, draft = tiny_pair
    with launched_server(
        target,
        tmp_path_factory.mktemp("tools_server"),
        env=TOOL_ENV,
        timeout=600.0,
        python=hook_python,
        module="sglang.launch_server",  # SGLang's own command: the hook enables PARSE and the CPU runtime
        enable_metrics=True,
        decode_log_interval=1,  # SGLang folds accept lengths into /server_info at each decode log
        **parse_engine_kwargs(draft, CONFIG),
    ) as srv:
        yield srv


def server_totals(server) -> dict:
    info = requests.get(server.url + "/server_info", timeout=60).json()
    (state,) = info["internal_states"]
    return state


def test_serving_benchmark_reports_parse_accept_length(server, hook_python, tiny_pair, tmp_path):
    result_file = tmp_path / "serving.jsonl"
    host, port = server.url.removeprefix("http://").split(":")
    args = [
        "-m",
        "sglang.benchmark.serving",
        "--backend",
        "sglang",
        "--host",
        host,
        "--port",
        port,
        "--tokenizer",
        str(tiny_pair[0]),
        *random_dataset_flags(),
        "--output-file",
        str(result_file),
    ]
    out = run_tool(hook_python, args, tmp_path)
    result = json.loads(result_file.read_text().splitlines()[-1])
    state = server_totals(server)
    parse = state["parse"]
    assert result["completed"] == NUM_PROMPTS and result["total_output_tokens"] == NUM_PROMPTS * OUTPUT_LEN
    # The accept length the benchmark reports is SGLang's, and equals PARSE's tokens per round.
    assert result["accept_length"] == state["avg_spec_accept_length"] == parse["tokens_per_round"]
    assert result_table(out)["Accept length"] == round(parse["tokens_per_round"], 2)
    assert parse["requests"] >= NUM_PROMPTS and parse["judge_probes"] > 0


METRIC_LINE = re.compile(r"^(sglang:[a-z_]+)\{([^}]*)\} (\S+)$", re.M)


def scrape(server) -> dict:
    """/metrics as {name: value summed over label sets}, buckets keyed by their `le`."""
    text = requests.get(server.url + "/metrics", timeout=60).text
    values: dict = {}
    for name, labels, value in METRIC_LINE.findall(text):
        le = re.search(r'le="([^"]+)"', labels)
        key = (name, le.group(1)) if le else name
        values[key] = values.get(key, 0.0) + float(value)
    return values


def test_metrics_carry_parse_counters(server):
    before, totals_before = scrape(server), server_totals(server)["parse"]
    prompts = ["The river and the moon", "def f(x): return", "one two three four", "Step one: add"]
    params = {
        "max_new_tokens": 20,
        "temperature": 0.0,
        "ignore_eos": True,
        "custom_params": {"parse": {"return_probe_scores": True}},
    }
    outs = requests.post(server.url + "/generate", json={"text": prompts, "sampling_params": params}, timeout=TIMEOUT)
    assert outs.status_code == 200, outs.text[:2000]
    stats = [out["meta_info"]["parse"] for out in outs.json()]
    after, totals_after = scrape(server), server_totals(server)["parse"]

    def delta(name):
        return after.get(name, 0.0) - before.get(name, 0.0)

    summed = {name: sum(s[name] for s in stats) for name in COUNTERS}
    assert delta("sglang:parse_requests_total") == len(prompts)
    for name in COUNTERS:
        assert delta(f"sglang:parse_{name}_total") == summed[name], name
    assert 0 < delta("sglang:parse_verify_passes_total") <= summed["rounds"]  # one pass serves several requests
    for name in TOTALS:  # /metrics and /server_info count the same
        assert delta(f"sglang:parse_{name}_total") == totals_after[name] - totals_before[name], name
        assert after[f"sglang:parse_{name}_total"] == totals_after[name], name
    scores = [score for s in stats for round_ in s["probe_scores"] for _, score in round_["probes"]]
    assert len(scores) == summed["judge_probes"] > 0
    assert delta("sglang:parse_probe_score_count") == len(scores)
    assert delta("sglang:parse_probe_score_sum") == pytest.approx(sum(scores), abs=1e-6)
    assert delta(("sglang:parse_probe_score_bucket", "0.5")) == sum(score <= 0.5 for score in scores)
    assert delta(("sglang:parse_probe_score_bucket", "+Inf")) == len(scores)
    assert "sglang:spec_accept_length" in after  # SGLang's own speculative metrics, next to PARSE's


def test_stream_last_chunk_carries_parse_counters(server):
    payload = {"text": "The sun and the moon and the", "sampling_params": {"max_new_tokens": 24, "temperature": 0.0}}
    with requests.post(
        server.url + "/generate", json={**payload, "stream": True}, stream=True, timeout=TIMEOUT
    ) as reply:
        assert reply.status_code == 200
        chunks = [
            json.loads(line[len(b"data: ") :])
            for line in reply.iter_lines()
            if line.startswith(b"data: ") and line != b"data: [DONE]"
        ]
    assert len(chunks) > 2
    assert not any(isinstance(chunk["meta_info"].get("parse"), dict) for chunk in chunks[:-1])
    last = chunks[-1]["meta_info"]
    assert last["finish_reason"] is not None and set(last["parse"]) == set(COUNTERS)
    assert last["parse"]["rounds"] == last["spec_verify_ct"]
    whole = requests.post(server.url + "/generate", json=payload, timeout=TIMEOUT).json()
    assert chunks[-1]["output_ids"] == whole["output_ids"]
    assert last["parse"] == whole["meta_info"]["parse"]  # the same request, streamed or not


# ----- the paired measurement against a running server -------------------------------------


def test_semantic_measures_a_running_server_paired(server, tmp_path):
    """`benchmarks/semantic.py --url` with a user's problems and grader (in the current folder):
    the server's lossless and likelihood rows over HTTP, no engine started; each row's paired
    counts are its per-problem verdicts against lossless's, and the lossless row judges nothing."""
    (tmp_path / "grader.py").write_text("def grade(problem, text):\n    return len(text) % 2 == 0\n")
    problems = [c["conversations"][0]["value"] for c in json.loads(PROMPTS_JSON.read_text())[:4]]
    (tmp_path / "problems.json").write_text(json.dumps(problems))
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "semantic.py"),
            "--url",
            server.url,
            "--prompts",
            "problems.json",
            "--grader",
            "grader:grade",
            "--modes",
            "parse_lossless",
            "parse_likelihood",
            "--thresholds",
            "0.05",
            "--max-new-tokens",
            "16",
            "--no-nll",
            "--json",
            "--plot",
            str(tmp_path / "plot.png"),
        ],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    rows = {row["mode"]: row for row in map(json.loads, proc.stdout.splitlines())}
    assert set(rows) == {"parse_lossless", "parse_likelihood"} and rows["parse_likelihood"]["threshold"] == 0.05
    base, judged = rows["parse_lossless"]["correct"], rows["parse_likelihood"]["correct"]
    assert len(base) == len(judged) == 4 and rows["parse_lossless"]["judged"] == 0
    assert rows["parse_likelihood"]["paired_b"] == sum(x and not y for x, y in zip(base, judged))
    assert rows["parse_likelihood"]["paired_c"] == sum(y and not x for x, y in zip(base, judged))
    assert rows["parse_likelihood"]["loss_upper95"] is not None
