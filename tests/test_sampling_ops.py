"""Unit tests of the torch sampling-verification ops (sglang_cpu.sampling_ops) and of the
patch that lets SGLang 0.5.23's `eagle_sample` use them on CPU (sglang_cpu.sampling_patch).

Each op is compared, for fixed coins, with a float64 reference written here as plain loops
over Python lists from the rules of the GPU kernels (SGLang's speculative_sampling CUDA kernel,
its Triton chain sampler, FlashInfer's renorm kernels): acceptance decisions, accept indices
and lengths, sampled tokens, and the draft_probs the tree kernel writes. Inputs are float64
(the ops then compute in float64) and thresholds are exact in float32 (the kernel's type), so
the two sides see the same numbers. Statistical tests check that the first emitted token is
distributed as the target, with a deliberately wrong rule as the negative control. The last
tests call SGLang's own `eagle_sample` (no engine: a verify view, a SamplingBatchInfo and a
runtime context of SGLang's) after `sampling_patch.install()`.
"""

from __future__ import annotations

import inspect
import pkgutil
import random
from types import SimpleNamespace

import pytest
import torch

from sglang_cpu.sampling_ops import (
    chain_speculative_sampling_triton,
    murmur_hash32,
    top_k_renorm_prob,
    top_p_renorm_prob,
    tree_speculative_sampling_target_only,
)

SEEDS = range(6)
SENTINEL = -7  # predicts entries the ops must leave alone


# ---------------------------------------------------------------- float64 references


def ref_first_above(weights, coin, norm=None, last_positive=True):
    """Inverse-CDF draw: first index of positive weight whose running sum exceeds coin * norm."""
    total = sum(weights) if norm is None else norm
    u = coin * total
    running = 0.0
    for i, w in enumerate(weights):
        running += w
        if w > 0 and running > u:
            return i
    positive = [i for i, w in enumerate(weights) if w > 0]
    return positive[-1] if (positive and last_positive) else len(weights) - 1


def ref_target_only(cand, ridx, first_child, next_sib, coins, final_coins, target, draft, depth, thr_single, thr_acc):
    """Returns (predicts {slot: token}, accept_index rows, accepted counts); updates `draft` in place."""
    predicts, accept_rows, counts = {}, [], []
    thr_acc = max(thr_acc, 1e-9)
    for b in range(len(cand)):
        row, last, accepted = 0, ridx[b][0], 0
        accept_row = [ridx[b][0]] + [-1] * (depth - 1)
        while accepted < depth - 1:
            child, mass, chosen = first_child[b][row], 0.0, None
            while child != -1:
                p = target[b][row][cand[b][child]]
                mass += p
                if p > 0 and (coins[b][row] < mass / thr_acc or p >= thr_single):
                    chosen = child
                    break
                draft[b][row][cand[b][child]] = p  # a rejected draft leaves the residual
                child = next_sib[b][child]
            if chosen is None:
                break
            predicts[last] = cand[b][chosen]
            accepted += 1
            last = ridx[b][chosen]
            accept_row[accepted] = last
            row = chosen
        if accepted == depth - 1:
            weights = list(target[b][row])
        else:
            weights = [max(t - d, 0.0) for t, d in zip(target[b][row], draft[b][row])]
        predicts[last] = ref_first_above(weights, final_coins[b])
        accept_rows.append(accept_row)
        counts.append(accepted)
    return predicts, accept_rows, counts


def ref_chain(cand, ridx, coins, final_coins, target, draft, block):
    """Rejection sampling of chains (classic, or block verification); returns like ref_target_only."""
    predicts, accept_rows, counts = {}, [], []
    slots = len(cand[0])
    for b in range(len(cand)):
        p_tok = [target[b][s - 1][cand[b][s]] for s in range(1, slots)]
        q_tok = [draft[b][s - 1][cand[b][s]] for s in range(1, slots)]
        accepted, scale, norm = 0, 1.0, None
        if not block:
            for s in range(1, slots):
                q = q_tok[s - 1]
                if 0 < q <= 1 and coins[b][s - 1] * q < p_tok[s - 1]:
                    accepted += 1
                else:
                    break
        else:
            h, prefix = 1.0, []
            for p, q in zip(p_tok, q_tok):
                h = min(h * p / q, 1.0) if 0 < q <= 1 else 0.0
                prefix.append(h)
            for s in range(slots - 1, 0, -1):
                h, coin = prefix[s - 1], coins[b][s - 1]
                if not coin < h:
                    continue
                mass = None
                accept_prob = h
                if s < slots - 1 and 0 < h < 1:
                    # each term as the GPU's max(x, 0): a NaN term (NaN draft entry) counts as 0
                    mass = sum(h * pt - qt if h * pt - qt > 0 else 0.0 for pt, qt in zip(target[b][s], draft[b][s]))
                    accept_prob = mass / (mass + 1 - h)
                if coin < accept_prob:
                    accepted, scale, norm = s, h, mass
                    break
        for s in range(1, accepted + 1):
            predicts[ridx[b][s - 1]] = cand[b][s]
        if accepted == slots - 1:
            weights = list(target[b][accepted])
        else:
            clean = [q if 0 <= q <= 1 else 0.0 for q in draft[b][accepted]]
            weights = [max(scale * t - q, 0.0) for t, q in zip(target[b][accepted], clean)]
        predicts[ridx[b][accepted]] = ref_first_above(weights, final_coins[b], norm=norm, last_positive=False)
        accept_rows.append(ridx[b][: accepted + 1] + [-1] * (slots - 1 - accepted))
        counts.append(accepted)
    return predicts, accept_rows, counts


