"""Loaded into SGLang's scheduler process (this folder and the checkout's root on PYTHONPATH)
by benchmarks/round_cost.py and tests/test_round_syncs.py: measures `ParseWorker._round`
from outside it and writes one record per round to $PARSE_ROUND_PROBE_OUT (JSON, rewritten
after every round). Does nothing unless that variable is set. Never imported by the package.

Rounds alternate between two kinds, so that measuring never disturbs what is measured:
- "count" rounds run under `support.sync_counter.SyncCounter` (suspended inside the draft
  chain, an EAGLE-3 head's chain and extend, and the target's forward, which run as graph
  replays on a GPU): host/device traffic
  per worker step, attributed to PARSE's code or SGLang's;
- "time" rounds: milliseconds per worker step, and `host_ms`, the round less the time inside
  the draft chain and the target's forward (CUDA-synchronised on a GPU): PARSE's own work.
"""

import os

if os.environ.get("PARSE_ROUND_PROBE_OUT"):
    import functools
    import json
    import sys
    import threading
    import time

    # The worker's steps (and those of earlier versions, to measure them too).
    STEPS = (
        "_draft",
        "_plan_window",
        "_verify",
        "_accept",
        "_record",
        "_result",
        "_record_stats",
        "_update_target_phases",
    )
    _records = []
    _state = {"counter": None, "in_round": False, "forward_s": 0.0, "step_s": {}}

    def _sync():
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.cuda.synchronize()

    def _write():
        with open(os.environ["PARSE_ROUND_PROBE_OUT"], "w") as f:
            json.dump(_records, f)

    def _probe_step(name, fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            counter = _state["counter"]
            if counter is not None:
                counter.step = name
            _sync()
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                _sync()
                _state["step_s"][name] = _state["step_s"].get(name, 0.0) + time.perf_counter() - start

        return run

    def _model_forward(fn):
        """The draft chain's or the target's forward: outside the counter, timed."""

        @functools.wraps(fn)
        def run(*args, **kwargs):
            from torch.overrides import _pop_mode_temporarily

            _sync()
            start = time.perf_counter()
            try:
                if _state["counter"] is None:
                    return fn(*args, **kwargs)
                with _pop_mode_temporarily():
                    return fn(*args, **kwargs)
            finally:
                _sync()
                _state["forward_s"] += time.perf_counter() - start

        return run

    def _probe_round(fn):
        @functools.wraps(fn)
        def run(worker, batch):
            from support.sync_counter import SyncCounter

            counting = len(_records) % 2 == 0
            _state.update(counter=None, in_round=True, forward_s=0.0, step_s={})
            record = {"kind": "count" if counting else "time", "batch_size": len(batch.reqs)}
            _sync()
            start = time.perf_counter()
            if counting:
                counter = _state["counter"] = SyncCounter()
                for name, value in list(vars(batch).items()):
                    if name.endswith("_cpu") and value is not None:
                        if value is getattr(batch, name[: -len("_cpu")], None):  # one tensor on a CPU: two on a GPU
                            value = value.clone()
                            setattr(batch, name, value)
                        counter.mark_host(value)
                for key, made in worker.constants._made.items():  # the tier-0 plan kept since an earlier
                    if key[0] == "nothing_drafted":  # round: its host half (`window_plan.nothing_drafted`)
                        counter.mark_host(list(vars(made[0]).values()))
                with counter:
                    out = fn(worker, batch)
                _state["counter"] = None
                for owner in ("parse", "sglang"):
                    events = [e for e in counter.events if e.owner == owner]
                    record[owner] = [[e.direction, e.step, e.what, e.where, e.nbytes] for e in events]
                record["host_bytes"] = counter.host_bytes
            else:
                out = fn(worker, batch)
                _sync()
                round_s = time.perf_counter() - start
                record["ms"] = {name: s * 1e3 for name, s in _state["step_s"].items()}
                record["ms"]["_round"] = round_s * 1e3
                record["host_ms"] = (round_s - _state["forward_s"]) * 1e3
            _state["in_round"] = False
            _records.append(record)
            _write()
            return out

        return run

    def _instrument(worker_cls, chain_cls, head_cls, tp_worker_cls):
        for name in STEPS:
            if hasattr(worker_cls, name):
                setattr(worker_cls, name, _probe_step(name, getattr(worker_cls, name)))
        worker_cls._round = _probe_round(worker_cls._round)
        chain_cls.draft = _model_forward(chain_cls.draft)
        head_cls.draft = _model_forward(head_cls.draft)
        head_cls.extend = _model_forward(head_cls.extend)
        original = tp_worker_cls.forward_batch_generation

        probed = _model_forward(original)

        @functools.wraps(original)
        def forward(self, *args, **kwargs):  # the verify pass inside a round; prefills as they were
            return (probed if _state["in_round"] else original)(self, *args, **kwargs)

        tp_worker_cls.forward_batch_generation = forward

    def _wait_for_worker():
        """The plugin imports parse_sglang.worker when the scheduler builds its speculative
        worker; instrument the classes as soon as they exist (before the first round)."""
        while True:
            module = sys.modules.get("parse_sglang.worker")
            if module is not None and hasattr(module, "ParseWorker"):
                from parse_sglang.draft_chain import DraftChain
                from parse_sglang.eagle3_head import HeadChain
                from sglang.srt.managers.tp_worker import TpModelWorker

                _instrument(module.ParseWorker, DraftChain, HeadChain, TpModelWorker)
                return
            time.sleep(0.05)

    threading.Thread(target=_wait_for_worker, daemon=True).start()
