"""Keeps the ranks of a tensor-parallel PARSE server in step (`--tp-size N`, docs/gpu.md §7).

Every TP rank's scheduler runs the same round on the same batch, and the model's own
collectives make the logits equal on every rank. What a rank decides on its own is not:
the draft tokens, the probe boundaries (placed on the host from the draft's text by the
tokenizer), the judge's τ comparisons, the target-phase cuts and the bonus token (drawn
from each rank's RNG for a sampled request). Ranks that disagreed on the window shape
would run collectives of different sizes (a hang); ranks that disagreed on the emitted
tokens would commit different sequences (silent divergence). So every rank uses rank 0's
decisions, two broadcasts per round over SGLang's TP group (`get_tp_group()`, the group
the draft shares with the target):

- `share_plan`: the host plan before the window is built (`window_plan.ProbePlan`: drafts,
  acceptable draft lengths, target-phase limits, judge flags and thresholds, boundaries),
  over the group's CPU (gloo) group, because it lives on the host: int32 [bs, 2L + 7];
- `share_accepted`: the acceptance decisions (emitted tokens with the bonus, accepted
  lengths, exact-match counts), over the device group (NCCL on a GPU): int32 [bs, L + 3].

With one rank both are the identity: a single-GPU server pays nothing.

Test hook, inert unless set (read once per scheduler process of a TP server; only ranks
!= 0 are perturbed): `PARSE_TEST_TP_FAULT=skew` moves every value of a rank's plan and
decisions by one before each broadcast (neighbouring token ids, lengths and boundaries off
by one, flags flipped), as ranks that disagreed would; the broadcasts must make that
harmless. `PARSE_TEST_TP_FAULT=skew-drafts-unsynced` moves only the plan's draft token ids
and skips the plan broadcast (the acceptance broadcast still runs, so the ranks keep
running the same collectives and cannot hang): what a server without the plan broadcast
does when the ranks' drafts differ. tests/test_sglang_tp.py uses both.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional, Sequence

import torch

from parse_sglang.packing import fields_of, pack, unpack

FAULT_ENV = "PARSE_TEST_TP_FAULT"
FAULTS = ("skew", "skew-drafts-unsynced")
ACCEPTED_FIELDS = ("emitted", "lengths", "exact_tokens")  # acceptance.Accepted


class TpSync:
    """Rank 0's plan and decisions on every rank of a TP group (module docstring)."""

    def __init__(self, group):
        """group: SGLang's `GroupCoordinator` of the ranks that serve one batch."""
        self.group = group
        self.enabled = group.world_size > 1
        self.is_source = group.rank_in_group == 0
        self.fault = _test_fault() if self.enabled else None  # every rank must know which broadcasts run

    @classmethod
    def of_tp_group(cls) -> "TpSync":
        from sglang.srt.distributed.parallel_state import get_tp_group

        return cls(get_tp_group())

    def share_plan(self, plan):
        """Rank 0's `ProbePlan` (host tensors): one broadcast over the CPU group."""
        if self.fault == "skew-drafts-unsynced":
            return plan if self.is_source else dataclasses.replace(plan, drafts=_neighbours(plan.drafts))
        return self._share(plan, [f.name for f in dataclasses.fields(plan)], self.group.cpu_group)

    def share_choice(self, *values: int) -> tuple[int, ...]:
        """Rank 0's choices of the round (an adaptive server's draft length, tier 0's steps): one
        broadcast over the CPU group, before the draft (its window shape must be every rank's)."""
        if not self.enabled:
            return values
        (shared,) = broadcast_packed([torch.tensor(values)], self.group.ranks[0], self.group.cpu_group)
        return tuple(int(v) for v in shared)

    def share_accepted(self, accepted):
        """Rank 0's acceptance decisions (`acceptance.Accepted`, device tensors): one broadcast
        over the device group."""
        return self._share(accepted, ACCEPTED_FIELDS, self.group.device_group)

    def _share(self, record, fields: Sequence[str], process_group):
        if not self.enabled:
            return record
        tensors = [getattr(record, name) for name in fields]
        if self.fault == "skew" and not self.is_source:
            tensors = [_neighbours(t) for t in tensors]
        shared = broadcast_packed(tensors, self.group.ranks[0], process_group)
        if self.is_source:
            return record
        return dataclasses.replace(record, **dict(zip(fields, shared)))


def broadcast_packed(tensors: Sequence[torch.Tensor], src: int, process_group) -> list[torch.Tensor]:
    """Broadcast per-request tensors (`packing`: same shapes on every rank) from global rank
    `src` as ONE int32 collective; returns the received tensors in their own shapes and dtypes."""
    packed = pack(tensors)
    torch.distributed.broadcast(packed, src=src, group=process_group)
    return unpack(packed, fields_of(tensors))


def _neighbours(values: torch.Tensor) -> torch.Tensor:
    """Test fault: every value moved by one and kept valid (v - 1, or 1 for 0; flags flipped)."""
    if values.dtype == torch.bool:
        return ~values
    return torch.where(values > 0, values - 1, torch.ones_like(values))


def _test_fault() -> Optional[str]:
    fault = os.environ.get(FAULT_ENV) or None
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"{FAULT_ENV}={fault!r} is invalid: allowed is one of {FAULTS} (a test hook)")
    return fault
