"""Torch versions of the ops SGLang 0.5.23's EAGLE verification samples with (`eagle_sample`'s
non-greedy branch, sglang/srt/speculative/eagle_utils.py), with the GPU kernels' semantics.

On a CPU SGLang has none of them (`tree_speculative_sampling_target_only`, `top_k_renorm_prob`
and `top_p_renorm_prob` resolve to None, `chain_speculative_sampling_triton` is a Triton
kernel), so it verifies every request greedily; `sglang_cpu.sampling_patch` binds these
instead. What each reproduces:

- `tree_speculative_sampling_target_only`: SGLang's JIT CUDA kernel
  (sglang/kernels/jit/include/sgl_kernel/speculative/sampling.cuh, FlashInfer's
  `DeviceSamplingFromProb` for the last token);
- `chain_speculative_sampling_triton`: the Triton kernel of
  sglang/kernels/ops/speculative/reject_sampling.py (`--speculative-use-rejection-sampling`,
  with or without block verification);
- `top_k_renorm_prob` / `top_p_renorm_prob`: FlashInfer 0.7's `top_k_renorm_probs` (radix
  select) and `top_p_renorm_probs` (AIR top-p; ternary search below 2048 tokens);
- `murmur_hash32`: the `sgl_kernel::murmur_hash32_cpu` op behind the seeded verify coins
  (`_seeded_verify_coins`, used with deterministic inference);
- `row_argmax`: the Triton kernel a sampled draft proposal takes its Gumbel race's winner with
  (`spec_utils.fast_sample`): each row's first largest entry.

Decisions (acceptance, thresholds, which token a coin selects) follow the kernels exactly;
sums and prefix sums run in torch's order rather than a GPU block reduction's, so only a coin
within rounding of a bucket edge can pick a neighbouring token. Arithmetic runs in the probability
dtype, at least float32 (the kernels' float). The tree walk loops over requests and tree
nodes in Python; everything that touches the vocabulary is vectorised.
"""

from __future__ import annotations

from typing import Optional, Union

import numpy as np
import torch
from torch import Tensor

_U32 = 0xFFFFFFFF


def _work_dtype(probs: Tensor) -> torch.dtype:
    """The dtype the kernels compute in: float32, or the input's dtype when that is wider."""
    return torch.promote_types(probs.dtype, torch.float32)


def _relu(x: Tensor) -> Tensor:
    """max(x, 0) as the kernels' max (CUDA fmaxf, PTX max.f32): a NaN term counts as 0."""
    return torch.where(x > 0, x, 0.0)


def _first_above(weights: Tensor, coins: Tensor, norm: Optional[Tensor] = None, last_positive: bool = True) -> Tensor:
    """[bs] int64: for each row, the first index whose inclusive prefix sum of `weights`
    exceeds u = coin * norm (norm: the row sum unless given), among indices of positive weight.

    Where no index qualifies (u at or past the total, through rounding, or an all-zero row):
    the last index of positive weight when `last_positive` (FlashInfer's
    `DeviceSamplingFromProb`), else, and for an all-zero row, the last index (the Triton chain
    sampler's default token).
    """
    vocab = weights.shape[-1]
    if norm is None:
        norm = weights.sum(dim=-1)
    u = coins.to(weights.dtype) * norm
    positive = weights > 0
    hit = (weights.cumsum(dim=-1) > u[:, None]) & positive
    idx = torch.arange(vocab, device=weights.device)
    first = torch.where(hit, idx, vocab).amin(dim=-1)
    fallback = torch.full_like(first, vocab - 1)
    if last_positive:
        fallback = torch.where(positive.any(dim=-1), torch.where(positive, idx, -1).amax(dim=-1), fallback)
    return torch.where(first < vocab, first, fallback)


