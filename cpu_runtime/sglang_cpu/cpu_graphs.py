"""SGLang's CUDA-graph runners on CPU, for tests: the GPU graph path's Python, run eagerly.

Inert unless the processes of an engine start with `PARSE_CPU_GRAPHS=1`
(`sglang_cpu.CPU_GRAPHS_ENV`) on a machine without CUDA: tests set it, nothing else
does. Then, on a CPU device:
- AFTER `handle_attention_backend_compatibility` (server-argument resolution, main process):
  decode graphs stay on for the torch_native backend, which SGLang turns them off for;
- AROUND `cuda_graph_setup.capture_decode_graph`: where SGLang's CPU path skips decode
  graphs (or uses its torch.compile `CPUGraphRunner`), it builds the GPU path's
  `DecodeCudaGraphRunner` — for a PARSE target, the TARGET_VERIFY graph runner;
- AROUND `ForwardMode.is_cpu_graph`: on CPU SGLang replays DECODE only; TARGET_VERIFY
  replays too, as `is_cuda_graph` allows on a GPU;
- AROUND `resolve_decode_backend` as bound in the decode and EAGLE-draft graph runner
  modules: the `EagerReplayBackend` stand-in (cpu_runtime/sglang_cpu/graph_replay.py) instead of
  torch.cuda graphs, which do not exist on CPU.
Everything else — the runners' buffers, bucket padding, capture inputs, out-of-graph
attention planning (the torch_native backend's graph API), output slicing — is SGLang's
code, so a CPU engine started with decode graphs on exercises it end to end.
"""

from __future__ import annotations

from sglang.srt.plugins.hook_registry import HookType

from parse_sglang.scheduler_patches import register_hooks_once

RESOLVE_TARGET = "sglang.srt.arg_groups.attention_hook.handle_attention_backend_compatibility"
CAPTURE_TARGET = "sglang.srt.model_executor.model_runner_components.cuda_graph_setup.capture_decode_graph"
MODE_TARGET = "sglang.srt.model_executor.forward_batch_info.ForwardMode.is_cpu_graph"
BACKEND_TARGETS = (
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner.resolve_decode_backend",
    "sglang.srt.speculative.eagle_draft_cuda_graph_runner.resolve_decode_backend",
)

HOOKED_SIGNATURES = {
    RESOLVE_TARGET: "(server_args: 'Any')",
    CAPTURE_TARGET: "(*, model_runner: 'ModelRunner') -> 'GraphCapture'",
    MODE_TARGET: "(self)",
    **{target: "(cuda_graph_runner: 'BaseCudaGraphRunner') -> 'BaseCudaGraphBackend'" for target in BACKEND_TARGETS},
}


def keep_decode_graphs(result, server_args):
    """AFTER handle_attention_backend_compatibility: decode graphs back on for torch_native."""
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, with_phase

    from sglang_cpu import graphs_requested

    cfg = resolving_view(server_args)
    if graphs_requested() and cfg.device == "cpu" and not cfg.disable_cuda_graph:
        declare_resolution(
            server_args,
            "sglang_cpu.cpu_graphs",
            cuda_graph_config=with_phase(cfg.cuda_graph_config, Phase.DECODE, backend=Backend.FULL),
        )
    return result


def capture_decode_graph_on_cpu(original, *, model_runner):
    """AROUND capture_decode_graph: the GPU path's decode graph runner on a CPU device."""
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, check_cuda_graph_backend

    from sglang_cpu import graphs_requested

    if (
        not graphs_requested()
        or model_runner.device != "cpu"
        or check_cuda_graph_backend(Phase.DECODE, Backend.DISABLED)
    ):
        return original(model_runner=model_runner)
    from sglang.srt.model_executor.model_runner_components.cuda_graph_setup import GraphCapture
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    phase = "target_verify" if model_runner.spec_algorithm.is_speculative() else "decode"
    return GraphCapture(
        runner=DecodeCudaGraphRunner(model_runner), memory_phase=phase, memory_usage_gb=0, capture_time=0
    )


def replay_modes_as_on_gpu(original, mode):
    """AROUND ForwardMode.is_cpu_graph: the modes a GPU replays (TARGET_VERIFY among them)."""
    from sglang_cpu import graphs_requested

    return mode.is_cuda_graph() if graphs_requested() else original(mode)


def eager_replay_on_cpu(original, cuda_graph_runner):
    """AROUND resolve_decode_backend: the eager-replay stand-in on a CPU device."""
    from sglang_cpu import graphs_requested

    if not graphs_requested() or cuda_graph_runner.model_runner.device != "cpu":
        return original(cuda_graph_runner)
    from sglang_cpu.graph_replay import EagerReplayBackend, install_device_api

    install_device_api()
    return EagerReplayBackend(cuda_graph_runner)


def install() -> str:
    register_hooks_once(
        __name__,
        (RESOLVE_TARGET, keep_decode_graphs, HookType.AFTER),
        (CAPTURE_TARGET, capture_decode_graph_on_cpu, HookType.AROUND),
        (MODE_TARGET, replay_modes_as_on_gpu, HookType.AROUND),
        *((target, eager_replay_on_cpu, HookType.AROUND) for target in BACKEND_TARGETS),
    )
    return f"{RESOLVE_TARGET}, {CAPTURE_TARGET}, resolve_decode_backend: SGLang's graph runners on CPU when asked"
