"""The verify window: its shape, the shapes a server's rounds can have, and its tensors,
built on the device from compact descriptors.

In SGLang every request of a TARGET_VERIFY batch has the same number of rows, so a
PARSE batch's window has one shape (`WindowShape`): N = 1 + L + K*m rows per request,
the chain c_n, d_1..d_L then K probe blocks of the m-token judge suffix (the row rule is
`layout.row_roles` / `row_reach` / `visible`, shared with the host-side reference layout).

Per round the host contributes O(batch x window) numbers: the boundaries [bs, K] (placed
from the draft's text). The committed lengths and the draft tokens are already on the
device. Everything else is computed here with static-shape device ops and no host sync:
input ids, positions, the QLEN_ONLY mask (N x N per request), the FULL mask FlashInfer and
Triton read (N x (P + N) per request, the one object that grows with the context) and the
logits rows PARSE reads. So nothing whose size grows with the context is built on the host
or copied to the device, and a fixed shape (K = K_max) gives the same tensors shapes every
round, which is what a CUDA graph needs.

`WindowGeometry` is every window a server's rounds can have (its L, tiers, K_max and m):
the worker, the CUDA-graph capture and the start-up memory bound read the same one.
`ShapeConstants` holds what depends only on (batch size, window shape): the logits rows PARSE
reads and the chain's tree indices (`ChainView`, what SGLang's `eagle_sample` verifies). A
captured graph bakes the logits rows in, so they must outlive the capture: the cache lives on
the target's model runner, for the life of the process.

Logits rows are request-major: request b's chain rows, then the last row of each of its
probes, at b*N + ...; SGLang's graph runner keeps the first raw_bs*N output rows of a
padded batch, which then always hold every real request's rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from parse_sglang.attention.layout import row_offsets, row_reach, row_roles, visible
from parse_sglang.boundaries import probe_stride
from parse_sglang.settings import ParseConfig, judge_probe_for


@dataclass(frozen=True)
class WindowShape:
    """draft_len L, num_probes K, suffix_len m of every request's window in a batch."""

    draft_len: int
    num_probes: int
    suffix_len: int

    def __post_init__(self):
        if self.draft_len < 0 or self.num_probes < 0 or self.suffix_len < 0:
            raise ValueError(f"{self}: needs draft_len >= 0, num_probes >= 0, suffix_len >= 0")
        if self.num_probes and not self.suffix_len:
            raise ValueError(f"{self}: probes need a judge suffix of >= 1 token")

    @property
    def rows(self) -> int:
        """N: window rows per request."""
        return 1 + self.draft_len + self.num_probes * self.suffix_len

    @property
    def chain_rows(self) -> int:
        return 1 + self.draft_len

    @property
    def read_rows(self) -> int:
        """Rows per request whose logits PARSE reads: the chain and each probe's last row."""
        return self.chain_rows + self.num_probes

    def logits_rows(self, batch_size: int, device) -> Tensor:
        """[batch_size * read_rows] int64 window rows PARSE reads, request-major."""
        probe_ends = (
            self.chain_rows + torch.arange(self.num_probes, device=device) * self.suffix_len + self.suffix_len - 1
        )
        per_request = torch.cat([torch.arange(self.chain_rows, device=device), probe_ends])
        starts = torch.arange(batch_size, device=device)[:, None] * self.rows
        return (starts + per_request).reshape(-1)

    def split_logits(self, logits: Tensor, batch_size: int) -> tuple[Tensor, Tensor]:
        """Rows of `logits_rows` -> (chain logits [bs, L+1, V], probe logits [bs, K, V])."""
        rows = logits[: batch_size * self.read_rows].view(batch_size, self.read_rows, -1)
        return rows[:, : self.chain_rows], rows[:, self.chain_rows :]


