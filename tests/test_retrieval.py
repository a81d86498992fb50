"""Retrieval's copies against brute force, its corpus's bound, and the controller's choice of
copies (parse_sglang/retrieval.py, adaptive.py): no model, no SGLang."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from parse_sglang.adaptive import AdaptiveDraftLength
from parse_sglang.cost_table import CostTable
from parse_sglang.draft_length import DECODE
from parse_sglang.request_state import RequestPolicy
from parse_sglang.retrieval import (
    Copy,
    CopyKeep,
    RecentOutputs,
    Retrieval,
    SuffixAutomaton,
    continuation,
    window_length,
    with_copies,
)
from parse_sglang.settings import ParseConfig


def earlier_by_brute_force(stream: list) -> tuple[int, int]:
    """The longest suffix of `stream` that also ends before its last token, and where it first ends."""
    n = len(stream)
    for length in range(n - 1, 0, -1):
        suffix = stream[n - length :]
        for end in range(length - 1, n - 1):
            if stream[end - length + 1 : end + 1] == suffix:
                return length, end
    return 0, -1


def match_by_brute_force(stream: list, text: list) -> tuple[int, int]:
    """The longest suffix of `text` that occurs in `stream`, and where it first ends there."""
    for length in range(len(text), 0, -1):
        suffix = text[len(text) - length :]
        for end in range(length - 1, len(stream)):
            if stream[end - length + 1 : end + 1] == suffix:
                return length, end
    return 0, -1


@pytest.mark.parametrize("alphabet", [2, 3, 5])
def test_the_earlier_match_is_the_longest_and_first(alphabet):
    rng = random.Random(alphabet)
    for _ in range(40):
        stream = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 60))]
        index = SuffixAutomaton()
        for i, token in enumerate(stream):
            index.extend(token)
            n, end = index.earlier()
            want = earlier_by_brute_force(stream[: i + 1])
            assert n == want[0], stream[: i + 1]
            if n:
                assert end == want[1], stream[: i + 1]
        assert index.states <= max(2 * len(stream) - 1, 2)


def test_a_match_in_the_stream_is_the_longest_suffix_and_first():
    rng = random.Random(7)
    for _ in range(200):
        stream = [rng.randrange(4) for _ in range(rng.randrange(0, 50))]
        text = [rng.randrange(4) for _ in range(rng.randrange(1, 12))]
        n, end = SuffixAutomaton(stream).match(text)
        want = match_by_brute_force(stream, text)
        assert n == want[0], (stream, text)
        if n:
            assert end == want[1], (stream, text)


def test_continuation_stops_at_a_separator_and_the_length():
    assert continuation([1, 2, 3, -1, 4], 0, 8) == (2, 3)
    assert continuation([1, 2, 3, 4], 0, 2) == (2, 3)
    assert continuation([1, 2], 1, 4) == ()


def test_the_corpus_stays_bounded_and_no_match_crosses_two_outputs():
    corpus = RecentOutputs(max_tokens=64)
    rng = random.Random(3)
    for _ in range(200):
        corpus.add([rng.randrange(50) for _ in range(rng.randrange(1, 40))])
        assert len(corpus.index.tokens) <= 64 and corpus.index.states <= 2 * 64
    assert sum(len(o) + 1 for o in corpus.outputs) == len(corpus.index.tokens)
    corpus = RecentOutputs(max_tokens=100)
    corpus.add([1, 2, 3])
    corpus.add([4, 5, 6])
    assert corpus.copy([9, 1, 2], 8) == Copy((3,), 2)  # stops at the end of its output
    assert corpus.copy([2, 3, 4], 8) == Copy((5, 6), 1)  # "3, 4" spans two outputs: only "4" matches
    assert corpus.copy([7, 8], 8) is None


def req(rid: str, prompt: list, output: list, finished: bool = False):
    return SimpleNamespace(rid=rid, origin_input_ids=prompt, output_ids=output, finished=lambda: finished)


def test_a_request_copies_what_followed_its_last_tokens():
    retrieval = Retrieval(min_match=3, corpus_tokens=0)
    prompt = [10, 11, 12, 13, 14, 15, 16, 17]
    r = req("a", prompt, [20, 11, 12, 13])  # "11 12 13" occurred at 1..3: 14 15 16 ... follows
    assert retrieval.propose([r], [3]) == [Copy((14, 15, 16), 3)]
    r.output_ids += [14, 99]  # the copy diverged: "14 99" occurs nowhere before
    assert retrieval.propose([r], [8]) == [None]
    r.output_ids += [11, 12]  # a match of 2 < min_match
    assert retrieval.propose([r], [8]) == [None]
    assert retrieval.propose([req("b", prompt, [12, 13, 14])], [0]) == [None]  # no budget: no copy


def test_finished_outputs_feed_the_corpus_and_a_longer_match_wins():
    retrieval = Retrieval(min_match=2, corpus_tokens=1024)
    first = req("a", [1, 2], [5, 6, 7, 8, 9], finished=True)
    assert retrieval.propose([first], [4]) == [None]
    second = req("b", [5, 6, 7], [])  # the first is gone from the batch, finished: its output is in the corpus
    assert retrieval.propose([second], [4]) == [Copy((8, 9), 3)]
    own = req("c", [3, 4, 5, 6, 7, 30, 5, 6], [7])  # its own "5 6 7" (3) against the corpus's "5 6 7" (3): its own
    assert retrieval.propose([own], [2]) == [Copy((30, 5), 3)]


def test_windows_hold_the_copies_in_the_shortest_tier():
    copies = [Copy((1,) * 5, 3), None, Copy((2,) * 20, 4)]
    assert window_length((0, 4, 8, 16, 32), 4, copies, [True, False, False]) == 8
    assert window_length((0, 4, 8, 16, 32), 0, copies, [True, False, True]) == 32
    assert window_length((0, 4, 8, 16, 32), 4, copies, [False, False, False]) == 4
    drafts, confidence = torch.tensor([[7, 7], [8, 8], [9, 9]]), torch.full((3, 2), 0.5)
    out, sure, counts = with_copies(drafts, confidence, copies, [True, False, False], 8)
    assert out.tolist() == [[1] * 5 + [0] * 3, [8, 8] + [0] * 6, [9, 9] + [0] * 6]
    assert counts == [5, 2, 2] and sure[0].tolist() == [1.0] * 8 and sure[1, :2].tolist() == [0.5, 0.5]


def test_a_copys_keep_rate_is_learned_per_match_length():
    keep = CopyKeep()
    assert keep.alive(3, 2) == pytest.approx([1.0, 1 / 2, 1 / 2 * 2 / 3])  # Beta(1, 1): E[r], E[r^2]
    for _ in range(20):
        keep.observe(20, 16, 16)  # long matches: every copied token kept
        keep.observe(3, 16, 0)  # short ones: none
    decayed = (1 - 0.98**20) / 0.02  # 20 observations, each aged by 0.98 per later one
    assert keep.alive(3, 16)[1] == pytest.approx(1 / (2 + decayed))  # (0 + 1) / (0 + 1 + decayed + 1)
    assert keep.alive(20, 16)[-1] > 0.5 and keep.alive(8, 2) == pytest.approx([1.0, 1 / 2, 1 / 3])  # bins apart


def policy(budget: int = 16) -> RequestPolicy:
    return RequestPolicy(ParseConfig(), budget, False, frozenset(), None, None, 0)


def controller() -> AdaptiveDraftLength:
    """Tiers {0, 4, 16}; a draft step costs 0.3 of a one-row verify, a verify row 0.05 of one."""
    tiers = (0, 4, 16)
    costs = CostTable(
        draft={(1, L): 0.003 * (L + 1) if L else 0.0 for L in tiers},
        rest={(1, L + 1): 0.01 + 5e-4 * (L + 1) for L in tiers},
        fixed=True,
    )
    return AdaptiveDraftLength(tiers, costs)


def test_the_controller_verifies_a_copy_where_it_pays_and_not_where_it_does_not():
    """Copies of a match length that are never kept: the draft model's tiers; once they are kept:
    a round of copies alone (no draft model) at the window that holds them."""
    chooser = controller()
    reqs, policies = [SimpleNamespace()], [policy()]
    copies = [Copy(tuple(range(12)), 20)]
    for _ in range(30):
        chooser.copy_keep.observe(20, 12, 0)
    assert chooser.choose(reqs, policies, lambda L: L + 1, 1, copies) in chooser.tiers and chooser.copying == ()
    for _ in range(30):
        chooser.copy_keep.observe(20, 12, 12)
    assert chooser.choose(reqs, policies, lambda L: L + 1, 1, copies) == DECODE and list(chooser.copying) == [True]
    assert window_length(chooser.lengths, 0, copies, chooser.copying) == 16
    assert chooser.choose(reqs, policies, lambda L: L + 1, 1, None) in chooser.tiers and chooser.copying == ()


def test_a_round_of_copies_teaches_the_copy_rate_not_the_drafts():
    """A round verifying one request's copy (the other has none: its bonus alone) counts the copy
    in the copies' keep rate of its match length and nothing in the draft's curves."""
    chooser = controller()
    reqs, policies = [SimpleNamespace(), SimpleNamespace()], [policy(), policy()]
    copies = [Copy(tuple(range(12)), 20), None]
    for _ in range(10):
        chooser.copy_keep.observe(20, 12, 12)
    assert chooser.choose(reqs, policies, lambda L: L + 1, 1, copies) == DECODE
    assert list(chooser.copying) == [True, False]
    kept, pooled = chooser.copy_keep.kept[CopyKeep.bin(20)], (chooser.pooled.kept, chooser.pooled.reached)
    chooser.drafts_on_host()
    plan = SimpleNamespace(
        draft_lens=torch.tensor([12, 0]), judged=torch.zeros(2, dtype=torch.bool), confidence=torch.ones(2, 16)
    )
    result = SimpleNamespace(lengths=[7, 0], emitted=[list(range(8)), [5]])
    chooser.after_round(reqs, SimpleNamespace(shape=SimpleNamespace(rows=17), plan=plan), result, 1)
    assert chooser.copy_keep.kept[CopyKeep.bin(20)] == pytest.approx(0.98 * kept + 7)
    assert chooser.copy_keep.rejected[CopyKeep.bin(20)] == pytest.approx(1.0)
    assert (chooser.pooled.kept, chooser.pooled.reached) == pooled
    assert chooser.keep_rate(reqs[0]).kept == 0.0


@pytest.mark.parametrize(
    "values, named",
    [
        ({"retrieval": "yes"}, "retrieval='yes' is invalid: allowed is true or false"),
        ({"retrieval_min_match": 0}, "retrieval_min_match=0 is invalid: allowed is an integer in [1, 64]"),
        ({"retrieval_corpus": -1}, "retrieval_corpus=-1 is invalid: allowed is an integer in [0, 4194304]"),
    ],
)
def test_bad_retrieval_settings_are_refused_by_name(values, named):
    with pytest.raises(ValueError) as err:
        ParseConfig.from_dict(values)
    assert named in str(err.value)


def test_a_request_may_turn_retrieval_off_but_not_on():
    from parse_sglang.settings import request_parse_config

    on, off = ParseConfig(), ParseConfig(retrieval=False)
    assert request_parse_config({"parse": {"retrieval": False}}, on).retrieval is False
    with pytest.raises(ValueError, match=r'custom_params\["parse"\]: retrieval=true is invalid'):
        request_parse_config({"parse": {"retrieval": True}}, off)
    with pytest.raises(ValueError, match="retrieval_corpus"):  # server-wide
        request_parse_config({"parse": {"retrieval_corpus": 0}}, on)