def _check_verify_args(
    predicts,
    accept_index,
    accept_token_num,
    candidates,
    retrive_index,
    retrive_next_token,
    retrive_next_sibling,
    uniform_samples,
    uniform_samples_for_final_sampling,
    target_probs,
    draft_probs,
    threshold_single,
    threshold_acc,
) -> None:
    """The shapes both verify ops need (those of the CUDA kernel's TensorMatcher);
    ValueError naming the first bad argument."""
    if candidates.dim() != 2:
        raise ValueError(f"candidates: expected [batch, draft_tokens], got shape {tuple(candidates.shape)}")
    bs, n = candidates.shape
    for name, t in (
        ("retrive_index", retrive_index),
        ("retrive_next_token", retrive_next_token),
        ("retrive_next_sibling", retrive_next_sibling),
        ("uniform_samples", uniform_samples),
    ):
        if tuple(t.shape) != (bs, n):
            raise ValueError(f"{name}: expected shape {(bs, n)} like candidates, got {tuple(t.shape)}")
    for name, t in (
        ("candidates", candidates),
        ("retrive_index", retrive_index),
        ("predicts", predicts),
        ("accept_index", accept_index),
        ("accept_token_num", accept_token_num),
    ):
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise ValueError(f"{name}: expected an integer tensor, got {t.dtype}")
    if accept_index.dim() != 2 or accept_index.shape[0] != bs or accept_index.shape[1] < 1:
        raise ValueError(f"accept_index: expected [{bs}, max_depth >= 1], got shape {tuple(accept_index.shape)}")
    if tuple(accept_token_num.shape) != (bs,):
        raise ValueError(f"accept_token_num: expected shape {(bs,)}, got {tuple(accept_token_num.shape)}")
    if predicts.dim() != 1 or predicts.numel() != bs * n:
        raise ValueError(f"predicts: expected a flat tensor of {bs * n} entries, got shape {tuple(predicts.shape)}")
    if tuple(uniform_samples_for_final_sampling.shape) != (bs,):
        got = tuple(uniform_samples_for_final_sampling.shape)
        raise ValueError(f"uniform_samples_for_final_sampling: expected shape {(bs,)}, got {got}")
    if target_probs.dim() != 3 or tuple(target_probs.shape[:2]) != (bs, n) or target_probs.shape[2] < 1:
        raise ValueError(f"target_probs: expected [{bs}, {n}, vocab], got shape {tuple(target_probs.shape)}")
    if not target_probs.dtype.is_floating_point:
        raise ValueError(f"target_probs: expected a floating tensor, got {target_probs.dtype}")
    if draft_probs.dim() != 3 or draft_probs.shape[0] != bs or draft_probs.shape[2] != target_probs.shape[2]:
        raise ValueError(
            f"draft_probs: expected [{bs}, rows, {target_probs.shape[2]}] like target_probs, "
            f"got shape {tuple(draft_probs.shape)}"
        )
    for name, value in (("threshold_single", threshold_single), ("threshold_acc", threshold_acc)):
        if not 0.0 <= float(value) <= 1.0:
            raise ValueError(f"{name}: must lie in [0, 1], got {value}")


