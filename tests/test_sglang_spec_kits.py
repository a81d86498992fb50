"""SGLang tier, HTTP: SGLang's own speculative-decoding test kits (`sglang.test.kits.
spec_server_kits`, shipped in the wheel) against a PARSE server in lossless mode on CPU.

The kits are unittest mixins written for SGLang's EAGLE / STANDALONE fixtures; `ParseServer`
is the fixture they need here (`base_url`, `tokenizer`, `run_decode`: a launched PARSE server on
the tiny pair, judge off, L = 4), and each kit test runs as it is, on one case object. The
kits import modules that need the CPU runtime's stand-ins, so they are imported once it is on.
Run: the kits' tests that sample (EOS at temperature 0.1, the logprobs of a temperature-1 run
against a prefill rescore, penalties at temperature 0.7 under concurrency) and the cheap greedy
ones. Not run: those that need a real model's quality (`test_acc_length`: 3.1 tokens per verify
on a FastAPI prompt), a GSM8K download, a reference server on SGLang's fixed test port, hidden
states or DFlash's sampling mask, and the 1000-token greedy logprob sweeps (minutes on CPU).
"""

from __future__ import annotations

import contextlib
import unittest

import pytest
import requests
from http_server import parse_server

from conftest import probe_config

pytestmark = pytest.mark.sglang

KIT_TESTS = [
    "SpecCorrectnessKit.test_eos_token",
    "SpecCorrectnessKit.test_first_token_finish",
    "SpecCorrectnessKit.test_batch_generation",
    "SpecLogprobKit.test_logprob_match",
    "SpecLogprobKit.test_logprob_start_len",
    "SpecPenaltyKit.test_penalty_mixed",
]


class ParseServer:
    """What the kits read of SGLang's spec fixtures: `base_url`, `tokenizer`, `run_decode`."""

    def run_decode(self, sampling_params):
        """SGLang's fixtures' request (temperature 0.7, 48 tokens, logprobs) with `sampling_params`."""
        response = requests.post(
            self.base_url + "/generate",
            json={
                "text": "Human: Write a travel blog post to Hawaii.\n\nAssistant:",
                "sampling_params": {"max_new_tokens": 48, "temperature": 0.7, **sampling_params},
                "return_logprob": True,
                "top_logprobs_num": 5,
                "logprob_start_len": 0,
            },
            timeout=300,
        )
        self.assertEqual(response.status_code, 200, response.text[:500])


@pytest.fixture(scope="module")
def kit_case(tiny_pair, cpu_runtime, tmp_path_factory):
    """One case object of every kit, bound to a lossless PARSE server."""
    from sglang.test.kits import spec_server_kits as kits
    from transformers import AutoTokenizer

    case_class = type(
        "ParseKitCase",
        (ParseServer, kits.SpecCorrectnessKit, kits.SpecLogprobKit, kits.SpecPenaltyKit, unittest.TestCase),
        {"runTest": lambda self: None},
    )
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(
            parse_server(tiny_pair, tmp_path_factory.mktemp("kits"), probe_config(draft_budget=4, judge=False))
        )
        case = case_class()
        case.base_url, case.tokenizer = server.url, AutoTokenizer.from_pretrained(tiny_pair[0])
        yield case


@pytest.mark.parametrize("kit_test", KIT_TESTS)
def test_sglang_spec_kit(kit_case, kit_test):
    getattr(kit_case, kit_test.split(".")[1])()
