"""The PARSE verify window of a batch: rows, positions, KV indices and custom masks.

One request's window is N = 1 + L + K*m query rows appended after its committed KV:

    chain rows 0..L      c_n, d_1..d_L        positions P + j
    probe block k        s_1..s_m             positions P + 1 + b_k + i

(P = prefix_len, the committed tokens already in the KV cache.) Every row sees all P
committed tokens; chain rows are causal among themselves; probe k row i sees chain rows
0..b_k and probe-k rows 0..i, so each probe reads exactly as if the suffix had been
appended right after d_{b_k}. Everything here is built with tensor ops over all rows of
the batch at once; only the per-request Python lists are walked to flatten them.

The masks come in SGLang's two forms: QLEN_ONLY (N x N per request, what the CPU
backends read) and FULL (N x (P + N) per request, FlashInfer's `custom_mask`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor


@dataclass(frozen=True)
class VerifyRequest:
    """One request's verify round: committed length, last token, draft, boundaries, probe suffix."""

    prefix_len: int
    last_token: int
    draft_ids: Sequence[int]
    boundaries: Sequence[int]
    suffix_ids: Sequence[int]


@dataclass(frozen=True)
class VerifyLayout:
    """Attention metadata of a verify batch; row indices are global over the batch's rows."""

    num_requests: int
    input_ids: Tensor  # [R] int64
    positions: Tensor  # [R] int64
    prefix_lens: Tensor  # [B] int64, committed tokens in the KV cache (P)
    draft_lens: Tensor  # [B] int64 (L)
    window_lens: Tensor  # [B] int64 (N = 1 + L + K*m)
    seq_lens: Tensor  # [B] int64 (P + N)
    qo_indptr: Tensor  # [B+1] int32
    kv_indptr: Tensor  # [B+1] int32
    kv_indices: Tensor  # [sum seq_lens] int32, slot of every KV entry a request reads
    out_cache_loc: Tensor  # [R] int64, slot each window row's KV is written to
    mask_qlen_only: Tensor  # flat bool, per request N x N row-major
    mask_qlen_only_indptr: Tensor  # [B+1] int64
    mask_full: Tensor  # flat bool, per request N x (P + N) row-major
    mask_full_indptr: Tensor  # [B+1] int64
    chain_rows: Tensor  # [sum (L+1)] int64, rows of c_n, d_1..d_L
    chain_indptr: Tensor  # [B+1] int64
    probe_rows: Tensor  # [sum K] int64, last row of each probe block (judge answer)
    probe_boundaries: Tensor  # [sum K] int64, b_k of each probe
    probe_indptr: Tensor  # [B+1] int64


