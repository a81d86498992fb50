"""Loaded by benchmarks/round_cost.py into SGLang's scheduler process (via PYTHONPATH): times
each step of `ParseWorker._round` and writes the totals to $PARSE_ROUND_TIMER_OUT after every
round. Does nothing unless that variable is set. Benchmark-only: never imported by the package.
"""

import os

if os.environ.get("PARSE_ROUND_TIMER_OUT"):
    import json
    import sys
    import threading
    import time

    STEPS = ("_draft", "_plan_window", "_verify", "_accept", "_record_stats", "_update_target_phases", "_result")

    def _sync():
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.cuda.synchronize()

    def _instrument(worker_cls):
        totals = {name: 0.0 for name in (*STEPS, "_round")}
        counts = dict.fromkeys(totals, 0)

        def timed(name, fn):
            def run(*args, **kwargs):
                _sync()
                start = time.perf_counter()
                out = fn(*args, **kwargs)
                _sync()
                totals[name] += time.perf_counter() - start
                counts[name] += 1
                if name == "_round":
                    with open(os.environ["PARSE_ROUND_TIMER_OUT"], "w") as f:
                        json.dump({"seconds": totals, "calls": counts}, f)
                return out

            return run

        for name in totals:
            setattr(worker_cls, name, timed(name, getattr(worker_cls, name)))

    def _wait_for_worker():
        """The plugin imports parse_sglang.worker when the scheduler builds its speculative
        worker; instrument the class as soon as it exists (before the first round)."""
        while True:
            module = sys.modules.get("parse_sglang.worker")
            if module is not None and hasattr(module, "ParseWorker"):
                _instrument(module.ParseWorker)
                return
            time.sleep(0.05)

    threading.Thread(target=_wait_for_worker, daemon=True).start()