@dataclass(frozen=True)
class WindowGeometry:
    """Every window a server's rounds can have: its settings (L, tiers, probe stride, judge)
    and m, the judge suffix's tokens (0 without the probe)."""

    config: ParseConfig
    suffix_len: int

    @classmethod
    def of_server(cls, config: ParseConfig, tokenizer_path: str, trust_remote_code: bool = False) -> "WindowGeometry":
        """m counted with the worker's own probe builder, so every process sizes the same window."""
        if not config.uses_probe:
            return cls(config, 0)
        return cls(config, len(judge_probe_for(tokenizer_path, config.judge_question, trust_remote_code).suffix_ids))

    def max_probes(self, draft_len: Optional[int] = None) -> int:
        """K_max: the most boundaries `select_boundaries` returns for a draft of L tokens (the
        server's L, or `draft_len`): interior segment ends at least Δ apart (`boundaries.probe_stride`), plus the end."""
        length = self.config.draft_budget if draft_len is None else draft_len
        if not self.config.uses_probe or length < 1:
            return 0
        return (length - 1) // probe_stride(self.config.probe_stride, length) + 1

    def fixed(self, draft_len: Optional[int] = None) -> WindowShape:
        """The largest window of a round drafting L tokens: K_max probes of m rows (what a fixed
        window always has, and a CUDA graph captures)."""
        length = self.config.draft_budget if draft_len is None else draft_len
        probes = self.max_probes(length)
        return WindowShape(length, probes, self.suffix_len if probes else 0)

    def rows(self, draft_len: int, probes: bool) -> int:
        """Verify rows per request of a round drafting `draft_len` tokens: the fixed window where
        a request of the batch probes, else the chain alone."""
        return self.fixed(draft_len).rows if probes else draft_len + 1

    @property
    def max_rows(self) -> int:
        """N_max = 1 + L + K_max * m: the verify rows one request may need in a round."""
        return self.fixed().rows

    def shapes(self) -> list[WindowShape]:
        """Every shape a round can have with a fixed window: per tier, the chain alone and, where
        the server probes, K_max probes; with an EAGLE-3 head, its rounds' chain of k drafts."""
        shapes = {WindowShape(L, 0, 0) for L in self.config.tiers} | {self.fixed(L) for L in self.config.tiers}
        if self.config.eagle3_head:
            shapes.add(WindowShape(self.config.eagle3_steps, 0, 0))
        return sorted(shapes, key=lambda s: (s.draft_len, s.num_probes))