def tree_speculative_sampling_target_only(
    predicts: Tensor,
    accept_index: Tensor,
    accept_token_num: Tensor,
    candidates: Tensor,
    retrive_index: Tensor,
    retrive_next_token: Tensor,
    retrive_next_sibling: Tensor,
    uniform_samples: Tensor,
    uniform_samples_for_final_sampling: Tensor,
    target_probs: Tensor,
    draft_probs: Tensor,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
) -> None:
    """Verify each request's draft tree against the target distribution alone; fills
    `predicts`, `accept_index`, `accept_token_num` and writes into `draft_probs`, as the kernel.

    Request b walks its tree from node 0 (retrive_next_token: first child, retrive_next_sibling:
    next sibling). At a node whose target row is r (the last accepted node, 0 at first) with
    coin c = uniform_samples[b, r], the children are tried in sibling order, accumulating their
    target probabilities p = target_probs[b, r, token]: child k is accepted when p > 0 and
    (c < (p_1 + ... + p_k) / threshold_acc or p >= threshold_single); then its row and coin take
    over and the accumulator restarts. A rejected child gets draft_probs[b, r, token] =
    target_probs[b, r, token]. The walk stops when no child is accepted, a leaf is reached, or
    accept_index's width - 1 tokens are accepted. With both thresholds 1 each accepted token
    is distributed exactly as the target (siblings partition [0, 1) by their target mass).

    predicts[retrive_index of each accepted node's parent] = its token; the last accepted
    node's slot gets a token drawn with uniform_samples_for_final_sampling[b] from
    relu(target_probs[b, r] - draft_probs[b, r]) (just the target row when every level was
    accepted), so the rejected siblings are excluded. accept_index[b, 0..a] are the
    retrive_index of node 0 and the accepted nodes; accept_token_num[b] = a.

    `deterministic` chooses the kernel's prefix-sum algorithm (reproducible bits); both
    give the same token here.
    """
    _check_verify_args(
        predicts,
        accept_index,
        accept_token_num,
        candidates,
        retrive_index,
        retrive_next_token,
        retrive_next_sibling,
        uniform_samples,
        uniform_samples_for_final_sampling,
        target_probs,
        draft_probs,
        threshold_single,
        threshold_acc,
    )
    if draft_probs.shape[1] != candidates.shape[1]:
        raise ValueError(
            f"draft_probs: expected {candidates.shape[1]} rows per request like target_probs, "
            f"got {draft_probs.shape[1]}"
        )
    bs, n = candidates.shape
    if bs == 0:
        return
    depth = accept_index.shape[1]
    work = _work_dtype(target_probs)
    np_work = np.float32 if work == torch.float32 else np.float64
    # cand_p[b, r, k]: target probability, under row r, of node k's token
    cand_p = target_probs.gather(2, candidates.to(torch.int64)[:, None, :].expand(bs, n, n)).to(work).cpu().numpy()
    coins = uniform_samples.to(work).cpu().numpy()
    # the kernel takes both thresholds as float, threshold_acc at least 1e-9
    thr_single = np_work(np.float32(threshold_single))
    thr_acc = np_work(max(np.float32(threshold_acc), np.float32(1e-9)))
    cand, ridx = candidates.tolist(), retrive_index.tolist()
    first_child, next_sibling = retrive_next_token.tolist(), retrive_next_sibling.tolist()

    predict_at, predict_tok = [], []
    accept_rows, accept_cols, accept_vals = [], [], []
    rejected = ([], [], [])  # (b, row, token) of rejected children
    num_accepted, final_row, final_slot = [], [], []
    for b in range(bs):
        row, coin, last = 0, coins[b, 0], ridx[b][0]
        accept_rows.append(b), accept_cols.append(0), accept_vals.append(last)
        accepted, node, prob_acc = 0, 0, np_work(0)
        for _ in range(1, depth):
            node = first_child[b][node]
            while node != -1:
                p = cand_p[b, row, node]
                prob_acc = np_work(prob_acc + p)
                if p > 0 and (coin < np_work(prob_acc / thr_acc) or p >= thr_single):
                    prob_acc, row, coin = np_work(0), node, coins[b, node]
                    predict_at.append(last), predict_tok.append(cand[b][node])
                    accepted += 1
                    last = ridx[b][node]
                    accept_rows.append(b), accept_cols.append(accepted), accept_vals.append(last)
                    break
                rejected[0].append(b), rejected[1].append(row), rejected[2].append(cand[b][node])
                node = next_sibling[b][node]
            if node == -1:
                break
        num_accepted.append(accepted), final_row.append(row), final_slot.append(last)

    if rejected[0]:
        at = tuple(torch.tensor(r, dtype=torch.int64, device=draft_probs.device) for r in rejected)
        draft_probs[at] = target_probs[at].to(draft_probs.dtype)
    dev = target_probs.device
    batch = torch.arange(bs, device=dev)
    rows = torch.tensor(final_row, dtype=torch.int64, device=dev)
    target_row = target_probs[batch, rows].to(work)
    all_accepted = torch.tensor(num_accepted, device=dev) == depth - 1
    draft_row = torch.where(all_accepted[:, None], 0.0, draft_probs[batch, rows].to(work))
    final = _first_above(_relu(target_row - draft_row), uniform_samples_for_final_sampling.to(work))

    predict_at.extend(final_slot)
    predict_tok.extend(final.tolist())
    predicts[torch.tensor(predict_at, dtype=torch.int64, device=predicts.device)] = torch.tensor(
        predict_tok, dtype=predicts.dtype, device=predicts.device
    )
    accept_index[
        torch.tensor(accept_rows, device=accept_index.device), torch.tensor(accept_cols, device=accept_index.device)
    ] = torch.tensor(accept_vals, dtype=accept_index.dtype, device=accept_index.device)
    accept_token_num.copy_(torch.tensor(num_accepted, dtype=accept_token_num.dtype))


