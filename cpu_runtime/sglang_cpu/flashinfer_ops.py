"""Torch versions of the FlashInfer attention API that SGLang's `flashinfer` backend calls (CPU).

The stand-in package `standin_flashinfer/flashinfer` re-exports these names; see
`sglang_cpu.enable_flashinfer_standin`. The semantics are FlashInfer 0.7's for what
SGLang's `layers/attention/flashinfer_backend.py` uses, with page size 1 and the NHD layout:

- `plan` (alias `begin_forward`) records the batch: indptrs and KV indices are kept as
  given (FlashInfer's `.to(device)` of a same-device tensor), a custom mask is packed with
  `segment_packbits(..., bitorder="little")` exactly as FlashInfer packs it and unpacked
  once for the runs; `packed_custom_mask` is taken as is.
- `run` (and the deprecated `forward` / `forward_return_lse`, which first set causal,
  sm_scale, window_left and logits_soft_cap as FlashInfer does): a planned custom mask wins,
  else `causal` is FlashInfer's bottom-right-aligned causal mask, else full attention;
  `k_scale` scales sm_scale, `v_scale` the output; `return_lse` adds FlashInfer's base-2
  log-sum-exp (`-inf` for a row that sees nothing).
- `merge_state` merges two partial states with base-2 LSEs, as FlashInfer's MergeState
  kernel (an empty pair gives zeros and `-inf`).
- Attention itself is `sglang_cpu.paged.paged_prefill_attention`; a ragged
  wrapper is the paged one over the identity slot order of its k/v.

Everything SGLang's eager CPU paths do not use raises NotImplementedError naming the
feature (CUDA-graph wrappers, page size > 1, HND, sliding windows, soft-capped logits,
RoPE inside attention, multi-item scoring, attention sinks, quantized KV scales tensors);
performance-only knobs (split-KV sizes, non_blocking, backends, workspace sizes) are
accepted and have no effect.

Tests learn which of these paths an engine's processes ran from `trace` (each kind of call
is appended once per process to the file named by $PARSE_FLASHINFER_STANDIN_TRACE, if set).
"""

from __future__ import annotations

import math
import os
from typing import Optional

import torch
from torch import Tensor

from parse_sglang.attention.layout import indptr_of
from sglang_cpu.packbits import packbits as _packbits
from sglang_cpu.packbits import segment_packbits as _segment_packbits
from sglang_cpu.packbits import unpack_segments
from sglang_cpu.paged import paged_prefill_attention

__all__ = [
    "BatchDecodeWithPagedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "fast_decode_plan",
    "merge_state",
    "packbits",
    "segment_packbits",
]


TRACE_ENV = "PARSE_FLASHINFER_STANDIN_TRACE"
_traced: set[str] = set()


def trace(event: str) -> None:
    """Append `event` (e.g. "paged:custom_mask") to the $PARSE_FLASHINFER_STANDIN_TRACE file, once per process."""
    path = os.environ.get(TRACE_ENV)
    if path and event not in _traced:
        _traced.add(event)
        with open(path, "a") as f:
            f.write(event + "\n")


def _unsupported(feature: str) -> NotImplementedError:
    return NotImplementedError(
        f"{feature}: not supported by parse_sglang's CPU stand-in of FlashInfer, which covers "
        "what SGLang's eager flashinfer backend uses (page size 1, NHD, no sliding window, "
        "no soft cap, no CUDA graphs)"
    )


def _require(condition: bool, feature: str) -> None:
    if not condition:
        raise _unsupported(feature)


# ----- bit packing (FlashInfer's public defaults: bitorder "big") ------------------------


def packbits(x: Tensor, bitorder: str = "big") -> Tensor:
    """flashinfer.packbits: a 1-D boolean tensor -> uint8, zero-padded."""
    return _packbits(x.reshape(-1), bitorder)


