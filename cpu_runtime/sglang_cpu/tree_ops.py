"""Torch versions of the `sgl_kernel` CPU ops that build and verify draft-token trees.

SGLang 0.5.23 calls these on CPU for EAGLE/STANDALONE (`build_tree_kernel_efficient_cpu`,
`verify_tree_greedy_cpu`, via `sglang/kernels/ops/speculative/spec_tree.py`) and NGRAM
(`sgl_kernel.speculative.reconstruct_indices_from_tree_mask`, via
`.../reconstruct_tree.py`). Semantics are those of the Triton twins in the same files.
Tree nodes are indexed 0..n-1 per request (0 = the verified last token); `retrieve_index`
holds request-global indices `b * n + i`. Work is vectorised over requests and nodes;
the only loops run over tree depth (and, in verify, over one node's siblings).
"""

from __future__ import annotations

import torch

FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = 0, 1, 2  # sglang TreeMaskMode values


def _next_sibling(parent: torch.Tensor) -> torch.Tensor:
    """[bs, n]: smallest k > t with parent[k] == parent[t] (t not a root), else -1."""
    n = parent.shape[1]
    idx = torch.arange(n, device=parent.device)
    same = (parent[:, :, None] == parent[:, None, :]) & (idx[:, None] > idx[None, :])  # [b, k, t]
    first = torch.where(same, idx[None, :, None], n).amin(dim=1)
    return torch.where((parent >= 0) & (first < n), first, -1)


def reconstruct_indices_from_tree_mask(
    tree_mask: torch.Tensor,
    verified_seq_len: torch.Tensor,
    positions: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    batch_size: int,
    draft_token_num: int,
) -> None:
    """NGRAM verify metadata from a [bs, n, n] ancestor mask (row i marks i's ancestors and i).

    positions = #strict ancestors + verified_seq_len; parent = largest strict ancestor;
    next_token = smallest strict descendant; next_sibling = next node with the same parent.
    """
    if batch_size == 0:
        return
    n = draft_token_num
    device = tree_mask.device
    idx = torch.arange(n, device=device)
    anc = tree_mask.reshape(batch_size, n, n).bool() & (idx[None, :] < idx[:, None])  # [b, i, j]
    depth = anc.sum(dim=2)
    positions.view(batch_size, n)[:] = depth + verified_seq_len.to(torch.int64)[:, None]
    parent = torch.where(anc, idx, -1).amax(dim=2)
    first_desc = torch.where(anc, idx[None, :, None], n).amin(dim=1)  # min row i over column t
    retrieve_index.view(batch_size, n)[:] = torch.arange(batch_size * n, device=device).view(batch_size, n)
    retrieve_next_token.view(batch_size, n)[:] = torch.where(first_desc < n, first_desc, -1)
    retrieve_next_sibling.view(batch_size, n)[:] = _next_sibling(parent)


