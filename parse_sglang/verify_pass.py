"""A decode batch as PARSE's round reads and writes it in SGLang, and the round's one target
forward.

- `Committed`: where the batch stands before the round (P, its slots, c_n on the device).
- `set_lengths`: the batch's lengths as a forward of the round needs them (the worker overwrites
  SGLang's copies for the draft and the verify).
- `target_verify`: ONE TARGET_VERIFY forward over every request's window, at
  req_to_token[P : P + N] (SGLang over-allocates 2 * N_max slots a decode round), under the graph
  captured at the window's shape if any.
- `next_round_input`: what SGLang carries to the next round (filtered and merged with the batch).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
from sglang.srt.speculative.eagle_info import EagleDraftInput

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Committed:
    """Where a decode batch stands before the round (the worker overwrites the batch's copies)."""

    seq_lens: torch.Tensor  # [bs] P
    seq_lens_cpu: torch.Tensor
    rows: torch.Tensor  # [bs] req_pool_indices
    last_tokens: torch.Tensor  # [bs] c_n, on the device

    @classmethod
    def of(cls, batch: ScheduleBatch, device) -> "Committed":
        carried = batch.spec_info
        if (
            isinstance(carried, EagleDraftInput)
            and carried.bonus_tokens is not None
            and len(carried.bonus_tokens) == len(batch.reqs)
        ):
            last = carried.bonus_tokens
        else:  # not carried by SGLang (never seen): the host's copy, one more copy to the device
            logger.warning(
                "PARSE round without its carried input tokens (spec_info=%s): taken from the requests",
                type(carried).__name__,
            )
            last = torch.tensor([req.output_ids[-1] for req in batch.reqs], dtype=torch.int64).to(device)
        return cls(batch.seq_lens, batch.seq_lens_cpu, batch.req_pool_indices, last)


def set_lengths(batch: ScheduleBatch, committed: Committed) -> None:
    batch.seq_lens = committed.seq_lens
    batch.seq_lens_cpu = committed.seq_lens_cpu
    batch.seq_lens_sum = int(committed.seq_lens_cpu.sum())


def window_slots(req_to_token, committed: Committed, rows: int) -> torch.Tensor:
    """[bs * rows] the KV slots of each request's first `rows` window rows, P .. P + rows - 1."""
    slots = committed.seq_lens[:, None] + torch.arange(rows, device=committed.seq_lens.device)
    return req_to_token[committed.rows[:, None], slots].reshape(-1).to(torch.int64)


def target_verify(
    target_worker, verify_graphs, req_to_token, batch: ScheduleBatch, committed: Committed, window, aux: bool = False
):
    """The round's one target forward; returns chain logits [bs * (L+1), V], probe logits
    [bs, K, V], whether it replayed a graph, and with `aux` the target's EAGLE-3 aux hidden
    states of every window row [bs * rows, K*H] (an EAGLE-3 head's input), else None."""
    verify_input = window.verify_input
    verify_input.capture_hidden_mode = CaptureHiddenMode.FULL if aux else CaptureHiddenMode.NULL
    set_lengths(batch, committed)
    batch.forward_mode = ForwardMode.TARGET_VERIFY
    batch.spec_info = verify_input
    batch.input_ids = verify_input.input_ids
    batch.out_cache_loc = window_slots(req_to_token, committed, window.shape.rows)
    with verify_graphs.replaying(window.shape):
        out = target_worker.forward_batch_generation(batch, is_verify=True)
    bs = len(batch.reqs)
    chain, probes = window.shape.split_logits(out.logits_output.next_token_logits, bs)
    hidden = out.logits_output.hidden_states if aux else None
    return chain.reshape(bs * window.chain_rows, -1), probes, out.can_run_cuda_graph, hidden


def next_round_input(bonus: torch.Tensor) -> EagleDraftInput:
    """What SGLang carries to the next round for each request: its last emitted token, the
    next round's c_n."""
    bonus = bonus.to(torch.int64)
    return EagleDraftInput(
        topk_p=torch.ones(bonus.shape[0], 1, dtype=torch.float32, device=bonus.device),
        topk_index=bonus[:, None],
        bonus_tokens=bonus,
        hidden_states=None,
        capture_hidden_mode=CaptureHiddenMode.NULL,
    )
