"""Requests that would kill a scheduler, refused in the main process (every SGLang server).

What it changes: hooks on the main process's request path, all raising `ValueError` (HTTP
400 on every endpoint, a `ValueError` from `sglang.Engine.generate`) that names the field,
the bad value and what is allowed, before the request is tokenized further or sent on:
- around `GenerateReqInput.normalize_batch_and_arguments` (the first thing `generate_request`
  does with a request, before any per-request state exists): `sampling_params.n` must be
  an integer in [1, MAX_PARALLEL_SAMPLES] (checked before SGLang copies the request n times),
  and a list of `sampling_params` must have one entry per prompt.
- BEFORE `TokenizerManager._validate_one_request` (each single or batched sub-request,
  with its final prompt ids, whatever the endpoint): every prompt token id is an integer in
  [0, vocab_size); the prompt is not empty (unless a session supplies it);
  `top_logprobs_num` in [0, vocab_size]; `logprob_start_len` >= -1.
- BEFORE `SamplingParams.verify(vocab_size)`: `custom_params` is a JSON object;
  `stop_token_ids` and `logit_bias` keys are token ids in [0, vocab_size); `logit_bias`
  values are finite; integer fields are integers; `top_k` fits the int32 SGLang samples with.
- BEFORE `SamplingParams.normalize`: each `stop_regex` compiles.

Why: stock SGLang 0.5.23 checks none of these before the scheduler. Probing a target-only
server found five kinds of request that kill its scheduler, and with it the server and every
other client's requests: a prompt id outside the vocabulary (IndexError in the embedding;
/generate and /v1/completions alike), an empty text prompt, `top_logprobs_num` (OpenAI:
`logprobs`, `top_logprobs`) above the vocabulary size (topk out of range), `logprob_start_len`
below -1 (an assertion), a sampled request with `top_k` >= 2**31 (int32 overflow). A huge `n`
is copied n times in the main process (n = 10**9: billions of list entries; not probed). Others
answered 500 (a `stop_regex` that does not compile, a `sampling_params` list shorter than the
batch, non-object `custom_params`) or were served quietly (stop token ids outside the
vocabulary, n <= 0). Non-integer integer fields and non-finite `logit_bias` values cannot come
through HTTP (SGLang's /generate schema and the OpenAI models refuse them) but can through
`sglang.Engine`. All get the same 400 / ValueError. The plugin loads this module in every SGLang
process, whatever the speculative algorithm, so target-only servers are covered too.
"""

from __future__ import annotations

import math
import numbers
import re

from sglang.srt.plugins.hook_registry import HookType

from parse_sglang.scheduler_patches import register_hooks_once

NORMALIZE = "sglang.srt.managers.io_struct.GenerateReqInput.normalize_batch_and_arguments"
VALIDATE_ONE = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
VERIFY = "sglang.srt.sampling.sampling_params.SamplingParams.verify"
NORMALIZE_PARAMS = "sglang.srt.sampling.sampling_params.SamplingParams.normalize"

HOOKED_SIGNATURES = {
    NORMALIZE: "(self)",
    VALIDATE_ONE: "(self, obj: 'Union[GenerateReqInput, EmbeddingReqInput]', input_ids: 'List[int]') -> 'None'",
    VERIFY: "(self, vocab_size)",
    NORMALIZE_PARAMS: "(self, tokenizer)",
}

# Most parallel samples one request may ask for (OpenAI's documented maximum of `n`).
MAX_PARALLEL_SAMPLES = 128
# SGLang builds its per-request top_k tensor as int32.
MAX_TOP_K = 2**31 - 1
# SamplingParams fields SGLang declares as integers (None allowed where the default is None).
INT_FIELDS = ("max_new_tokens", "min_new_tokens", "top_k", "n", "stream_interval", "beam_width")


def _vocab(size: int) -> str:
    return f"[0, {size}) (the model's vocabulary)"


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_token_ids(where: str, ids, vocab_size: int) -> None:
    """Raise ValueError naming `where[i]=value` for the first id that is not an int in [0, vocab_size)."""
    if all(type(t) is int for t in ids) and (len(ids) == 0 or (min(ids) >= 0 and max(ids) < vocab_size)):
        return  # the common case, without a Python loop per token
    for i, token in enumerate(ids):
        if not _is_int(token):
            raise ValueError(f"{where}[{i}]={token!r} is not a token id: allowed are integers in {_vocab(vocab_size)}")
        if not 0 <= token < vocab_size:
            raise ValueError(f"{where}[{i}]={token} is out of range: allowed is {_vocab(vocab_size)}")


def defer_bad_parallel_samples(obj) -> None:
    """BEFORE GenerateReqInput.normalize_batch_and_arguments: an n outside [1, MAX_PARALLEL_SAMPLES]
    is noted on the request and replaced by 1, so normalizing stays cheap and completes (SGLang's
    abort task for a refused stream reads the normalized fields); the AFTER hook refuses it."""
    params = obj.sampling_params
    listed = params if isinstance(params, list) else [params]
    for i, one in enumerate(listed):
        n = one.get("n") if isinstance(one, dict) else None
        if n is not None and (not _is_int(n) or not 1 <= n <= MAX_PARALLEL_SAMPLES):
            where = f"sampling_params[{i}].n" if isinstance(params, list) else "sampling_params.n"
            obj._refused_n = ValueError(
                f"{where}={n!r} is out of range: allowed is an integer in [1, {MAX_PARALLEL_SAMPLES}] "
                "(parallel samples of one request)"
            )
            one_sample = [{**p, "n": 1} if isinstance(p, dict) else p for p in listed]
            obj.sampling_params = one_sample if isinstance(params, list) else one_sample[0]
            return


