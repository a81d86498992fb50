"""Where one PARSE round's time and host traffic go, inside SGLang, next to a target-only step.

One `sglang.Engine` serves the prompts target-only (greedy), then one serves them with PARSE
at the given settings (default: PARSE's defaults, L = 32, Δ = 8, judge on, τ = 0.5), at each
batch size (that many concurrent copies of the prompt). The PARSE engine's scheduler loads
`support/round_probe/sitecustomize.py`, which measures `ParseWorker._round` from outside it:
every other round it counts host/device traffic (`support.sync_counter`: device-to-host
reads, host-to-device copies, host bytes made), every other round it times each step and
PARSE's own host work (`host_ms`: the round less the draft chain's and the target's forwards).
A last pass sends the same requests with the judge off per request (`judge: false`) and
reports the verify rows they ran: on a probe server, a batch in which no request probes
verifies only its L + 1 chain rows.

Printed per batch size: the verify window (N_max = 1 + L + K_max·m), milliseconds per round for
each step, syncs per round (PARSE's, and SGLang's inside the round for reference), host
ms / bytes per round, and the round's cost in target-only decode steps next to the tokens it
yields. `--json`: one JSON line per batch size with `device_to_host_per_round`,
`host_to_device_per_round`, `host_ms_per_round`, `host_bytes_per_round` and the rest.

Run:  python benchmarks/round_cost.py [--target DIR --draft DIR] [--steps 32] [--probe-stride 8]
                                      [--threshold 0.5 | --lossless] [--parse-config JSON] [--max-new-tokens 64]
                                      [--batch 1 8 32] [--json]
Without --target/--draft: SmolLM2-135M-Instruct and its layer-dropped draft (parse_sglang.smollm2).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's `support` package
from sglang_cpu import engine_settings  # noqa: E402
from parse_sglang.settings import parse_engine_kwargs  # noqa: E402
from parse_sglang.settings import ParseConfig  # noqa: E402

PROBE_DIR = ROOT / "support" / "round_probe"
STEP_NAMES = {
    "_draft": "draft: L+1 decode steps of the draft model",
    "_plan_window": "boundaries, probes, verify layout",
    "_verify": "ONE target verify forward (chain + probe rows)",
    "_accept": "acceptance (exact match, judge scores)",
    "_record": "result to the host, counters, target phases",
    "_result": "result for the scheduler",
}
# Round steps before the verify, and after acceptance (the budget counts each side).
BEFORE_VERIFY = ("_draft", "_plan_window")


def probe_environment(out: Path) -> dict:
    path = os.pathsep.join(filter(None, [str(PROBE_DIR), str(ROOT), os.environ.get("PYTHONPATH")]))
    return {"PARSE_ROUND_PROBE_OUT": str(out), "PYTHONPATH": path}


def run_engine(engine_kwargs: dict, prompt: str, sampling: dict, batches, env: dict | None = None):
    """{batch: (outputs, seconds)} from one engine; `env` set while it starts."""
    import sglang

    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        engine = sglang.Engine(**engine_kwargs)
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    try:
        engine.generate(prompt, {**sampling, "max_new_tokens": 4})  # warm-up
        runs = {}
        for batch in batches:
            start = time.perf_counter()
            outs = engine.generate([prompt] * batch, sampling)
            runs[batch] = (outs, time.perf_counter() - start)
        return runs, engine
    except BaseException:
        engine.shutdown()
        raise


def summarise(records: list[dict], batch: int) -> dict:
    """Per-round means over the probe's records of this batch size."""
    counted = [r for r in records if r["kind"] == "count" and r["batch_size"] == batch]
    timed = [r for r in records if r["kind"] == "time" and r["batch_size"] == batch]
    if not counted or not timed:
        raise RuntimeError(f"batch {batch}: the probe recorded {len(counted)} counted and {len(timed)} timed rounds")

    def per_round(owner: str, direction: str, steps=None) -> float:
        events = [e for r in counted for e in r[owner] if e[0] == direction and (steps is None or e[1] in steps)]
        return len(events) / len(counted)

    after = tuple(s for s in STEP_NAMES if s not in BEFORE_VERIFY)
    traffic = Counter()
    for r in counted:
        for direction, *_, nbytes in r["parse"]:
            traffic[direction] += nbytes
    return {
        "rounds_counted": len(counted),
        "rounds_timed": len(timed),
        "device_to_host_per_round": per_round("parse", "device_to_host"),
        "device_to_host_before_verify_per_round": per_round("parse", "device_to_host", BEFORE_VERIFY),
        "device_to_host_after_accept_per_round": per_round("parse", "device_to_host", after),
        "host_to_device_per_round": per_round("parse", "host_to_device"),
        "sglang_device_to_host_per_round": per_round("sglang", "device_to_host"),
        "sglang_host_to_device_per_round": per_round("sglang", "host_to_device"),
        "device_to_host_bytes_per_round": traffic["device_to_host"] / len(counted),
        "host_to_device_bytes_per_round": traffic["host_to_device"] / len(counted),
        "host_bytes_per_round": statistics.mean(r["host_bytes"] for r in counted),
        "host_ms_per_round": statistics.median(r["host_ms"] for r in timed),
        "step_ms": {s: statistics.median(r["ms"].get(s, 0.0) for r in timed) for s in (*STEP_NAMES, "_round")},
        "sync_sites": sorted({f"{e[0]} {e[1]} {e[2]} @ {e[3]}" for r in counted for e in r["parse"]}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--steps", type=int, default=ParseConfig.draft_budget, help="L")
    parser.add_argument("--probe-stride", type=int, default=ParseConfig.probe_stride, help="Δ")
    judge = parser.add_mutually_exclusive_group()
    judge.add_argument("--threshold", type=float, default=ParseConfig.threshold, help="τ")
    judge.add_argument("--lossless", action="store_true", help="judge off")
    parser.add_argument(
        "--parse-config",
        default="{}",
        help="more PARSE settings as JSON, e.g. '{\"adaptive\": true}' (a useless draft then runs tier 0)",
    )
    parser.add_argument("--prompt", default="Explain in a few sentences why the sky is blue.")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, nargs="+", default=[1], help="concurrent copies of the prompt")
    parser.add_argument("--json", action="store_true", help="one JSON line per batch size")
    args = parser.parse_args()
    if (args.target is None) != (args.draft is None):
        parser.error("--target and --draft go together")
    if any(b < 1 for b in args.batch):
        parser.error(f"--batch {args.batch} is invalid: allowed are integers >= 1")
    if args.target is None:
        from parse_sglang import smollm2

        args.target, args.draft = map(str, smollm2.model_pair())
    try:
        extra = json.loads(args.parse_config)
        config = ParseConfig(
            **{
                "draft_budget": args.steps,
                "probe_stride": args.probe_stride,
                "adaptive": False,
                "threshold": args.threshold,
                "judge": not args.lossless,
                "judge_mode": "probe",
                **extra,
            }
        )
    except (ValueError, TypeError) as err:
        parser.error(f"--parse-config={args.parse_config!r} is invalid: {err}")
    common = dict(engine_settings(), model_path=args.target, log_level="error", max_running_requests=max(args.batch))
    from parse_sglang.attention.window import WindowGeometry  # imports SGLang: after the CPU runtime

    geometry = WindowGeometry.of_server(config, args.target)
    suffix_len = geometry.suffix_len
    if common.get("device") == "cpu":
        common.update(mem_fraction_static=0.5, max_total_tokens=max(8192, 2 * max(args.batch) * 512))
    sampling = {"temperature": 0.0, "max_new_tokens": args.max_new_tokens, "ignore_eos": True}
    base, engine = run_engine(common, args.prompt, sampling, args.batch)
    engine.shutdown()

    probe_out = Path(tempfile.mkdtemp()) / "round_probe.json"
    runs, engine = run_engine(
        {**common, **parse_engine_kwargs(args.draft, config)},
        args.prompt,
        sampling,
        args.batch,
        env=probe_environment(probe_out),
    )
    try:
        records = json.loads(probe_out.read_text())
        totals = engine.get_server_info()["internal_states"][0]["parse"]
        off = {**sampling, "custom_params": {"parse": {"judge": False}}}
        engine.generate([args.prompt] * max(args.batch), off)
        after = engine.get_server_info()["internal_states"][0]["parse"]
        judge_off_rows = (after["verify_rows"] - totals["verify_rows"]) / (after["rounds"] - totals["rounds"])
    finally:
        engine.shutdown()

    n_max = geometry.max_rows
    header = (
        f"target={args.target}\ndraft={args.draft}\n"
        f"L={config.draft_budget} Δ={config.probe_stride} "
        f"judge={'on, τ=' + str(config.threshold) if config.judge else 'off'} "
        f"m={suffix_len} K_max={geometry.max_probes()} N_max={n_max} rows; {args.max_new_tokens} tokens, "
        f"{common.get('device', 'cuda')}"
    )
    if not args.json:
        print(header + "\n")
    for batch in args.batch:
        outs, seconds = runs[batch]
        base_outs, base_s = base[batch]
        row = summarise(records, batch)
        step_ms = base_s / max(len(base_outs[0]["output_ids"]) - 1, 1) * 1e3  # prefill gave token 1 (~ its share)
        stats = [out["meta_info"]["parse"] for out in outs]
        tokens_per_round = sum(len(o["output_ids"]) - 1 for o in outs) / sum(s["rounds"] for s in stats)
        row.update(
            batch=batch,
            L=config.draft_budget,
            window_rows=n_max,
            judge_off_verify_rows_per_round=judge_off_rows,
            tokens_per_round=tokens_per_round,
            target_step_ms=step_ms,
            wall_s=seconds,
            target_only_wall_s=base_s,
        )
        if args.json:
            print(json.dumps(row))
            continue
        round_ms = row["step_ms"]["_round"]
        print(f"batch {batch}: {row['rounds_counted']} rounds counted, {row['rounds_timed']} timed")
        print("| step of a round | ms per round | share |\n| --- | --- | --- |")
        for name, label in STEP_NAMES.items():
            print(f"| {label} | {row['step_ms'][name]:.1f} | {row['step_ms'][name] / round_ms:.0%} |")
        print(f"| whole round | {round_ms:.1f} | 100% |")
        print(
            f"syncs per round (PARSE): {row['device_to_host_per_round']:.2f} device-to-host "
            f"({row['device_to_host_before_verify_per_round']:.2f} before the verify, "
            f"{row['device_to_host_after_accept_per_round']:.2f} after acceptance), "
            f"{row['host_to_device_per_round']:.2f} host-to-device; SGLang inside the round: "
            f"{row['sglang_device_to_host_per_round']:.2f} / {row['sglang_host_to_device_per_round']:.2f}"
        )
        print(
            f"host work per round: {row['host_ms_per_round']:.1f} ms, "
            f"{row['host_bytes_per_round'] / 1024:.1f} KiB made on the host, "
            f"{row['device_to_host_bytes_per_round'] / 1024:.1f} KiB to the host, "
            f"{row['host_to_device_bytes_per_round'] / 1024:.1f} KiB to the device"
        )
        print(
            f"target-only decode step: {step_ms:.1f} ms; one PARSE round = {round_ms / step_ms:.1f} target-only steps "
            f"and yields {tokens_per_round:.2f} tokens; judge-off requests verify {judge_off_rows:.0f} rows per round "
            f"(N_max {n_max})"
        )
        print(f"wall: target-only {base_s:.1f} s, PARSE {seconds:.1f} s for {batch} x {args.max_new_tokens} tokens\n")


if __name__ == "__main__":
    main()