def _block_verification(p_tok: Tensor, q_tok: Tensor, coins: Tensor, target_probs: Tensor, draft_probs: Tensor):
    """Block verification (arXiv 2403.10444, Algorithm 2) as the Triton kernel runs it.

    Returns (num_accept [bs], residual_scale [bs], norm_sum [bs]; norm_sum < 0: not computed).
    """
    bs, steps = p_tok.shape  # steps = num_slots - 1
    valid_q = (q_tok > 0) & (q_tok <= 1)
    prefix = torch.empty_like(p_tok)
    h = torch.ones(bs, dtype=p_tok.dtype, device=p_tok.device)
    for s in range(steps):
        h = torch.where(valid_q[:, s], torch.clamp(h * p_tok[:, s] / q_tok[:, s], max=1.0), 0.0)
        prefix[:, s] = h
    # residual mass of the next position for each step but the last: sum relu(h * p_next - q_next)
    residual = torch.full_like(prefix, -1.0)
    if steps > 1:
        p_next = target_probs[:, 1:steps].to(p_tok.dtype)
        q_next = draft_probs[:, 1:steps].to(p_tok.dtype)
        mass = _relu(prefix[:, : steps - 1, None] * p_next - q_next).sum(dim=-1)
        strict = (prefix[:, : steps - 1] > 0) & (prefix[:, : steps - 1] < 1)
        residual[:, : steps - 1] = torch.where(strict, mass, -1.0)
    accept_prob = torch.where(residual >= 0, residual / (residual + 1.0 - prefix), prefix)
    ok = (coins < prefix) & (coins < accept_prob)
    step_no = torch.arange(1, steps + 1, device=p_tok.device)
    num_accept = torch.where(ok, step_no, 0).amax(dim=1)
    pick = (num_accept - 1).clamp(min=0)[:, None]
    taken = num_accept > 0
    scale = torch.where(taken, prefix.gather(1, pick).squeeze(1), 1.0)
    norm = torch.where(taken, residual.gather(1, pick).squeeze(1), -1.0)
    return num_accept, scale, norm