def ref_top_k(row, k):
    """Keep every value >= the k-th largest (ties included), renormalise."""
    if k >= len(row):
        keep = row
    else:
        pivot = sorted(row, reverse=True)[k - 1]
        keep = [v if v >= pivot else 0.0 for v in row]
    total = sum(keep)
    return [v / max(total, 1e-8) for v in keep]


def ref_top_p(row, top_p):
    """Keep every value whose strictly larger values sum to < top_p * total, renormalise."""
    total = sum(row)
    if top_p >= 1:
        keep = row
    else:
        keep = [v if sum(w for w in row if w > v) < top_p * total else 0.0 for v in row]
    kept = sum(keep)
    return [v / (kept if kept > 1e-8 else 1.0) for v in keep]


# ---------------------------------------------------------------- random inputs


def random_tree(rng, n, chain):
    """(first_child, next_sibling) of a tree over nodes 0..n-1 whose parents precede them."""
    parent = [-1] + [k - 1 if chain else rng.randrange(k) for k in range(1, n)]
    children = [[k for k in range(n) if parent[k] == i] for i in range(n)]
    first_child = [c[0] if c else -1 for c in children]
    next_sibling = [-1] * n
    for c in children:
        for a, b in zip(c, c[1:]):
            next_sibling[a] = b
    depth = [0] * n
    for k in range(1, n):
        depth[k] = depth[parent[k]] + 1
    return parent, first_child, next_sibling, max(depth) + 1


def random_dist(g, vocab, zeros):
    """A probability row with `zeros` entries exactly 0 (as after top-k), float64."""
    row = torch.softmax(torch.randn(vocab, generator=g, dtype=torch.float64) * 1.5, dim=0)
    if zeros:
        row[torch.randperm(vocab, generator=g)[:zeros]] = 0
    return row / row.sum()


