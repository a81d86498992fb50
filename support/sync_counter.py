"""Counting, on a CPU, what would make a GPU's host wait: device-to-host reads and
host-to-device copies (docs/gpu.md §9).

On a CPU every tensor is a host tensor, so `SyncCounter` keeps the distinction itself: a
tensor stands for a device tensor unless it is known to live on the host. Host tensors are
those made by a factory given no device (`torch.tensor(list)`, `torch.arange(n)`: on a GPU
machine, the host's default device), those `.cpu()` returns, those the caller names
(`mark_host`: e.g. a batch's `*_cpu` fields), and whatever ops make from host tensors alone.
A factory given a device (`device=self.device`), and `.to(device)` of a host tensor, make a
device tensor: on a CPU run the device is named "cpu", so this counter cannot tell an
explicit `device="cpu"` (host) from the device, nor `.to("cpu")` (a read) from `.to(device)`
of a device tensor (nothing): PARSE's round code names the host by leaving the device out and
reads with `.cpu()`, which it can tell; SGLang's own code sometimes does not, so SGLang's
counts are indicative only.

Counted, with the Python frame that asked for it:
- device -> host: `.item()`, `.tolist()`, `.cpu()`, `.numpy()`, `bool()` / `int()` / `float()`
  of a device tensor, a copy into a host tensor, and ops whose output size
  depends on a device tensor's values (`nonzero`, boolean-mask indexing, `masked_select`,
  `unique`, `repeat_interleave` without `output_size`): each blocks the host on a GPU;
- host -> device: `.to(device)` of a host tensor, `torch.tensor(data, device=...)`, a copy
  from a host tensor into a device one, and an op that mixes a host tensor of more than one
  element into device tensors (on a GPU: an implicit copy, or an error).

Each event is attributed to PARSE's round (the innermost frame outside torch is in
`parse_sglang`) or to SGLang (anything else, the CPU runtime `sglang_cpu` among it).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import weakref
from collections import Counter
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

_T = torch.Tensor
_READS = {_T.item, _T.tolist, _T.cpu, _T.numpy, _T.__bool__, _T.__int__, _T.__float__, _T.__index__}
_DATA_SHAPED = {
    torch.nonzero,
    _T.nonzero,
    torch.masked_select,
    _T.masked_select,
    torch.unique,
    _T.unique,
    torch.argwhere,
    _T.argwhere,
}
_FROM_DATA = {torch.tensor, torch.as_tensor, torch.asarray}
_PACKAGE = os.path.dirname(importlib.util.find_spec("parse_sglang").origin) + os.sep  # the one this process runs
_TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


@dataclass
class SyncEvent:
    direction: str  # "device_to_host" | "host_to_device"
    owner: str  # "parse" | "sglang"
    step: str  # the worker step running (set by the caller), "" outside one
    what: str  # the call
    where: str  # file:line of the innermost frame outside torch
    nbytes: int


class SyncCounter(TorchFunctionMode):
    """A torch function mode counting host/device traffic (module docstring)."""

    def __init__(self):
        super().__init__()
        self.events: list[SyncEvent] = []
        self.host_bytes = 0  # bytes of host tensors made (host-side tensor work)
        self.step = ""  # the worker step running, set by the caller
        self._host: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    # ----- provenance ---------------------------------------------------------------------

    def mark_host(self, *tensors) -> None:
        for t in tree_leaves(tensors):
            if isinstance(t, torch.Tensor):
                self._host[id(t)] = t

    def is_host(self, t: torch.Tensor) -> bool:
        return self._host.get(id(t)) is t

    def counts(self, owner: str = "parse") -> Counter:
        return Counter(e.direction for e in self.events if e.owner == owner)

    # ----- the mode -----------------------------------------------------------------------

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        on_device = [t for t in inputs if not self.is_host(t)]
        out = func(*args, **kwargs)
        if func in (_T.to, _T.cuda, _T.cpu) and out is args[0]:
            out = out.clone()  # a transfer makes a new tensor on a GPU; on a CPU it returns its input
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        name = getattr(func, "__qualname__", getattr(func, "__name__", repr(func)))
        host_out = False
        if func in _READS:
            if on_device:
                self._event("device_to_host", name, args[0])
            host_out = True
        elif func is _T.to or func is _T.cuda:
            target = kwargs.get("device", args[1] if len(args) > 1 else None)
            to_device = (
                func is _T.cuda
                or isinstance(target, (str, torch.device))
                or (isinstance(target, torch.Tensor) and not self.is_host(target))
            )
            if to_device and self.is_host(args[0]):
                self._event("host_to_device", name, args[0])
            host_out = self.is_host(args[0]) and not to_device
        elif func is _T.copy_:
            dst, src = args[0], args[1]
            if self.is_host(dst) and not self.is_host(src):
                self._event("device_to_host", name, src)
            elif not self.is_host(dst) and self.is_host(src):
                self._event("host_to_device", name, src)
            host_out = self.is_host(dst)
        elif not inputs:
            host_out = kwargs.get("device") is None
            if not host_out and func in _FROM_DATA:
                self._event("host_to_device", name, outputs[0] if outputs else None)
        else:
            host_out = not on_device
            if on_device and (func in _DATA_SHAPED or self._data_shaped(func, args, kwargs)):
                self._event("device_to_host", name, on_device[0])
            mixed = [t for t in inputs if self.is_host(t) and t.numel() > 1]
            if on_device and mixed:
                self._event("host_to_device", name + " (a host tensor mixed into device ones)", mixed[0])
        if host_out:
            self.mark_host(outputs)
            self.host_bytes += sum(t.numel() * t.element_size() for t in outputs)
        return out

    @staticmethod
    def _data_shaped(func, args, kwargs) -> bool:
        """Boolean-mask indexing, and repeat_interleave with tensor repeats and no output_size."""
        if func in (_T.__getitem__, _T.__setitem__):
            index = args[1] if len(args) > 1 else None
            return any(isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in tree_leaves(index))
        if func in (torch.repeat_interleave, _T.repeat_interleave):
            repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
            return isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None
        return False

    def _event(self, direction: str, what: str, tensor) -> None:
        frame = sys._getframe(2)
        while frame is not None and frame.f_code.co_filename.startswith(_TORCH):
            frame = frame.f_back
        where = "?" if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno}"
        path = "" if frame is None else frame.f_code.co_filename
        owner = "parse" if path.startswith(_PACKAGE) else "sglang"
        nbytes = tensor.numel() * tensor.element_size() if isinstance(tensor, torch.Tensor) else 0
        self.events.append(SyncEvent(direction, owner, self.step, what, where, nbytes))
