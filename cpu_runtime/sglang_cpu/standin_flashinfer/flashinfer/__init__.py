"""Stand-in for `flashinfer` on CPU-only machines: the attention API SGLang's `flashinfer`
backend calls, in torch (sglang_cpu.flashinfer_ops).

Opt-in, for tests: `sglang_cpu.enable_flashinfer_standin()` puts it on the import path
of this process and of the SGLang processes it starts. Only the names SGLang's backend uses
exist here; any other `flashinfer.<name>` is an AttributeError (and other submodules a
ModuleNotFoundError), so SGLang's feature probes see them absent.
"""

from sglang_cpu.flashinfer_ops import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    fast_decode_plan,
    merge_state,
    packbits,
    segment_packbits,
)

from . import cascade, decode, prefill, quantization

__version__ = "0.7.2+parse.standin"
PARSE_STANDIN = True


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(
        f"flashinfer.{name}: not provided by parse_sglang's CPU stand-in of FlashInfer "
        "(it has only what SGLang's flashinfer attention backend calls)"
    )


__all__ = [
    "BatchDecodeWithPagedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "cascade",
    "decode",
    "fast_decode_plan",
    "merge_state",
    "packbits",
    "prefill",
    "quantization",
    "segment_packbits",
]