def tree_case(seed, bs, n, vocab, chain):
    """Random verify inputs for `bs` trees of n nodes; draft tokens follow the parent's target row
    half the time (so acceptance happens), else are uniform; retrive_index is a random
    permutation of the flat slots."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    target = torch.stack([torch.stack([random_dist(g, vocab, rng.randrange(3)) for _ in range(n)]) for _ in range(bs)])
    cand = torch.zeros(bs, n, dtype=torch.int64)
    firsts, sibs, depths = [], [], []
    for b in range(bs):
        parent, first_child, next_sibling, depth = random_tree(rng, n, chain)
        firsts.append(first_child), sibs.append(next_sibling), depths.append(depth)
        cand[b, 0] = rng.randrange(vocab)
        for k in range(1, n):
            if rng.random() < 0.5:
                cand[b, k] = int(torch.multinomial(target[b, parent[k]], 1, generator=g))
            else:
                cand[b, k] = rng.randrange(vocab)
    return SimpleNamespace(
        cand=cand,
        ridx=torch.randperm(bs * n, generator=g).view(bs, n),
        first_child=torch.tensor(firsts),
        next_sibling=torch.tensor(sibs),
        depth=max(depths),
        target=target,
        coins=torch.rand(bs, n, generator=g, dtype=torch.float64),
        final_coins=torch.rand(bs, generator=g, dtype=torch.float64),
    )


def run_tree_op(case, draft, depth, thr_single, thr_acc):
    bs, n = case.cand.shape
    predicts = torch.full((bs * n,), SENTINEL, dtype=torch.int32)
    accept_index = torch.full((bs, depth), -1, dtype=torch.int32)
    accept_num = torch.full((bs,), -1, dtype=torch.int32)
    tree_speculative_sampling_target_only(
        predicts,
        accept_index,
        accept_num,
        case.cand,
        case.ridx,
        case.first_child,
        case.next_sibling,
        case.coins,
        case.final_coins,
        case.target,
        draft,
        threshold_single=thr_single,
        threshold_acc=thr_acc,
        deterministic=True,
    )
    return predicts, accept_index, accept_num


def expected_predicts(size, written):
    out = [SENTINEL] * size
    for slot, token in written.items():
        out[slot] = token
    return out


# ---------------------------------------------------------------- tree (target-only) sampling


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("chain", [True, False], ids=["chain", "tree"])
@pytest.mark.parametrize(
    "thresholds", [(1.0, 1.0), (0.5, 0.75), (0.25, 0.5), (0.0, 1.0)], ids=["exact", "s0.5-a0.75", "s0.25-a0.5", "s0-a1"]
)
@pytest.mark.parametrize("draft_kind", ["zeros", "random"])
def test_tree_target_only_matches_reference(seed, chain, thresholds, draft_kind):
    bs, n, vocab = 1 + seed % 4, 3 + seed % 5, 12
    case = tree_case(seed, bs, n, vocab, chain)
    g = torch.Generator().manual_seed(100 + seed)
    if draft_kind == "zeros":
        draft = torch.zeros_like(case.target)
    else:
        draft = torch.rand(case.target.shape, generator=g, dtype=torch.float64) * 0.2
    # a cap below the tree's depth (seed 0, 3) stops acceptance early
    depth = case.depth if seed % 3 else max(1, case.depth - 1)
    ref_draft = draft.tolist()
    ref_pred, ref_accept, ref_counts = ref_target_only(
        case.cand.tolist(),
        case.ridx.tolist(),
        case.first_child.tolist(),
        case.next_sibling.tolist(),
        case.coins.tolist(),
        case.final_coins.tolist(),
        case.target.tolist(),
        ref_draft,
        depth,
        *thresholds,
    )
    predicts, accept_index, accept_num = run_tree_op(case, draft, depth, *thresholds)
    assert accept_num.tolist() == ref_counts
    assert accept_index.tolist() == ref_accept
    assert predicts.tolist() == expected_predicts(bs * n, ref_pred)
    assert draft.tolist() == ref_draft  # rejected drafts' entries now hold their target probability


def test_tree_target_only_accepts_sibling_by_cumulative_mass():
    """Hand case: siblings with target mass 0.25, 0.0, 0.5 under the root; coin 0.6 rejects the
    first (0.6 >= 0.25), skips the massless one, accepts the third (0.6 < 0.75); the bonus is
    drawn from the third's row."""
    vocab = 4
    target = torch.zeros(1, 4, vocab, dtype=torch.float64)
    target[0, 0] = torch.tensor([0.25, 0.0, 0.5, 0.25], dtype=torch.float64)
    target[0, 3] = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    case = SimpleNamespace(
        cand=torch.tensor([[3, 0, 1, 2]]),
        ridx=torch.tensor([[0, 1, 2, 3]]),
        first_child=torch.tensor([[1, -1, -1, -1]]),
        next_sibling=torch.tensor([[-1, 2, 3, -1]]),
        coins=torch.tensor([[0.6, 0.0, 0.0, 0.0]], dtype=torch.float64),
        final_coins=torch.tensor([0.5], dtype=torch.float64),
        target=target,
    )
    draft = torch.zeros_like(target)
    predicts, accept_index, accept_num = run_tree_op(case, draft, depth=2, thr_single=1.0, thr_acc=1.0)
    assert accept_num.tolist() == [1] and accept_index.tolist() == [[0, 3]]
    assert predicts.tolist() == [2, SENTINEL, SENTINEL, 3]
    assert draft[0, 0].tolist() == [0.25, 0.0, 0.0, 0.0]


def test_tree_target_only_rejects_all_and_samples_the_residual():
    """Coin above every sibling's cumulative mass: nothing accepted; the bonus comes from the root
    row with the rejected tokens removed (mass 0.5 left on tokens 2 and 3)."""
    target = torch.tensor([[[0.3, 0.2, 0.4, 0.1], [0.25] * 4, [0.25] * 4]], dtype=torch.float64)
    case = SimpleNamespace(
        cand=torch.tensor([[3, 0, 1]]),
        ridx=torch.tensor([[0, 1, 2]]),
        first_child=torch.tensor([[1, -1, -1]]),
        next_sibling=torch.tensor([[-1, 2, -1]]),
        coins=torch.tensor([[0.9, 0.0, 0.0]], dtype=torch.float64),
        target=target,
    )
    for final_coin, token in ((0.7, 2), (0.85, 3)):  # residual [0, 0, 0.4, 0.1]: u = 0.35 -> 2, u = 0.425 -> 3
        case.final_coins = torch.tensor([final_coin], dtype=torch.float64)
        predicts, _, accept_num = run_tree_op(case, torch.zeros_like(target), depth=2, thr_single=1.0, thr_acc=1.0)
        assert accept_num.tolist() == [0] and predicts.tolist()[0] == token