def chain_speculative_sampling_triton(
    predicts,
    accept_index,
    accept_token_num,
    candidates,
    retrive_index,
    retrive_next_token,
    retrive_next_sibling,
    uniform_samples,
    uniform_samples_for_final_sampling,
    target_probs,
    draft_probs,
    threshold_single,
    threshold_acc,
    deterministic,
    *,
    block_verification: bool = False,
):
    """Rejection sampling of each request's draft chain against its draft distribution.

    Request b's slot 0 is the verified token, slots 1..S-1 its drafts; draft s is judged with
    target row s-1, draft row s-1 and coin uniform_samples[b, s-1]. Classic: accept while
    0 < q <= 1 and coin * q < p (probability min(1, p / q)), stop at the first rejection.
    `block_verification`: prefix ratios h_s = min(1, h_{s-1} p_s / q_s) (0 where q is not a
    probability); the longest s (tried from the end) with coin_s < h_s and coin_s < h_s's
    acceptance probability (r / (r + 1 - h_s), r = sum relu(h_s p_{s+1} - q_{s+1}), when
    s < S-1 and 0 < h_s < 1; else h_s) is accepted whole.

    The token after the a accepted drafts is drawn with uniform_samples_for_final_sampling[b]
    from target row a if a = S-1, else from relu(h * p - q) on row a (h = 1 classic; q outside
    [0, 1] or NaN counts as 0); an all-zero residual yields the last vocabulary index.
    Fills predicts (draft s at the retrive_index of slot s-1), accept_index[b, 0..a],
    accept_token_num[b] = a. `retrive_next_*`, the thresholds and `deterministic` are
    unused, as in the kernel.
    """
    _check_verify_args(
        predicts,
        accept_index,
        accept_token_num,
        candidates,
        retrive_index,
        retrive_next_token,
        retrive_next_sibling,
        uniform_samples,
        uniform_samples_for_final_sampling,
        target_probs,
        draft_probs,
        threshold_single,
        threshold_acc,
    )
    bs, slots = candidates.shape
    if tuple(accept_index.shape) != (bs, slots):
        raise ValueError(
            f"accept_index: the chain kernel writes it with retrive_index's layout, expected shape {(bs, slots)}, "
            f"got {tuple(accept_index.shape)}"
        )
    if draft_probs.shape[1] < slots - 1:
        raise ValueError(
            f"draft_probs: expected at least {slots - 1} rows per request (one per draft), got {draft_probs.shape[1]}"
        )
    if bs == 0:
        return
    work = _work_dtype(target_probs)
    dev = target_probs.device
    steps = slots - 1
    cand = candidates.to(torch.int64)
    p_tok = target_probs[:, :steps].gather(2, cand[:, 1:, None]).squeeze(2).to(work)
    q_tok = draft_probs[:, :steps].gather(2, cand[:, 1:, None]).squeeze(2).to(work)
    coins = uniform_samples[:, :steps].to(work)
    if block_verification and steps > 0:
        num_accept, scale, norm = _block_verification(p_tok, q_tok, coins, target_probs, draft_probs)
    else:
        ok = (q_tok > 0) & (q_tok <= 1) & (coins * q_tok < p_tok)
        num_accept = ok.to(torch.int64).cumprod(dim=1).sum(dim=1)
        scale = torch.ones(bs, dtype=work, device=dev)
        norm = torch.full((bs,), -1.0, dtype=work, device=dev)

    batch = torch.arange(bs, device=dev)
    all_accepted = num_accept == steps
    target_row = target_probs[batch, num_accept].to(work)
    if steps > 0:
        draft_row = draft_probs[batch, num_accept.clamp(max=steps - 1)].to(work)
    else:
        draft_row = torch.zeros_like(target_row)
    draft_row = torch.where((draft_row >= 0) & (draft_row <= 1), draft_row, 0.0)
    residual = _relu(scale[:, None] * target_row - draft_row)
    weights = torch.where(all_accepted[:, None], target_row, residual)
    norm = torch.where(norm >= 0, norm, weights.sum(dim=-1))
    final = _first_above(weights, uniform_samples_for_final_sampling.to(work), norm=norm, last_positive=False)

    slot = torch.arange(slots, device=dev)
    kept = slot[None, :] <= num_accept[:, None]
    ridx = retrive_index.to(torch.int64)
    accept_index[kept] = ridx[kept].to(accept_index.dtype)
    drafted = kept[:, 1:]
    predicts[ridx[:, :-1][drafted]] = cand[:, 1:][drafted].to(predicts.dtype)
    predicts[ridx[batch, num_accept]] = final.to(predicts.dtype)
    accept_token_num.copy_(num_accept.to(accept_token_num.dtype))


