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
so code that keeps a graph output past the next replay sees it change, as on a GPU.

Like a real graph, a replay may read only memory that outlives the capture. A CUDA graph
records addresses; a tensor that the captured forward read but that nothing keeps alive
after the capture (a capture-input helper's result, dropped with the capture's ForwardBatch)
is freed memory at every replay. The stand-in records every tensor the captured forward
reads that it did not create itself, and at the first replay keeps those the runner does not
own (reachable from the runner object, not through a captured function); a replay that reads
one of them fails, naming it (`FreedMemoryRead`). The eager re-run would otherwise read the
Python object the closure still holds, and never see it.

What a graph would freeze but this re-executes is host-side Python inside the captured
function (a `.item()` or a branch on a host value): such code is wrong under graphs and is
caught only on a GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
from typing import Any, Callable, Optional

import torch
from sglang.srt.model_executor.runner_backend.base_cuda_graph_backend import BaseCudaGraphBackend
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class FreedMemoryRead(RuntimeError):
    """A graph replay read a tensor that only the capture kept alive."""


def _storage(tensor: torch.Tensor) -> Optional[int]:
    if tensor.device.type == "meta" or tensor.untyped_storage().nbytes() == 0:
        return None
    return tensor.untyped_storage().data_ptr()


class _CaptureReads(TorchDispatchMode):
    """Tensors an op reads whose storage it did not make during this capture: {storage: tensor}."""

    def __init__(self):
        super().__init__()
        self.external: dict[int, torch.Tensor] = {}
        self._made: set[int] = set()

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor) and (key := _storage(t)) is not None and key not in self._made:
                self.external.setdefault(key, t)
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and (key := _storage(t)) is not None and key not in self.external:
                self._made.add(key)
        return out


class _FreedGuard(TorchDispatchMode):
    """Fails an op that reads one of `freed` ({storage: tensor read at capture})."""

    def __init__(self, freed: dict[int, torch.Tensor]):
        super().__init__()
        self.freed = freed

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor) and (key := _storage(t)) in self.freed:
                kept = self.freed[key]
                raise FreedMemoryRead(
                    f"graph replay: {func} reads a {tuple(kept.shape)} {kept.dtype} tensor that the captured "
                    "forward read but nothing keeps alive after the capture (freed memory on a GPU): keep it "
                    "in the graph runner's buffers or a per-shape cache that lives for the process"
                )
        return func(*args, **(kwargs or {}))


_NOT_OWNING = (types.ModuleType, type, types.FunctionType, types.MethodType, types.BuiltinFunctionType)


def owned_storages(root: Any, skip: Any) -> set[int]:
    """Storages of every tensor reachable from `root` through containers and object
    attributes, not through functions, methods, classes or modules (a captured function's
    closure owns nothing once a real graph has replaced it), nor through `skip`."""
    seen: set[int] = {id(skip)}
    owned: set[int] = set()
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _NOT_OWNING):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if (key := _storage(obj)) is not None:
                owned.add(key)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif hasattr(obj, "__dict__"):
            stack.extend(vars(obj).values())
    return owned


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
    """`capture_one` warms the function up and keeps it with its output; `replay` reruns it,
    failing on a read of memory a real graph would find freed (module docstring)."""

    def __init__(self, cuda_graph_runner=None, **_):
        self._runner = cuda_graph_runner
        self._functions: dict[Any, Callable[[], Any]] = {}
        self._outputs: dict[Any, Any] = {}
        self._capture_reads: dict[int, torch.Tensor] = {}
        self._freed: Optional[dict[int, torch.Tensor]] = None  # found at the first replay

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
        with _CaptureReads() as reads:
            self._outputs[shape_key] = forward_fn()
        self._capture_reads.update(reads.external)
        self._functions[shape_key] = forward_fn

    def can_run(self, forward_batch, shape_key) -> bool:
        return shape_key in self._functions

    @contextlib.contextmanager
    def replay_session(self):
        yield

    def replay(self, shape_key, static_forward_batch, **kwargs) -> Any:
        if self._freed is None:  # the runner's and the graphs' own outputs outlive the capture
            owned = owned_storages(self._runner, skip=self) | owned_storages(self._outputs, skip=None)
            self._freed = {key: t for key, t in self._capture_reads.items() if key not in owned}
        output = self._outputs[shape_key]
        with _FreedGuard(self._freed):
            fresh = self._functions[shape_key]()
        _copy_into(output, fresh)
        return output

    def cleanup(self) -> None:
        self._functions.clear()
        self._outputs.clear()
        self._capture_reads.clear()
        self._freed = None