def test_tree_target_only_runs_in_float32_like_the_kernel():
    case = tree_case(7, 4, 6, 10, chain=False)
    draft = torch.zeros_like(case.target)
    out64 = run_tree_op(case, draft.clone(), case.depth, 1.0, 1.0)
    case.target, case.coins, case.final_coins = case.target.float(), case.coins.float(), case.final_coins.float()
    out32 = run_tree_op(case, draft.float(), case.depth, 1.0, 1.0)
    assert all(torch.equal(a, b) for a, b in zip(out64, out32))


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(threshold_acc=1.5), "threshold_acc"),
        (dict(threshold_single=-0.1), "threshold_single"),
        (dict(uniform_samples=torch.rand(2, 5)), "uniform_samples"),
        (dict(draft_probs=torch.zeros(2, 3, 7)), "draft_probs"),
        (dict(predicts=torch.zeros(5, dtype=torch.int32)), "predicts"),
        (dict(candidates=torch.zeros(2, 3)), "candidates"),
    ],
)
def test_verify_ops_name_the_bad_argument(change, message):
    bs, n, vocab = 2, 3, 8
    args = dict(
        predicts=torch.zeros(bs * n, dtype=torch.int32),
        accept_index=torch.zeros(bs, n, dtype=torch.int32),
        accept_token_num=torch.zeros(bs, dtype=torch.int32),
        candidates=torch.zeros(bs, n, dtype=torch.int64),
        retrive_index=torch.arange(bs * n).view(bs, n),
        retrive_next_token=torch.full((bs, n), -1),
        retrive_next_sibling=torch.full((bs, n), -1),
        uniform_samples=torch.rand(bs, n),
        uniform_samples_for_final_sampling=torch.rand(bs),
        target_probs=torch.rand(bs, n, vocab),
        draft_probs=torch.zeros(bs, n, vocab),
        threshold_single=1.0,
        threshold_acc=1.0,
        deterministic=True,
    )
    args.update(change)
    for op in (tree_speculative_sampling_target_only, chain_speculative_sampling_triton):
        with pytest.raises(ValueError, match=message):
            op(**args)


# ---------------------------------------------------------------- chain rejection sampling


