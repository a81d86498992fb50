"""The SGLang a tool talks to: a running server over its native HTTP API (`--url`) or an in-process
`sglang.Engine` started with the user's own flags (`--engine-args`), behind one interface, the
`generate` / `get_server_info` calls and answers the two share.

On a machine without CUDA an Engine runs on the CPU runtime (cpu_runtime/, `sglang_cpu`), which
`parse_sglang.cpu_engine_settings` enables where it is installed and names where it is not; a
server at a URL needs nothing here.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path


class HttpServer:
    """A running SGLang server (`python -m sglang.launch_server ...`) at `url`: `generate` posts to
    /generate, `get_server_info` reads /server_info; answers as `sglang.Engine`'s."""

    def __init__(self, url: str, flag: str = "--url", timeout_s: float = 3600.0):
        self.url, self.flag, self.timeout_s = url.rstrip("/"), flag, timeout_s

    def _call(self, path: str, body: dict | None = None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                return json.loads(reply.read())
        except urllib.error.HTTPError as err:
            raise RuntimeError(f"{self.flag} {self.url}{path}: HTTP {err.code}: {err.read().decode()[:500]}") from None
        except (urllib.error.URLError, OSError) as err:
            raise RuntimeError(f"{self.flag}={self.url!r} is invalid: no SGLang server answers there ({err})") from None

    def generate(self, **request):
        """POST /generate with `request` (input_ids, sampling_params, return_logprob, ...)."""
        return self._call("/generate", request)

    def get_server_info(self) -> dict:
        return self._call("/server_info")

    def shutdown(self) -> None:
        """Nothing: the server is the user's."""


@dataclass
class Model:
    """A connected model: `client` (HttpServer or sglang.Engine), its checkpoint and tokenizer."""

    client: object
    model_path: str
    tokenizer_path: str


def engine_kwargs(engine_args: dict) -> dict:
    """`sglang.Engine` keyword arguments: errors logged only, the CPU runtime's settings where there
    is no CUDA device, then the user's `engine_args` (theirs win)."""
    import torch

    kwargs = {"log_level": "error"}
    if not torch.cuda.is_available():
        from parse_sglang import cpu_engine_settings

        kwargs.update(cpu_engine_settings())
    return {**kwargs, **engine_args}


def parse_engine_args(text: str, flag: str) -> dict:
    """`--engine-args` JSON: an object with at least model_path."""
    try:
        values = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{flag}={text!r} is invalid: {err}; allowed is a JSON object of sglang.Engine arguments")
    if not isinstance(values, dict) or not isinstance(values.get("model_path"), str):
        raise ValueError(f"{flag}={text!r} is invalid: allowed is a JSON object with model_path (sglang.Engine's)")
    return values


@contextlib.contextmanager
def connect(url: str | None, engine_args: dict | None, hidden: bool = False, flags: str = "--url / --engine-args"):
    """A `Model` at `url`, or an Engine of `engine_args` (shut down on exit); `hidden`: it must
    return hidden states (an Engine is started with them; a server must have been)."""
    if (url is None) == (engine_args is None):
        raise ValueError(f"{flags}: give exactly one (a running server's URL, or sglang.Engine arguments as JSON)")
    if url is not None:
        server = HttpServer(url, flags.split(" / ")[0])
        info = server.get_server_info()
        if hidden and not info.get("enable_return_hidden_states"):
            raise ValueError(
                f"{server.flag}={url!r} is invalid here: the server returns no hidden states; allowed is a "
                "server launched with --enable-return-hidden-states"
            )
        yield Model(server, info["model_path"], info.get("tokenizer_path") or info["model_path"])
        return
    kwargs = engine_kwargs({**engine_args, **({"enable_return_hidden_states": True} if hidden else {})})
    import sglang

    engine = sglang.Engine(**kwargs)
    try:
        yield Model(engine, kwargs["model_path"], kwargs.get("tokenizer_path") or kwargs["model_path"])
    finally:
        engine.shutdown()


def target_identity(model_path: str):
    """The `TargetIdentity` of a checkpoint folder, or of a hub id's config (transformers)."""
    from parse_sglang.judge_head import TargetIdentity

    if (Path(model_path) / "config.json").is_file():
        return TargetIdentity.of_checkpoint(model_path)
    from transformers import AutoConfig

    return TargetIdentity.of_config(AutoConfig.from_pretrained(model_path))


def teacher_top1(client, prompts: list, outputs: list) -> tuple[list, float]:
    """Per request, the model's top-1 token and its probability at each output position given the
    text before it (teacher forcing, one prefill each); and the seconds per token of these prefills."""
    got, tokens, start = [], 0, time.perf_counter()
    for prompt, output in zip(prompts, outputs):
        meta = client.generate(
            input_ids=prompt + output,
            sampling_params={"max_new_tokens": 1, "temperature": 0},
            return_logprob=True,
            logprob_start_len=len(prompt) - 1,
            top_logprobs_num=1,
        )["meta_info"]
        tops = meta["input_top_logprobs"][1 : len(output) + 1]  # [0] is the prompt's last token's own
        got.append(([t[0][1] for t in tops], [math.exp(t[0][0]) for t in tops]))
        tokens += len(prompt) + len(output)
    return got, (time.perf_counter() - start) / max(tokens, 1)
