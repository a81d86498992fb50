"""The device-built verify window (attention/window.py, window_plan.py): the same rows,
positions and masks as the reference layout, request-major logits rows, and a per-round
host cost that does not grow with the context."""

import random

import pytest
import torch

from parse_sglang.attention.layout import VerifyRequest, build_verify_layout
from parse_sglang.attention.window import WindowShape, full_mask, window_inputs
from support.host_traffic import HostTraffic


def test_device_window_equals_reference_layout():
    """Random uniform batches (one L, K, m): input ids, positions, QLEN_ONLY and FULL masks equal
    `build_verify_layout`'s, and the logits rows are its chain and probe rows, request-major."""
    rng = random.Random(0)
    for trial in range(60):
        bs, L = rng.randint(1, 5), rng.randint(1, 9)
        K = rng.randint(0, min(L, 4))
        m = rng.randint(1, 4) if K else 0
        suffix = [rng.randrange(100) for _ in range(m)]
        reqs = [
            VerifyRequest(
                rng.randint(0, 12),
                rng.randrange(100),
                [rng.randrange(100) for _ in range(L)],
                sorted(rng.sample(range(1, L + 1), K)),
                suffix,
            )
            for _ in range(bs)
        ]
        layout = build_verify_layout(reqs)
        shape = WindowShape(L, K, m)
        prefix = torch.tensor([r.prefix_len for r in reqs])
        ids, positions, mask = window_inputs(
            shape,
            prefix,
            torch.tensor([[r.last_token, *r.draft_ids] for r in reqs]),
            torch.tensor([r.boundaries for r in reqs], dtype=torch.int64).view(bs, K),
            torch.tensor(suffix, dtype=torch.int64),
        )
        assert torch.equal(ids, layout.input_ids), trial
        assert torch.equal(positions, layout.positions), trial
        assert torch.equal(mask, layout.mask_qlen_only), trial
        assert torch.equal(full_mask(mask, shape.rows, prefix, int(prefix.sum())), layout.mask_full), trial
        expected = []
        for b in range(bs):
            expected += layout.chain_rows[layout.chain_indptr[b] : layout.chain_indptr[b + 1]].tolist()
            expected += layout.probe_rows[layout.probe_indptr[b] : layout.probe_indptr[b + 1]].tolist()
        assert shape.logits_rows(bs, "cpu").tolist() == expected, trial


def test_one_row_window_is_a_decode_step():
    """L = 0 (an adaptive tier-0 round): each request's one row is c_n at position P, seeing its
    P committed tokens and itself (FULL form: P + 1 True per request)."""
    prefix = torch.tensor([0, 5, 3])
    ids, positions, mask = window_inputs(
        WindowShape(0, 0, 0),
        prefix,
        torch.tensor([[7], [8], [9]], dtype=torch.int32),
        torch.zeros(3, 0, dtype=torch.int64),
        torch.zeros(0, dtype=torch.int64),
    )
    assert ids.tolist() == [7, 8, 9] and ids.dtype == torch.int64
    assert positions.tolist() == [0, 5, 3]
    assert mask.tolist() == [True] * 3
    assert full_mask(mask, 1, prefix, 8).tolist() == [True] * (8 + 3)


def test_split_logits_reads_request_major_rows():
    shape = WindowShape(draft_len=3, num_probes=2, suffix_len=5)
    bs, vocab = 3, 7
    logits = torch.randn(bs * shape.read_rows + 4, vocab)  # a padded graph batch has more rows
    chain, probes = shape.split_logits(logits, bs)
    assert chain.shape == (bs, 4, vocab) and probes.shape == (bs, 2, vocab)
    assert torch.equal(chain[1, 0], logits[shape.read_rows]) and torch.equal(probes[2, 1], logits[3 * 6 - 1])


def test_window_shape_refuses_probes_without_suffix():
    with pytest.raises(ValueError, match="probes need a judge suffix"):
        WindowShape(draft_len=4, num_probes=2, suffix_len=0)


# ----- host cost per round ---------------------------------------------------------------

BATCH, DRAFT, STRIDE, SUFFIX = 8, 32, 8, 23  # the defaults' window: K_max = 4, N_max = 125
CONTEXTS = (1024, 8192, 32768)


def test_round_metadata_cost_does_not_grow_with_context(tmp_path, cpu_runtime):
    """One round's window planning with its device tensors on `meta`, counted: host bytes,
    host-to-device bytes and device bytes per round are the same at contexts 1k, 8k and 32k
    (O(batch x window); the FULL mask is written into a buffer reserved once). The same count
    on the host-built reference layout grows with the context, so the count can tell."""
    from conftest import probe_config
    from parse_sglang.window_plan import RequestPolicy
    from support.offline_round import OfflineRound
    from support.tiny_models import build_tokenizer

    tokenizer = build_tokenizer(tmp_path)
    torch.manual_seed(0)
    drafts_host = torch.randint(0, len(tokenizer), (BATCH, DRAFT))
    policy = RequestPolicy(probe_config(draft_budget=DRAFT, probe_stride=STRIDE), DRAFT, True, frozenset())
    rows = 1 + DRAFT + 4 * SUFFIX
    planner = OfflineRound(tokenizer, policy, BATCH, SUFFIX, rows, max(CONTEXTS), "meta")
    planner.plan(drafts_host, CONTEXTS[0], fixed_probes=DRAFT // STRIDE)  # per-shape constants, made once
    rounds = []
    for context in CONTEXTS:
        with HostTraffic() as traffic:
            window = planner.plan(drafts_host, context, fixed_probes=DRAFT // STRIDE)
        assert window.shape.rows == rows
        rounds.append(traffic)
    for name in ("host_bytes", "to_device_bytes", "device_bytes"):
        assert len({getattr(r, name) for r in rounds}) == 1, name
    assert rounds[0].host_bytes < BATCH * 2000 * 8  # a few hundred numbers per request
    assert rounds[0].to_device_bytes < BATCH * 200 * 4  # the one packed plan

    host_built = []
    for context in (1024, 8192):
        with HostTraffic() as traffic:
            build_verify_layout([VerifyRequest(context, 0, list(range(DRAFT)), [8, 16, 24, 32], [0] * SUFFIX)])
        host_built.append(traffic.host_bytes)
    assert host_built[1] - host_built[0] >= rows * (8192 - 1024)  # at least the FULL mask's growth


def test_full_mask_buffer_equals_a_fresh_full_mask_round_after_round():
    """Rounds of different committed lengths written into one buffer give the FULL mask
    `full_mask` builds afresh, and leave True past it (what a padded graph batch reads)."""
    from parse_sglang.attention.window import FullMaskBuffer

    shape, rng = WindowShape(draft_len=4, num_probes=2, suffix_len=2), random.Random(1)
    buffer = FullMaskBuffer(shape.rows * (3 * 40 + 3 * shape.rows), "cpu")
    for _ in range(6):
        bs = rng.randint(1, 3)
        prefix = torch.tensor([rng.randint(0, 40) for _ in range(bs)])
        chain = torch.randint(0, 50, (bs, 5))
        bounds = torch.tensor([sorted(rng.sample(range(1, 5), 2)) for _ in range(bs)])
        _, _, mask = window_inputs(shape, prefix, chain, bounds, torch.tensor([7, 8]))
        written = buffer.write(mask, shape.rows, prefix, int(prefix.sum()))
        assert torch.equal(written, full_mask(mask, shape.rows, prefix, int(prefix.sum())))
        assert bool(buffer.buffer[written.numel() :].all())
