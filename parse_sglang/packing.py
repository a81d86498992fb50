"""Several per-request tensors as ONE int32 tensor, so that a round moves its plan to the
device and its result back in one copy each (docs/gpu.md §9), and a tensor-parallel server
broadcasts each in one collective.

Fields are [bs, width] (or [bs]) int, bool or float32 tensors; floats travel as their bits
(`Tensor.view(torch.int32)`), so they come back exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch


@dataclass(frozen=True)
class Field:
    """One packed field: its dtype and width (columns per request; None for a [bs] tensor)."""

    dtype: torch.dtype
    width: Optional[int]

    @property
    def columns(self) -> int:
        return 1 if self.width is None else self.width


def fields_of(tensors: Sequence[torch.Tensor]) -> tuple[Field, ...]:
    return tuple(Field(t.dtype, t.shape[1] if t.dim() == 2 else None) for t in tensors)


def pack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """[bs, sum of widths] int32 holding `tensors` side by side (all on one device)."""
    columns = []
    for t in tensors:
        t = t.reshape(t.shape[0], -1)
        if t.dtype == torch.float32:
            columns.append(t.contiguous().view(torch.int32))
        elif t.dtype.is_floating_point:
            raise TypeError(f"pack: {t.dtype} cannot travel exactly; allowed are int, bool and float32 tensors")
        else:
            columns.append(t.to(torch.int32))
    return torch.cat(columns, dim=1)


def unpack(packed: torch.Tensor, fields: Sequence[Field]) -> list[torch.Tensor]:
    """The tensors `pack` was given, in their dtypes and shapes, on `packed`'s device."""
    parts = packed.split([f.columns for f in fields], dim=1)
    out = []
    for part, f in zip(parts, fields, strict=True):
        if f.dtype == torch.float32:
            part = part.contiguous().view(torch.float32)
        elif f.dtype == torch.bool:
            part = part != 0
        else:
            part = part.to(f.dtype)
        out.append(part[:, 0] if f.width is None else part)
    return out
