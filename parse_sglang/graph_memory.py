"""What PARSE reserves on the device when its draft and verify run under CUDA graphs.

SGLang's graph runners size their static buffers for the widest batch they capture, and a
PARSE verify batch is wide: max_bs requests x N_max rows. At startup (main process, once the
server arguments are resolved) this module computes, logs and bounds what that costs:

- the target verify graphs' FlashInfer KV-index buffers: max_bs * N * context_len int32 for
  each captured window width N (SGLang sizes them as if every verify row could read a whole
  context): N_max, the chain-only L + 1 where the window has probe rows (a batch in which no
  request probes replays it), and with adaptive draft lengths both widths of every tier;
- PARSE's FULL custom-mask buffer, reserved once and written in place every round
  (`attention.window.FullMaskBuffer`): at most max_bs * N_max * (context_len + N_max) bytes;
- the draft chains' multi-step KV-index buffers: (L + 2) * max_bs * context_len int32 per draft
  length L (one, or one per adaptive tier);
- the graphs' shared logits buffer, fp32 x vocabulary: max_bs * (L + 1 + K_max) rows, the rows
  PARSE reads (scheduler_patches/verify_graph.py; SGLang alone would reserve max_bs * N_max);
- with an EAGLE-3 head (`eagle3_head`, k steps): the verify graphs' aux hidden-state buffers,
  max_bs * N * (K aux layers x hidden) of the model's dtype per captured width N (the head reads
  them), and the head's k-step chain and (k + 1)-row extend KV indices, (2k + 1) * max_bs *
  context_len int32 (its head-round verify width k + 1 is among the widths above).

SGLang prices none of these (its graph reserve is ~2 MB per captured request), so they come
out of the memory it leaves outside its static pool, GPU memory x (1 - mem_fraction_static).
A configuration whose reservations exceed that is refused with the settings that size them.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True)
class GraphReservations:
    max_bs: int
    window_rows: int  # N_max
    read_rows: int  # L + 1 + K_max
    verify_widths: tuple[int, ...]  # every captured verify width N (N_max among them)
    draft_steps: tuple[int, ...]  # L + 2 of every draft chain
    context_len: int
    vocab_size: int
    head_steps: int = 0  # k of an EAGLE-3 head (0: none)
    aux_width: int = 0  # K * hidden: the aux hidden states a head reads per verify row
    dtype_bytes: int = 2  # of the target's activations

    @property
    def verify_kv_indices(self) -> int:
        return self.max_bs * sum(self.verify_widths) * self.context_len * 4

    @property
    def verify_custom_mask(self) -> int:
        return self.max_bs * self.window_rows * (self.context_len + self.window_rows)

    @property
    def draft_kv_indices(self) -> int:
        return sum(self.draft_steps) * self.max_bs * self.context_len * 4

    @property
    def head(self) -> int:
        """An EAGLE-3 head's: the verify graphs' aux buffers, its chain's and extend's KV indices."""
        if not self.head_steps:
            return 0
        aux = self.max_bs * sum(self.verify_widths) * self.aux_width * self.dtype_bytes
        return aux + (2 * self.head_steps + 1) * self.max_bs * self.context_len * 4

    @property
    def logits(self) -> int:
        return self.max_bs * self.read_rows * self.vocab_size * 4

    @property
    def logits_unpruned(self) -> int:
        """What SGLang's own sizing would reserve for the logits buffer."""
        return self.max_bs * self.window_rows * self.vocab_size * 4

    @property
    def total(self) -> int:
        return self.verify_kv_indices + self.verify_custom_mask + self.draft_kv_indices + self.logits + self.head

    def describe(self) -> str:
        parts = {
            "verify KV indices": self.verify_kv_indices,
            "FULL custom mask": self.verify_custom_mask,
            "draft-chain KV indices": self.draft_kv_indices,
            "logits": self.logits,
        }
        if self.head_steps:
            parts["EAGLE-3 head"] = self.head
        listed = ", ".join(f"{name} {size / MIB:.0f} MiB" for name, size in parts.items())
        return (
            f"{self.total / MIB:.0f} MiB ({listed}; max_bs={self.max_bs}, N_max={self.window_rows}, "
            f"context_len={self.context_len}, vocab={self.vocab_size}; the logits buffer alone "
            f"would be {self.logits_unpruned / MIB:.0f} MiB unpruned)"
        )


def check_fits(reservations: GraphReservations, device_mib: float, mem_fraction_static: float) -> None:
    """Refuse (ValueError naming the settings) reservations above the memory SGLang leaves
    outside its static pool."""
    headroom = device_mib * (1.0 - mem_fraction_static) * MIB
    if reservations.total > headroom:
        raise ValueError(
            f"PARSE's CUDA-graph reservations need {reservations.describe()}, more than the "
            f"{headroom / MIB:.0f} MiB SGLang leaves outside its static pool (device {device_mib:.0f} MiB x "
            f"(1 - --mem-fraction-static={mem_fraction_static})). Allowed are reservations within that: "
            f"lower --cuda-graph-max-bs / --max-running-requests (max_bs={reservations.max_bs}), "
            f"--context-length ({reservations.context_len}), --speculative-num-steps or raise probe_stride "
            f"(N_max={reservations.window_rows}), lower --mem-fraction-static, or --disable-cuda-graph"
        )