def segment_packbits(x: Tensor, indptr: Tensor, bitorder: str = "big") -> tuple[Tensor, Tensor]:
    """flashinfer.segment_packbits: each segment packed on its own -> (packed, packed_indptr)."""
    return _segment_packbits(x.reshape(-1), indptr, bitorder)


# ----- merging partial attention states ---------------------------------------------------


def merge_state(v_a: Tensor, s_a: Tensor, v_b: Tensor, s_b: Tensor) -> tuple[Tensor, Tensor]:
    """flashinfer.cascade.merge_state: (v [n, h, d], base-2 LSE [n, h]) of KV segments A and B
    -> the state of A and B together, v in v_a's dtype, LSE fp32."""
    trace("merge_state")
    s_a, s_b = s_a.float(), s_b.float()
    s_max = torch.maximum(s_a, s_b)
    # Two empty states: (-inf) - (-inf) is NaN; FlashInfer's max(..., -inf) turns it into a zero weight.
    w_a = torch.exp2(torch.nan_to_num(s_a - s_max, nan=-math.inf))
    w_b = torch.exp2(torch.nan_to_num(s_b - s_max, nan=-math.inf))
    d_sum = w_a + w_b
    safe = torch.where(d_sum > 0, d_sum, torch.ones_like(d_sum))
    a_scale = torch.where(d_sum > 0, w_a / safe, torch.zeros_like(d_sum))
    b_scale = torch.where(d_sum > 0, w_b / safe, torch.zeros_like(d_sum))
    v = v_a.float() * a_scale[..., None] + v_b.float() * b_scale[..., None]
    return v.to(v_a.dtype), torch.log2(d_sum) + s_max


# ----- the wrappers ---------------------------------------------------------------------


def _unpack_kv(paged_kv_cache, kv_layout: str) -> tuple[Tensor, Tensor]:
    """(k, v) as [num_slots, Hk, D] from FlashInfer's accepted NHD forms with page size 1:
    a tuple of [slots, Hk, D] or [pages, 1, Hk, D] tensors, or one [pages, 2, (1,) Hk, D] tensor."""
    _require(kv_layout == "NHD", f"kv_layout={kv_layout!r}")
    if isinstance(paged_kv_cache, tuple):
        k, v = paged_kv_cache
    elif torch.is_tensor(paged_kv_cache):
        k, v = paged_kv_cache.unbind(dim=1)
    else:
        raise KeyError(f"paged_kv_cache: {type(paged_kv_cache).__name__}; expected a tensor or a (k, v) tuple")
    if k.dim() == 4:
        _require(k.shape[1] == 1 and v.shape[1] == 1, f"page size {k.shape[1]} in the KV cache (page size > 1)")
        k, v = k[:, 0], v[:, 0]
    return k, v


