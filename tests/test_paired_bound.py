"""The paired bound of benchmarks/semantic.py: Newcombe's hybrid score interval for the difference
of paired proportions (Stat Med 1998;17:2635, method 10) against published worked examples, and
the one-sided loss bound `paired` derives from it. No engine."""

from __future__ import annotations

import pytest

from conftest import load_benchmark


@pytest.fixture(scope="module")
def semantic():
    return load_benchmark("semantic", "semantic_bench")


@pytest.mark.parametrize(
    "table, published",
    [
        # Newcombe 1998, Table II, method 10 (95%): (e, f, g, h) = both, first only, second only, neither
        ((36, 12, 2, 0), (0.0569, 0.3404)),
        ((18, 12, 2, 18), (0.0562, 0.3290)),
        ((53, 0, 0, 1), (-0.0729, 0.0729)),  # no discordant pair
        ((0, 30, 0, 0), (0.8395, 1.0)),
        # Fagerland, Lydersen & Laake, Statistical Analysis of Contingency Tables (2017), ch. 8:
        # complete response before and after consolidation therapy (Cavo et al. 2012), Newcombe
        ((59, 6, 16, 80), (-0.1186, -0.0046)),
    ],
)
def test_newcombe_interval_matches_published_examples(semantic, table, published):
    low, high = semantic.paired_difference_interval(*table)
    assert (low, high) == pytest.approx(published, abs=5e-5)


def test_interval_is_antisymmetric_and_narrows_with_level(semantic):
    """Swapping the two arms (f <-> g) negates the interval; a 90% interval lies inside the 95% one."""
    low, high = semantic.paired_difference_interval(20, 7, 3, 10)
    assert semantic.paired_difference_interval(20, 3, 7, 10) == pytest.approx((-high, -low))
    low90, high90 = semantic.paired_difference_interval(20, 7, 3, 10, level=0.90)
    assert low < low90 < 4 / 40 < high90 < high


def test_bad_counts_name_the_values(semantic):
    with pytest.raises(ValueError, match=r"e=1 f=-1 g=0 h=0, level=0.95: allowed are counts >= 0"):
        semantic.paired_difference_interval(1, -1, 0, 0)
    with pytest.raises(ValueError, match="at least one pair"):
        semantic.paired_difference_interval(0, 0, 0, 0)
    with pytest.raises(ValueError, match=r"level=1.0: allowed .* 0 < level < 1"):
        semantic.paired_difference_interval(1, 1, 1, 1, level=1.0)


def rows(semantic, base: list[bool], arm: list[bool]) -> dict:
    lossless, judged = {"mode": "parse_lossless", "correct": base}, {"mode": "parse_likelihood", "correct": arm}
    semantic.paired([lossless, judged])
    return judged


def test_loss_bound_is_one_sided_95(semantic):
    """`loss_upper95` is the upper end of the two-sided 90% interval for lossless's accuracy minus
    the arm's; 10 answers lost in 100 (none gained) bound the loss at 16.0 points, not 10."""
    judged = rows(semantic, [True] * 100, [False] * 10 + [True] * 90)
    assert (judged["paired_b"], judged["paired_c"]) == (10, 0)
    assert judged["loss_upper95"] == pytest.approx(0.16036, abs=5e-5)
    assert judged["loss_upper95"] == semantic.paired_difference_interval(90, 10, 0, 0, level=0.90)[1]


def test_loss_bound_is_positive_without_discordant_pairs(semantic):
    """Identical answers on 30 problems (10 right) do not prove the loss is 0: the bound is 5.9 points,
    and it shrinks as the problems grow."""
    same = [True] * 10 + [False] * 20
    bound30 = rows(semantic, same, list(same))["loss_upper95"]
    assert bound30 == pytest.approx(0.05931, abs=5e-5)
    bound300 = rows(semantic, same * 10, same * 10)["loss_upper95"]
    assert 0 < bound300 < bound30


def test_loss_bound_rises_with_answers_lost(semantic):
    """On 60 problems, 30 right under lossless: each answer the arm loses (b) raises the bound, each it
    gains (c) lowers it."""
    base = [True] * 30 + [False] * 30

    def bound(b: int, c: int) -> float:
        return rows(semantic, base, [False] * b + [True] * (30 - b) + [True] * c + [False] * (30 - c))["loss_upper95"]

    by_b = [bound(b, 2) for b in range(8)]
    assert by_b == sorted(by_b) and len(set(by_b)) == len(by_b)
    by_c = [bound(3, c) for c in range(8)]
    assert by_c == sorted(by_c, reverse=True) and len(set(by_c)) == len(by_c)
