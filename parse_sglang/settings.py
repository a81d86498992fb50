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

The settings themselves: `ParseConfig`, one PARSE policy, validated where it is built.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from parse_sglang.judge import DEFAULT_QUESTION, TOKEN_JUDGES, JudgeProbe, build_judge_probe

ALGORITHM = "PARSE"  # the name SGLang knows the algorithm by (--speculative-algorithm)
DEFAULT_DELIMITERS = ("\n", ". ", "? ", "! ")
AFTER_REJECTION_POLICIES = ("redraft", "target_to_delimiter")
VERIFY_WINDOWS = ("auto", "fixed", "variable")
JUDGE_MODES = ("probe", "likelihood", "both", "divergence", "head")
SHORTEST_TIER = 4  # the default adaptive tiers: 0, and L, L / 2, L / 4, ... while at least SHORTEST_TIER


def default_tiers(length: int) -> tuple[int, ...]:
    """An adaptive server's tiers at draft budget L = `length`: 0, and L halved while it stays at
    least SHORTEST_TIER (L = 32: {0, 4, 8, 16, 32}; 8: {0, 4, 8}; 2: {0, 2}). By exact replay
    (docs/settings.md), {0, 8, 32} lost up to 20% to the best fixed L where that was 4."""
    tiers, tier = [0], length
    while True:
        tiers.append(tier)
        tier //= 2
        if tier < SHORTEST_TIER:
            break
    return tuple(sorted(set(tiers)))


