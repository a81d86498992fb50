"""Sampled speculative verification on CPU: EAGLE-style `eagle_sample` takes its sampling path.

What it changes, in a process running SGLang's CPU engine under parse_sglang's CPU runtime
(SGLANG_USE_CPU_ENGINE=1, no CUDA; `sglang_cpu.enable()` sets it for every SGLang
process):
- the module globals `tree_speculative_sampling_target_only`, `chain_speculative_sampling_triton`,
  `top_k_renorm_prob` and `top_p_renorm_prob` of `sglang.srt.speculative.eagle_utils` become
  the torch versions in `sglang_cpu.sampling_ops` (direct assignment);
- AROUND `eagle_utils._verify_uses_greedy` (SGLang's HookRegistry): it is asked with is_cpu=False;
- REPLACE `sglang.kernels.ops.speculative.row_argmax.row_argmax` (a Triton kernel, with which a
  sampled draft proposal picks its token, `spec_utils.fast_sample`): torch's argmax;
- AROUND `ModelRunner.maybe_enable_batch_invariant_mode`: skipped. Per-request sampling seeds
  (`sampling_seed`) exist only under `--enable-deterministic-inference`, which swaps in
  batch-invariant kernels that need CUDA or XPU and stops a CPU engine at startup; on a CPU
  torch's own kernels give the same output for the same batch run after run (not across batch
  compositions), which is what a seeded request's reproducibility needs here.

Why: in SGLang 0.5.23 `eagle_utils` binds these four names at its import, from
`sglang.kernels.ops.speculative.verify_sampling` and `sglang.kernels.ops.sampling.renorm`,
which resolve them once per platform: on CPU the tree sampler and both renorm ops are None
(neither `sgl_kernel` nor `flashinfer` is consulted) and the chain sampler is a Triton kernel,
which cannot launch on CPU. So `_verify_uses_greedy` returns True whenever is_cpu, and sampled
requests are verified as greedy ones: draft tokens are accepted only where they equal the argmax.
With this patch they are accepted by the same rules as on a GPU.

The names are assigned, not hooked: SGLang's HookRegistry propagates a patch to every module
attribute that `is` the original, and the original here is None. The names stay as they are in
the modules that define them and in other importers (DFLASH, UNO), whose CPU paths this does not
touch. The seeded verify coins (deterministic inference) call `sgl_kernel::murmur_hash32_cpu`,
which the `sgl_kernel` stand-in registers on import.
"""

from __future__ import annotations

import importlib

from sglang_cpu import CPU_ENGINE_ENV, runtime_active, sampling_ops
from parse_sglang.scheduler_patches import register_hooks_once

EAGLE_UTILS = "sglang.srt.speculative.eagle_utils"
GREEDY_TARGET = f"{EAGLE_UTILS}._verify_uses_greedy"
ROW_ARGMAX_TARGET = "sglang.kernels.ops.speculative.row_argmax.row_argmax"
BATCH_INVARIANT_TARGET = "sglang.srt.model_executor.model_runner.ModelRunner.maybe_enable_batch_invariant_mode"
# eagle_utils global -> its torch version
OPS = {
    "tree_speculative_sampling_target_only": sampling_ops.tree_speculative_sampling_target_only,
    "chain_speculative_sampling_triton": sampling_ops.chain_speculative_sampling_triton,
    "top_k_renorm_prob": sampling_ops.top_k_renorm_prob,
    "top_p_renorm_prob": sampling_ops.top_p_renorm_prob,
}

# SGLang callables this module relies on, with the signature it was written against: the
# caller, the predicate it hooks, and the GPU ops whose calls the torch versions must accept.
HOOKED_SIGNATURES = {
    f"{EAGLE_UTILS}.eagle_sample": (
        "(verify_input: 'EagleVerifyInput', batch: 'ScheduleBatch', logits_output: 'LogitsProcessorOutput', "
        "grammar_mask: 'Optional[GrammarMask]' = None, uno_target_max_top_k: 'Optional[int]' = None, *, "
        "watermark_state: 'Optional[WatermarkState]' = None, watermark_full_mask: 'bool' = True)"
    ),
    GREEDY_TARGET: (
        "(*, is_all_greedy: 'bool', is_cpu: 'bool', is_hip: 'bool', is_xpu: 'bool', "
        "use_rejection_sampling: 'bool') -> 'bool'"
    ),
    ROW_ARGMAX_TARGET: "(x: torch.Tensor) -> torch.Tensor",
    BATCH_INVARIANT_TARGET: "(self)",
    "sglang.kernels.ops.speculative.sampling.tree_speculative_sampling_target_only": (
        "(predicts: 'torch.Tensor', accept_index: 'torch.Tensor', accept_token_num: 'torch.Tensor', "
        "candidates: 'torch.Tensor', retrive_index: 'torch.Tensor', retrive_next_token: 'torch.Tensor', "
        "retrive_next_sibling: 'torch.Tensor', uniform_samples: 'torch.Tensor', "
        "uniform_samples_for_final_sampling: 'torch.Tensor', target_probs: 'torch.Tensor', "
        "draft_probs: 'torch.Tensor', threshold_single: 'float' = 1.0, threshold_acc: 'float' = 1.0, "
        "deterministic: 'bool' = True) -> 'None'"
    ),
    "sglang.kernels.ops.speculative.reject_sampling.chain_speculative_sampling_triton": (
        "(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token, "
        "retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs, "
        "draft_probs, threshold_single, threshold_acc, deterministic, *, block_verification: bool = False)"
    ),
}


def sample_on_cpu(original_fn, **flags) -> bool:
    """AROUND `_verify_uses_greedy`: SGLang's answer as if the platform were not a CPU
    (greedy only for all-greedy batches, or XPU / HIP as SGLang decides)."""
    return original_fn(**{**flags, "is_cpu": False})


def without_batch_invariant_kernels(original_fn, runner) -> None:
    """AROUND `maybe_enable_batch_invariant_mode`: nothing (see the module docstring)."""


def install() -> str:
    """Bind the torch sampling ops in eagle_utils and register the `_verify_uses_greedy`
    hook (applied by SGLang's HookRegistry.apply_hooks); idempotent. Does nothing outside
    the CPU runtime (`sglang_cpu.runtime_active`)."""
    if not runtime_active():
        return f"CPU sampling verification: not installed ({CPU_ENGINE_ENV} is not 1, or CUDA is available)"
    from sglang.srt.plugins.hook_registry import HookType

    eagle_utils = importlib.import_module(EAGLE_UTILS)
    for name, fn in OPS.items():
        setattr(eagle_utils, name, fn)
    register_hooks_once(
        __name__,
        (GREEDY_TARGET, sample_on_cpu, HookType.AROUND),
        (ROW_ARGMAX_TARGET, sampling_ops.row_argmax, HookType.REPLACE),
        (BATCH_INVARIANT_TARGET, without_batch_invariant_kernels, HookType.AROUND),
    )
    return (
        f"CPU sampling verification: {EAGLE_UTILS}.{{{', '.join(OPS)}}} -> sglang_cpu.sampling_ops; "
        f"AROUND {GREEDY_TARGET} (is_cpu=False); REPLACE {ROW_ARGMAX_TARGET} (torch argmax); "
        f"AROUND {BATCH_INVARIANT_TARGET} (skipped: seeds without CUDA-only kernels)"
    )