class _Wrapper:
    """What FlashInfer's wrappers share: construction, plan options, the masks, one run, and
    the deprecated `forward` entries SGLang calls (which set options, then run)."""

    _kind = ""  # for trace

    def __init__(self, float_workspace_buffer: Tensor, kv_layout: str = "NHD", use_cuda_graph: bool = False, **buffers):
        _require(kv_layout == "NHD", f"kv_layout={kv_layout!r}")
        _require(not use_cuda_graph, "use_cuda_graph=True (CUDA-graph wrappers)")
        _require(
            buffers.get("jit_args") is None and buffers.get("jit_kwargs") is None, "jit_args (custom JIT variants)"
        )
        self._float_workspace_buffer = float_workspace_buffer
        self.device = float_workspace_buffer.device
        self._kv_layout = kv_layout
        self._backend = buffers.get("backend", "auto")
        self._use_tensor_cores = bool(buffers.get("use_tensor_cores", False))
        self._custom_mask_buf: Optional[Tensor] = None  # packed, as FlashInfer keeps it
        self._mask_indptr_buf: Optional[Tensor] = None
        self._custom_mask: Optional[Tensor] = None  # unpacked once at plan
        self._causal = False
        self._sm_scale: Optional[float] = None
        self._window_left = -1
        self._out_dtype: Optional[torch.dtype] = None
        self._planned = False

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return False

    def _set_options(
        self,
        *,
        causal: Optional[bool] = None,
        pos_encoding_mode: str = "NONE",
        window_left: int = -1,
        logits_soft_cap: Optional[float] = None,
        sm_scale: Optional[float] = None,
        **no_effect,  # use_fp16_qk_reduction, rope_scale / rope_theta (RoPE is off)
    ) -> None:
        _require(
            pos_encoding_mode == "NONE", f"pos_encoding_mode={pos_encoding_mode!r} (RoPE / ALiBi inside attention)"
        )
        _require(window_left is None or window_left < 0, f"window_left={window_left} (sliding-window attention)")
        _require(not logits_soft_cap, f"logits_soft_cap={logits_soft_cap} (soft-capped logits)")
        self._sm_scale = sm_scale
        if causal is not None:
            self._causal = causal

    def _plan(
        self,
        qo_indptr: Tensor,
        kv_indptr: Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        *,
        custom_mask: Optional[Tensor] = None,
        packed_custom_mask: Optional[Tensor] = None,
        o_data_type=None,
        prefix_len_ptr: Optional[Tensor] = None,
        token_pos_in_items_ptr: Optional[Tensor] = None,
        v_indptr: Optional[Tensor] = None,
        o_indptr: Optional[Tensor] = None,
        block_tables: Optional[Tensor] = None,
        q_len_per_req: int = 1,
        **options,
    ) -> None:
        """What every plan does; `options` are _set_options' and the performance-only knobs
        (q/kv data types, non_blocking, split-KV sizes, max lengths), which have no effect."""
        _require(prefix_len_ptr is None and token_pos_in_items_ptr is None, "multi-item scoring (prefix_len_ptr)")
        _require(v_indptr is None and o_indptr is None, "v_indptr / o_indptr (ragged value / output layouts)")
        _require(block_tables is None, "block_tables (trtllm-gen)")
        _require(q_len_per_req == 1, f"q_len_per_req={q_len_per_req} (multi-token decode)")
        if num_qo_heads % num_kv_heads:
            raise ValueError(f"num_qo_heads={num_qo_heads} is not a multiple of num_kv_heads={num_kv_heads}")
        if len(qo_indptr) != len(kv_indptr):
            raise ValueError("The length of qo_indptr and paged_kv_indptr should be the same.")
        option_names = ("causal", "pos_encoding_mode", "window_left", "logits_soft_cap", "sm_scale")
        self._set_options(**{name: options[name] for name in option_names if name in options})
        self._qo_indptr_buf, self._kv_indptr_buf = qo_indptr, kv_indptr
        self._set_mask(custom_mask, packed_custom_mask)
        self._out_dtype = _dtype(o_data_type) if o_data_type is not None else None
        self._planned = True

    def _set_mask(self, custom_mask: Optional[Tensor], packed_custom_mask: Optional[Tensor]) -> None:
        """FULL custom mask: per request qo_len x kv_len booleans, row-major, concatenated."""
        if custom_mask is None and packed_custom_mask is None:
            self._custom_mask_buf = self._mask_indptr_buf = self._custom_mask = None
            return
        qo_lens = self._qo_indptr_buf[1:] - self._qo_indptr_buf[:-1]
        mask_indptr = indptr_of(qo_lens.long() * (self._kv_indptr_buf[1:] - self._kv_indptr_buf[:-1]).long())
        if packed_custom_mask is None:
            packed_custom_mask, packed_indptr = _segment_packbits(
                custom_mask.contiguous().view(-1), mask_indptr.to(custom_mask.device), "little"
            )
        else:
            packed_indptr = indptr_of((mask_indptr[1:] - mask_indptr[:-1] + 7) // 8, torch.int32)
        self._custom_mask_buf, self._mask_indptr_buf = packed_custom_mask, packed_indptr
        self._custom_mask = unpack_segments(packed_custom_mask, mask_indptr, "little")

    def _attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        kv_indices: Tensor,
        *,
        q_scale=None,
        k_scale=None,
        v_scale=None,
        out: Optional[Tensor] = None,
        lse: Optional[Tensor] = None,
        return_lse: bool = False,
        window_left: Optional[int] = None,
        sinks=None,
        kv_cache_sf=None,
        **no_effect,  # enable_pdl, ...
    ):
        if not self._planned:
            raise RuntimeError(f"{type(self).__name__}: run before plan")
        _require(sinks is None, "sinks (attention sinks)")
        _require(kv_cache_sf is None, "kv_cache_sf (block-scaled KV cache)")
        if window_left is not None and window_left != self._window_left:
            raise AssertionError(f"window_left={window_left} differs from the planned {self._window_left}")
        for name, scale in (("q_scale", q_scale), ("k_scale", k_scale), ("v_scale", v_scale)):
            _require(scale is None or isinstance(scale, (int, float)), f"{name} as a tensor (per-head KV scales)")
        causal = self._custom_mask is None and self._causal
        mode = "custom_mask" if self._custom_mask is not None else "causal" if causal else "full"
        trace(f"{self._kind}:{mode}{'+lse' if return_lse else ''}")
        sm_scale = self._sm_scale if self._sm_scale is not None else 1.0 / math.sqrt(q.size(-1))
        sm_scale *= (q_scale if q_scale is not None else 1.0) * (k_scale if k_scale is not None else 1.0)
        o, s = paged_prefill_attention(
            q,
            k,
            v,
            self._qo_indptr_buf,
            self._kv_indptr_buf,
            kv_indices,
            custom_mask=self._custom_mask,
            sm_scale=sm_scale,
            causal=causal,
            return_lse=True,
        )
        if v_scale is not None and v_scale != 1.0:
            o = o * v_scale
        o = o.to(self._out_dtype or q.dtype)
        if out is not None:
            out.copy_(o)
            o = out
        if lse is not None:
            lse.copy_(s)
            s = lse
        return (o, s) if return_lse else o

    def run_return_lse(self, *args, **kwargs):
        return self.run(*args, **{**kwargs, "return_lse": True})

    def _forward(self, run_args: tuple, *, q_scale=None, k_scale=None, v_scale=None, return_lse=False, **options):
        """The deprecated forward: set causal / sm_scale / window / soft cap, then run."""
        self._set_options(**options)
        return self.run(*run_args, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, return_lse=return_lse)

    def forward_return_lse(self, *args, **kwargs):
        return self.forward(*args, **kwargs, return_lse=True)

    def end_forward(self) -> None:
        """Deprecated in FlashInfer; no effect."""


