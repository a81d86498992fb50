"""Logits of a PARSE verify pass: only the rows PARSE reads reach the lm_head.

What it changes: an AFTER hook on SGLang's `LogitsMetadata.from_forward_batch` sets
`draft_extend_select_index` to the verify input's `logits_row_index` when the forward is
a TARGET_VERIFY whose `spec_info` carries one (only `ParseVerifyInput` does).

Under a decode CUDA graph the forward also carries the graphs' shared logits buffer, which
SGLang slices to every verify row; it is cut to the rows kept, so the lm_head writes into
it instead of allocating (scheduler_patches/verify_graph.py sizes it to those rows).

Why: SGLang sets that index for DRAFT_EXTEND_V2 only, so a TARGET_VERIFY pass computes
full-vocabulary logits for every window row. PARSE reads the L+1 chain rows and the last
row of each probe; the K*m probe rows are most of the window, and at a 150k vocabulary
their logits would be hundreds of MB per request. `LogitsProcessor._get_pruned_states`
already honours the index for TARGET_VERIFY, so this hook is all it takes. Other
algorithms' verify inputs have no `logits_row_index` and are left alone.
"""

from __future__ import annotations

from sglang.srt.plugins.hook_registry import HookType

from parse_sglang.scheduler_patches import register_hooks_once

TARGET = "sglang.srt.layers.logits_processor.LogitsMetadata.from_forward_batch"

HOOKED_SIGNATURES = {
    TARGET: "(forward_batch: sglang.srt.model_executor.forward_batch_info.ForwardBatch)",
}


def keep_parse_rows(metadata, cls, forward_batch):
    """AFTER hook: select PARSE's rows (chain rows, then probe read-out rows)."""
    rows = getattr(forward_batch.spec_info, "logits_row_index", None)
    if rows is not None and forward_batch.forward_mode.is_target_verify():
        metadata.draft_extend_select_index = rows
        if metadata.next_token_logits_buffer is not None:
            metadata.next_token_logits_buffer = metadata.next_token_logits_buffer[: rows.numel()]
    return metadata


def install() -> str:
    register_hooks_once(__name__, (TARGET, keep_parse_rows, HookType.AFTER))
    return f"{TARGET}: AFTER hook pruning PARSE verify logits to chain + probe read-out rows"
