"""Unit tests of the torch `sgl_kernel` CPU ops (sglang_cpu.*_ops).

Each op is compared with a plain-Python reference that follows, line for line, the Triton
kernel SGLang 0.5.23 runs on GPUs for the same call (sglang/srt/mem_cache/allocation.py,
sglang/kernels/ops/kvcache/cache_move.py, sglang/kernels/ops/speculative/*.py), on random
inputs covering ragged batches, empty spans, trees with siblings and unmatched parents.
"""

from __future__ import annotations

import random

import pytest
import torch

from sglang_cpu.cache_ops import (
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    copy_all_layer_kv_cache_cpu,
)
from sglang_cpu.spec_ops import fill_accept_out_cache_loc_cpu, fill_bonus_tokens_cpu, rotate_input_ids_cpu
from sglang_cpu.tree_ops import (
    FULL_MASK,
    QLEN_ONLY,
    QLEN_ONLY_BITPACKING,
    build_tree_kernel_efficient_cpu,
    reconstruct_indices_from_tree_mask,
    verify_tree_greedy_cpu,
)

SEEDS = range(5)


def _spans(rng, bs, pool_len):
    starts = [rng.randint(0, pool_len // 2) for _ in range(bs)]
    ends = [s + rng.randint(0, pool_len // 2) for s in starts]
    ends[0] = starts[0]  # one empty span
    return torch.tensor(starts), torch.tensor(ends)


@pytest.mark.parametrize("seed", SEEDS)
def test_assign_req_to_token_pool_scatters_spans(seed):
    rng = random.Random(seed)
    bs, pool_len = 4, 16
    table = torch.randint(0, 1000, (6, pool_len), dtype=torch.int32)
    rows = torch.tensor(rng.sample(range(6), bs))
    start, end = _spans(rng, bs, pool_len)
    locs = torch.randint(0, 1000, (int((end - start).sum()) + 3,), dtype=torch.int64)
    expected = table.clone()
    offset = 0
    for i in range(bs):
        for j in range(int(start[i]), int(end[i])):
            expected[rows[i], j] = int(locs[offset])
            offset += 1
    assign_req_to_token_pool_cpu(rows, table, start, end, locs, pool_len)
    assert torch.equal(table, expected)


@pytest.mark.parametrize("seed", SEEDS)
def test_assign_extend_cache_locs_gathers_spans(seed):
    rng = random.Random(seed)
    bs, pool_len = 4, 16
    table = torch.randint(0, 1000, (6, pool_len), dtype=torch.int32)
    rows = torch.tensor(rng.sample(range(6), bs))
    start, end = _spans(rng, bs, pool_len)
    out = torch.full((int((end - start).sum()) + 2,), -7, dtype=torch.int64)
    expected = out.clone()
    offset = 0
    for i in range(bs):
        for j in range(int(start[i]), int(end[i])):
            expected[offset] = int(table[rows[i], j])
            offset += 1
    assign_extend_cache_locs_cpu(rows, table, start, end, out, pool_len)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("topk,steps", [(1, 3), (2, 2), (4, 1)])
def test_assign_draft_cache_locs_contiguous(topk, steps):
    pool_len = 20
    table = torch.arange(5 * pool_len, dtype=torch.int32).view(5, pool_len) * 3
    rows = torch.tensor([3, 0, 4])
    seq = torch.tensor([2, 7, 0])
    out = torch.full((3 * topk * steps,), -1, dtype=torch.int64)
    assign_draft_cache_locs_contiguous_cpu(rows, table, seq, out, pool_len, topk, steps)
    width = topk * steps
    for i in range(3):
        want = table[rows[i], seq[i] : seq[i] + width].long()
        assert torch.equal(out[i * width : (i + 1) * width], want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_copy_all_layer_kv_cache_moves_rows_in_every_buffer(dtype):
    buffers = [torch.randn(12, 2, 4).to(dtype) for _ in range(3)]
    before = [b.clone() for b in buffers]
    ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64)
    strides = torch.tensor([b[0].numel() * b.element_size() for b in buffers], dtype=torch.int64)
    tgt = torch.tensor([1, 5, 9, 3])
    src = torch.tensor([5, 1, 0, 9])  # overlapping: 1<->5 swap, 9 both read and written
    copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    for b, old in zip(buffers, before):
        want = old.clone()
        want[tgt] = old[src]
        assert torch.equal(b, want)


def test_copy_all_layer_kv_cache_empty_is_noop():
    buf = torch.randn(4, 3)
    old = buf.clone()
    nothing = torch.empty(0, dtype=torch.int64)
    copy_all_layer_kv_cache_cpu(torch.tensor([buf.data_ptr()]), torch.tensor([12]), nothing, nothing)
    assert torch.equal(buf, old)


def test_fill_accept_out_cache_loc_compacts_accepted():
    accept_index = torch.tensor([[0, 2, -1], [3, -1, -1], [6, 7, 8]])
    out_cache_loc = torch.arange(100, 109)
    out = torch.full((9,), -5, dtype=torch.int64)
    fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, out)
    assert out.tolist() == [100, 102, 103, 106, 107, 108, -5, -5, -5]


def test_fill_bonus_tokens_picks_last_accepted():
    accept_tokens = torch.tensor([[10, 11, 12], [20, 21, 22], [30, 31, 32]])
    accept_lens = torch.tensor([2, 1, 3])
    bonus = torch.zeros(3, dtype=torch.int64)
    fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus, 3)
    assert bonus.tolist() == [11, 20, 32]


@pytest.mark.parametrize("with_select", [False, True])
def test_rotate_input_ids(with_select):
    ids = torch.arange(10, 20)
    starts = torch.tensor([0, 4, 4, 7])
    lens = torch.tensor([4, 0, 3, 3])
    new = torch.tensor([90, 91, 92, 93])
    select = torch.tensor([1, 0, 5, 9]) if with_select else None
    expected = ids.clone()
    for s, n, tok, i in zip(starts.tolist(), lens.tolist(), new.tolist(), range(4)):
        for j in range(n - 1):
            expected[s + j] = ids[s + j + 1]
        if n > 0:
            expected[select[i] if with_select else s + n - 1] = tok
    rotate_input_ids_cpu(ids, starts, lens, new, select)
    assert torch.equal(ids, expected)


# ---------------------------------------------------------------- trees


def _random_parents(rng, n):
    """parent[i] < i for i >= 1, node 0 the root."""
    return [-1] + [rng.randrange(0, i) for i in range(1, n)]


def _ancestor_mask(parents):
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask


def _reconstruct_reference(mask, seq_lens, n):
    bs = len(seq_lens)
    pos, idx, nxt, sib = ([[0] * n for _ in range(bs)] for _ in range(4))
    for b in range(bs):
        m = mask[b]
        anc = [[bool(m[i, j]) and j < i for j in range(n)] for i in range(n)]
        parent = [max([j for j in range(n) if anc[i][j]], default=-1) for i in range(n)]
        for t in range(n):
            pos[b][t] = sum(anc[t]) + seq_lens[b]
            idx[b][t] = b * n + t
            nxt[b][t] = min([k for k in range(n) if anc[k][t]], default=-1)
            sibs = [k for k in range(t + 1, n) if parent[k] == parent[t]]
            sib[b][t] = sibs[0] if parent[t] >= 0 and sibs else -1
    return pos, idx, nxt, sib


@pytest.mark.parametrize("seed", SEEDS)
def test_reconstruct_indices_from_tree_mask(seed):
    rng = random.Random(seed)
    bs, n = 3, 7
    mask = torch.stack([_ancestor_mask(_random_parents(rng, n)) for _ in range(bs)])
    seq = torch.tensor([rng.randint(1, 30) for _ in range(bs)])
    outs = [torch.full((bs * n,), -9, dtype=torch.int64) for _ in range(4)]
    reconstruct_indices_from_tree_mask(mask.flatten(), seq, *outs, bs, n)
    want = _reconstruct_reference(mask, seq.tolist(), n)
    for got, ref in zip(outs, want):
        assert got.view(bs, n).tolist() == ref


def _build_tree_reference(parent_list, selected, seq_lens, topk, depth, n, mode):
    """Python port of sgl_build_tree_kernel_efficient_triton (one program per request)."""
    bs = len(seq_lens)
    prefix = [sum(seq_lens[:b]) for b in range(bs)]
    size = sum(seq_lens) * n + n * n * bs if mode == FULL_MASK else n * n * bs
    mask = [True] * size
    positions = [0] * (bs * n)
    r_idx, r_next, r_sib = ([[-1] * n for _ in range(bs)] for _ in range(3))
    for b in range(bs):
        sel, par, seq = selected[b], parent_list[b], seq_lens[b]
        positions[b * n] = seq
        for i in range(n - 1, 0, -1):
            r_idx[b][i] = b * n + i
            ptb = sel[i - 1] // topk
            found, ppos = 0, 0
            if ptb == 0:
                found = 1
            else:
                ptok = par[ptb]
                for pp in range(n - 1):
                    if found == 0 and sel[pp] == ptok:
                        ppos, found = pp + 1, 1
            if found:
                old = r_next[b][ppos]
                r_next[b][ppos] = i
                if old != -1:
                    r_sib[b][i] = old
        r_idx[b][0] = b * n
        for x in range(n):
            if mode == FULL_MASK:
                base = n * n * b + prefix[b] * n + (seq + n) * x + seq + 1
            else:
                base = n * n * b + n * x + 1
            mask[base - 1] = True
            for i in range(n - 1):
                mask[base + i] = False
            if x > 0:
                cur, position, go = x - 1, 0, True
                for _ in range(depth):
                    if go:
                        position += 1
                        mask[base + cur] = True
                        ptb = sel[cur] // topk
                        if ptb == 0:
                            go = False
                        else:
                            ptok, found = par[ptb], False
                            for cp in range(n - 1):
                                if not found and sel[cp] == ptok:
                                    cur, found = cp, True
                            if not found:
                                go = False
                positions[b * n + x] = position + seq
    return mask, positions, r_idx, r_next, r_sib


@pytest.mark.parametrize("mode", [FULL_MASK, QLEN_ONLY])
@pytest.mark.parametrize("topk,depth,seed", [(1, 3, 0), (2, 3, 1), (4, 4, 2), (3, 2, 3)])
def test_build_tree_kernel_efficient(mode, topk, depth, seed):
    rng = random.Random(seed)
    bs = 3
    n = 1 + (topk * depth if topk == 1 else min(topk * depth, 6))
    num_candidates = topk + (depth - 1) * topk * topk
    selected = [sorted(rng.sample(range(num_candidates), n - 1)) for _ in range(bs)]
    width = 1 + (depth - 1) * topk
    # parent entries: mostly real candidates (found), some values never selected (not found)
    parent_list = [[rng.choice(selected[b] + [num_candidates + 5]) for _ in range(width)] for b in range(bs)]
    seq = [rng.randint(1, 9) for _ in range(bs)]
    reference = _build_tree_reference(parent_list, selected, seq, topk, depth, n, mode)
    ref_mask, ref_pos, ref_idx, ref_next, ref_sib = reference

    tree_mask = torch.ones(len(ref_mask), dtype=torch.bool)
    positions = torch.empty(bs * n, dtype=torch.int64)
    retrieve = torch.full((3, bs, n), -1, dtype=torch.int64)
    build_tree_kernel_efficient_cpu(
        torch.tensor(parent_list),
        torch.tensor(selected),
        torch.tensor(seq),
        tree_mask,
        positions,
        retrieve[0],
        retrieve[1],
        retrieve[2],
        topk,
        depth,
        n,
        mode,
    )
    assert tree_mask.tolist() == ref_mask
    assert positions.tolist() == ref_pos
    assert retrieve[0].tolist() == ref_idx
    assert retrieve[1].tolist() == ref_next
    assert retrieve[2].tolist() == ref_sib


def test_build_tree_chain_is_causal():
    """topk=1, with the inputs SGLang's chain fast path passes (base_spec_worker.py): a chain
    whose QLEN_ONLY mask is lower-triangular and whose positions count up."""
    n, steps = 4, 3
    mask = torch.ones(n * n, dtype=torch.bool)
    positions = torch.empty(n, dtype=torch.int64)
    retrieve = torch.full((3, 1, n), -1, dtype=torch.int64)
    build_tree_kernel_efficient_cpu(
        torch.tensor([[-1, 0, 1]]),
        torch.tensor([[0, 1, 2]]),
        torch.tensor([10]),
        mask,
        positions,
        retrieve[0],
        retrieve[1],
        retrieve[2],
        1,
        steps,
        n,
        QLEN_ONLY,
    )
    assert torch.equal(mask.view(n, n), torch.ones(n, n, dtype=torch.bool).tril())
    assert positions.tolist() == [10, 11, 12, 13]
    assert retrieve[1].tolist() == [[1, 2, 3, -1]] and retrieve[2].tolist() == [[-1, -1, -1, -1]]


def test_build_tree_rejects_bitpacked_mode():
    with pytest.raises(ValueError, match="tree_mask_mode"):
        build_tree_kernel_efficient_cpu(
            torch.zeros(1, 1, dtype=torch.int64),
            torch.zeros(1, 1, dtype=torch.int64),
            torch.tensor([3]),
            torch.zeros(2, dtype=torch.uint8),
            torch.empty(2, dtype=torch.int64),
            *torch.full((3, 1, 2), -1, dtype=torch.int64),
            1,
            1,
            2,
            QLEN_ONLY_BITPACKING,
        )


def _verify_reference(candidates, r_idx, r_next, r_sib, target, steps, predicts, accept_index, accept_num):
    """Python port of verify_tree_greedy_kernel_triton (one program per request)."""
    bs = len(candidates)
    flat_target = [t for row in target for t in row]
    for b in range(bs):
        last = r_idx[b][0]
        accept_index[b][0] = last
        num, cur = 0, 0
        for _ in range(1, steps):
            cur = r_next[b][cur]
            want = flat_target[last]
            matched = False
            while cur != -1:
                if candidates[b][cur] == want:
                    predicts[last] = want
                    num += 1
                    accept_index[b][num] = r_idx[b][cur]
                    last = r_idx[b][cur]
                    matched = True
                    break
                cur = r_sib[b][cur]
            if not matched:
                break
        accept_num[b] = num
        predicts[last] = flat_target[last]


@pytest.mark.parametrize("seed", SEEDS)
def test_verify_tree_greedy(seed):
    rng = random.Random(seed)
    bs, n, steps = 4, 7, 5
    mask = torch.stack([_ancestor_mask(_random_parents(rng, n)) for _ in range(bs)])
    r = [torch.empty(bs * n, dtype=torch.int64) for _ in range(4)]
    reconstruct_indices_from_tree_mask(mask.flatten(), torch.zeros(bs, dtype=torch.int64), *r, bs, n)
    r_idx, r_next, r_sib = (t.view(bs, n) for t in r[1:])
    vocab = 3  # small vocabulary: many matches, deep accepted paths, sibling ties
    candidates = torch.randint(0, vocab, (bs, n), generator=torch.Generator().manual_seed(seed))
    target = torch.randint(0, vocab, (bs, n), generator=torch.Generator().manual_seed(seed + 100))

    predicts = torch.full((bs * n,), -1, dtype=torch.int64)
    accept_index = torch.full((bs, steps), -1, dtype=torch.int64)
    accept_num = torch.full((bs,), -1, dtype=torch.int64)
    verify_tree_greedy_cpu(
        predicts=predicts,
        accept_index=accept_index,
        accept_token_num=accept_num,
        candidates=candidates,
        retrive_index=r_idx,
        retrive_next_token=r_next,
        retrive_next_sibling=r_sib,
        target_predict=target,
    )
    ref_pred, ref_acc, ref_num = [-1] * (bs * n), [[-1] * steps for _ in range(bs)], [-1] * bs
    _verify_reference(
        candidates.tolist(),
        r_idx.tolist(),
        r_next.tolist(),
        r_sib.tolist(),
        target.tolist(),
        steps,
        ref_pred,
        ref_acc,
        ref_num,
    )
    assert predicts.tolist() == ref_pred
    assert accept_index.tolist() == ref_acc
    assert accept_num.tolist() == ref_num
    assert max(ref_num) >= 1  # the inputs do exercise acceptance