def refuse_after_normalizing(result, obj):
    """AFTER GenerateReqInput.normalize_batch_and_arguments: the deferred n refusal; one
    sampling_params entry per prompt."""
    refused = obj.__dict__.pop("_refused_n", None)
    if refused is not None:
        raise refused
    params = obj.sampling_params
    if not obj.is_single and isinstance(params, list):
        prompts = obj.batch_size * obj.parallel_sample_num
        if len(params) != prompts:
            given = len(params) // max(obj.parallel_sample_num, 1)
            raise ValueError(
                f"sampling_params has {given} entries for a batch of {obj.batch_size} prompts: "
                "allowed is one entry per prompt, or a single object for all"
            )
    return result


def check_prompt(manager, obj, input_ids):
    """BEFORE TokenizerManager._validate_one_request: the request's final prompt ids and its
    logprob options, checked against the served model's vocabulary."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    vocab_size = manager.model_config.vocab_size
    has_ids = input_ids is not None and getattr(obj, "input_embeds", None) is None
    multimodal = manager.mm_processor is not None and obj.contains_mm_input()  # ids hold media placeholders
    if has_ids and not multimodal:
        where = "input_ids" if obj.input_ids is not None else "the tokenized text's ids"
        _check_token_ids(where, input_ids, vocab_size)
        session_params = getattr(obj, "session_params", None)
        session = session_params.get("id") if isinstance(session_params, dict) else None
        if len(input_ids) == 0 and not session:
            raise ValueError("the prompt is empty (0 tokens): allowed is a prompt of at least 1 token")
    if isinstance(obj, GenerateReqInput):
        top = obj.top_logprobs_num
        if top is not None and (not _is_int(top) or not 0 <= top <= vocab_size):
            raise ValueError(
                f"top_logprobs_num={top!r} is out of range: allowed is an integer in [0, {vocab_size}] "
                "(the model's vocabulary size; OpenAI: logprobs / top_logprobs)"
            )
        start = obj.logprob_start_len
        if start is not None and (not _is_int(start) or start < -1):
            raise ValueError(
                f"logprob_start_len={start!r} is out of range: allowed is -1 (output tokens only) "
                "or a prompt position >= 0"
            )


def check_sampling_params(params, vocab_size):
    """BEFORE SamplingParams.verify: fields that reach the scheduler unchecked."""
    custom = params.custom_params
    if custom is not None and not isinstance(custom, dict):
        raise ValueError(f"custom_params={custom!r} is invalid: allowed is a JSON object")
    for field in INT_FIELDS:
        value = getattr(params, field)
        if value is not None and not _is_int(value):
            raise ValueError(f"{field}={value!r} is invalid: allowed is an integer")
    if not 1 <= params.top_k <= MAX_TOP_K:  # -1 (no limit) is already the whole vocabulary here
        raise ValueError(f"top_k={params.top_k} is out of range: allowed is -1 (no limit) or [1, {MAX_TOP_K}]")
    bad = sorted(t for t in params.stop_token_ids or () if not 0 <= t < vocab_size)  # ints since __post_init__
    if bad:
        raise ValueError(f"stop_token_ids: {bad[0]} is out of range: allowed are token ids in {_vocab(vocab_size)}")
    for key, bias in (params.logit_bias or {}).items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise ValueError(
                f"logit_bias key {key!r} is not a token id: allowed are token ids in {_vocab(vocab_size)}"
            ) from None
        if not 0 <= token < vocab_size:
            raise ValueError(f"logit_bias key {key!r} is out of range: allowed are token ids in {_vocab(vocab_size)}")
        if isinstance(bias, bool) or not isinstance(bias, numbers.Real) or not math.isfinite(bias):
            raise ValueError(f"logit_bias[{key!r}]={bias!r} is invalid: allowed is a finite number")


def check_stop_regex(params, tokenizer):
    """BEFORE SamplingParams.normalize: every stop_regex compiles (else SGLang answers 500)."""
    patterns = params.stop_regex_strs
    for pattern in [patterns] if isinstance(patterns, str) else patterns or ():
        try:
            re.compile(pattern)
        except (re.error, TypeError) as err:
            raise ValueError(f"stop_regex={pattern!r} is not a regular expression ({err})") from None


def install() -> str:
    register_hooks_once(
        __name__,
        (NORMALIZE, defer_bad_parallel_samples, HookType.BEFORE),
        (NORMALIZE, refuse_after_normalizing, HookType.AFTER),
        (VALIDATE_ONE, check_prompt, HookType.BEFORE),
        (VERIFY, check_sampling_params, HookType.BEFORE),
        (NORMALIZE_PARAMS, check_stop_regex, HookType.BEFORE),
    )
    return (
        f"request validation before the scheduler: {NORMALIZE} (n, batch lengths), {VALIDATE_ONE} "
        f"(prompt ids, logprob options), {VERIFY} (stop_token_ids, logit_bias, types, top_k), "
        f"{NORMALIZE_PARAMS} (stop_regex)"
    )
