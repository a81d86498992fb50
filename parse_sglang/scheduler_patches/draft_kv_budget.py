"""The draft's KV pool (and an EAGLE-3 head's) priced into SGLang's KV budget.

What it changes: an AFTER hook on SGLang's `DefaultPoolConfigurator.__init__` adds the PARSE
draft's KV bytes per token to the target's `_cell_size` (the bytes one pool token costs), on
the target worker only, and with `eagle3_head` the head's too (one layer). SGLang then sizes
the target's pool from the memory left after the models' weights at (target + draft + head)
bytes per token; the draft's and the head's pools, which hold as many tokens as the target's
(they share the target's slot table), fit beside it.

Why: SGLang does this for EAGLE and STANDALONE only (`spec_algorithm.is_eagle() or
is_standalone()` in `DefaultPoolConfigurator.__init__`). For a plug-in algorithm it prices
the target alone, so on a GPU the target's pool took all of `--mem-fraction-static` and the
draft pool's allocation failed with CUDA out of memory (the first H200 run, Qwen3-8B / 0.6B
shapes: benchmarks/README.md, "First runs on a GPU"). SGLang's EAGLE branch scales the target's cell by layer count, which
assumes the draft's per-layer KV equals the target's; a PARSE draft is a different model
(Qwen2.5-Coder-0.5B: 2 KV heads of 64 against the 1.5B's 2 of 128), so it is sized here
from the draft's own config, as SGLang's MHA pool is.

Hybrid (mamba) targets are refused at start-up (worker.py); hybrid-SWA targets use another
configurator and are not priced here.
"""

from __future__ import annotations

import torch
from sglang.srt.plugins.hook_registry import HookType

from parse_sglang.scheduler_patches import register_hooks_once
from parse_sglang.settings import ALGORITHM, server_parse_config

TARGET = "sglang.srt.model_executor.pool_configurator.DefaultPoolConfigurator.__init__"

HOOKED_SIGNATURES = {
    TARGET: "(self, kvc: 'KVCacheConfigurator')",
}


_draft_configs: dict = {}  # (path, revision) -> a draft's ModelConfig: a configurator is built several times


def _draft_model_config(server_args, path: str, revision=None):
    from sglang.srt.configs.model_config import ModelConfig

    key = (path, revision)
    if key not in _draft_configs:
        _draft_configs[key] = ModelConfig.from_server_args(
            server_args, model_path=path, model_revision=revision, is_draft_model=True
        )
    return _draft_configs[key]


def draft_kv_bytes_per_token(kvc) -> int:
    """Bytes one token costs in the draft's MHA pool on this rank (K and V, every layer), plus
    in an EAGLE-3 head's (`eagle3_head`)."""
    from sglang.srt.runtime_context import get_spec

    args = kvc.server_args
    total = _kv_bytes(
        kvc, _draft_model_config(args, args.speculative_draft_model_path, args.speculative_draft_model_revision)
    )
    head = server_parse_config(args, get_spec().speculative_num_steps).eagle3_head
    return total + (_kv_bytes(kvc, _draft_model_config(args, head)) if head else 0)


def _kv_bytes(kvc, config) -> int:
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    heads = config.get_num_kv_heads(parallel.attn_tp_size, parallel.attn_dcp_size)
    return (
        heads
        * (config.head_dim + config.v_head_dim)
        * config.num_hidden_layers
        * torch._utils._element_size(kvc.kv_cache_dtype)
    )


def price_draft_pool(result, self, kvc):
    """AFTER hook: the target's cell size plus the draft's."""
    if not kvc.is_draft_worker and getattr(kvc.spec_algorithm, "name", None) == ALGORITHM:
        self._cell_size += draft_kv_bytes_per_token(kvc)
    return result


def pool_bytes_per_token(model_runner) -> int:
    """What a runner's KV pool allocated per token (its K and V buffers over their rows)."""
    pool = model_runner.token_to_kv_pool
    k_bytes, v_bytes = pool.get_kv_size_bytes()
    return int(k_bytes + v_bytes) // int(pool.k_buffer[0].shape[0])


def kv_bytes_per_token(target_runner, draft_runner, head_runner=None) -> dict:
    """get_server_info()'s record of the budget: what SGLang prices a pool token at now, and what
    the target's, the draft's (and an EAGLE-3 head's) pools allocated per token (their sum when
    the draft and the head are priced)."""
    from sglang.srt.model_executor.pool_configurator import create_memory_pool_configurator

    record = {
        "priced": int(create_memory_pool_configurator(target_runner.kv_cache_configurator)._cell_size),
        "target": pool_bytes_per_token(target_runner),
        "draft": pool_bytes_per_token(draft_runner),
    }
    if head_runner is not None:
        record["head"] = pool_bytes_per_token(head_runner)
    return record


def install() -> str:
    register_hooks_once(__name__, (TARGET, price_draft_pool, HookType.AFTER))
    return f"{TARGET}: AFTER hook adding the PARSE draft's (and an EAGLE-3 head's) KV bytes per token to the target's pool budget"