def _per_row(value: Union[Tensor, float, int], rows: int, name: str, device) -> Tensor:
    """A scalar or [rows] tensor argument as a [rows] tensor."""
    t = torch.as_tensor(value, device=device)
    if t.dim() == 0:
        return t.expand(rows)
    t = t.reshape(-1) if t.dim() == 2 and t.shape[1] == 1 else t
    if tuple(t.shape) != (rows,):
        raise ValueError(f"{name}: expected a scalar or {rows} values (one per row), got shape {tuple(t.shape)}")
    return t


def _renormalize(probs: Tensor, keep: Tensor, work: torch.dtype, tiny_mass_divisor: float) -> Tensor:
    """probs with the entries outside `keep` zeroed, divided by the kept mass, in probs' dtype.
    A kept mass <= 1e-8 is replaced by `tiny_mass_divisor` (the kernels differ there)."""
    kept = torch.where(keep, probs.to(work), 0.0)
    total = kept.sum(dim=-1, keepdim=True)
    return (kept / torch.where(total > 1e-8, total, tiny_mass_divisor)).to(probs.dtype)


def _check_probs(probs: Tensor) -> None:
    if probs.dim() != 2 or not probs.dtype.is_floating_point:
        raise ValueError(
            f"probs: expected a floating [batch, vocab] tensor, got {probs.dtype} of shape {tuple(probs.shape)}"
        )


def top_k_renorm_prob(probs: Tensor, top_k: Union[Tensor, int]) -> Tensor:
    """FlashInfer's `top_k_renorm_probs`: per row, keep every probability >= the k-th largest
    (all ties with it, so possibly more than k), zero the rest, renormalise.

    top_k: an int or one per row; k >= vocab (SGLang's "whole vocabulary" is 1 << 30) keeps
    the row, only renormalised. k must be positive.
    """
    _check_probs(probs)
    bs, vocab = probs.shape
    k = _per_row(top_k, bs, "top_k", probs.device).to(torch.int64)
    if bool((k <= 0).any()):
        raise ValueError(f"top_k: every value must be positive (>= vocab keeps the row), got {k.tolist()}")
    work = _work_dtype(probs)
    if bs == 0:
        return probs.clone()
    ordered = probs.to(work).sort(dim=-1, descending=True).values
    pivot = ordered.gather(1, (k.clamp(max=vocab) - 1)[:, None])
    keep = (probs.to(work) >= pivot) | (k >= vocab)[:, None]
    return _renormalize(probs, keep, work, tiny_mass_divisor=1e-8)


def top_p_renorm_prob(probs: Tensor, top_p: Union[Tensor, float]) -> Tensor:
    """FlashInfer's `top_p_renorm_probs`: per row, keep every probability v whose strictly larger
    probabilities sum to less than top_p * (row sum) (all ties with the last kept value stay),
    zero the rest, renormalise.

    top_p: a float or one per row, in (0, 1]; a row with top_p >= 1 is only renormalised.
    """
    _check_probs(probs)
    bs, _ = probs.shape
    p = _per_row(top_p, bs, "top_p", probs.device)
    work = _work_dtype(probs)
    p = p.to(work)
    if bool(((p <= 0) | (p > 1) | p.isnan()).any()):
        raise ValueError(f"top_p: every value must lie in (0, 1], got {p.tolist()}")
    if bs == 0:
        return probs.clone()
    values = probs.to(work)
    ordered = values.sort(dim=-1, descending=True).values
    # At the first of a run of equal values the exclusive prefix sum is the mass strictly above
    # that value; the nucleus is a prefix of the sorted row, and `>= its smallest value` keeps
    # the whole run of ties the prefix reaches into.
    above = ordered.cumsum(dim=-1) - ordered
    in_nucleus = above < p[:, None] * ordered.sum(dim=-1, keepdim=True)
    threshold = ordered.gather(1, (in_nucleus.sum(dim=-1, keepdim=True) - 1).clamp(min=0))
    keep = (values >= threshold) | (p >= 1)[:, None]
    return _renormalize(probs, keep, work, tiny_mass_divisor=1.0)


