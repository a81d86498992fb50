"""Counting what a piece of tensor code builds on the host and sends to the device.

`HostTraffic` is a torch dispatch mode: while active, every op's new outputs (not views of
its inputs, not its in-place results: those allocate nothing) are tallied by where they live. Run the code with its device tensors on the `meta` device and the tallies
say, without a GPU, how many bytes the code creates on the host (`host_bytes`: tensors made
from Python data, host-side ops), copies from the host to the device (`to_device_bytes`),
and allocates on the device (`device_bytes`). Used to check that a PARSE round's verify
metadata costs the host O(batch x window), whatever the context length.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

_COPIES = {torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default, torch.ops.aten._copy_from.default}


class HostTraffic(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.host_bytes = 0
        self.to_device_bytes = 0
        self.device_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(ret.alias_info is not None for ret in func._schema.returns):
            return out  # a view or an in-place result
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        for tensor in (t for t in tree_leaves(out) if isinstance(t, torch.Tensor)):
            size = tensor.numel() * tensor.element_size()
            if tensor.device.type == "cpu":
                self.host_bytes += size
            else:
                self.device_bytes += size
                if func in _COPIES and any(t.device.type == "cpu" for t in inputs):
                    self.to_device_bytes += size
        return out
