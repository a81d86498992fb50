"""support/step_times/summary.py: the timed closed batch of a run's events, and their sums."""

from __future__ import annotations

import json

from support.step_times.summary import main, summarize

# [start, seconds, key] as the probe writes them: a warm-up batch of 4, then the timed batch of 4
WARM_UP = [
    [0.0, 1.0, "Scheduler.run_batch:EXTEND:4"],
    [1.0, 0.5, "ModelRunner.forward:DECODE:4:4"],
    [1.0, 0.6, "Scheduler.run_batch:DECODE:4"],
    [1.6, 0.1, "Scheduler.process_batch_result:DECODE:4"],
]
TIMED = [
    [10.0, 2.0, "Scheduler.run_batch:EXTEND:4"],
    [12.0, 0.1, "Scheduler.process_batch_result:EXTEND:4"],
    [12.1, 0.3, "ParseWorker._round:4"],
    [12.1, 0.25, "ModelRunner.forward:TARGET_VERIFY:4:4"],
    [12.1, 0.3, "Scheduler.run_batch:DECODE:4"],
    [12.4, 0.2, "Scheduler.process_batch_result:DECODE:4"],
]
AB = [[5.0, 0.2, "AB.decode:8"], [5.3, 0.25, "AB.verify:8"], [5.6, 1, "AB.argmax_differs:8"]]


def test_the_timed_batch_is_the_last_prefill_of_the_largest_batch_to_its_last_result():
    summary = summarize([*WARM_UP, *AB, *TIMED, [20.0, 0.01, "Scheduler.get_next_batch_to_run:"]])
    assert summary["engine"] == "parse"
    assert abs(summary["timed_s"] - 2.6) < 1e-9  # 10.0 .. 12.6, not the idle call after it
    assert summary["timed"]["Scheduler.run_batch:EXTEND:4"] == [1, 2.0]  # the warm-up's prefill left out
    assert "ModelRunner.forward:DECODE:4:4" not in summary["timed"]
    assert summary["ab"] == {"AB.argmax_differs:8": [1, 1], "AB.decode:8": [1, 0.2], "AB.verify:8": [1, 0.25]}


def test_processes_without_a_scheduler_and_other_files_are_left_out(tmp_path):
    (tmp_path / "1.jsonl").write_text("".join(json.dumps(e) + "\n" for e in WARM_UP[1:2]))
    sglang = [e for e in WARM_UP + TIMED if not e[2].startswith("ParseWorker.")]
    (tmp_path / "2.jsonl").write_text("".join(json.dumps(e) + "\n" for e in sglang))
    (tmp_path / "cells.jsonl").write_text(json.dumps({"row": "target_only"}) + "\n")  # a bench's --out beside them
    out = tmp_path / "summary.json"
    assert main([str(tmp_path), "--out", str(out)]) == 0
    (only,) = json.loads(out.read_text())
    assert only["engine"] == "sglang"
    assert only["timed"]["ModelRunner.forward:TARGET_VERIFY:4:4"] == [1, 0.25]
