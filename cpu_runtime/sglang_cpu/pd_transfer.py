"""SGLang's prefill/decode KV transfer with mooncake (over TCP) on a CPU server.

What it changes: AFTER `sglang.srt.disaggregation.mooncake.conn.MooncakeKVSender.__init__`: each
sender of a CPU prefill server says it takes no host-tensor indices
(`supports_host_tensor_indices = False`), so the prefill scheduler hands it page indices made by
SGLang's other path (`kv_to_page_indices`).

Why: the host-tensor path copies the page indices into pinned memory and records a
`torch.cuda.Event` for mooncake's transfer thread to wait on. On a CPU device the pinned copy
fails ("pin_memory=True requires a CUDA or other accelerator backend") and kills the prefill
scheduler at its first transfer; the indices are on the host already.
"""

from __future__ import annotations

from sglang.srt.plugins.hook_registry import HookType

from parse_sglang.scheduler_patches import register_hooks_once

TARGET = "sglang.srt.disaggregation.mooncake.conn.MooncakeKVSender.__init__"
HOOKED_SIGNATURES = {
    TARGET: "(self, mgr: 'CommonKVManager', bootstrap_addr: 'str', bootstrap_room: 'int', "
    "req_has_disagg_prefill_dp_rank: 'bool' = False)"
}


def host_indices_only(result, self, *args, **kwargs):
    """AFTER MooncakeKVSender.__init__: page indices by SGLang's host path."""
    self.supports_host_tensor_indices = False


def install() -> str:
    register_hooks_once(__name__, (TARGET, host_indices_only, HookType.AFTER))
    return f"{TARGET}: mooncake senders take page indices made on the host (no pinned copy, no CUDA event)"