@dataclass(frozen=True)
class ParseConfig:
    """One PARSE policy.

    draft_budget: L, draft tokens per round.
    probe_stride: Δ, a probe roughly every Δ draft tokens (moved forward to a delimiter).
    delimiters: text that ends a segment; a boundary is placed right after one.
    threshold: τ, a prefix is accepted when P(yes)/(P(yes)+P(no)) >= τ.
    judge_question: what the probe asks the target.
    judge: off = lossless token-level speculative decoding (output == target greedy).
    judge_mode: which draft tokens the judge accepts beyond exact matches (a round keeps the
        longest prefix of exact or accepted tokens): "probe" (those of a prefix whose judge
        probes answer yes, τ), "likelihood" (target probability >= likelihood_threshold, read
        from the chain rows: no probe rows in the verify window at all), "both" (both),
        "divergence" (FLy's rule: the target's entropy there >= divergence_entropy and the next
        divergence_window draft tokens equal the target's own) or "head" (the server's
        judge_head says P(harmful) <= head_threshold).
    likelihood_threshold: λ of the likelihood judge.
    divergence_entropy: θ of the divergence judge, nats.
    divergence_window: W of the divergence judge, draft tokens.
    head_threshold: the judge head's bound on P(harmful) (a head file carries none: its calibration
        lists what each bound accepted on held-out mismatches).
    judge_head: a judge head file `python -m parse_sglang.tools.judge_head train` wrote for this target
        (empty: none; judge_mode "head" needs one). Server-wide.
    after_rejection: "redraft" (draft again at once) or "target_to_delimiter" (the target
        decodes up to the next delimiter first, as SpecReason/HoVer do).
    verify_window: "fixed" gives every round K_max probes (N_max rows, the width a captured
        CUDA graph replays), "variable" the batch's own probe count (fewer rows, but an
        eager verify on a GPU whenever it is below K_max), "auto" fixed exactly when the
        target's decode CUDA graph is captured. Server-wide.
    adaptive: each round's L chosen among `adaptive_tiers` by measured cost and the acceptance
        seen (parse_sglang/adaptive.py); off: every round drafts L. Server-wide.
    adaptive_tiers: the draft lengths an adaptive server chooses among (0: plain decode steps);
        empty: `default_tiers(L)`, L = 32: {0, 4, 8, 16, 32}. Server-wide.
    tier0_steps: the plain decode steps one tier-0 round runs back to back on the device (at
        most L + 1 and the batch's longest output left; 1 where a step's token must reach the
        host before the next is sampled: grammar, penalties, logprobs). Server-wide.
    cost_table: a JSON file `python -m parse_sglang.tools.profile_cost` wrote: the adaptive server's
        costs, fixed (empty: measured from its own rounds). Server-wide.
    eagle3_head: an EAGLE-3 head checkpoint for the target (empty: none): an adaptive server's
        tier-0 rounds run as head rounds, `eagle3_steps` head drafts verified exactly
        (parse_sglang/eagle3_head.py, docs/eagle3.md). Server-wide.
    eagle3_steps: the head's draft tokens per head round. Server-wide.
    retrieval: an adaptive server may verify, in place of a request's draft, the continuation
        that followed the longest earlier occurrence of its last tokens in its own text or in
        recent outputs (parse_sglang/retrieval.py, docs/retrieval.md), where the controller
        expects it to emit more; off: the draft model alone. A request may turn it off.
    retrieval_min_match: the fewest tokens of a request's text that must match to copy.
        Server-wide.
    retrieval_corpus: finished requests' output tokens kept to copy from (0: a request copies
        only from its own text). Server-wide.
    """

    # The defaults are what the measured tables say (docs/settings.md, "Why these defaults"):
    # lossless and adaptive, so that a server started with no settings falls back to plain decode
    # steps where the draft does not pay (the replay still has it below the target alone at
    # batch 32); a judge a user turns on is the likelihood judge at λ = 0.2.
    draft_budget: int = 32
    probe_stride: int = 8
    delimiters: tuple[str, ...] = DEFAULT_DELIMITERS
    threshold: float = 0.9
    judge_question: str = DEFAULT_QUESTION
    judge: bool = False
    judge_mode: str = "likelihood"
    likelihood_threshold: float = 0.2
    divergence_entropy: float = 0.5
    divergence_window: int = 4
    head_threshold: float = 0.1
    judge_head: str = ""
    after_rejection: str = "redraft"
    verify_window: str = "auto"
    adaptive: bool = True
    adaptive_tiers: tuple[int, ...] = ()
    tier0_steps: int = 4
    cost_table: str = ""
    eagle3_head: str = ""
    eagle3_steps: int = 3
    retrieval: bool = True
    retrieval_min_match: int = 3
    retrieval_corpus: int = 16384

    def __post_init__(self):
        _check_int("draft_budget", self.draft_budget, 1, 1024)
        _check_int("probe_stride", self.probe_stride, 1, 1024)
        delims = self.delimiters
        if isinstance(delims, str) or not delims or not all(isinstance(d, str) and d for d in delims):
            raise ValueError(f"delimiters={delims!r} is invalid: allowed is a non-empty list of non-empty strings")
        object.__setattr__(self, "delimiters", tuple(delims))
        for name in ("threshold", "likelihood_threshold", "head_threshold"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0.0 <= float(value) <= 1.0):
                raise ValueError(f"{name}={value!r} is invalid: allowed is a number in [0, 1]")
            object.__setattr__(self, name, float(value))
        theta = self.divergence_entropy
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not (0.0 <= float(theta) <= 20.0):
            raise ValueError(f"divergence_entropy={theta!r} is invalid: allowed is a number of nats in [0, 20]")
        object.__setattr__(self, "divergence_entropy", float(theta))
        _check_int("divergence_window", self.divergence_window, 1, 64)
        if not isinstance(self.judge_question, str) or not self.judge_question.strip():
            raise ValueError(f"judge_question={self.judge_question!r} is invalid: allowed is a non-empty string")
        if not isinstance(self.judge, bool):
            raise ValueError(f"judge={self.judge!r} is invalid: allowed is true or false")
        if self.judge_mode not in JUDGE_MODES:
            raise ValueError(f"judge_mode={self.judge_mode!r} is invalid: allowed is one of {JUDGE_MODES}")
        if self.after_rejection not in AFTER_REJECTION_POLICIES:
            raise ValueError(
                f"after_rejection={self.after_rejection!r} is invalid: allowed is one of {AFTER_REJECTION_POLICIES}"
            )
        if self.verify_window not in VERIFY_WINDOWS:
            raise ValueError(f"verify_window={self.verify_window!r} is invalid: allowed is one of {VERIFY_WINDOWS}")
        if not isinstance(self.adaptive, bool):
            raise ValueError(f"adaptive={self.adaptive!r} is invalid: allowed is true or false")
        tiers = self.adaptive_tiers
        if (
            isinstance(tiers, (str, bytes))
            or not isinstance(tiers, (list, tuple))
            or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= 1024 for t in tiers)
        ):
            raise ValueError(f"adaptive_tiers={tiers!r} is invalid: allowed is a list of integers in [0, 1024]")
        object.__setattr__(self, "adaptive_tiers", tuple(sorted(set(tiers))))
        _check_int("tier0_steps", self.tier0_steps, 1, 64)
        for name in ("cost_table", "eagle3_head", "judge_head"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid: allowed is a file path (a string)")
        _check_int("eagle3_steps", self.eagle3_steps, 1, 16)
        if not isinstance(self.retrieval, bool):
            raise ValueError(f"retrieval={self.retrieval!r} is invalid: allowed is true or false")
        _check_int("retrieval_min_match", self.retrieval_min_match, 1, 64)
        _check_int("retrieval_corpus", self.retrieval_corpus, 0, 1 << 22)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], base: "ParseConfig | None" = None) -> "ParseConfig":
        """Build from a mapping (JSON settings, Engine kwargs), refusing unknown keys by name."""
        if not isinstance(values, Mapping):
            raise ValueError(f"PARSE settings={values!r} are invalid: allowed is a mapping of setting names")
        known = cls.field_names()
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"unknown PARSE setting(s) {unknown}: allowed are {list(known)}")
        return dataclasses.replace(base or cls(), **values)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls) if f.init)

    @property
    def uses_probe(self) -> bool:
        """The judge asks the probe (its verify window has probe rows)."""
        return self.judge and self.judge_mode in ("probe", "both")

    @property
    def token_judge(self) -> int:
        """The judge's token rule (`judge.TOKEN_JUDGES`; 0: none, the probe alone or judge off)."""
        if not self.judge or self.judge_mode == "probe":
            return 0
        return TOKEN_JUDGES["likelihood" if self.judge_mode == "both" else self.judge_mode]

    @property
    def token_threshold(self) -> float:
        """The token judge's bound: λ, θ or the head's P(harmful) bound."""
        return {"divergence": self.divergence_entropy, "head": self.head_threshold}.get(
            self.judge_mode, self.likelihood_threshold
        )

    @property
    def tiers(self) -> tuple[int, ...]:
        """The draft lengths this server's rounds run at: L alone, or the adaptive tiers."""
        if not self.adaptive:
            return (self.draft_budget,)
        return tuple(sorted(set(self.adaptive_tiers or default_tiers(self.draft_budget)) | {self.draft_budget}))

    @property
    def chain_lengths(self) -> tuple[int, ...]:
        """The draft lengths with a draft chain (tier 0 skips the draft)."""
        return tuple(t for t in self.tiers if t > 0)

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.field_names()}


