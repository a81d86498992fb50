"""Tier 1: settings, boundaries and acceptance, no model."""

import pytest
import torch

from parse_sglang.acceptance import accept_lengths, emitted_tokens
from parse_sglang import judge
from parse_sglang.judge import judged_tokens, probe_reach
from parse_sglang.boundaries import delimiter_ends, select_boundaries
from parse_sglang.settings import ParseConfig


# ---- settings ---------------------------------------------------------------------------


def test_config_defaults_are_the_measured_ones_and_round_trip():
    """A server given no settings runs lossless with adaptive draft lengths up to L = 32; a judge a
    user turns on is the likelihood judge at λ = 0.2 (docs/settings.md, "Why these defaults")."""
    cfg = ParseConfig()
    assert ParseConfig.from_dict(cfg.to_dict()) == cfg
    assert (cfg.judge, cfg.adaptive, cfg.draft_budget, cfg.tiers) == (False, True, 32, (0, 4, 8, 16, 32))
    assert (cfg.judge_mode, cfg.likelihood_threshold, cfg.threshold) == ("likelihood", 0.2, 0.9)
    judged = ParseConfig(judge=True)
    assert (judged.uses_probe, judged.token_judge) == (False, judge.TOKEN_JUDGES["likelihood"])


@pytest.mark.parametrize(
    "field, value, allowed",
    [
        ("threshold", 1.5, "[0, 1]"),
        ("threshold", -0.1, "[0, 1]"),
        ("threshold", "high", "[0, 1]"),
        ("draft_budget", 0, "[1, 1024]"),
        ("draft_budget", 2.5, "[1, 1024]"),
        ("probe_stride", 0, "[1, 1024]"),
        ("delimiters", [], "non-empty list"),
        ("delimiters", ["\n", ""], "non-empty strings"),
        ("delimiters", "\n", "non-empty list"),
        ("judge_question", "  ", "non-empty string"),
        ("judge", "yes", "true or false"),
        ("after_rejection", "wait", "redraft"),
    ],
)
def test_config_refuses_bad_values_naming_field_value_and_range(field, value, allowed):
    with pytest.raises(ValueError) as err:
        ParseConfig(**{field: value})
    message = str(err.value)
    assert f"{field}={value!r}" in message and allowed in message


def test_config_from_dict_refuses_unknown_setting():
    with pytest.raises(ValueError, match=r"unknown PARSE setting\(s\) \['drafts'\]"):
        ParseConfig.from_dict({"drafts": 3})
    assert ParseConfig.from_dict({"threshold": 0}).threshold == 0.0


# ---- boundaries -------------------------------------------------------------------------

TOKENS = ["Hello", " world", ".", " Next", " line", "\n", "a", "b", "c", "d", ".", " x"]


def test_delimiter_ends_anchor_on_last_non_space_character():
    # ". " ends at the "." token even though its space is glued to the next word.
    assert delimiter_ends(TOKENS, [". "]) == [3, 11]
    assert delimiter_ends(TOKENS, ["\n"]) == [6]
    assert delimiter_ends(TOKENS, ["."]) == [3, 11]
    assert delimiter_ends(["ab\nc", "d"], ["\n"]) == [1]  # delimiter inside a token


def test_select_boundaries_stride_moves_forward_to_next_delimiter():
    delims = [". ", "\n", "."]
    assert select_boundaries(TOKENS, 1, delims) == [3, 6, 11, 12]
    assert select_boundaries(TOKENS, 4, delims) == [6, 11, 12]  # first segment end >= 4, then >= 10
    assert select_boundaries(TOKENS, 100, delims) == [12]  # always the end of the draft
    assert select_boundaries(["a", "b", "c"], 1, ["\n"]) == [3]  # no delimiter: one probe at the end
    assert select_boundaries(["a", "."], 1, ["."]) == [2]  # no duplicate end boundary


def test_select_boundaries_refuses_empty_draft():
    with pytest.raises(ValueError, match="draft is empty"):
        select_boundaries([], 4, ["\n"])


# ---- acceptance -------------------------------------------------------------------------


def pad_ragged(rows, fill, dtype) -> torch.Tensor:
    """Right-pad a list of rows into one [B, max_len] tensor."""
    width = max(1, max(map(len, rows), default=0))
    return torch.tensor([list(row) + [fill] * (width - len(row)) for row in rows], dtype=dtype)