def window_inputs(
    shape: WindowShape,
    prefix_lens: Tensor,
    chain_tokens: Tensor,
    boundaries: Tensor,
    suffix_ids: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """(input_ids [bs*N], positions [bs*N], QLEN_ONLY mask [bs*N*N] bool) of a batch.

    prefix_lens [bs]: committed tokens P; chain_tokens [bs, L+1]: c_n, d_1..d_L;
    boundaries [bs, K]: b_k of each probe (1 <= b_k <= L); suffix_ids [m]. All on one device.
    """
    device = chain_tokens.device
    bs, N = chain_tokens.shape[0], shape.rows
    if N == 1:  # nothing drafted (an adaptive tier-0 round): c_n at P, seeing itself, as in a decode step
        return (
            chain_tokens[:, 0].to(torch.int64),
            prefix_lens.to(torch.int64),
            torch.ones(bs, dtype=torch.bool, device=device),
        )
    row = torch.arange(N, device=device)
    is_chain, k, i = row_roles(row, shape.draft_len, shape.suffix_len)
    if shape.num_probes:
        b = boundaries.to(torch.int64).gather(1, k.clamp(0, shape.num_probes - 1).expand(bs, N))
        suffix_tok = suffix_ids.to(torch.int64)[i.clamp(0, shape.suffix_len - 1)]
    else:
        b = torch.zeros(bs, N, dtype=torch.int64, device=device)
        suffix_tok = torch.zeros(N, dtype=torch.int64, device=device)
    b = torch.where(is_chain, 0, b)  # [bs, N]; chain rows take no boundary
    chain_tok = chain_tokens.to(torch.int64)[:, row.clamp(max=shape.draft_len)]
    input_ids = torch.where(is_chain, chain_tok, suffix_tok)
    positions = prefix_lens.to(torch.int64)[:, None] + row_offsets(row, is_chain, b, i)
    chain_hi, own_lo = row_reach(row, is_chain, shape.draft_len, shape.suffix_len, k, b)
    mask = visible(row[None, None, :], row[None, :, None], chain_hi[..., None], own_lo[..., None])
    return input_ids.reshape(-1), positions.reshape(-1), mask.reshape(-1)


def _full_mask_positions(rows: int, prefix_lens: Tensor) -> Tensor:
    """[bs*N*N] where each QLEN_ONLY element lands in the FULL form (per request N x (P + N),
    row-major, concatenated): after the P committed columns of its row."""
    device = prefix_lens.device
    N = rows
    P = prefix_lens.to(torch.int64)
    bs = P.numel()
    starts = N * (torch.cumsum(P, 0) - P) + torch.arange(bs, device=device) * N * N
    r = torch.arange(N, device=device)
    return (
        starts[:, None, None] + r[None, :, None] * (P[:, None, None] + N) + P[:, None, None] + r[None, None, :]
    ).reshape(-1)


def full_mask(mask_qlen_only: Tensor, rows: int, prefix_lens: Tensor, prefix_sum: int) -> Tensor:
    """QLEN_ONLY [bs*N*N] -> FULL (per request N x (P + N), row-major, concatenated): every
    row sees the P committed columns, then its QLEN_ONLY row. `prefix_sum` (= sum of
    prefix_lens, known on the host) sizes the result, so there is no device sync."""
    bs = prefix_lens.numel()
    out = torch.ones(rows * prefix_sum + bs * rows * rows, dtype=torch.bool, device=mask_qlen_only.device)
    out[_full_mask_positions(rows, prefix_lens)] = mask_qlen_only.reshape(-1).to(torch.bool)
    return out


class FullMaskBuffer:
    """The FULL form of every round's mask, written in place into one buffer reserved at
    startup instead of allocated per round.

    The buffer is all True but for the current round's window blocks: a round writes its
    bs*N*N QLEN_ONLY elements where they land (`_full_mask_positions`) after setting the
    previous round's back to True, so its cost does not grow with the context, and whatever
    follows the round's FULL mask (a CUDA-graph replay's padded requests) reads True, as
    SGLang pads EAGLE's mask. `capacity` bounds N * sum(P) + bs * N * N over every round: N_max
    x (the KV pool's tokens + max_bs x N_max), since the committed tokens of a batch all live in
    the pool.
    """

    def __init__(self, capacity: int, device):
        self.buffer = torch.ones(capacity, dtype=torch.bool, device=device)
        self._written: Tensor | None = None  # positions of the last round's window blocks

    @classmethod
    def for_pools(cls, rows: int, max_bs: int, pool_tokens: int, context_len: int, device) -> "FullMaskBuffer":
        """The buffer for windows of `rows` rows over a KV pool of `pool_tokens` tokens, at most
        max_bs requests of at most context_len tokens: N * sum(P) + bs * N * N at most."""
        committed = min(pool_tokens, max_bs * context_len)
        return cls(rows * (committed + max_bs * rows), device)

    def write(self, mask_qlen_only: Tensor, rows: int, prefix_lens: Tensor, prefix_sum: int) -> Tensor:
        """The FULL mask of this round's window (a view of the buffer)."""
        size = rows * prefix_sum + prefix_lens.numel() * rows * rows
        if size > self.buffer.numel():
            raise RuntimeError(
                f"PARSE FULL mask of {size} elements exceeds its buffer of {self.buffer.numel()} "
                "(sized from the KV pool at startup)"
            )
        positions = _full_mask_positions(rows, prefix_lens)
        if self._written is not None:
            self.buffer[self._written] = True
        self.buffer[positions] = mask_qlen_only.reshape(-1).to(torch.bool)
        self._written = positions
        return self.buffer[:size]


class ShapeConstants:
    """Per-(batch size, window shape) tensors, made once on `device` and kept."""

    def __init__(self, device):
        self.device = device
        self._logits_rows: dict[tuple[int, WindowShape], torch.Tensor] = {}
        self._chains: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._made: dict = {}

    def cached(self, key, make):
        """`make()` on the first call with `key`, then the same object (constants of a batch shape
        that other modules define, e.g. `window_plan`'s nothing-drafted plan)."""
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]

    def logits_rows(self, batch_size: int, shape: WindowShape) -> torch.Tensor:
        """[batch_size * read_rows] window rows PARSE reads, request-major (`WindowShape.logits_rows`)."""
        key = (batch_size, shape)
        if key not in self._logits_rows:
            self._logits_rows[key] = shape.logits_rows(batch_size, self.device)
        return self._logits_rows[key]

    def chain_view(self, chain_tokens: torch.Tensor) -> "ChainView":
        """chain_tokens [bs, L+1] (c_n, d_1..d_L) as the topk=1 tree `eagle_sample` verifies:
        node j's only child is j + 1."""
        bs, width = chain_tokens.shape
        if (bs, width) not in self._chains:
            next_token = torch.arange(1, width + 1, dtype=torch.int64, device=self.device)
            next_token[-1] = -1
            self._chains[bs, width] = (
                torch.arange(bs * width, dtype=torch.int64, device=self.device).view(bs, width),
                next_token.repeat(bs, 1),
                torch.full((bs, width), -1, dtype=torch.int64, device=self.device),
            )
        index, next_token, next_sibling = self._chains[bs, width]
        return ChainView(chain_tokens.reshape(-1), width, index, next_token, next_sibling)


def shape_constants(model_runner) -> ShapeConstants:
    """The target model runner's `ShapeConstants` (made on first use; it lives as long as the
    runner, which is the process)."""
    constants = getattr(model_runner, "parse_shape_constants", None)
    if constants is None:
        constants = model_runner.parse_shape_constants = ShapeConstants(model_runner.device)
    return constants


@dataclass
class ChainView:
    """The chain rows of a PARSE window as the topk=1 tree `eagle_sample` verifies
    (`ShapeConstants.chain_view`).

    draft_token: [bs * (L+1)] c_n, d_1..d_L per request; node j's only child is j + 1.
    """

    draft_token: torch.Tensor
    draft_token_num: int
    retrieve_index: torch.Tensor
    retrieve_next_token: torch.Tensor
    retrieve_next_sibling: torch.Tensor
    positions: Optional[torch.Tensor] = None
    custom_mask: Optional[torch.Tensor] = None
    draft_probs: Optional[torch.Tensor] = None
    tree_topk: int = 1

    @property
    def max_tree_depth(self) -> int:
        return self.draft_token_num