def ragged_index(lengths: Tensor) -> tuple[Tensor, Tensor]:
    """For consecutive segments of `lengths`: each element's segment id and index inside it."""
    segment = torch.repeat_interleave(torch.arange(len(lengths), device=lengths.device), lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    local = torch.arange(int(lengths.sum()), device=lengths.device) - starts[segment]
    return segment, local


def indptr_of(lengths: Tensor, dtype: torch.dtype = torch.int64) -> Tensor:
    """[0, cumsum(lengths)...] as `dtype`."""
    out = torch.zeros(len(lengths) + 1, dtype=dtype, device=lengths.device)
    out[1:] = torch.cumsum(lengths, 0)
    return out


def row_roles(row: Tensor, draft_len, suffix_len) -> tuple[Tensor, Tensor, Tensor]:
    """(is_chain, k, i) of window rows: rows 0..L are the chain; row L+1+k*m+i is row i of
    probe block k (k and i are meaningless on chain rows). draft_len / suffix_len are ints
    or tensors broadcastable with `row`; a suffix length of 0 (no probes) is allowed."""
    is_chain = row <= draft_len
    offset = row - draft_len - 1
    m = max(suffix_len, 1) if isinstance(suffix_len, int) else suffix_len.clamp(min=1)
    k = torch.div(offset, m, rounding_mode="floor")
    return is_chain, k, offset - k * m


def row_reach(
    row: Tensor, is_chain: Tensor, draft_len, suffix_len, k: Tensor, boundary: Tensor
) -> tuple[Tensor, Tensor]:
    """(chain_hi, own_lo): the last chain row a row sees (a chain row: itself; a probe row of
    boundary b_k: chain row b_k) and the first row of its own probe block it sees (a chain
    row: none, so row + 1)."""
    chain_hi = torch.where(is_chain, row, boundary)
    own_lo = torch.where(is_chain, row + 1, draft_len + 1 + k * suffix_len)
    return chain_hi, own_lo


def row_offsets(row: Tensor, is_chain: Tensor, boundary: Tensor, i: Tensor) -> Tensor:
    """Position of each row after the committed prefix: chain row j at P + j, probe row i of
    boundary b_k at P + 1 + b_k + i (right after d_{b_k}, as if the suffix were appended there)."""
    return torch.where(is_chain, row, 1 + boundary + i)


def visible(col: Tensor, row: Tensor, chain_hi: Tensor, own_lo: Tensor) -> Tensor:
    """Whether window row `row` sees window column `col` (the PARSE mask rule)."""
    return (col <= chain_hi) | ((col >= own_lo) & (col <= row))


def expand_qlen_only_mask(mask_qlen_only: Tensor, prefix_lens: Tensor, window_lens: Tensor) -> Tensor:
    """QLEN_ONLY (N x N per request) -> FULL (N x (P + N) per request, prefix columns all True)."""
    prefix_lens = torch.as_tensor(prefix_lens, dtype=torch.int64, device=mask_qlen_only.device)
    window_lens = torch.as_tensor(window_lens, dtype=torch.int64, device=mask_qlen_only.device)
    expected = int((window_lens * window_lens).sum())
    if mask_qlen_only.numel() != expected:
        raise ValueError(
            f"mask_qlen_only: has {mask_qlen_only.numel()} elements, expected sum(window_lens**2) = {expected}"
        )
    row_lens = prefix_lens + window_lens
    full = torch.ones(int((window_lens * row_lens).sum()), dtype=torch.bool, device=mask_qlen_only.device)
    request, local = ragged_index(window_lens * window_lens)
    row, col = local // window_lens[request], local % window_lens[request]
    full_start = indptr_of(window_lens * row_lens)[:-1]
    dest = full_start[request] + row * row_lens[request] + prefix_lens[request] + col
    full[dest] = mask_qlen_only.reshape(-1).to(torch.bool)
    return full


def _validate(index: int, req: VerifyRequest) -> None:
    draft_len = len(req.draft_ids)
    if req.prefix_len < 0:
        raise ValueError(f"requests[{index}].prefix_len: {req.prefix_len} is negative; must be >= 0")
    if draft_len == 0:
        raise ValueError(f"requests[{index}].draft_ids: empty; a verify round needs >= 1 draft token")
    bounds = list(req.boundaries)
    for k, b in enumerate(bounds):
        if not 1 <= b <= draft_len:
            raise ValueError(
                f"requests[{index}].boundaries: {bounds} has {b} at {k}; "
                f"each must lie in [1, {draft_len}] (the draft length)"
            )
        if k > 0 and b <= bounds[k - 1]:
            raise ValueError(f"requests[{index}].boundaries: {bounds} is not strictly increasing at {k}")
    if bounds and len(req.suffix_ids) == 0:
        raise ValueError(
            f"requests[{index}].suffix_ids: empty with {len(bounds)} boundaries; "
            "probes need a suffix of >= 1 token (or no boundaries)"
        )


def _long(values, device) -> Tensor:
    return torch.as_tensor(list(values), dtype=torch.int64, device=device)


def build_verify_layout(
    requests: Sequence[VerifyRequest],
    kv_slots: Sequence[Tensor] | None = None,
    device: str | torch.device = "cpu",
) -> VerifyLayout:
    """Lay out the verify window of a batch (see the module docstring).

    kv_slots: per request, the KV-pool slot of each of its P committed tokens followed by the
    slot of each of its N window rows (page size 1). None: slots are contiguous, request
    after request, from 0.
    """
    if len(requests) == 0:
        raise ValueError("requests: empty; a verify batch needs >= 1 request")
    for i, req in enumerate(requests):
        _validate(i, req)
    num_requests = len(requests)
    prefix = _long((r.prefix_len for r in requests), device)
    draft = _long((len(r.draft_ids) for r in requests), device)
    num_probes = _long((len(r.boundaries) for r in requests), device)
    # With no probes the suffix is unused; zero keeps N = 1 + L.
    suffix = torch.where(num_probes > 0, _long((len(r.suffix_ids) for r in requests), device), 0)
    window = 1 + draft + num_probes * suffix
    seq = prefix + window

    if kv_slots is None:
        kv_flat = torch.arange(int(seq.sum()), dtype=torch.int64, device=device)
    else:
        if len(kv_slots) != num_requests:
            raise ValueError(f"kv_slots: {len(kv_slots)} tensors for {num_requests} requests; need one per request")
        for i, slots in enumerate(kv_slots):
            if slots.dim() != 1 or slots.numel() != int(seq[i]):
                raise ValueError(
                    f"kv_slots[{i}]: shape {tuple(slots.shape)}; must be 1-D of length "
                    f"prefix_len + window = {int(prefix[i])} + {int(window[i])} = {int(seq[i])}"
                )
        kv_flat = torch.cat([s.to(device=device, dtype=torch.int64) for s in kv_slots])

    # Flattened per-request lists.
    chain_tokens = _long((t for r in requests for t in (r.last_token, *r.draft_ids)), device)
    suffix_tokens = _long((t for r, m in zip(requests, suffix.tolist()) for t in list(r.suffix_ids)[:m]), device)
    boundaries = _long((b for r in requests for b in r.boundaries), device)
    suffix_start = indptr_of(suffix)[:-1]
    probe_indptr = indptr_of(num_probes)

    # Per-row attributes; chain rows and probe rows each come in the order of their flat lists.
    request, row = ragged_index(window)
    row_start = indptr_of(window)[:-1]
    L, m = draft[request], suffix[request]
    is_chain, k, i = row_roles(row, L, m)
    is_probe = ~is_chain
    b = torch.zeros_like(row)
    b[is_probe] = boundaries[probe_indptr[request[is_probe]] + k[is_probe]]
    chain_hi, own_lo = row_reach(row, is_chain, L, m, k, b)
    positions = prefix[request] + row_offsets(row, is_chain, b, i)
    input_ids = torch.empty_like(row)
    input_ids[is_chain] = chain_tokens
    input_ids[is_probe] = suffix_tokens[suffix_start[request[is_probe]] + i[is_probe]]

    # QLEN_ONLY mask: one element per (row, column) of each request's N x N block.
    cell_request, cell = ragged_index(window * window)
    cell_row = cell // window[cell_request]
    cell_col = cell % window[cell_request]
    cell_global_row = row_start[cell_request] + cell_row
    mask_qlen_only = visible(cell_col, cell_row, chain_hi[cell_global_row], own_lo[cell_global_row])

    chain_rows = torch.nonzero(is_chain).flatten()
    probe_rows = torch.nonzero(is_probe & (i == m - 1)).flatten()
    kv_request, kv_pos = ragged_index(seq)
    is_window_kv = kv_pos >= prefix[kv_request]

    return VerifyLayout(
        num_requests=num_requests,
        input_ids=input_ids,
        positions=positions,
        prefix_lens=prefix,
        draft_lens=draft,
        window_lens=window,
        seq_lens=seq,
        qo_indptr=indptr_of(window, torch.int32),
        kv_indptr=indptr_of(seq, torch.int32),
        kv_indices=kv_flat.to(torch.int32),
        out_cache_loc=kv_flat[is_window_kv],
        mask_qlen_only=mask_qlen_only,
        mask_qlen_only_indptr=indptr_of(window * window),
        mask_full=expand_qlen_only_mask(mask_qlen_only, prefix, window),
        mask_full_indptr=indptr_of(window * seq),
        chain_rows=chain_rows,
        chain_indptr=indptr_of(draft + 1),
        probe_rows=probe_rows,
        probe_boundaries=boundaries,
        probe_indptr=probe_indptr,
    )
