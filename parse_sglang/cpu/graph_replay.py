"""A torch stand-in of CUDA-graph capture and replay, so SGLang's graph runners run on CPU.

SGLang's decode graph runner (`DecodeCudaGraphRunner`, which captures the target's
TARGET_VERIFY) and its EAGLE draft runner (`EAGLEDraftCudaGraphRunner`, the whole draft
chain) hand a `BaseCudaGraphBackend` one forward function per batch-size bucket; the
function reads only the runner's static buffers and the capture-time ForwardBatch. The
stand-in keeps that function and, at replay, runs it again instead of replaying a graph.
Everything around it is SGLang's own code, run as on a GPU: bucket padding, static-buffer
filling, attention metadata planned outside the graph for the padded batch, the capture-time
spec input (and so its baked-in logits rows), output slicing.

Like a real graph, a replay returns the SAME output tensors every time (filled in place),
so code that keeps a graph output past the next replay sees it change, as on a GPU. What a
graph would freeze but this re-executes is host-side Python inside the captured function
(a `.item()` or a branch on a host value): such code is wrong under graphs and is caught
only on a GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Optional

import torch
from sglang.srt.model_executor.runner_backend.base_cuda_graph_backend import BaseCudaGraphBackend


def _copy_into(static: Any, fresh: Any) -> None:
    """Copy a replay's output into the captured output, tensor by tensor (same structure)."""
    if isinstance(static, torch.Tensor):
        if static.shape != fresh.shape:
            raise RuntimeError(f"graph replay produced shape {tuple(fresh.shape)}, captured {tuple(static.shape)}")
        static.copy_(fresh)
    elif isinstance(static, (tuple, list)):
        for a, b in zip(static, fresh, strict=True):
            _copy_into(a, b)
    elif dataclasses.is_dataclass(static):
        for field in dataclasses.fields(static):
            _copy_into(getattr(static, field.name), getattr(fresh, field.name))
    elif static is not None and fresh is not None and static != fresh:
        raise RuntimeError(f"graph replay produced {fresh!r}, captured {static!r}")


def install_device_api() -> None:
    """The one graph call SGLang's runners make on their device module (`torch.cpu` here)
    that torch.cpu lacks: nothing is ever being captured by a stream under eager replay."""
    if not hasattr(torch.cpu, "is_current_stream_capturing"):
        torch.cpu.is_current_stream_capturing = lambda: False


class EagerReplayBackend(BaseCudaGraphBackend):
    """`capture_one` warms the function up and keeps it with its output; `replay` reruns it."""

    def __init__(self, cuda_graph_runner=None, **_):
        self._functions: dict[Any, Callable[[], Any]] = {}
        self._outputs: dict[Any, Any] = {}

    @contextlib.contextmanager
    def capture_session(self, stream):
        yield

    def capture_one(
        self,
        shape_key,
        forward_fn: Callable[[], Any],
        capture_inputs: Optional[Any] = None,
        post_warmup_hook: Optional[Callable[[], None]] = None,
    ) -> None:
        forward_fn()  # warm-up, as SGLang's backends run before capturing
        if post_warmup_hook is not None:
            post_warmup_hook()
        self._outputs[shape_key] = forward_fn()
        self._functions[shape_key] = forward_fn

    def can_run(self, forward_batch, shape_key) -> bool:
        return shape_key in self._functions

    @contextlib.contextmanager
    def replay_session(self):
        yield

    def replay(self, shape_key, static_forward_batch, **kwargs) -> Any:
        output = self._outputs[shape_key]
        _copy_into(output, self._functions[shape_key]())
        return output

    def cleanup(self) -> None:
        self._functions.clear()
        self._outputs.clear()
