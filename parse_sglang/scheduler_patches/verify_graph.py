"""PARSE's verify pass under SGLang's decode CUDA graphs (the target's TARGET_VERIFY graphs).

What it changes (each only for a PARSE target runner; other algorithms are untouched):
- AROUND `DecodeCudaGraphRunner.get_spec_info` and AROUND `create_dummy_verify_input` as
  bound in `model_executor/runner/base_runner.py` (warm-up / FlashInfer autotune dummy
  forwards): both return None for plug-in algorithms; PARSE's answer is
  `ParseVerifyInput.for_capture` of the window shape being captured, whose request-major
  logits rows the graph bakes in. Those rows come from the model runner's `ShapeConstants`,
  so they live as long as the graph (a tensor made for the capture and dropped after it
  would be freed memory at every replay). On a server with an EAGLE-3 head or a judge head the
  capture input asks for `CaptureHiddenMode.FULL`, so the graphs keep the hidden states the head reads
  (SGLang sizes the runner's aux buffer and replays only forwards that ask for no more).
- AFTER `ModelRunner.max_decode_logits_rows` and
  `DecodeCudaGraphRunner._next_token_logits_buffer_capacity_rows`: SGLang sizes the graphs'
  shared logits buffer for every verify row (max_bs * N_max rows x vocab, fp32: GBs at a
  150k vocabulary); PARSE reads only max_bs * (L + 1 + K_max) rows, so that is what is
  reserved (scheduler_patches/logits_rows.py cuts each forward's slice to its rows).

Why: SGLang captures TARGET_VERIFY at `get_num_tokens_per_req_for_target_verify` rows per
request (PARSE answers N_max, spec_algo.py) but has no PARSE input to capture with; the
window itself has a fixed shape in "auto" mode whenever the graph is captured
(worker._fixed_window), so the captured logits rows are the ones every replay reads.

`VerifyGraphs` adds a runner for every other window shape a round can have (`WindowGeometry.
shapes`: the chain-only width L + 1, for a batch in which no request probes, and with
adaptive draft lengths each tier's widths), built the way SGLang's adaptive-steps runtime
states build theirs (a runner with its own attention backend), and swaps
`ModelRunner.decode_cuda_graph_runner` for the round's shape.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from typing import Optional

from sglang.srt.plugins.hook_registry import HookType

from parse_sglang.attention.window import WindowShape
from parse_sglang.scheduler_patches import register_hooks_once
from parse_sglang.settings import ALGORITHM, server_parse_config

logger = logging.getLogger(__name__)

RUNNER = "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner"
SPEC_INFO_TARGET = f"{RUNNER}.get_spec_info"
DUMMY_TARGET = "sglang.srt.model_executor.runner.base_runner.create_dummy_verify_input"
LOGITS_ROWS_TARGET = "sglang.srt.model_executor.model_runner.ModelRunner.max_decode_logits_rows"
CAPACITY_TARGET = f"{RUNNER}._next_token_logits_buffer_capacity_rows"

HOOKED_SIGNATURES = {
    SPEC_INFO_TARGET: "(self, num_tokens: 'int')",
    DUMMY_TARGET: (
        "(spec_algorithm: 'SpeculativeAlgorithm', custom_mask: 'torch.Tensor', num_tokens_per_req: 'int', "
        "is_draft_worker: 'bool') -> 'Optional[SpecInput]'"
    ),
    LOGITS_ROWS_TARGET: "(self) -> 'int'",
    CAPACITY_TARGET: "(self, max_num_tokens: 'int') -> 'int'",
    RUNNER + ".__init__": (
        "(self, model_runner: 'ModelRunner', *, attn_backend=None, speculative_num_steps: 'Optional[int]' = None, "
        "speculative_num_draft_tokens: 'Optional[int]' = None, record_nolora_graph: 'bool' = False)"
    ),
}

# The window shape a runner is being built for (`VerifyGraphs.capture`); unset: the server's
# fixed window, which SGLang's own runner captures.
_capturing: contextvars.ContextVar[Optional[WindowShape]] = contextvars.ContextVar("parse_capturing", default=None)


def capturing_window() -> Optional[WindowShape]:
    return _capturing.get()


def _parse_window(spec_algorithm, is_draft_worker: bool) -> Optional[WindowShape]:
    """The window shape a PARSE target runner captures, or None (not a PARSE target)."""
    if is_draft_worker or not spec_algorithm.is_speculative() or spec_algorithm.name != ALGORITHM:
        return None
    shape = _capturing.get()
    if shape is not None:
        return shape
    from sglang.srt.runtime_context import get_model, get_server_args, get_serving, get_spec

    from parse_sglang.attention.window import WindowGeometry
    from parse_sglang.settings import server_parse_config

    config = server_parse_config(get_server_args(), get_spec().speculative_num_steps)
    return WindowGeometry.of_server(config, get_serving().tokenizer_path, get_model().trust_remote_code).fixed()


def capture_spec_info(original, runner, num_tokens: int):
    """AROUND get_spec_info: PARSE's capture input for num_tokens // N requests."""
    model_runner = runner.model_runner
    shape = _parse_window(model_runner.spec_algorithm, model_runner.is_draft_worker)
    if shape is None:
        return original(runner, num_tokens)
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

    from parse_sglang.attention.window import shape_constants
    from parse_sglang.verify_input import ParseVerifyInput

    rows = shape_constants(model_runner).logits_rows(num_tokens // shape.rows, shape)
    info = ParseVerifyInput.for_capture(shape, rows, runner.buffers.custom_mask)
    from sglang.srt.runtime_context import get_spec

    judge_head = server_parse_config(model_runner.server_args, get_spec().speculative_num_steps).judge_head
    if model_runner.spec_aux_config.eagle_use_aux_hidden_state or judge_head:  # the heads read every verify's states
        info.capture_hidden_mode = CaptureHiddenMode.FULL
    return info


def dummy_verify_input(original, spec_algorithm, custom_mask, num_tokens_per_req: int, is_draft_worker: bool):
    """AROUND create_dummy_verify_input: a warm-up forward's PARSE input. Its batch size is
    not passed, so it reads the logits of one request's rows (present in any batch)."""
    shape = _parse_window(spec_algorithm, is_draft_worker)
    if shape is None:
        return original(spec_algorithm, custom_mask, num_tokens_per_req, is_draft_worker)
    from parse_sglang.verify_input import ParseVerifyInput

    return ParseVerifyInput.for_capture(shape, shape.logits_rows(1, custom_mask.device), custom_mask)


def read_rows_only(rows: int, model_runner) -> int:
    """AFTER max_decode_logits_rows: max_bs * N verify rows -> max_bs * (L + 1 + K)."""
    shape = _parse_window(model_runner.spec_algorithm, model_runner.is_draft_worker)
    if shape is None:
        return rows
    return rows // shape.rows * shape.read_rows


def read_rows_capacity(rows: int, runner, max_num_tokens: int) -> int:
    """AFTER _next_token_logits_buffer_capacity_rows: the same cut for the runner's buffer."""
    return read_rows_only(rows, runner.model_runner)


class VerifyGraphs:
    """The target's verify graph runners by window shape: SGLang's own (captured at the
    server's fixed window) and one per other shape a round can have; `replaying(shape)` makes
    the runner of a round's shape the one the target's forward replays (None: that shape runs
    eagerly)."""

    def __init__(self, model_runner):
        self.model_runner = model_runner
        self.runners: dict[WindowShape, object] = {}

    @property
    def captured(self) -> bool:
        return bool(self.runners)

    def capture(self, shapes) -> None:
        """After SGLang captured the target's graphs (at the server's fixed window): its
        runner, then one for each other of `shapes`."""
        default = self.model_runner.decode_cuda_graph_runner
        if default is None:
            return
        self.runners[_parse_window(self.model_runner.spec_algorithm, False)] = default
        from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

        runner = self.model_runner
        for shape in (s for s in shapes if s not in self.runners):
            token = _capturing.set(shape)
            workspace = runner.init_new_workspace
            try:
                backend = runner._get_attention_backend(init_new_workspace=True)
                self.runners[shape] = DecodeCudaGraphRunner(
                    runner, attn_backend=backend, speculative_num_draft_tokens=shape.rows
                )
            finally:
                runner.init_new_workspace = workspace
                _capturing.reset(token)
        logger.info("PARSE verify graphs captured at widths %s", sorted(s.rows for s in self.runners))

    @contextlib.contextmanager
    def replaying(self, shape: WindowShape):
        runner = self.model_runner
        before = runner.decode_cuda_graph_runner
        runner.decode_cuda_graph_runner = self.runners.get(shape)
        try:
            yield
        finally:
            runner.decode_cuda_graph_runner = before


def install() -> str:
    register_hooks_once(
        __name__,
        (SPEC_INFO_TARGET, capture_spec_info, HookType.AROUND),
        (DUMMY_TARGET, dummy_verify_input, HookType.AROUND),
        (LOGITS_ROWS_TARGET, read_rows_only, HookType.AFTER),
        (CAPACITY_TARGET, read_rows_capacity, HookType.AFTER),
    )
    return (
        f"{SPEC_INFO_TARGET}, {DUMMY_TARGET}: AROUND hooks giving PARSE's verify-capture input; "
        f"{LOGITS_ROWS_TARGET}, {CAPACITY_TARGET}: AFTER hooks sizing the graph logits buffer to PARSE's read rows"
    )
