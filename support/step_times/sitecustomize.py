"""Loaded into every process of an engine run (this folder and the checkout's root on
PYTHONPATH, e.g. before `python benchmarks/compare.py ...`): each call of SGLang's and PARSE's
steps, one JSON line [start (perf_counter), seconds, key] appended to $PARSE_STEP_TIMES_DIR/PID.jsonl
as it returns ("AB.argmax_differs" lines hold a count where the others hold seconds). Does nothing unless that variable is set. Never imported by the package.
`summary.py` beside it sums a run's files.

Keys: "ModelRunner.forward:MODE:bs:rows" (":draft" after a draft model's), "Sampler.forward:bs",
"Scheduler.<step>:MODE:bs" (run_batch, process_batch_result; get_next_batch_to_run and
ingest_requests without), "ParseWorker.<step>:bs" (the round's parts) and "OtherRounds._decode_steps:bs".

PARSE_STEP_TIMES_AB=1 also runs, beside each tier-0 step of a PARSE batch of 8 or more requests,
SGLang's own DECODE forward of the same batch (c_n at P, written to the step's KV slot with the
same values), before the step's one-row TARGET_VERIFY on odd steps and after it on even ones:
"AB.decode:bs" and "AB.verify:bs" time them in one process, "AB.argmax_differs:bs" counts the
requests whose two argmaxes differ. The extra forwards slow the PARSE row: its wall clock is then no cell.
"""

import os

if os.environ.get("PARSE_STEP_TIMES_DIR"):
    import builtins
    import functools
    import json
    import sys
    import time

    _out = open(os.path.join(os.environ["PARSE_STEP_TIMES_DIR"], f"{os.getpid()}.jsonl"), "a", buffering=1)

    def _record(start, value, key):
        _out.write(json.dumps([start, value, key]) + "\n")

    def _timed(cls, name, key):
        fn = getattr(cls, name)

        @functools.wraps(fn)
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                _record(start, time.perf_counter() - start, f"{cls.__name__}.{name}:{key(*args)}")

        setattr(cls, name, run)

    def _forward_key(self, fb, *a):
        return f"{fb.forward_mode.name}:{fb.batch_size}:{fb.input_ids.numel()}" + (
            ":draft" if self.is_draft_worker else ""
        )

    def _sglang(modules):
        runner, sampler, scheduler = modules
        _timed(runner.ModelRunner, "forward", _forward_key)
        _timed(sampler.Sampler, "forward", lambda self, out, *a: out.next_token_logits.shape[0])
        for step in ("run_batch", "process_batch_result"):
            _timed(scheduler.Scheduler, step, lambda self, b, *a: f"{b.forward_mode.name}:{b.batch_size()}")
        for step in ("get_next_batch_to_run", "ingest_requests"):
            _timed(scheduler.Scheduler, step, lambda self, *a: "")

    def _decode_beside(worker):
        """PARSE_STEP_TIMES_AB: SGLang's DECODE forward beside each tier-0 step (module doc)."""
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        from parse_sglang.verify_pass import Committed, set_lengths, window_slots

        verify = worker.ParseWorker._verify
        steps = [0]
        fields = ("forward_mode", "spec_info", "input_ids", "out_cache_loc", "seq_lens", "seq_lens_cpu", "seq_lens_sum")

        def decode(self, batch, committed):  # SGLang's decode batch: seq_lens count c_n, written at P
            ahead = Committed(committed.seq_lens + 1, committed.seq_lens_cpu + 1, committed.rows, committed.last_tokens)
            set_lengths(batch, ahead)
            batch.forward_mode, batch.spec_info, batch.input_ids = ForwardMode.DECODE, None, committed.last_tokens
            batch.out_cache_loc = window_slots(self.req_to_token_pool.req_to_token, committed, 1)
            start = time.perf_counter()
            logits = self.target_worker.forward_batch_generation(batch, is_verify=True).logits_output.next_token_logits
            token = logits.argmax(-1)
            _record(start, time.perf_counter() - start, f"AB.decode:{len(batch.reqs)}")
            return token

        def beside(self, batch, committed, window):
            bs = len(batch.reqs)
            if window.shape.rows != 1 or bs < 8 or self.head is not None:
                return verify(self, batch, committed, window)
            steps[0] += 1
            first = steps[0] % 2 == 1
            if first:
                token = decode(self, batch, committed)
            start = time.perf_counter()
            out = verify(self, batch, committed, window)
            verified = out[0].argmax(-1)
            _record(start, time.perf_counter() - start, f"AB.verify:{bs}")
            if not first:
                kept = {f: getattr(batch, f) for f in fields}  # the verify's batch, as the round reads it next
                token = decode(self, batch, committed)
                for f, value in kept.items():
                    setattr(batch, f, value)
            _record(time.perf_counter(), float((token != verified).sum()), f"AB.argmax_differs:{bs}")
            return out

        worker.ParseWorker._verify = beside

    def _parse(modules):
        worker, other = modules
        if os.environ.get("PARSE_STEP_TIMES_AB") == "1":
            _decode_beside(worker)
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
