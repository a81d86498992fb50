"""SGLang's FlashInfer attention backend on a CPU, against parse_sglang's torch FlashInfer stand-in.

Tests only: `parse_sglang.plugin` installs this module only in processes where `import
flashinfer` loads the stand-in (`sglang_cpu.enable_flashinfer_standin()`), never by
default and never next to a real FlashInfer. Everything else in
`sglang/srt/layers/attention/flashinfer_backend.py` runs as shipped; what it changes:

1. `flashinfer_backend`: runs the module's own `if is_flashinfer_available():` import block,
   which SGLang skipped at import because FlashInfer is gated on CUDA
   (`is_flashinfer_available()` = flashinfer importable and `is_cuda()`). That binds
   `BatchPrefillWithPagedKVCacheWrapper`, `BatchPrefillWithRaggedKVCacheWrapper`,
   `BatchDecodeWithPagedKVCacheWrapper`, `fast_decode_plan` and `merge_state` (from the
   stand-in), `merge_state_triton` and SGLang's `_safe_merge_state`. `is_flashinfer_available()`
   itself stays False, so no other SGLang path (sampling, norms, RoPE, MoE) turns to FlashInfer.
2. `flashinfer_backend.merge_state_triton` -> the torch version of its Triton kernel
   (`_safe_merge_state`'s fallback for many heads; sglang_cpu.triton_ops).
3. `flashinfer_backend.generate_draft_decode_kv_indices` -> the torch version of that Triton
   kernel, which `FlashInferMultiStepDraftBackend` launches for its per-step KV indices.
4. `flashinfer_backend.torch` -> a view of torch whose `empty` / `zeros` place a
   `device="cuda"` tensor on the CPU: `FlashInferIndicesUpdaterDecode.call_begin_forward`
   (the decode KV indices) and `FlashInferMultiStepDraftBackend.init_forward_metadata` (the
   draft-step KV indices) allocate with a hard-coded `device="cuda"`. Every other name is torch's.
5. `sglang.srt.mem_cache.kv_index_translator.create_flashinfer_kv_indices_triton` -> the torch
   version of that Triton kernel: `KVIndexTranslator.pack_read_stream` launches it for every
   paged plan (extend, decode, and the verify input's `generate_attn_arg_prefill`).
6. `sglang.srt.speculative.eagle_utils.default_tree_mask_mode` (and every module that
   imported it by name) -> always `TreeMaskMode.FULL_MASK`. SGLang picks the verify-mask form
   by platform: QLEN_ONLY (n x n per request) on a CPU, the form of its intel_amx CPU kernel,
   FULL (n x (prefix + n)) elsewhere; its FlashInfer backend reads FULL, and
   `EagleVerifyInput.generate_attn_arg_prefill` pads a short mask with True instead of
   refusing it, so EAGLE / STANDALONE verification through FlashInfer on a CPU would attend
   to the wrong keys. parse_sglang's torch_native verify reads both forms, so a torch_native
   engine started while the stand-in is on is unaffected (intel_amx is not).

What stays unrun on CPU: the CUDA-graph paths (`init_cuda_graph_state`, capture / replay
metadata, `fast_prefill_plan`, graph wrappers with fixed buffers: the stand-in refuses
`use_cuda_graph=True`), sliding-window and cross-attention wrapper pairs, FP4 / FP8 dequant
workspaces, multi-item scoring, and EAGLE's plan stream (`torch.cuda.Stream`).

`uninstall()` restores every replaced or added name (sglang_cpu.disable_flashinfer_standin).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
import types
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from sglang.srt.speculative.eagle_utils import TreeMaskMode

FLASHINFER_BACKEND = "sglang.srt.layers.attention.flashinfer_backend"
KV_INDEX_TRANSLATOR = "sglang.srt.mem_cache.kv_index_translator"
EAGLE_UTILS = "sglang.srt.speculative.eagle_utils"

# SGLang callables this module relies on, with the signature it was written against.
HOOKED_SIGNATURES = {
    "sglang.srt.utils.is_flashinfer_available": "()",
    f"{FLASHINFER_BACKEND}.FlashInferAttnBackend.__init__": (
        "(self, model_runner: 'ModelRunner', skip_prefill: 'bool' = False, "
        "kv_indptr_buf: 'Optional[torch.Tensor]' = None, kv_last_page_len_buf: 'Optional[torch.Tensor]' = None, "
        "init_new_workspace: 'bool' = False)"
    ),
    f"{FLASHINFER_BACKEND}.FlashInferIndicesUpdaterDecode.call_begin_forward": (
        "(self, wrapper: 'BatchDecodeWithPagedKVCacheWrapper', paged_kernel_lens: 'torch.Tensor', "
        "paged_kernel_lens_sum: 'int', kv_indptr: 'torch.Tensor', kv_start_idx: 'torch.Tensor', "
        "spec_info: 'Optional[SpecInput]', seq_lens_cpu: 'Optional[torch.Tensor]', "
        "use_sliding_window_kv_pool: 'bool' = False, fixed_split_size: 'Optional[int]' = None, "
        "disable_split_kv: 'Optional[bool]' = None, *, plan: 'KVLocPlan', req_pool_indices: 'torch.Tensor')"
    ),
    f"{FLASHINFER_BACKEND}.FlashInferMultiStepDraftBackend.init_forward_metadata": "(self, forward_batch: 'ForwardBatch')",
    f"{EAGLE_UTILS}.default_tree_mask_mode": "() -> 'TreeMaskMode'",
    "sglang.kernels.ops.attention.merge_state.merge_state_triton": (
        "(prefix_output: torch.Tensor, prefix_lse: torch.Tensor, suffix_output: torch.Tensor, "
        "suffix_lse: torch.Tensor, output: Optional[torch.Tensor] = None, output_lse: Optional[torch.Tensor] = None)"
        " -> Tuple[torch.Tensor, Optional[torch.Tensor]]"
    ),
    "sglang.kernels.ops.speculative.cache_locs.generate_draft_decode_kv_indices.fn": (
        "(req_pool_indices, req_to_token, paged_kernel_lens, kv_indices, kv_indptr, positions, row_stride, "
        "kv_indices_stride: 'tl.constexpr', kv_indptr_stride: 'tl.constexpr', bs_upper: 'tl.constexpr', "
        "iter_upper: 'tl.constexpr', num_tokens_upper: 'tl.constexpr', page_size: 'tl.constexpr', "
        "window_size: 'tl.constexpr' = 0, sink_size: 'tl.constexpr' = 0, NUM_STEPS: 'tl.constexpr' = 0, "
        "ENTRY_PAGE_SIZE: 'tl.constexpr' = 1, v2p=None, TRANSLATE: 'tl.constexpr' = False)"
    ),
    "sglang.kernels.ops.attention.kv_indices.create_flashinfer_kv_indices_triton.fn": (
        "(req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr, kv_indptr, kv_start_idx, kv_indices_ptr, "
        "req_to_token_ptr_stride, ENTRY_PAGE_SIZE: triton.language.core.constexpr = 1, "
        "TOKEN_BLOCK_PARALLEL: triton.language.core.constexpr = False, token_mapping=None)"
    ),
}

# Names the skipped import block must bind in flashinfer_backend.
IMPORT_BLOCK_NAMES = (
    "BatchDecodeWithPagedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "fast_decode_plan",
    "merge_state",
    "merge_state_triton",
    "_safe_merge_state",
)

_MISSING = object()
_saved: list[tuple[types.ModuleType, str, object]] = []  # (module, name, previous value or _MISSING)


class _CpuTorch(types.ModuleType):
    """torch as flashinfer_backend sees it on a CPU: `empty` / `zeros` with device="cuda" allocate
    on the CPU; every other attribute is torch's."""

    def __init__(self):
        super().__init__("torch", "torch, with device='cuda' allocations on the CPU (parse_sglang)")

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def empty(*args, **kwargs):
        return torch.empty(*args, **_on_cpu(kwargs))

    @staticmethod
    def zeros(*args, **kwargs):
        return torch.zeros(*args, **_on_cpu(kwargs))