def _parents_from_selection(parent_list, selected_index, topk):
    """[bs, n] parent node of each tree node (node 0 and unresolvable parents: -1)."""
    sel = selected_index.to(torch.int64)
    bs = sel.shape[0]
    parent_tb = sel // topk  # 0 = child of the verified token
    parents_flat = parent_list.reshape(bs, -1).to(torch.int64)
    if parents_flat.shape[1] == 0:
        parent_token = torch.full_like(parent_tb, -1)
    else:
        parent_token = parents_flat.gather(1, parent_tb.clamp(max=parents_flat.shape[1] - 1))
    match = sel[:, None, :] == parent_token[:, :, None]  # [b, node-1, candidate pp]
    pos = torch.where(match.any(dim=2), match.int().argmax(dim=2) + 1, -1)
    pos = torch.where(parent_tb == 0, 0, pos)
    return torch.cat([torch.full((bs, 1), -1, dtype=torch.int64, device=sel.device), pos], dim=1)


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """EAGLE tree from the top-scoring draft candidates: mask rows, positions, retrieve links.

    Node i >= 1 is candidate selected_index[i-1]; its parent is node 0 when that
    candidate came from the first draft step, else the node whose candidate is its
    parent_list entry. Mask row x = node 0, x and x's ancestors (at most `depth`).
    FULL_MASK rows are seq_len + n wide after each request's seq_len * n prefix block
    (whose prefix columns the caller pre-fills); QLEN_ONLY rows are n wide.
    """
    mode = int(tree_mask_mode)
    if mode not in (FULL_MASK, QLEN_ONLY):
        raise ValueError(
            f"tree_mask_mode={mode!r} is not supported by the torch CPU op; "
            f"allowed: {FULL_MASK} (FULL_MASK) or {QLEN_ONLY} (QLEN_ONLY)"
        )
    n = draft_token_num
    seq = verified_seq_len.to(torch.int64)
    bs = seq.numel()
    device = seq.device
    parent = _parents_from_selection(parent_list, selected_index, topk)
    node = torch.arange(n, device=device)

    # rows[b, x, c]: column c is on node x's path (x itself and ancestors, not node 0).
    rows = torch.zeros(bs, n, n, dtype=torch.bool, device=device)
    batch_ix = torch.arange(bs, device=device)[:, None].expand(bs, n)
    node_ix = node[None, :].expand(bs, n)
    cur = node_ix.clone()
    steps = torch.zeros(bs, n, dtype=torch.int64, device=device)  # path length = position offset
    for _ in range(depth):
        live = cur > 0
        rows[batch_ix[live], node_ix[live], cur[live]] = True
        steps += live
        cur = torch.where(live, parent.gather(1, cur.clamp(min=0)), -1)
    positions.view(bs, n)[:] = steps + seq[:, None]
    rows[:, :, 0] = True

    if mode == QLEN_ONLY:
        tree_mask.view(bs, n, n)[:] = rows
    else:
        block_start = n * n * torch.arange(bs, device=device) + (torch.cumsum(seq, 0) - seq) * n
        flat = (
            block_start[:, None, None]
            + (seq[:, None, None] + n) * node[None, :, None]
            + seq[:, None, None]
            + node[None, None, :]
        )
        tree_mask[flat] = rows

    found = parent >= 0
    first_child = torch.where((parent[:, None, :] == node[None, :, None]) & found[:, None, :], node, n).amin(dim=2)
    retrieve_index.view(bs, n)[:] = torch.arange(bs * n, device=device).view(bs, n)
    retrieve_next_token.view(bs, n)[:] = torch.where(first_child < n, first_child, -1)
    retrieve_next_sibling.view(bs, n)[:] = _next_sibling(parent)


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy tree verification: walk down from node 0, at each level taking the first
    child (in sibling order) whose draft token equals the target's prediction at the
    current node; stop when none does or accept_index is full.

    Writes accept_index[b, 0..a] (global indices of the accepted path, node 0 first),
    accept_token_num[b] = a, and predicts[global index] = the target token at each
    accepted node (the bonus token at the last one). Keyword names follow the op schema.
    """
    bs, n = candidates.shape
    steps = accept_index.shape[1]
    device = candidates.device
    target = target_predict.reshape(-1)
    batch = torch.arange(bs, device=device)
    gidx = retrive_index.reshape(bs, n).to(torch.int64)
    next_token = retrive_next_token.reshape(bs, n).to(torch.int64)
    next_sibling = retrive_next_sibling.reshape(bs, n).to(torch.int64)

    last = gidx[:, 0].clone()
    accept_index[:, 0] = last.to(accept_index.dtype)
    num = torch.zeros(bs, dtype=torch.int64, device=device)
    cur = torch.zeros(bs, dtype=torch.int64, device=device)
    active = torch.ones(bs, dtype=torch.bool, device=device)
    for _ in range(1, steps):
        cur = torch.where(active, next_token[batch, cur.clamp(min=0)], -1)
        want = target[last]
        searching = active & (cur >= 0)
        matched = torch.zeros_like(active)
        for _ in range(n):
            if not bool(searching.any()):
                break
            safe = cur.clamp(min=0)
            hit = searching & (candidates[batch, safe] == want)
            predicts[last[hit]] = want[hit].to(predicts.dtype)
            accept_index[batch[hit], num[hit] + 1] = gidx[batch, safe][hit].to(accept_index.dtype)
            num += hit
            last = torch.where(hit, gidx[batch, safe], last)
            matched |= hit
            searching &= ~hit
            cur = torch.where(searching, next_sibling[batch, safe], cur)
            searching &= cur >= 0
        active &= matched
        if not bool(active.any()):
            break
    accept_token_num[:bs] = num.to(accept_token_num.dtype)
    predicts[last] = target[last].to(predicts.dtype)
