"""SGLang tier: a judge head mined, trained and served on the synthetic pair (judge_mode "head").

`python -m parse_sglang.tools.judge_head mine | train | eval` run as a user runs them, on a prompts
file and grader (`python -m support.judge_suites synthetic`), the target and the draft running
SGLang HTTP servers (`--url`, launched with --enable-return-hidden-states, and `--draft-url`; an
in-process Engine's shutdown would end a server this process started); then a PARSE server with
the head: its output equals the reference generator's with the same head, token for token, at the
server's default head_threshold and at 1.0; a head made for another target, or a damaged file, is
refused at start-up by name.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from http_server import launched_server

from parse_sglang import judge_head
from parse_sglang.settings import ParseConfig, parse_engine_kwargs
from parse_sglang.tools import judge_head as head_tools

pytestmark = pytest.mark.sglang

MAX_NEW = 48


@pytest.fixture(scope="module")
def synthetic_pair():
    from support import synthetic

    target, draft = synthetic.build()
    return str(target), str(draft)


@pytest.fixture(scope="module")
def mined(synthetic_pair, tmp_path_factory, cpu_runtime):
    """(shard, head file): 16 problems no test scores, up to 8 mismatches each, then trained."""
    from support import judge_suites

    folder = tmp_path_factory.mktemp("judge_head")
    problems, shard, head = folder / "problems.json", folder / "shard.json", folder / "head.json"
    judge_suites.main(["synthetic", "--count", "16", "--out", str(problems)])
    (folder / "target").mkdir()
    (folder / "draft").mkdir()
    with (
        launched_server(synthetic_pair[0], folder / "target", env={}, enable_return_hidden_states=True) as target,
        launched_server(synthetic_pair[1], folder / "draft", env={}) as draft,
    ):
        head_tools.main(
            [
                "mine",
                "--prompts",
                str(problems),
                "--grader",
                "support.judge_suites:synthetic",
                "--url",
                target.url,
                "--draft-url",
                draft.url,
                "--max-new-tokens",
                "96",
                "--per-problem",
                "8",
                "--batch",
                "16",
                "--out",
                str(shard),
            ]
        )
    head_tools.main(
        ["train", str(shard), "--target", synthetic_pair[0], "--out", str(head), "--max-harmful-accepted", "0.2"]
    )
    return shard, head


def test_mining_labels_both_ways_and_the_head_is_bound_to_its_target(mined, synthetic_pair, capsys):
    shard, head_path = mined
    rows = json.loads(shard.read_text())["rows"]
    harmful = sum(r["harmful"] for r in rows)
    assert len(rows) >= 40 and 0 < harmful < len(rows)
    assert all(r["draft_token"] != r["target_token"] for r in rows)  # every row is a real mismatch
    assert {r["group"] for r in rows} == {r["problem"] for r in rows}  # no "group": each problem its own
    head = judge_head.load(str(head_path), json.loads((judge_head.Path(synthetic_pair[0]) / "config.json").read_text()))
    assert head.target == judge_head.TargetIdentity.of_checkpoint(synthetic_pair[0])
    assert head.recipe["mismatches"] == len(rows)
    capsys.readouterr()
    head_tools.main(["eval", str(head_path), str(shard)])
    report = json.loads(capsys.readouterr().out)
    assert report["mismatches"] == len(rows) and 0.0 <= report["auc"] <= 1.0
    assert [c["threshold"] for c in report["calibration"]] == list(head_tools.THRESHOLDS)


def test_served_head_equals_reference(mined, synthetic_pair, engine_factory):
    """The server's rounds with the head at the default head_threshold and at 1.0 (every mismatch
    it reads accepted) give the reference generator's output; the looser bound judges more."""
    import torch
    from support import synthetic
    from support.reference import ParseGenerator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, head_path = mined
    target_dir, draft_dir = synthetic_pair
    config = ParseConfig(adaptive=False, draft_budget=8, judge=True, judge_mode="head", judge_head=str(head_path))
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    enc = synthetic.Encoder(tokenizer)
    prompts = [enc.prompt_ids(p) for p in synthetic.problems(synthetic.TEST_SEED, 4)]
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
    judged = {}
    with engine_factory(target_dir, **parse_engine_kwargs(draft_dir, config)) as engine:
        for bound in (ParseConfig.head_threshold, 1.0):
            params = {
                "max_new_tokens": MAX_NEW,
                "temperature": 0.0,
                "custom_params": {"parse": {"head_threshold": bound}},
            }
            outs = engine.generate(input_ids=prompts, sampling_params=params)
            reference = ParseGenerator(target, draft, tokenizer, dataclasses.replace(config, head_threshold=bound))
            judged[bound] = 0
            for prompt, out in zip(prompts, outs):
                expected, stats = reference.generate(prompt + out["output_ids"][:1], MAX_NEW - 1)
                assert out["output_ids"][1:] == expected
                assert out["meta_info"]["parse"]["accepted_judged"] == stats.accepted_judged
                judged[bound] += stats.accepted_judged
    assert judged[1.0] > 0 and judged[1.0] >= judged[ParseConfig.head_threshold]


def test_foreign_or_damaged_heads_are_refused_at_startup(mined, synthetic_pair, tiny_pair, tmp_path, engine_factory):
    """An Engine started with the synthetic head on the tiny target, or with the synthetic head
    with one number changed, fails at start-up with the setting, the file and what is wrong."""
    _, head_path = mined
    damaged = tmp_path / "damaged.json"
    raw = json.loads(head_path.read_text())
    damaged.write_text(json.dumps({**raw, "bias": raw["bias"] + 1.0}))  # one number changed, its sha256 kept
    for (target, draft), head, wrong in (
        (tiny_pair, head_path, "it was made for"),
        (synthetic_pair, damaged, "the file is damaged"),
    ):
        config = ParseConfig(adaptive=False, judge=True, judge_mode="head", judge_head=str(head))
        with pytest.raises(ValueError, match=rf"judge_head='.*{head.name}' is invalid: {wrong}"):
            with engine_factory(str(target), **parse_engine_kwargs(draft, config)):
                pass
