"""Loaded into every process of an engine run (this folder and the checkout's root on
PYTHONPATH, e.g. before `python benchmarks/compare.py ...`): seconds spent in SGLang's and
PARSE's steps, per forward mode and batch size, written to $PARSE_STEP_TIMES_DIR/PID.json
(rewritten every 50 calls; {key: [calls, seconds]}). Does nothing unless that variable is set.
Never imported by the package.

Keys: "ModelRunner.forward:MODE:bs:tokens" (one forward, tokens = rows of the batch),
"Sampler.forward:bs", "Scheduler.run_batch:MODE:bs", "ParseWorker.<step>:bs" (the
worker's round parts) and "OtherRounds._decode_steps:bs". What compared tier 0 with SGLang's decode step at batch 32
(benchmarks/README.md, "GSM-symbolic, closed batches of 32").
"""

import os

if os.environ.get("PARSE_STEP_TIMES_DIR"):
    import builtins
    import functools
    import json
    import sys
    import time

    _totals: dict = {}
    _calls = [0]

    def _write():
        path = os.path.join(os.environ["PARSE_STEP_TIMES_DIR"], f"{os.getpid()}.json")
        with open(path, "w") as f:
            json.dump(_totals, f)

    def _timed(cls, name, key):
        fn = getattr(cls, name)

        @functools.wraps(fn)
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                cell = _totals.setdefault(f"{cls.__name__}.{name}:{key(*args)}", [0, 0.0])
                cell[0] += 1
                cell[1] += time.perf_counter() - start
                _calls[0] += 1
                if _calls[0] % 50 == 0:
                    _write()

        setattr(cls, name, run)

    def _sglang(modules):
        runner, sampler, scheduler = modules
        _timed(
            runner.ModelRunner,
            "forward",
            lambda self, fb, *a: f"{fb.forward_mode.name}:{fb.batch_size}:{fb.input_ids.numel()}",
        )
        _timed(sampler.Sampler, "forward", lambda self, out, *a: out.next_token_logits.shape[0])
        _timed(scheduler.Scheduler, "run_batch", lambda self, b, *a: f"{b.forward_mode.name}:{b.batch_size()}")

    def _parse(modules):
        worker, other = modules
        for step in ("_round", "_copies", "_draft_length", "_verify", "_accept", "_result"):
            _timed(worker.ParseWorker, step, lambda self, batch, *a: len(batch.reqs))
        _timed(other.OtherRounds, "_decode_steps", lambda self, batch, *a: len(batch.reqs))

    _WANTED = [  # (modules, the attribute each must have by then, what to wrap)
        [("sglang.srt.model_executor.model_runner", "ModelRunner"), ("sglang.srt.layers.sampler", "Sampler"),
         ("sglang.srt.managers.scheduler", "Scheduler"), _sglang],
        [("parse_sglang.worker", "ParseWorker"), ("parse_sglang.other_rounds", "OtherRounds"), _parse],
    ]  # fmt: skip
    _import = builtins.__import__

    def _watching(name, *args, **kwargs):
        module = _import(name, *args, **kwargs)
        for wanted in list(_WANTED):
            *names, wrap = wanted
            loaded = [sys.modules.get(m) for m, _ in names]
            if all(mod is not None and hasattr(mod, attr) for mod, (_, attr) in zip(loaded, names)):
                _WANTED.remove(wanted)
                wrap(loaded)
        if not _WANTED:
            builtins.__import__ = _import
        return module

    builtins.__import__ = _watching
