"""The radix tree of a server with an EAGLE-3 head shares prefixes as SGLang's EAGLE does.

What it changes: a BEFORE hook on SGLang's `mem_cache.registry.create_tree_cache` sets the
tree's `is_eagle` (bigram keys: a cached prefix matches one token shorter) on a PARSE server
with `eagle3_head`; every other server's tree is SGLang's as built.

Why: the head's KV is shifted in content (slot p holds the target's aux states at p with token
p + 1, parse_sglang/eagle3_head.py), so the last slot of a shared prefix holds the head's KV of
the request that wrote it, whose token p + 1 may differ from the next one's. SGLang keys its
tree by bigrams for EAGLE (`spec_algorithm.is_eagle()` in `kv_cache_builder.build_kv_cache`),
which a plug-in algorithm is not. Without it, two synthetic prompts sharing six tokens gave the
second a head draft no fresh head over its own text drafts (test_sglang_eagle3's judged test,
in CI): a wrong head KV costs acceptance, never output (the target verifies every draft).
"""

from __future__ import annotations

from sglang.srt.plugins.hook_registry import HookType

from parse_sglang.scheduler_patches import register_hooks_once
from parse_sglang.settings import ALGORITHM, server_parse_config

TARGET = "sglang.srt.mem_cache.registry.create_tree_cache"

HOOKED_SIGNATURES = {
    TARGET: "(ctx: 'TreeCacheBuildContext') -> 'BasePrefixCache'",
}


def bigram_keys_for_the_head(ctx):
    """BEFORE hook: `is_eagle` on the tree's parameters of a PARSE server with a head."""
    from sglang.srt.runtime_context import get_spec

    spec = get_spec()
    if spec.speculative_algorithm == ALGORITHM:
        ctx.params.is_eagle = ctx.params.is_eagle or bool(
            server_parse_config(ctx.server_args, spec.speculative_num_steps).eagle3_head
        )
    return (ctx,), {}


def install() -> str:
    register_hooks_once(__name__, (TARGET, bigram_keys_for_the_head, HookType.BEFORE))
    return (
        f"{TARGET}: BEFORE hook keying the radix tree by bigrams on a server with an EAGLE-3 head (as SGLang's EAGLE)"
    )