def _rotl32(x: Tensor, r: int) -> Tensor:
    return ((x << r) | (x >> (32 - r))) & _U32


def _mul32(x: Tensor, c: int) -> Tensor:
    """(x * c) mod 2**32 for x, c < 2**32, in two 16-bit halves of c so no int64 product overflows."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _U32


def _murmur3_mix(h: Tensor, k: Tensor) -> Tensor:
    k = _mul32(_rotl32(_mul32(k, 0xCC9E2D51), 15), 0x1B873593)
    h = _rotl32(h ^ k, 13)
    return (h * 5 + 0xE6546B64) & _U32


def murmur_hash32(seed: Tensor, positions: Tensor, col_indices: Tensor) -> Tensor:
    """`sgl_kernel::murmur_hash32_cpu`: [n, m] uint32 MurmurHash3 of the four 32-bit blocks
    (seed low, seed high, position, column) of row i and column j, as SGLang's Triton kernel
    (sglang/kernels/ops/sampling/murmur_hash.py). seed: [n] uint64; positions: [n] int64 or
    uint64 (its low 32 bits are hashed); col_indices: [m] integers.

    Computed in int64, every intermediate below 2**49 and masked to 32 bits.
    """
    if seed.dim() != 1 or seed.dtype != torch.uint64:
        raise ValueError(f"seed: expected a 1-D torch.uint64 tensor, got {seed.dtype} of shape {tuple(seed.shape)}")
    if positions.dim() != 1 or positions.shape != seed.shape or positions.dtype not in (torch.int64, torch.uint64):
        raise ValueError(
            f"positions: expected a torch.int64 or torch.uint64 tensor of shape {tuple(seed.shape)} like seed, "
            f"got {positions.dtype} of shape {tuple(positions.shape)}"
        )
    if col_indices.dim() != 1 or col_indices.dtype.is_floating_point:
        raise ValueError(
            f"col_indices: expected a 1-D integer tensor, got {col_indices.dtype} of shape {tuple(col_indices.shape)}"
        )
    s = seed.contiguous().view(torch.int64)
    pos = positions.contiguous().view(torch.int64) & _U32
    col = col_indices.to(torch.int64) & _U32
    h = torch.zeros_like(s)
    h = _murmur3_mix(h, s & _U32)
    h = _murmur3_mix(h, (s >> 32) & _U32)
    h = _murmur3_mix(h, pos)
    h = _murmur3_mix(h[:, None], col[None, :]) ^ 16
    h ^= h >> 16
    h = _mul32(h, 0x85EBCA6B)
    h ^= h >> 13
    h = _mul32(h, 0xC2B2AE35)
    h ^= h >> 16
    return h.to(torch.uint32)


# torch.library registrations are undone when their Library object is collected: kept here, in
# a module that stays imported, not in the stand-in (tests drop and re-import `sgl_kernel`).
_op_library: Optional[torch.library.Library] = None


def register_murmur_hash32_op() -> None:
    """Define `torch.ops.sgl_kernel.murmur_hash32_cpu` (CPU kernel: murmur_hash32), as the real
    `sgl_kernel` does on import; idempotent. Called by the `sgl_kernel` stand-in only."""
    global _op_library
    if _op_library is None:
        _op_library = torch.library.Library("sgl_kernel", "FRAGMENT")
        _op_library.define("murmur_hash32_cpu(Tensor seed, Tensor positions, Tensor col_indices) -> Tensor")
        _op_library.impl("murmur_hash32_cpu", murmur_hash32, "CPU")


def row_argmax(x: Tensor) -> Tensor:
    """`x.argmax(dim=-1)` of a 2-D float32 tensor (SGLang's `row_argmax`)."""
    if x.dim() != 2 or x.dtype != torch.float32:
        raise ValueError(f"row_argmax: x must be a 2-D float32 tensor, got {x.dtype} of shape {tuple(x.shape)}")
    return x.argmax(dim=-1)
