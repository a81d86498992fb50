"""Sums a step-times run (`sitecustomize.py` beside this file) per scheduler process: over the
timed closed batch (from the start of its prefill, the last `Scheduler.run_batch:EXTEND` of the
largest batch size, to the end of the last `Scheduler.process_batch_result`), and the A/B keys over the whole process.

    python support/step_times/summary.py DIR [--out FILE.json]

Prints, and with --out writes, a JSON list with one entry per process that ran a scheduler:
{"engine": "parse" | "sglang", "timed_s", "timed": {key: [calls, seconds]}, "ab": {key: [calls, total]}}.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def read_events(path: Path) -> list[tuple[float, float, str]]:
    return [tuple(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def totals(events) -> dict[str, list]:
    out: dict[str, list] = {}
    for _, value, key in events:
        cell = out.setdefault(key, [0, 0.0])
        cell[0] += 1
        cell[1] += value
    return dict(sorted(out.items()))


def timed_batch_start(events) -> float | None:
    """The start of the last prefill of the largest batch size (a closed batch's timed prefill)."""
    prefills = [
        (int(key.rsplit(":", 1)[1]), start) for start, _, key in events if key.startswith("Scheduler.run_batch:EXTEND:")
    ]
    if not prefills:
        return None
    largest = max(bs for bs, _ in prefills)
    return max(start for bs, start in prefills if bs == largest)


def summarize(events) -> dict | None:
    start = timed_batch_start(events)
    if start is None:
        return None
    timed = [e for e in events if e[0] >= start and not e[2].startswith("AB.")]
    end = max(s + v for s, v, key in timed if key.startswith("Scheduler.process_batch_result:"))
    engine = "parse" if any(key.startswith("ParseWorker.") for _, _, key in events) else "sglang"
    ab = totals(e for e in events if e[2].startswith("AB."))
    return dict(engine=engine, timed_s=end - start, timed=totals(timed), ab=ab)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    # PID.jsonl are the probe's; a bench's --out cells may sit beside them
    runs = sorted(p for p in args.dir.glob("*.jsonl") if p.stem.isdigit())
    summaries = [s for p in runs if (s := summarize(read_events(p))) is not None]
    text = json.dumps(summaries, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