class _PagedWrapper(_Wrapper):
    """A wrapper over a paged KV cache (page size 1): the planned slots, and the run over them."""

    def _plan_pages(self, qo_indptr, kv_indptr, indices, last_page_len, num_qo_heads, num_kv_heads, page_size, options):
        _require(page_size == 1, f"page_size={page_size} (page size > 1)")
        self._plan(qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, **options)
        self._paged_kv_indices_buf = indices
        self._paged_kv_last_page_len_buf = last_page_len

    def run(self, q: Tensor, paged_kv_cache, *args, **kwargs):
        """Attention of q [qo_indptr[-1], Hq, D] over the planned slots of the paged cache."""
        k, v = _unpack_kv(paged_kv_cache, self._kv_layout)
        return self._attend(q, k, v, self._paged_kv_indices_buf, **kwargs)


class BatchPrefillWithPagedKVCacheWrapper(_PagedWrapper):
    """flashinfer.BatchPrefillWithPagedKVCacheWrapper (page size 1, NHD, eager)."""

    _kind = "paged"

    def plan(
        self,
        qo_indptr: Tensor,
        paged_kv_indptr: Tensor,
        paged_kv_indices: Tensor,
        paged_kv_last_page_len: Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        page_size: int,
        head_dim_vo: Optional[int] = None,
        **options,
    ) -> None:
        """custom_mask / packed_custom_mask (FULL), causal, sm_scale, ...: FlashInfer's keywords."""
        self._plan_pages(
            qo_indptr,
            paged_kv_indptr,
            paged_kv_indices,
            paged_kv_last_page_len,
            num_qo_heads,
            num_kv_heads,
            page_size,
            options,
        )

    begin_forward = plan

    def forward(self, q: Tensor, paged_kv_cache, causal: bool = False, **options):
        return self._forward((q, paged_kv_cache), causal=causal, **options)


