"""Bit packing of boolean masks, byte-for-byte as FlashInfer packs a custom mask.

FlashInfer's `plan(custom_mask=...)` packs the FULL mask with
`segment_packbits(mask, mask_indptr, bitorder="little")`: every request's segment is padded
to whole bytes on its own. Packing it ourselves lets a caller hand FlashInfer
`packed_custom_mask` directly (8x less to move) and lets tests check the packed form on CPU.
Note FlashInfer's public `packbits` / `segment_packbits` default to bitorder="big"; here the
default is "little", the order its attention kernels read.
"""

from __future__ import annotations

import torch
from torch import Tensor

from parse_sglang.attention.layout import indptr_of, ragged_index

_BITORDERS = ("little", "big")


def _bit_weights(bitorder: str, device) -> Tensor:
    if bitorder not in _BITORDERS:
        raise ValueError(f"bitorder: {bitorder!r}; allowed: {', '.join(_BITORDERS)}")
    shifts = torch.arange(8, device=device)
    if bitorder == "big":
        shifts = 7 - shifts
    return (1 << shifts).to(torch.int32)


def packbits(x: Tensor, bitorder: str = "little") -> Tensor:
    """Pack a 1-D boolean tensor into uint8 [(n + 7) // 8], like numpy.packbits (zero-padded)."""
    if x.dim() != 1:
        raise ValueError(f"x: shape {tuple(x.shape)}; packbits takes a 1-D tensor")
    weights = _bit_weights(bitorder, x.device)
    bits = torch.nn.functional.pad(x.to(torch.int32), (0, (-x.numel()) % 8)).view(-1, 8)
    return (bits * weights).sum(dim=1).to(torch.uint8)


def unpackbits(packed: Tensor, count: int, bitorder: str = "little") -> Tensor:
    """Inverse of packbits: the first `count` bits of uint8 `packed` as a bool tensor."""
    weights = _bit_weights(bitorder, packed.device)
    bits = (packed.to(torch.int32)[:, None] & weights) != 0
    return bits.flatten()[:count]


def segment_packbits(x: Tensor, indptr: Tensor, bitorder: str = "little") -> tuple[Tensor, Tensor]:
    """Pack each segment x[indptr[i]:indptr[i+1]] separately -> (packed uint8, packed_indptr int32).

    packed_indptr[i+1] - packed_indptr[i] == (segment length + 7) // 8, as in FlashInfer.
    """
    lengths = (indptr[1:] - indptr[:-1]).to(torch.int64)
    if (lengths < 0).any() or int(indptr[-1]) != x.numel():
        raise ValueError(f"indptr: must be non-decreasing and end at len(x) = {x.numel()}; got {indptr.tolist()}")
    packed_indptr = indptr_of((lengths + 7) // 8)
    # Scatter each segment to a byte-aligned start, then pack the whole padded stream.
    segment, local = ragged_index(lengths)
    padded = torch.zeros(8 * int(packed_indptr[-1]), dtype=torch.bool, device=x.device)
    padded[8 * packed_indptr[segment] + local] = x.to(torch.bool)
    return packbits(padded, bitorder), packed_indptr.to(torch.int32)


def unpack_segments(packed: Tensor, indptr: Tensor, bitorder: str = "little") -> Tensor:
    """Inverse of segment_packbits, given the ORIGINAL (unpacked) segment indptr."""
    lengths = (indptr[1:] - indptr[:-1]).to(torch.int64)
    packed_indptr = indptr_of((lengths + 7) // 8)
    segment, local = ragged_index(lengths)
    bits = unpackbits(packed, 8 * packed.numel(), bitorder)
    return bits[8 * packed_indptr[segment] + local]