def _accept(drafts, targets, bounds, scores, threshold, judge):
    """Probe-judged acceptance (judge_mode "probe")."""
    lens = torch.tensor([len(d) for d in drafts])
    draft = pad_ragged(drafts, 0, torch.long)
    reach = probe_reach(
        pad_ragged(scores, 0.0, torch.float),
        torch.tensor(threshold, dtype=torch.float),
        pad_ragged(bounds, 0, torch.long),
    )
    every = torch.ones(draft.shape, dtype=torch.bool)  # no token judge: every token passes it
    passed = judged_tokens(draft.shape[1], torch.tensor(judge), torch.ones(len(drafts), dtype=torch.bool), reach, every)
    return accept_lengths(draft, lens, pad_ragged(targets, -1, torch.long), passed)


def test_accept_is_max_of_exact_and_judged_and_first_failing_probe_stops():
    drafts = [[5, 6, 7, 8, 9, 10], [1, 2, 3], [4, 4, 4, 4]]
    targets = [[5, 6, 0, 0, 0, 0, 0], [1, 2, 3, 9], [0, 0, 0, 0, 0]]
    bounds = [[2, 4, 6], [3], [1, 2, 4]]
    scores = [[0.9, 0.8, 0.1], [0.2], [0.7, 0.2, 0.9]]
    got = _accept(drafts, targets, bounds, scores, [0.5, 0.5, 0.5], [True, True, True])
    assert got.exact.tolist() == [2, 3, 0]
    assert got.accepted.tolist() == [4, 3, 1]  # probe 3 of request 0 fails; probe 2 of request 2 stops it
    assert got.judged.tolist() == [2, 0, 1]


def test_accept_judge_off_is_token_level_and_tau_zero_takes_whole_draft():
    drafts, targets = [[5, 6, 7], [1, 2]], [[5, 0, 0, 0], [1, 2, 3]]
    bounds, scores = [[1, 3], [2]], [[0.0, 0.0], [0.0]]
    off = _accept(drafts, targets, bounds, scores, [0.0, 0.0], [False, False])
    assert off.accepted.tolist() == [1, 2] and off.judged.tolist() == [0, 0]
    on = _accept(drafts, targets, bounds, scores, [0.0, 1.0], [True, True])
    assert on.accepted.tolist() == [3, 2] and on.judged.tolist() == [2, 0]


def test_accept_ignores_padding_past_draft_length():
    got = _accept(
        [[3, 3], [3, 3, 3, 3]], [[3, 3, 3, 3, 3], [3, 3, 3, 3, 3]], [[2], [4]], [[0.0], [0.0]], [0.5, 0.5], [True, True]
    )
    assert got.exact.tolist() == [2, 4]


def test_emitted_tokens_truncate_like_target_only_decoding():
    assert emitted_tokens([1, 2, 99, 3], 4, 7, [99], 10) == ([1, 2, 99], True)  # EOS inside the draft
    assert emitted_tokens([1, 2, 3], 3, 99, [99], 10) == ([1, 2, 3, 99], True)  # EOS as the bonus
    assert emitted_tokens([1, 2, 3], 3, 7, [99], 2) == ([1, 2], True)  # max_new_tokens inside
    assert emitted_tokens([1, 2, 3], 1, 7, [99], 5) == ([1, 7], False)
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        emitted_tokens([1], 1, 2, [], 0)


def test_likelihood_judge_accepts_each_likely_token_and_exact_matches_pass_it():
    """Draft [5, 6, 7, 8, 9] against the target's [5, 0, 7, 0, 0]: target probabilities 0.1, 0.8,
    0.05, 0.4, 0.9 at λ = 0.5: d_1 and d_3 are exact (an exact match needs no judge, however
    unlikely), d_2 is likely, d_4 is neither: the round keeps 3 tokens, 1 by the judge."""
    stats = judge.ChainStats(
        torch.tensor([[5, 0, 7, 0, 0, 0]]),
        torch.tensor([[0.1, 0.8, 0.05, 0.4, 0.9]]),
        torch.ones(1, 5),
        torch.ones(1, 5),
    )
    drafts = torch.tensor([[5, 6, 7, 8, 9]])
    mode = torch.tensor([judge.TOKEN_JUDGES["likelihood"]])
    ok, _ = judge.token_passes(
        stats, drafts == stats.top_tokens[:, :-1], torch.tensor([5]), mode, torch.tensor([0.5]), torch.tensor([1]), None
    )
    passed = judged_tokens(5, torch.tensor([True]), torch.tensor([False]), torch.tensor([0]), ok)
    got = accept_lengths(drafts, torch.tensor([5]), stats.top_tokens, passed)
    assert (got.exact.item(), got.accepted.item(), got.judged.item()) == (1, 3, 2)