class BatchPrefillWithRaggedKVCacheWrapper(_Wrapper):
    """flashinfer.BatchPrefillWithRaggedKVCacheWrapper (NHD, eager): request b's queries
    q[qo_indptr[b]:qo_indptr[b+1]] attend to k/v[kv_indptr[b]:kv_indptr[b+1]]."""

    _kind = "ragged"

    def plan(
        self,
        qo_indptr: Tensor,
        kv_indptr: Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        head_dim_vo: Optional[int] = None,
        **options,
    ) -> None:
        """custom_mask / packed_custom_mask (FULL), causal, sm_scale, ...: FlashInfer's keywords."""
        self._plan(qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, **options)

    begin_forward = plan

    def run(self, q: Tensor, k: Tensor, v: Tensor, *args, **kwargs):
        """Attention of q [qo_indptr[-1], Hq, D] over k/v [kv_indptr[-1], Hk, D]."""
        return self._attend(q, k, v, torch.arange(k.shape[0], device=k.device), **kwargs)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, causal: bool = False, **options):
        return self._forward((q, k, v), causal=causal, **options)


class BatchDecodeWithPagedKVCacheWrapper(_PagedWrapper):
    """flashinfer.BatchDecodeWithPagedKVCacheWrapper (page size 1, NHD, eager): one query row
    per request, attending to all of its planned slots."""

    _kind = "decode"

    @property
    def use_tensor_cores(self) -> bool:
        return self._use_tensor_cores

    def plan(
        self,
        indptr: Tensor,
        indices: Tensor,
        last_page_len: Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        **options,
    ) -> None:
        """sm_scale, q_len_per_req, data types, ...: FlashInfer's keywords (all after page_size)."""
        batch = len(last_page_len)
        one_row_each = torch.arange(batch + 1, dtype=torch.int32, device=indptr.device)
        options = {**options, "causal": False}
        self._plan_pages(
            one_row_each, indptr[: batch + 1], indices, last_page_len, num_qo_heads, num_kv_heads, page_size, options
        )

    begin_forward = plan

    def forward(self, q: Tensor, paged_kv_cache, **options):
        return self._forward((q, paged_kv_cache), **options)


def fast_decode_plan(
    self: BatchDecodeWithPagedKVCacheWrapper,
    indptr: Tensor,
    *plan_args,
    global_override_indptr_cpu: Optional[Tensor] = None,
    **options,
) -> None:
    """flashinfer.fast_decode_plan, SGLang's `partial(fast_decode_plan, wrapper)` begin_forward.

    On a GPU it skips plan's buffer copies and schedules from the host indptr
    `global_override_indptr_cpu`; the stand-in has no schedule, so it is plan, after checking
    that the host indptr agrees with `indptr` (a disagreement would be a silent error there).
    """
    if global_override_indptr_cpu is not None:
        host = global_override_indptr_cpu[: len(indptr)].to(torch.int64)
        if not torch.equal(host, indptr.cpu().to(torch.int64)):
            raise ValueError(f"global_override_indptr_cpu={host.tolist()} disagrees with indptr={indptr.tolist()}")
    self.plan(indptr, *plan_args, **options)


def _dtype(value) -> torch.dtype:
    return getattr(torch, value) if isinstance(value, str) else value
