"""`--speculative-algorithm PARSE`: its registration with SGLang and its server settings.

`install()` (called by the plugin entry point in every SGLang process) registers PARSE
with `SpeculativeAlgorithm.register` (`register_algorithm()`, which the start-up hook
`parse_sglang_startup` also calls as soon as a process imports SGLang's server arguments);
the other SGLang hooks PARSE needs are in `parse_sglang.plugin.INSTALLERS`. At launch SGLang then calls, on the stand-in
record of its resolution pipeline:
- `validate_parse_server_args`: refuses what PARSE cannot run with, naming the setting;
- `ParseSpecAlgo.handle_server_args`: declares the settings PARSE runs with (sync
  scheduling, chain drafts, L+1 chain rows) and, with decode CUDA graphs on, logs and
  bounds what the graphs reserve (graph_memory.py);
- `ParseSpecAlgo.resolve_max_speculative_num_draft_tokens`: N_max = 1 + L + K_max*m, the
  verify rows SGLang must over-allocate per request per decode round, and the width its
  decode CUDA graph captures the verify pass at (`get_num_tokens_per_req_for_target_verify`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from sglang.srt.arg_groups.overrides import resolving_view
from sglang.srt.environ import envs
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_registry import CustomSpecAlgo, get_spec

from parse_sglang.attention.window import WindowGeometry
from parse_sglang.graph_memory import GraphReservations, check_fits
from parse_sglang.scheduler_patches.verify_graph import capturing_window
from parse_sglang.settings import (
    ALGORITHM,
    ParseConfig,
    judge_probe_for,
    server_parse_config,
)

logger = logging.getLogger(__name__)

REGISTRATION_SIGNATURES = {
    "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.register": (
        "(name: 'str', *, supports_overlap: 'bool' = False, validate_server_args: "
        "'Optional[ServerArgsValidator]' = None, spec_class: 'Type[CustomSpecAlgo]' = "
        "<class 'sglang.srt.speculative.spec_registry.CustomSpecAlgo'>) -> 'Callable[[WorkerFactory], WorkerFactory]'"
    ),
    # a PD decode server's first round (ParseSpecAlgo.build_disagg_draft_input)
    "sglang.srt.speculative.spec_registry.CustomSpecAlgo.build_disagg_draft_input": (
        "(self, batch: 'ScheduleBatch', last_tokens_tensor: 'torch.Tensor', future_map: 'FutureMap') "
        "-> 'Optional[SpecInput]'"
    ),
}
HOOKED_SIGNATURES = REGISTRATION_SIGNATURES


def _server_config(sa):
    return server_parse_config(sa, sa.speculative_num_steps)


def _refuse(setting: str, value, allowed: str) -> None:
    raise ValueError(f"PARSE does not support {setting}={value!r}: allowed is {allowed}")


def validate_parse_server_args(sa) -> None:
    """Refuse, at startup, every setting PARSE cannot serve correctly (ValueError naming it)."""
    from sglang.srt.runtime_context import attn_dp_enabled_of

    if not sa.speculative_draft_model_path:
        _refuse(
            "--speculative-draft-model-path",
            sa.speculative_draft_model_path,
            "a draft model sharing the target's tokenizer",
        )
    _check_draft_vocabulary(sa)
    config = _server_config(sa)
    checks = [
        ("--page-size", sa.page_size, sa.page_size in (None, 1), "1"),
        ("--pp-size", sa.pp_size, sa.pp_size == 1, "1"),
        ("--enable-dp-attention", attn_dp_enabled_of(sa), not attn_dp_enabled_of(sa), "off"),
        ("--enable-lora", sa.enable_lora, not sa.enable_lora and not sa.lora_paths, "off (no LoRA adapters)"),
        (
            "--speculative-adaptive",
            sa.speculative_adaptive,
            not sa.speculative_adaptive,
            "off (EAGLE's); PARSE's adaptive draft length is --parse-config '{\"adaptive\": true}'",
        ),
        ("--enable-multi-layer-eagle", sa.enable_multi_layer_eagle, not sa.enable_multi_layer_eagle, "off"),
        ("--speculative-eagle-topk", sa.speculative_eagle_topk, sa.speculative_eagle_topk in (None, 1), "1 (a chain)"),
        (
            "--speculative-num-draft-tokens",
            sa.speculative_num_draft_tokens,
            sa.speculative_num_draft_tokens in (None, config.draft_budget + 1),
            f"--speculative-num-steps + 1 = {config.draft_budget + 1} (the chain rows), or unset",
        ),
        (
            "--speculative-accept-threshold-single",
            sa.speculative_accept_threshold_single,
            sa.speculative_accept_threshold_single == 1.0,
            "1.0; PARSE's judge threshold τ is --parse-config '{\"threshold\": ...}'",
        ),
        (
            "--speculative-accept-threshold-acc",
            sa.speculative_accept_threshold_acc,
            sa.speculative_accept_threshold_acc == 1.0,
            "1.0; PARSE's judge threshold τ is --parse-config '{\"threshold\": ...}'",
        ),
        ("--enable-hierarchical-cache", sa.enable_hierarchical_cache, not sa.enable_hierarchical_cache, "off"),
        ("--skip-tokenizer-init", sa.skip_tokenizer_init, not sa.skip_tokenizer_init, "off (the judge reads text)"),
        (
            "--enable-return-hidden-states",
            sa.enable_return_hidden_states,
            not sa.enable_return_hidden_states,
            "off (a PARSE round returns no hidden states)",
        ),
        ("--enable-watermark", sa.enable_watermark, not sa.enable_watermark, "off (not fed by PARSE rounds)"),
    ]
    for setting, value, ok, allowed in checks:
        if not ok:
            _refuse(setting, value, allowed)
    if envs.SGLANG_ENABLE_METADATA_GLUE_GRAPH.get():
        # The glue graph freezes the capture-time attention plan, and PARSE's verify metadata
        # (its custom mask, its KV lengths) is fed by the host every round, as DFlash's is,
        # for which SGLang forces the glue graph off.
        _refuse(
            "SGLANG_ENABLE_METADATA_GLUE_GRAPH", True, "unset or 0 (PARSE plans its verify on the host every round)"
        )
    if config.uses_probe:  # fails here, at startup, if the chat template yields no judge probe
        judge_probe_for(sa.tokenizer_path or sa.model_path, config.judge_question, bool(sa.trust_remote_code))
    if config.judge_head:  # a damaged head, or one made for another target, is refused here, at startup
        from sglang.srt.utils.hf_transformers import get_config

        from parse_sglang.judge_head import load

        load(config.judge_head, get_config(sa.model_path, bool(sa.trust_remote_code), sa.revision))
    if config.tier0_steps != ParseConfig.tier0_steps and not config.adaptive:
        _refuse("--parse-config tier0_steps", config.tier0_steps, 'unset unless "adaptive": true')
    if config.cost_table:  # and here if the cost table cannot be read
        from parse_sglang.cost_table import CostTable

        if not config.adaptive:
            _refuse("--parse-config cost_table", config.cost_table, 'unset unless "adaptive": true')
        CostTable.load(config.cost_table)


def _check_draft_vocabulary(sa) -> None:
    """The draft must emit the target's token ids (as SGLang's STANDALONE requires: equal
    vocabulary sizes). Checked here, in the main process, from the model configs: the
    same refusal in the scheduler process would only log and take the launcher down."""
    from sglang.srt.utils.hf_transformers import get_config, get_hf_text_config

    def vocab_size(path, revision):
        return get_hf_text_config(get_config(path, bool(sa.trust_remote_code), revision)).vocab_size

    target = vocab_size(sa.model_path, sa.revision)
    draft = vocab_size(sa.speculative_draft_model_path, sa.speculative_draft_model_revision)
    if draft != target:
        raise ValueError(
            f"PARSE does not support --speculative-draft-model-path={sa.speculative_draft_model_path!r}: "
            f"its vocabulary size {draft} differs from the target's {target}; allowed is a draft "
            "that shares the target's tokenizer"
        )


class ParseSpecAlgo(CustomSpecAlgo):
    """What SGLang asks the algorithm object (beyond CustomSpecAlgo's defaults)."""

    def handle_server_args(self, sa) -> None:
        from sglang.srt.model_executor.cuda_graph_config import Backend

        config = _server_config(sa)
        if not sa.disable_overlap_schedule:
            logger.info("PARSE runs the scheduler synchronously: overlap scheduling is turned off")
        sa.disable_overlap_schedule = True
        sa.enable_mixed_chunk = False
        sa.speculative_eagle_topk = 1
        sa.speculative_num_steps = config.draft_budget
        sa.speculative_num_draft_tokens = config.draft_budget + 1
        if sa.max_running_requests is None:  # as SGLang's builtin algorithms: eager buffers hold max_bs * N_max rows
            sa.max_running_requests = 48
        if str(sa.device).startswith("cuda"):
            # The draft runner's autotune warm-up would run a TARGET_VERIFY dummy, which
            # SGLang allows only for DFlash drafts.
            sa.disable_flashinfer_autotune = True
        graphs = sa.cuda_graph_config
        if graphs is not None and graphs.decode.backend != Backend.DISABLED:
            _bound_graph_memory(sa, config, graphs.decode.max_bs)

    def resolve_max_speculative_num_draft_tokens(self, server_args) -> int:
        cfg = resolving_view(server_args)
        return _geometry(cfg, server_parse_config(server_args, cfg.speculative_num_steps)).max_rows

    def get_num_tokens_per_req_for_target_verify(self, num_draft_tokens: int, is_draft_worker: bool) -> int:
        """The verify width SGLang's decode CUDA graph captures: N_max (a fixed window), or
        the width of the window shape PARSE is capturing a runner of its own for."""
        from sglang.srt.runtime_context import max_speculative_num_draft_tokens

        shape = capturing_window()
        if shape is not None:
            return shape.rows
        return max(num_draft_tokens, max_speculative_num_draft_tokens() or 0)

    def create_future_map(self, device, req_to_token_pool, needs_cpu_seq_lens=True, needs_confidence_relay=False):
        from sglang.srt.managers.overlap_utils import FutureMap

        return FutureMap(device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay)

    def carries_draft_hidden_states(self) -> bool:
        return False

    def build_disagg_draft_input(self, batch, last_tokens_tensor, future_map):
        """A PD decode server's first round of requests prefilled elsewhere: the prefill server
        sent the prompt's target and draft KV (the draft pool is SGLang's primary draft pool on
        both sides) and the first token it sampled, this round's c_n. Without it a decode batch
        that merges these requests merges a None spec_info and fails."""
        from parse_sglang.verify_pass import next_round_input

        return next_round_input(last_tokens_tensor)

    def need_topk(self) -> bool:
        return False

    def get_platform_worker_cls(self):
        return None


def _geometry(cfg, config: ParseConfig) -> WindowGeometry:
    """The windows of the server settings `cfg` (ServerArgs or a resolving view)."""
    return WindowGeometry.of_server(config, cfg.tokenizer_path or cfg.model_path, bool(cfg.trust_remote_code))


def _head_aux_count(path: str) -> int:
    """The aux layers an EAGLE-3 head reads (0: no head, or a checkpoint the worker refuses by name)."""
    try:
        return len(
            json.loads((Path(path) / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        )
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def _bound_graph_memory(sa, config, graph_max_bs) -> None:
    """Log what PARSE's CUDA graphs reserve and refuse a configuration that does not fit."""
    from sglang.srt.utils.common import get_device_memory_capacity
    from sglang.srt.utils.hf_transformers import get_config, get_context_length, get_hf_text_config

    text_config = get_hf_text_config(get_config(sa.model_path, bool(sa.trust_remote_code), sa.revision))
    geometry = _geometry(sa, config)
    shape = geometry.fixed()
    reservations = GraphReservations(
        max_bs=min(graph_max_bs or sa.max_running_requests, sa.max_running_requests),
        window_rows=shape.rows,
        read_rows=shape.read_rows,
        verify_widths=tuple(s.rows for s in geometry.shapes()),
        draft_steps=tuple(length + 2 for length in config.chain_lengths),
        context_len=sa.context_length or get_context_length(text_config),
        vocab_size=text_config.vocab_size,
        head_steps=config.eagle3_steps if config.eagle3_head else 0,
        aux_width=_head_aux_count(config.eagle3_head) * text_config.hidden_size,
        dtype_bytes=4 if sa.dtype == "float32" else 2,
    )
    logger.info("PARSE CUDA-graph reservations: %s", reservations.describe())
    device_mib = get_device_memory_capacity(sa.device)
    if device_mib is not None and sa.mem_fraction_static is not None:
        check_fits(reservations, device_mib, sa.mem_fraction_static)


def parse_worker_class(server_args):
    """Worker factory SGLang calls in each scheduler process."""
    from parse_sglang.worker import ParseWorker

    return ParseWorker


def register_algorithm() -> None:
    """`--speculative-algorithm PARSE` in SGLang's registry (once per process)."""
    if get_spec(ALGORITHM) is None:
        SpeculativeAlgorithm.register(
            ALGORITHM,
            supports_overlap=False,
            validate_server_args=validate_parse_server_args,
            spec_class=ParseSpecAlgo,
        )(parse_worker_class)


def install() -> str:
    """Register PARSE (once per process); returns what was installed."""
    register_algorithm()
    return f"speculative algorithm {ALGORITHM} (parse_sglang.worker.ParseWorker)"
