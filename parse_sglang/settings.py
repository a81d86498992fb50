"""Where PARSE's settings come from: the server's ParseConfig and each request's.

Server (validated once at startup, in the main process):
- `--parse-config JSON` (launch_server / `sglang serve`) or `sglang.Engine(parse_config={...})`,
  both carried as the bookkeeping attribute `server_args._parse_config` (JSON text or a
  dict), which SGLang pickles to its scheduler processes (scheduler_patches/cli_settings.py);
- SGLang's own flags where they mean the same thing: `--speculative-draft-model-path`, and
  `--speculative-num-steps` for L (`draft_budget`).

Request: `sampling_params={"custom_params": {"parse": {...}}}` with the keys of
REQUEST_SETTINGS. They may not outgrow the verify window the server reserved at startup
(no larger L, no denser probes, no judge the server turned off, no other judge question),
because SGLang gives every request of a batch the same number of verify rows. The same
mapping may hold the output options of REQUEST_OUTPUTS, which change what the response
reports, never how it is generated.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Mapping, Optional

from parse_sglang.attention.window import WindowShape
from parse_sglang.config import ParseConfig
from parse_sglang.judge import JudgeProbe, build_judge_probe

# custom_params key of a request's PARSE settings.
REQUEST_KEY = "parse"
REQUEST_WHERE = f'custom_params["{REQUEST_KEY}"]'
# Settings a request may change; the others shape the verify window every request shares.
REQUEST_SETTINGS = (
    "draft_budget",
    "probe_stride",
    "threshold",
    "judge",
    "judge_mode",
    "likelihood_threshold",
    "after_rejection",
)
# Per-request output options (booleans, default false). return_probe_scores: meta_info["parse"]
# also gets "probe_scores", one entry per round (parse_sglang/counters.py).
RETURN_PROBE_SCORES = "return_probe_scores"
REQUEST_OUTPUTS = (RETURN_PROBE_SCORES,)


def _as_mapping(raw: Any, where: str) -> Mapping[str, Any]:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{where}={raw!r} is not valid JSON ({err}): allowed is a JSON object of PARSE settings"
            ) from None
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}={raw!r} is invalid: allowed is a JSON object of PARSE settings")
    return raw


def server_parse_config(server_args, num_steps: Optional[int]) -> ParseConfig:
    """The server's ParseConfig from `server_args._parse_config` and `num_steps`.

    num_steps: `--speculative-num-steps` (None when not given); it is L, so a PARSE
    config naming a different draft_budget is refused rather than silently overridden.
    """
    raw = getattr(server_args, "_parse_config", None)
    values = dict(_as_mapping(raw, "--parse-config")) if raw is not None else {}
    if num_steps is not None:
        budget = values.get("draft_budget", num_steps)
        if budget != num_steps:
            raise ValueError(
                f"--speculative-num-steps={num_steps} and --parse-config draft_budget={budget!r} "
                "disagree: both set L (draft tokens per round); give one, or the same value"
            )
        values["draft_budget"] = num_steps
    try:
        return ParseConfig.from_dict(values)
    except ValueError as err:
        raise ValueError(f"--parse-config (Engine parse_config=): {err}") from None


def _request_values(custom_params: Optional[Mapping[str, Any]]) -> Optional[Mapping[str, Any]]:
    """`custom_params["parse"]` as a mapping (None when absent), unknown keys refused by name."""
    raw = (custom_params or {}).get(REQUEST_KEY)
    if raw is None:
        return None
    values = _as_mapping(raw, REQUEST_WHERE)
    unknown = sorted(set(values) - set(ParseConfig.field_names()) - set(REQUEST_OUTPUTS), key=repr)
    if unknown:
        raise ValueError(
            f"{REQUEST_WHERE}: unknown key(s) {unknown}: allowed are {list(REQUEST_SETTINGS + REQUEST_OUTPUTS)}"
        )
    for option in set(values) & set(REQUEST_OUTPUTS):
        if not isinstance(values[option], bool):
            raise ValueError(f"{REQUEST_WHERE}: {option}={values[option]!r} is invalid: allowed is true or false")
    return values


def request_outputs(custom_params: Optional[Mapping[str, Any]]) -> frozenset[str]:
    """The REQUEST_OUTPUTS a request switched on."""
    values = _request_values(custom_params) or {}
    return frozenset(option for option in REQUEST_OUTPUTS if values.get(option))


def request_parse_config(custom_params: Optional[Mapping[str, Any]], server: ParseConfig) -> ParseConfig:
    """A request's ParseConfig: the server's, with `custom_params["parse"]` applied
    (its output options are checked too, and read by `request_outputs`)."""
    values = _request_values(custom_params)
    if values is None:
        return server
    values = {key: value for key, value in values.items() if key not in REQUEST_OUTPUTS}
    if not values:
        return server
    fixed = sorted(set(values) - set(REQUEST_SETTINGS))
    if fixed:
        raise ValueError(
            f"{REQUEST_WHERE}: {fixed} can only be set for the whole server (--parse-config); "
            f"a request may set {list(REQUEST_SETTINGS)}"
        )
    try:
        config = ParseConfig.from_dict(values, base=server)
    except ValueError as err:
        raise ValueError(f"{REQUEST_WHERE}: {err}") from None
    if config.draft_budget > server.draft_budget:
        raise ValueError(
            f"{REQUEST_WHERE}: draft_budget={config.draft_budget} is invalid: allowed is at most the "
            f"server's {server.draft_budget} (--speculative-num-steps)"
        )
    if config.judge and not server.judge:
        raise ValueError(f"{REQUEST_WHERE}: judge=true is invalid: the server runs with the judge off (lossless)")
    if config.uses_probe and not server.uses_probe:
        raise ValueError(
            f"{REQUEST_WHERE}: judge_mode={config.judge_mode!r} is invalid: the server's verify window has no "
            f"probe rows (its judge_mode is {server.judge_mode!r}); allowed is \"likelihood\""
        )
    if config.uses_probe and config.probe_stride < server.probe_stride:
        raise ValueError(
            f"{REQUEST_WHERE}: probe_stride={config.probe_stride} is invalid: allowed is at least the "
            f"server's {server.probe_stride} (its verify window holds no more probes)"
        )
    return config


@functools.lru_cache(maxsize=4)
def target_tokenizer(tokenizer_path: str, trust_remote_code: bool = False):
    """The target's tokenizer as SGLang loads it (boundaries and the judge probe need text)."""
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    return get_tokenizer(tokenizer_path, trust_remote_code=trust_remote_code)


@functools.lru_cache(maxsize=8)
def judge_probe_for(tokenizer_path: str, question: str, trust_remote_code: bool = False) -> JudgeProbe:
    """The judge probe of the target's tokenizer; one builder for the window-size bound
    (main process) and the worker (scheduler), so both count the same suffix length m."""
    return build_judge_probe(target_tokenizer(tokenizer_path, trust_remote_code), question)


def max_probes(config: ParseConfig) -> int:
    """K_max: the most boundaries `select_boundaries` returns for a draft of L tokens —
    interior segment ends at least probe_stride apart (all < L), plus the draft's end."""
    if not config.uses_probe:
        return 0
    return (config.draft_budget - 1) // config.probe_stride + 1


def fixed_window_shape(config: ParseConfig, suffix_len: int) -> WindowShape:
    """The largest window a request may need in a round: L chain rows after c_n, K_max
    probes of m rows (what a fixed window always has, and a CUDA graph captures)."""
    probes = max_probes(config)
    return WindowShape(config.draft_budget, probes, suffix_len if probes else 0)


def verify_window_max(config: ParseConfig, suffix_len: int) -> int:
    """N_max = 1 + L + K_max * m: verify rows one request may need in a round."""
    return fixed_window_shape(config, suffix_len).rows