def chain_case(seed, bs, slots, vocab, draft_rows):
    """Chains whose drafts are drawn from their draft rows (sometimes uniformly, so q can be 0);
    some draft rows hold a value outside [0, 1] or NaN."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)

    def rows(count):
        return torch.tensor(
            [[random_dist(g, vocab, rng.randrange(3)).tolist() for _ in range(count)] for _ in range(bs)]
        )

    target = rows(slots).double()
    draft = rows(draft_rows).view(bs, draft_rows, vocab).double()
    cand = torch.randint(0, vocab, (bs, slots), generator=g)
    for b in range(bs):
        for s in range(1, slots):
            if rng.random() < 0.8:
                cand[b, s] = int(torch.multinomial(draft[b, s - 1], 1, generator=g))
    for b in range(bs):  # now and then an entry that is no probability: the kernel's guards
        if draft_rows and rng.random() < 0.4:
            draft[b, rng.randrange(draft_rows), rng.randrange(vocab)] = rng.choice([-0.1, 1.5, float("nan")])
    return SimpleNamespace(
        cand=cand,
        ridx=torch.randperm(bs * slots, generator=g).view(bs, slots),
        target=target,
        draft=draft,
        coins=torch.rand(bs, slots, generator=g, dtype=torch.float64),
        final_coins=torch.rand(bs, generator=g, dtype=torch.float64),
    )


def run_chain_op(case, block):
    bs, slots = case.cand.shape
    predicts = torch.full((bs * slots,), SENTINEL, dtype=torch.int32)
    accept_index = torch.full((bs, slots), -1, dtype=torch.int32)
    accept_num = torch.full((bs,), -1, dtype=torch.int32)
    nothing = torch.full((bs, slots), -1)
    chain_speculative_sampling_triton(
        predicts,
        accept_index,
        accept_num,
        case.cand,
        case.ridx,
        nothing,
        nothing,
        case.coins,
        case.final_coins,
        case.target,
        case.draft,
        1.0,
        1.0,
        True,
        block_verification=block,
    )
    return predicts, accept_index, accept_num


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("block", [False, True], ids=["classic", "block"])
@pytest.mark.parametrize("draft_rows", ["steps", "slots"])
def test_chain_sampling_matches_reference(seed, block, draft_rows):
    bs, slots, vocab = 1 + seed % 4, 1 + seed % 5, 10
    case = chain_case(seed, bs, slots, vocab, slots - 1 if draft_rows == "steps" else slots)
    ref_pred, ref_accept, ref_counts = ref_chain(
        case.cand.tolist(),
        case.ridx.tolist(),
        case.coins.tolist(),
        case.final_coins.tolist(),
        case.target.tolist(),
        case.draft.tolist(),
        block,
    )
    predicts, accept_index, accept_num = run_chain_op(case, block)
    assert accept_num.tolist() == ref_counts
    assert accept_index.tolist() == ref_accept
    assert predicts.tolist() == expected_predicts(bs * slots, ref_pred)


def test_final_draw_past_the_total_falls_back_like_each_kernel():
    """A final coin of 1 puts u at the residual's total, so no prefix sum exceeds it: the tree
    kernel (FlashInfer's sampler) takes the last token of positive mass, the Triton chain
    sampler the last vocabulary index."""
    target = torch.tensor([[[0.5, 0.25, 0.25, 0.0], [0.25] * 4]], dtype=torch.float64)
    coins = torch.tensor([[0.9, 0.9]], dtype=torch.float64)  # the draft (token 0) is rejected
    final = torch.tensor([1.0], dtype=torch.float64)
    tree = SimpleNamespace(
        cand=torch.tensor([[1, 0]]),
        ridx=torch.tensor([[0, 1]]),
        first_child=torch.tensor([[1, -1]]),
        next_sibling=torch.tensor([[-1, -1]]),
        coins=coins,
        final_coins=final,
        target=target,
    )
    predicts, _, accept_num = run_tree_op(tree, torch.zeros_like(target), depth=2, thr_single=1.0, thr_acc=1.0)
    assert accept_num.tolist() == [0] and predicts.tolist() == [2, SENTINEL]
    chain = SimpleNamespace(
        cand=torch.tensor([[1, 0]]),
        ridx=torch.tensor([[0, 1]]),
        target=target,
        coins=coins,
        final_coins=final,
        draft=torch.tensor([[[1.0, 0.0, 0.0, 0.0]]], dtype=torch.float64),
    )
    predicts, _, accept_num = run_chain_op(chain, block=False)
    assert accept_num.tolist() == [0] and predicts.tolist() == [3, SENTINEL]


def test_block_verification_reuses_the_raw_residual_mass_as_normaliser():
    """Block verification normalises the final draw by the residual mass it computed for the
    acceptance test from the raw draft row (a NaN term counting 0), while the draw itself treats
    a draft value outside [0, 1] or NaN as 0. Here draft 1 (h = 0.5 / 0.9) is accepted, draft 2
    rejected; draft row 1 holds NaN at token 2 and -0.5 at token 3, so the normaliser (0.678)
    exceeds the residual's total (0.317): a final coin of 0.5 runs past every prefix sum to the
    last index, one of 0.1 lands on token 2."""
    target = torch.tensor([[[0.5, 0.5, 0.0, 0.0], [0.25] * 4, [0.25] * 4]], dtype=torch.float64)
    draft = torch.tensor([[[0.1, 0.9, 0.0, 0.0], [0.9, 0.1, float("nan"), -0.5]]], dtype=torch.float64)
    case = SimpleNamespace(
        cand=torch.tensor([[2, 1, 0]]),
        ridx=torch.tensor([[0, 1, 2]]),
        target=target,
        draft=draft,
        coins=torch.tensor([[0.1, 0.9, 0.0]], dtype=torch.float64),
    )
    for final_coin, token in ((0.5, 3), (0.1, 2)):
        case.final_coins = torch.tensor([final_coin], dtype=torch.float64)
        predicts, accept_index, accept_num = run_chain_op(case, block=True)
        assert accept_num.tolist() == [1] and accept_index.tolist() == [[0, 1, -1]]
        assert predicts.tolist() == [1, token, SENTINEL]


def test_block_verification_accepts_more_than_classic():
    """Over many chains block verification's accepted length is at least as long on average
    (the point of arXiv 2403.10444), and differs somewhere: the two modes really differ."""
    case = chain_case(11, 400, 5, 8, 4)
    classic = run_chain_op(case, block=False)[2].double()
    block = run_chain_op(case, block=True)[2].double()
    assert block.mean() >= classic.mean() and not torch.equal(block, classic)


# ---------------------------------------------------------------- renorm ops


@pytest.mark.parametrize("seed", SEEDS)
def test_top_k_renorm_matches_reference(seed):
    g = torch.Generator().manual_seed(seed)
    bs, vocab = 5, 16
    # values on a coarse grid so rows have ties, including at the k-th value
    probs = torch.randint(0, 6, (bs, vocab), generator=g).double()
    probs[0] = 0
    probs[0, :3] = 1.0
    probs = probs / probs.sum(dim=1, keepdim=True).clamp(min=1)
    ks = torch.tensor([1, 3, 5, vocab, 1 << 30], dtype=torch.int32)[torch.randperm(bs, generator=g)]
    out = top_k_renorm_prob(probs, ks)
    expected = [ref_top_k(row, k) for row, k in zip(probs.tolist(), ks.tolist())]
    torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-15)
    assert ((out > 0).sum(dim=1) >= torch.minimum(ks.long(), (probs > 0).sum(dim=1))).all()
    assert torch.equal(top_k_renorm_prob(probs, 3), top_k_renorm_prob(probs, torch.full((bs,), 3)))


@pytest.mark.parametrize("seed", SEEDS)
def test_top_p_renorm_matches_reference(seed):
    g = torch.Generator().manual_seed(seed)
    bs, vocab = 6, 16
    probs = torch.randint(0, 6, (bs, vocab), generator=g).double()
    probs += torch.rand(bs, vocab, generator=g).double() * (seed % 2)  # odd seeds: no ties
    probs = probs / probs.sum(dim=1, keepdim=True)
    top_ps = torch.tensor([0.05, 0.3, 0.5, 0.77, 0.95, 1.0], dtype=torch.float64)[torch.randperm(bs, generator=g)]
    out = top_p_renorm_prob(probs, top_ps)
    expected = [ref_top_p(row, p) for row, p in zip(probs.tolist(), top_ps.tolist())]
    torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-15)


def test_top_p_keeps_every_tie_at_the_pivot():
    """[0.4, 0.2, 0.2, 0.2], top_p 0.5: 0.4 is not enough, so the pivot is 0.2 and all three ties stay."""
    probs = torch.tensor([[0.4, 0.2, 0.2, 0.2], [0.4, 0.3, 0.2, 0.1]], dtype=torch.float64)
    out = top_p_renorm_prob(probs, 0.5)
    torch.testing.assert_close(out[0], probs[0])
    torch.testing.assert_close(out[1], torch.tensor([4 / 7, 3 / 7, 0.0, 0.0], dtype=torch.float64))


def test_renorm_ops_keep_dtype_and_refuse_bad_values():
    probs = torch.softmax(torch.randn(3, 9), dim=1).to(torch.bfloat16)
    assert top_k_renorm_prob(probs, 2).dtype == torch.bfloat16 and top_p_renorm_prob(probs, 0.5).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="top_k"):
        top_k_renorm_prob(probs, torch.tensor([1, 0, 2]))
    with pytest.raises(ValueError, match="top_k"):
        top_k_renorm_prob(probs, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="top_p"):
        top_p_renorm_prob(probs, 0.0)
    with pytest.raises(ValueError, match="probs"):
        top_p_renorm_prob(probs[0], 0.5)


def test_murmur_hash32_known_values():
    """Values SGLang's own CPU test pins for sgl_kernel's murmur_hash32_cpu (test_murmur_hash32_cpu_known_values)."""
    seed = torch.tensor([0, 1, 42, 0x123456789ABCDEF0], dtype=torch.uint64)
    expected = [
        [2167721464, 10027521, 2423355346, 2203067026],
        [3755322398, 4196701286, 1002451629, 183234019],
        [772287619, 548237471, 2740678348, 3656549299],
        [3746406971, 2891010872, 104055988, 3372550890],
    ]
    for dtype in (torch.int64, torch.uint64):
        out = murmur_hash32(seed, torch.tensor([0, 7, 123, 456], dtype=dtype), torch.tensor([0, 1, 2, 17]))
        assert out.dtype == torch.uint32 and out.tolist() == expected
    with pytest.raises(ValueError, match="seed"):
        murmur_hash32(seed.long(), torch.tensor([0, 7, 123, 456]), torch.tensor([0]))


# ---------------------------------------------------------------- output distribution

DRAWS = 20_000
# Total-variation bound for DRAWS draws over 6 tokens: a correct rule's expected empirical TV
# is <= 0.5 * sqrt(6 / DRAWS) ~ 0.0087 and its standard deviation is about a quarter of that,
# so 0.02 is > 4 standard deviations above it; the negative controls sit near 0.1 or higher.
TV_BOUND = 0.02
FIRST_ROW = torch.tensor([0.3, 0.15, 0.05, 0.25, 0.2, 0.05], dtype=torch.float64)


def total_variation(tokens, dist):
    freq = torch.bincount(tokens.long(), minlength=dist.numel()).double() / tokens.numel()
    return 0.5 * float((freq - dist).abs().sum())


def root_with_three_drafts(seed):
    """DRAWS copies of a root with children drafting tokens 0, 3, 4 (mass 0.75), random coins."""
    g = torch.Generator().manual_seed(seed)
    n, vocab = 4, FIRST_ROW.numel()
    target = torch.full((DRAWS, n, vocab), 1 / vocab, dtype=torch.float64)
    target[:, 0] = FIRST_ROW
    return SimpleNamespace(
        cand=torch.tensor([0, 0, 3, 4]).repeat(DRAWS, 1),
        ridx=torch.arange(DRAWS * n).view(DRAWS, n),
        first_child=torch.tensor([1, -1, -1, -1]).repeat(DRAWS, 1),
        next_sibling=torch.tensor([-1, 2, 3, -1]).repeat(DRAWS, 1),
        target=target,
        coins=torch.rand(DRAWS, n, generator=g, dtype=torch.float64),
        final_coins=torch.rand(DRAWS, generator=g, dtype=torch.float64),
    )


def test_target_only_first_token_is_distributed_as_the_target():
    case = root_with_three_drafts(0)
    predicts, _, _ = run_tree_op(case, torch.zeros_like(case.target), depth=2, thr_single=1.0, thr_acc=1.0)
    first = predicts.view(DRAWS, 4)[:, 0]
    assert total_variation(first, FIRST_ROW) < TV_BOUND

    # negative control: the same walk, but the bonus drawn from the whole target row instead of the
    # residual (rejected drafts not excluded): drafted tokens are over-weighted, TV = 0.1875
    mass = torch.cumsum(FIRST_ROW[[0, 3, 4]], 0)
    accepted = (case.coins[:, :1] < mass).int().argmax(dim=1)
    some = case.coins[:, 0] < mass[-1]
    wrong_bonus = torch.searchsorted(torch.cumsum(FIRST_ROW, 0), case.final_coins, right=True).clamp(max=5)
    wrong = torch.where(some, torch.tensor([0, 3, 4])[accepted], wrong_bonus)
    assert total_variation(wrong, FIRST_ROW) > TV_BOUND


@pytest.mark.parametrize("block", [False, True], ids=["classic", "block"])
def test_chain_first_token_is_distributed_as_the_target(block):
    g = torch.Generator().manual_seed(1)
    vocab, slots = FIRST_ROW.numel(), 3
    draft_rows = torch.tensor([[0.05, 0.4, 0.05, 0.1, 0.3, 0.1], [0.2, 0.2, 0.2, 0.1, 0.1, 0.2]], dtype=torch.float64)
    target_rows = torch.stack([FIRST_ROW, torch.full((vocab,), 1 / vocab, dtype=torch.float64), FIRST_ROW.flip(0)])
    cand = torch.zeros(DRAWS, slots, dtype=torch.int64)
    cand[:, 1] = torch.multinomial(draft_rows[0], DRAWS, replacement=True, generator=g)
    cand[:, 2] = torch.multinomial(draft_rows[1], DRAWS, replacement=True, generator=g)
    case = SimpleNamespace(
        cand=cand,
        ridx=torch.arange(DRAWS * slots).view(DRAWS, slots),
        target=target_rows.expand(DRAWS, -1, -1),
        draft=draft_rows.expand(DRAWS, -1, -1),
        coins=torch.rand(DRAWS, slots, generator=g, dtype=torch.float64),
        final_coins=torch.rand(DRAWS, generator=g, dtype=torch.float64),
    )
    predicts, _, _ = run_chain_op(case, block)
    first = predicts.view(DRAWS, slots)[:, 0]
    assert total_variation(first, FIRST_ROW) < TV_BOUND

    # negative control: rejection draws the bonus from the target row, not from relu(p - q)
    keep = case.coins[:, 0] * draft_rows[0, cand[:, 1]] < FIRST_ROW[cand[:, 1]]
    wrong_bonus = torch.searchsorted(torch.cumsum(FIRST_ROW, 0), case.final_coins, right=True).clamp(max=vocab - 1)
    assert total_variation(torch.where(keep, cand[:, 1], wrong_bonus), FIRST_ROW) > TV_BOUND


# ---------------------------------------------------------------- SGLang's eagle_sample on CPU


@pytest.fixture(scope="module")
def sglang_verify():
    """SGLang's eagle_utils with the patch installed and its hooks applied, inside a runtime
    context of SGLang's own (dummy model path, single TP rank) that the test's overrides change."""
    import sglang_cpu

    sglang_cpu.enable()  # the sgl_kernel stand-in: seeded coins call its murmur_hash32_cpu
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.runtime_context import create_context, get_parallel, use_context
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative import eagle_utils

    from sglang_cpu import sampling_patch

    line = sampling_patch.install()
    assert sampling_patch.install() == line and "AROUND" in line
    HookRegistry.apply_hooks()
    single_rank = SimpleNamespace(world_size=1)
    with use_context(create_context(ServerArgs(model_path="dummy", device="cpu"), role="test")):
        with get_parallel().override(tp_group=single_rank, attn_tp_group=single_rank):
            yield eagle_utils


def sglang_batch(bs, vocab, temperature, top_k, top_p):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    info = SamplingBatchInfo(
        temperatures=torch.full((bs, 1), temperature),
        top_ps=torch.full((bs,), top_p),
        top_ks=torch.full((bs,), top_k, dtype=torch.int32),
        min_ps=torch.zeros(bs),
        is_all_greedy=False,
        is_any_greedy=False,
        need_top_p_sampling=top_p < 1,
        need_top_k_sampling=top_k < vocab,
        need_min_p_sampling=False,
        vocab_size=vocab,
        device="cpu",
        sampling_seed=torch.arange(bs) + 17,
    )
    seq_lens = torch.arange(bs) * 3 + 5
    return SimpleNamespace(
        forward_mode=ForwardMode.TARGET_VERIFY,
        seq_lens=seq_lens,
        sampling_info=info,
        device="cpu",
        return_logprob=False,
    )


def reference_probs(logits, temperature, top_k, top_p):
    probs = torch.softmax(logits.double() / temperature, dim=-1).tolist()
    return [ref_top_p(ref_top_k(row, top_k), top_p) for row in probs]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(
    "mode, thresholds",
    [("target_only", (1.0, 1.0)), ("target_only", (0.5, 0.75)), ("rejection", (1.0, 1.0)), ("block", (1.0, 1.0))],
)
def test_eagle_sample_samples_on_cpu(sglang_verify, seed, mode, thresholds):
    """eagle_sample on a PARSE chain view, seeded coins (SGLang's murmur stream) and top-k/top-p:
    its tokens and accept lengths equal the float64 reference's, and differ from greedy
    verification's somewhere (the argmax path was not taken)."""
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.runtime_context import get_spec

    from parse_sglang.attention.window import ShapeConstants

    eagle_utils = sglang_verify
    bs, width, vocab, temperature, top_k, top_p = 6, 4, 12, 0.9, 8, 0.9
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(bs * width, vocab, generator=g) * 1.5
    chain = torch.randint(0, vocab, (bs, width), generator=g)
    probs = reference_probs(logits, temperature, top_k, top_p)
    for b in range(bs):  # half the drafts from the target, so acceptance and rejection both happen
        for s in range(1, width):
            if (b + s) % 2:
                chain[b, s] = int(torch.multinomial(torch.tensor(probs[b * width + s - 1]), 1, generator=g))
    view = ShapeConstants("cpu").chain_view(chain)
    if mode != "target_only":
        view.draft_probs = torch.softmax(torch.randn(bs, width - 1, vocab, generator=g), dim=-1)
        view.draft_probs.scatter_(2, chain[:, 1:, None], 0.3)
    batch = sglang_batch(bs, vocab, temperature, top_k, top_p)
    coins, final_coins = eagle_utils._seeded_verify_coins(
        sampling_seed=batch.sampling_info.sampling_seed, seq_lens=batch.seq_lens, draft_token_num=width, device="cpu"
    )
    settings = dict(
        speculative_accept_threshold_single=thresholds[0],
        speculative_accept_threshold_acc=thresholds[1],
        speculative_use_rejection_sampling=mode != "target_only",
        speculative_use_block_verification=mode == "block",
    )
    with get_spec().override(**settings):
        predict, accept_lens, accept_index = eagle_utils.eagle_sample(
            view, batch, LogitsProcessorOutput(next_token_logits=logits.clone())
        )

    rows = [[probs[b * width + s] for s in range(width)] for b in range(bs)]
    ridx = view.retrieve_index.tolist()
    if mode == "target_only":
        ref_pred, ref_accept, ref_counts = ref_target_only(
            chain.tolist(),
            ridx,
            view.retrieve_next_token.tolist(),
            view.retrieve_next_sibling.tolist(),
            coins.double().tolist(),
            final_coins.double().tolist(),
            rows,
            [[[0.0] * vocab for _ in range(width)] for _ in range(bs)],
            width,
            *thresholds,
        )
    else:
        ref_pred, ref_accept, ref_counts = ref_chain(
            chain.tolist(),
            ridx,
            coins.double().tolist(),
            final_coins.double().tolist(),
            rows,
            view.draft_probs.double().tolist(),
            block=mode == "block",
        )
    assert accept_lens.tolist() == [c + 1 for c in ref_counts]
    assert accept_index.tolist() == ref_accept
    for slot, token in ref_pred.items():
        assert int(predict[slot]) == token

    greedy = logits.argmax(dim=-1).view(bs, width)
    greedy_lens = (greedy[:, :-1] == chain[:, 1:]).int().cumprod(dim=1).sum(dim=1) + 1
    emitted = predict.view(bs, width).gather(1, (accept_lens - 1).long()[:, None]).squeeze(1)
    greedy_emitted = greedy.gather(1, (greedy_lens - 1)[:, None]).squeeze(1)
    assert not (torch.equal(accept_lens.long(), greedy_lens) and torch.equal(emitted.long(), greedy_emitted))


def test_patch_pins_sglang_and_matches_its_op_signatures(sglang_verify):
    """HOOKED_SIGNATURES hold for the installed SGLang, the torch ops take the GPU ops' parameters
    (names, kinds, defaults), and install() bound them in eagle_utils."""
    from sglang_cpu import sampling_patch
    from parse_sglang.plugin import check_signatures

    check_signatures(sampling_patch.HOOKED_SIGNATURES)

    def parameters(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    for ours in (tree_speculative_sampling_target_only, chain_speculative_sampling_triton):
        dotted = next(name for name in sampling_patch.HOOKED_SIGNATURES if name.endswith("." + ours.__name__))
        assert parameters(ours) == parameters(pkgutil.resolve_name(dotted))
    for name, fn in sampling_patch.OPS.items():
        assert getattr(sglang_verify, name) is fn


def test_install_is_inert_outside_the_cpu_runtime(monkeypatch):
    from sglang_cpu import sampling_patch

    monkeypatch.delenv("SGLANG_USE_CPU_ENGINE", raising=False)
    assert sampling_patch.install().startswith("CPU sampling verification: not installed")
