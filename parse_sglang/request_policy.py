"""What a PARSE round needs of each request: its ParseConfig (server settings overridden by
`custom_params["parse"]`, resolved once per request) and this round's `RequestPolicy` (draft
budget, judged or not, sampled on CPU, stop tokens)."""

from __future__ import annotations

from sglang.srt.managers.schedule_batch import FINISH_ABORT
from sglang.srt.utils import is_cpu

from parse_sglang.config import ParseConfig
from parse_sglang.settings import request_outputs, request_parse_config
from parse_sglang.target_phase import in_target_phase
from parse_sglang.window_plan import RequestPolicy


def request_config(req, server: ParseConfig) -> ParseConfig:
    """The request's ParseConfig (and `req.parse_outputs`, its output options), resolved
    once; a bad one (SamplingParams.verify already refuses those in the main process)
    aborts the request and serves it losslessly."""
    config = getattr(req, "parse_config", None)
    if config is None:
        custom = req.sampling_params.custom_params
        try:
            config = request_parse_config(custom, server)
            req.parse_outputs = request_outputs(custom)
        except ValueError as err:
            req.to_finish = FINISH_ABORT(str(err), 400, "BadRequestError")
            config = ParseConfig.from_dict({"judge": False}, base=server)
            req.parse_outputs = frozenset()
        req.parse_config = config
    return config


def request_policy(req, server: ParseConfig) -> RequestPolicy:
    """What this round needs of a request."""
    config = request_config(req, server)
    sampled = is_cpu() and req.sampling_params.top_k != 1  # SGLang marks greedy requests with top_k 1
    params = req.sampling_params
    stops = frozenset()
    if not params.ignore_eos:
        stops = set(params.stop_token_ids or ()) | set(req.eos_token_ids or ())
        if req.tokenizer is not None and req.tokenizer.eos_token_id is not None:
            stops.add(req.tokenizer.eos_token_id)
        stops = frozenset(stops)
    budget = config.draft_budget
    if params.max_new_tokens is not None:  # one token of what is left is the round's bonus
        budget = min(budget, max(params.max_new_tokens - len(req.output_ids) - 1, 1))
    return RequestPolicy(
        config=config,
        budget=budget,
        judged=config.judge and req.grammar is None and in_target_phase(req) is None and not sampled,
        sampled=sampled,
        stop_ids=stops,
    )