def test_judge_mode_settings_are_checked():
    with pytest.raises(
        ValueError,
        match=r"judge_mode='vote' is invalid: allowed is one of \('probe', 'likelihood', 'both', 'divergence', 'head'\)",
    ):
        ParseConfig(judge_mode="vote")
    with pytest.raises(ValueError, match=r"likelihood_threshold=1.2 is invalid: allowed is a number in \[0, 1\]"):
        ParseConfig(likelihood_threshold=1.2)
    likelihood = ParseConfig(judge=True, judge_mode="likelihood")
    assert (likelihood.uses_probe, likelihood.token_judge) == (False, judge.TOKEN_JUDGES["likelihood"])
    assert not ParseConfig(judge=False, judge_mode="both").token_judge
    both = ParseConfig(judge=True, judge_mode="both")
    assert (both.uses_probe, both.token_judge) == (True, judge.TOKEN_JUDGES["likelihood"])
    divergence = ParseConfig(judge=True, judge_mode="divergence", divergence_entropy=1.5)
    assert (divergence.uses_probe, divergence.token_judge, divergence.token_threshold) == (False, 2, 1.5)
    with pytest.raises(ValueError, match=r"divergence_window=0 is invalid: allowed is an integer in \[1, 64\]"):
        ParseConfig(divergence_window=0)
    with pytest.raises(ValueError, match=r"divergence_entropy=-1 is invalid: allowed is a number of nats"):
        ParseConfig(divergence_entropy=-1)
    with pytest.raises(ValueError, match=r"head_threshold=2 is invalid: allowed is a number in \[0, 1\]"):
        ParseConfig(head_threshold=2)


def test_likelihood_server_has_no_probe_rows_and_refuses_probe_requests():
    from parse_sglang.attention.window import WindowGeometry
    from parse_sglang.settings import request_parse_config

    server = ParseConfig(draft_budget=16, judge=True, judge_mode="likelihood")
    geometry = WindowGeometry(server, suffix_len=23)
    assert geometry.max_probes() == 0 and geometry.max_rows == 17  # L + 1 rows
    ok = request_parse_config({"parse": {"likelihood_threshold": 0.8, "probe_stride": 2}}, server)
    assert ok.likelihood_threshold == 0.8 and ok.probe_stride == 2  # boundaries only: no probe rows needed
    with pytest.raises(ValueError, match=r"judge_mode='both' is invalid: the server's verify window has no probe rows"):
        request_parse_config({"parse": {"judge_mode": "both"}}, server)
    assert (
        request_parse_config(
            {"parse": {"judge_mode": "likelihood"}}, ParseConfig(judge=True, judge_mode="probe")
        ).uses_probe
        is False
    )


def test_a_pd_decode_server_refuses_prefill_servers_with_another_draft():
    """`pd_peer.refusal` on a prefill server's /server_info: the same draft passes; a target-only
    server, another draft, and a server without PARSE's state are refused naming both drafts."""
    from parse_sglang.scheduler_patches.pd_peer import refusal

    own = {"architectures": ["LlamaForCausalLM"], "config_sha256": "9e57", "kv_layers": 2, "kv_dtype": "torch.float32"}

    def info(algorithm, draft):
        return {"speculative_algorithm": algorithm, "internal_states": [{"parse": {"draft": draft}} if draft else {}]}

    url = "http://prefill:30000"
    assert refusal(url, info("PARSE", dict(own)), own) is None
    for peer in (info(None, None), info("PARSE", {**own, "config_sha256": "0000"}), {}):
        reason = refusal(url, peer, own)
        assert reason.startswith(
            "PARSE on a PD decode server needs its prefill server to run PARSE with the same draft"
        )
        assert url in reason and str(own) in reason
    assert "--speculative-algorithm None with draft None" in refusal(url, info(None, None), own)