def _check_int(name: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not (low <= value <= high):
        raise ValueError(f"{name}={value!r} is invalid: allowed is an integer in [{low}, {high}]")


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
    "divergence_entropy",
    "divergence_window",
    "head_threshold",
    "after_rejection",
    "retrieval",
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


_server_configs: dict = {}  # (settings as JSON, L) -> ParseConfig: parsed once per process


def server_parse_config(server_args, num_steps: Optional[int]) -> ParseConfig:
    """The server's ParseConfig from `server_args._parse_config` and `num_steps`.

    num_steps: `--speculative-num-steps` (None when not given); it is L, so a PARSE
    config naming a different draft_budget is refused rather than silently overridden.
    Parsed once per process for each settings and L: start-up, the worker, the graph capture
    and every request's settings ask for it (a refusal is raised again each time).
    """
    raw = getattr(server_args, "_parse_config", None)
    try:
        key = (raw if raw is None or isinstance(raw, str) else json.dumps(raw, sort_keys=True), num_steps)
    except TypeError:  # not JSON-able: refused below by name, never cached
        key = None
    if key not in _server_configs:
        config = _parse_server_config(raw, num_steps)
        if key is None:
            return config
        _server_configs[key] = config
    return _server_configs[key]


def _parse_server_config(raw, num_steps: Optional[int]) -> ParseConfig:
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
        config = ParseConfig.from_dict(values)
    except ValueError as err:
        raise ValueError(f"--parse-config (Engine parse_config=): {err}") from None
    if config.judge and config.judge_mode == "head" and not config.judge_head:
        raise ValueError(
            '--parse-config (Engine parse_config=): judge_mode="head" is invalid without judge_head: '
            "allowed is a judge head file for this target (python -m parse_sglang.tools.judge_head train)"
        )
    if config.judge_head and config.eagle3_head:
        raise ValueError(
            "--parse-config (Engine parse_config=): judge_head and eagle3_head cannot be combined yet: the "
            "verify captures the EAGLE-3 head's aux states, not the final hidden state a judge head reads"
        )
    beyond = [t for t in config.adaptive_tiers if t > config.draft_budget]
    if beyond:
        raise ValueError(
            f"--parse-config (Engine parse_config=): adaptive_tiers={list(config.adaptive_tiers)} is invalid: "
            f"{beyond} exceed the draft budget L={config.draft_budget} (--speculative-num-steps); allowed are "
            f"integers in [0, {config.draft_budget}]"
        )
    return config


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
    if config.retrieval and not server.retrieval:
        raise ValueError(f"{REQUEST_WHERE}: retrieval=true is invalid: the server runs with retrieval off")
    if config.uses_probe and not server.uses_probe:
        raise ValueError(
            f"{REQUEST_WHERE}: judge_mode={config.judge_mode!r} is invalid: the server's verify window has no "
            f'probe rows (its judge_mode is {server.judge_mode!r}); allowed is "likelihood"'
        )
    if config.judge and config.judge_mode == "head" and not server.judge_head:
        raise ValueError(
            f'{REQUEST_WHERE}: judge_mode="head" is invalid: the server has no judge_head file; allowed are '
            f'"likelihood", "divergence"{", " + repr(server.judge_mode) if server.uses_probe else ""}'
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


def parse_engine_kwargs(draft_path, config: ParseConfig) -> dict:
    """The PARSE part of the engine settings: SGLang's speculative flags (L is
    --speculative-num-steps) plus the `parse_config` keyword for the rest of `config`."""
    return dict(
        speculative_algorithm="PARSE",
        speculative_draft_model_path=str(draft_path),
        speculative_num_steps=config.draft_budget,
        parse_config={
            name: value
            for name, value in config.to_dict().items()
            if name != "draft_budget" and value != getattr(ParseConfig, name)
        },
    )