def _on_cpu(kwargs: dict) -> dict:
    return {**kwargs, "device": "cpu"} if kwargs.get("device") == "cuda" else kwargs


def _set(module: types.ModuleType, name: str, value) -> None:
    _saved.append((module, name, module.__dict__.get(name, _MISSING)))
    setattr(module, name, value)


def _skipped_import_block(module: types.ModuleType) -> ast.Module:
    """The body of the module's top-level `if is_flashinfer_available():`."""
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "is_flashinfer_available()":
            return ast.Module(body=node.body, type_ignores=[])
    raise RuntimeError(
        f"{module.__name__}: no top-level `if is_flashinfer_available():` import block; "
        "parse_sglang's FlashInfer-on-CPU patch was written against sglang 0.5.23"
    )


def install() -> str:
    """Apply changes 1-6 of the module docstring (once); returns what was done."""
    global _sglang_tree_mask_mode
    backend = importlib.import_module(FLASHINFER_BACKEND)
    translator = importlib.import_module(KV_INDEX_TRANSLATOR)
    if _saved:
        return _describe()
    from sglang_cpu import flashinfer_standin_active, triton_ops

    if not flashinfer_standin_active():
        raise RuntimeError("flashinfer_on_cpu: `import flashinfer` does not load parse_sglang's stand-in here")
    before = {name: backend.__dict__.get(name, _MISSING) for name in IMPORT_BLOCK_NAMES}
    _saved.extend((backend, name, value) for name, value in before.items())
    exec(compile(_skipped_import_block(backend), backend.__file__, "exec"), backend.__dict__)
    missing = [name for name in IMPORT_BLOCK_NAMES if name not in backend.__dict__]
    if missing:
        raise RuntimeError(f"{FLASHINFER_BACKEND}: its FlashInfer import block did not define {missing}")
    _set(backend, "merge_state_triton", triton_ops.merge_state_triton)
    _set(backend, "generate_draft_decode_kv_indices", triton_ops.generate_draft_decode_kv_indices)
    _set(backend, "torch", _CpuTorch())
    _set(translator, "create_flashinfer_kv_indices_triton", triton_ops.create_flashinfer_kv_indices_triton)
    _sglang_tree_mask_mode = importlib.import_module(EAGLE_UTILS).default_tree_mask_mode
    _replace_everywhere(_sglang_tree_mask_mode, _full_tree_mask_mode)
    return _describe()


_sglang_tree_mask_mode = None


def _full_tree_mask_mode() -> TreeMaskMode:  # SGLang's signature, annotation included
    """FULL_MASK while this patch is installed; SGLang's own choice after uninstall() (for a
    module that imported the replacement by name in between)."""
    if not _saved:
        return _sglang_tree_mask_mode()
    from sglang.srt.speculative.eagle_utils import TreeMaskMode

    return TreeMaskMode.FULL_MASK


def _replace_everywhere(original, replacement) -> None:
    """Rebind `original` to `replacement` in its module and in every module that imported it by name."""
    for module in list(sys.modules.values()):
        if isinstance(module, types.ModuleType):
            for name, value in list(vars(module).items()):
                if value is original:
                    _set(module, name, replacement)


def _describe() -> str:
    return (
        f"{FLASHINFER_BACKEND}: FlashInfer names bound to the CPU stand-in, Triton kernels "
        "(merge_state, draft decode KV indices, flashinfer KV indices) and device='cuda' buffers on CPU; "
        "speculative verify masks in the FULL form"
    )


def uninstall() -> None:
    """Restore every name install() replaced or added, latest first."""
    while _saved:
        module, name, value = _saved.pop()
        if value is _MISSING:
            module.__dict__.pop(name, None)
        else:
            setattr(module, name, value)
