"""Verify-window layout: rows, positions, KV indices, masks, validation."""

import random

import pytest
import torch

from parse_sglang.attention.layout import VerifyRequest, build_verify_layout, expand_qlen_only_mask

# The docs/design.md §1 example: L=6, boundaries (2, 4, 6), suffix of m=2; prefix_len 5.
DIAGRAM = VerifyRequest(
    prefix_len=5, last_token=100, draft_ids=[11, 12, 13, 14, 15, 16], boundaries=[2, 4, 6], suffix_ids=[50, 51]
)
DIAGRAM_MASK = """
1000000 00 00 00
1100000 00 00 00
1110000 00 00 00
1111000 00 00 00
1111100 00 00 00
1111110 00 00 00
1111111 00 00 00
1110000 10 00 00
1110000 11 00 00
1111100 00 10 00
1111100 00 11 00
1111111 00 00 10
1111111 00 00 11
"""


def _rows(text):
    return torch.tensor([[c == "1" for c in line.replace(" ", "")] for line in text.strip().splitlines()])


def reference_qlen_mask(req: VerifyRequest) -> torch.Tensor:
    """The mask rule spelled out cell by cell."""
    L, K, m = len(req.draft_ids), len(req.boundaries), len(req.suffix_ids) if req.boundaries else 0
    n = 1 + L + K * m
    mask = torch.zeros(n, n, dtype=torch.bool)
    for j in range(L + 1):
        for c in range(j + 1):
            mask[j, c] = True
    for k, b in enumerate(req.boundaries):
        for i in range(m):
            r = 1 + L + k * m + i
            for c in range(b + 1):
                mask[r, c] = True
            for c in range(1 + L + k * m, r + 1):
                mask[r, c] = True
    return mask


def test_diagram_example():
    layout = build_verify_layout([DIAGRAM])
    assert layout.window_lens.tolist() == [13]
    assert layout.seq_lens.tolist() == [18]
    assert layout.input_ids.tolist() == [100, 11, 12, 13, 14, 15, 16, 50, 51, 50, 51, 50, 51]
    assert layout.positions.tolist() == [5, 6, 7, 8, 9, 10, 11, 8, 9, 10, 11, 12, 13]
    assert torch.equal(layout.mask_qlen_only.view(13, 13), _rows(DIAGRAM_MASK))
    full = layout.mask_full.view(13, 18)
    assert full[:, :5].all()
    assert torch.equal(full[:, 5:], _rows(DIAGRAM_MASK))
    assert layout.chain_rows.tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert layout.chain_indptr.tolist() == [0, 7]
    assert layout.probe_rows.tolist() == [8, 10, 12]
    assert layout.probe_boundaries.tolist() == [2, 4, 6]
    assert layout.probe_indptr.tolist() == [0, 3]
    assert layout.qo_indptr.tolist() == [0, 13] and layout.qo_indptr.dtype == torch.int32
    assert layout.kv_indptr.tolist() == [0, 18] and layout.kv_indptr.dtype == torch.int32
    assert layout.kv_indices.tolist() == list(range(18)) and layout.kv_indices.dtype == torch.int32
    assert layout.mask_qlen_only_indptr.tolist() == [0, 169]
    assert layout.mask_full_indptr.tolist() == [0, 13 * 18]


def test_given_slots():
    slots = torch.tensor([40, 7, 33, 2, 91] + [60, 61, 5, 6, 70, 71, 72, 8, 9, 10, 11, 12, 99])
    layout = build_verify_layout([DIAGRAM], kv_slots=[slots])
    assert layout.kv_indices.tolist() == slots.tolist()
    assert layout.out_cache_loc.tolist() == slots[5:].tolist()


def test_batch_of_three():
    reqs = [
        VerifyRequest(prefix_len=3, last_token=1, draft_ids=[10, 11, 12], boundaries=[1, 3], suffix_ids=[7, 8, 9]),
        VerifyRequest(prefix_len=0, last_token=2, draft_ids=[20, 21], boundaries=[], suffix_ids=[7, 8, 9]),
        VerifyRequest(prefix_len=8, last_token=3, draft_ids=[30], boundaries=[1], suffix_ids=[5]),
    ]
    slots = [torch.arange(100, 113), torch.arange(200, 203), torch.arange(300, 311)]
    layout = build_verify_layout(reqs, kv_slots=slots)
    assert layout.num_requests == 3
    assert layout.window_lens.tolist() == [10, 3, 3]
    assert layout.seq_lens.tolist() == [13, 3, 11]
    assert layout.qo_indptr.tolist() == [0, 10, 13, 16]
    assert layout.kv_indptr.tolist() == [0, 13, 16, 27]
    assert layout.kv_indices.tolist() == torch.cat(slots).tolist()
    assert layout.out_cache_loc.tolist() == list(range(103, 113)) + [200, 201, 202] + [308, 309, 310]
    assert layout.input_ids.tolist() == [1, 10, 11, 12, 7, 8, 9, 7, 8, 9] + [2, 20, 21] + [3, 30, 5]
    assert layout.positions.tolist() == [3, 4, 5, 6, 5, 6, 7, 7, 8, 9] + [0, 1, 2] + [8, 9, 10]
    assert layout.chain_rows.tolist() == [0, 1, 2, 3, 10, 11, 12, 13, 14]
    assert layout.chain_indptr.tolist() == [0, 4, 7, 9]
    assert layout.probe_rows.tolist() == [6, 9, 15]
    assert layout.probe_boundaries.tolist() == [1, 3, 1]
    assert layout.probe_indptr.tolist() == [0, 2, 2, 3]
    assert layout.mask_qlen_only_indptr.tolist() == [0, 100, 109, 118]
    assert layout.mask_full_indptr.tolist() == [0, 130, 139, 172]
    for i, req in enumerate(reqs):
        n, p = int(layout.window_lens[i]), req.prefix_len
        qlen = layout.mask_qlen_only[layout.mask_qlen_only_indptr[i] : layout.mask_qlen_only_indptr[i + 1]].view(n, n)
        assert torch.equal(qlen, reference_qlen_mask(req))
        full = layout.mask_full[layout.mask_full_indptr[i] : layout.mask_full_indptr[i + 1]].view(n, p + n)
        assert full[:, :p].all() and torch.equal(full[:, p:], qlen)
    # The request without probes is plain causal.
    assert torch.equal(layout.mask_qlen_only[100:109].view(3, 3), torch.ones(3, 3, dtype=torch.bool).tril())


def test_random_batches_match_reference():
    rng = random.Random(0)
    for _ in range(20):
        reqs = []
        for _ in range(rng.randint(1, 4)):
            L = rng.randint(1, 20)
            bounds = sorted(rng.sample(range(1, L + 1), rng.randint(0, min(L, 5))))
            reqs.append(
                VerifyRequest(
                    prefix_len=rng.randint(0, 12),
                    last_token=rng.randint(0, 99),
                    draft_ids=[rng.randint(0, 99) for _ in range(L)],
                    boundaries=bounds,
                    suffix_ids=[rng.randint(0, 99) for _ in range(rng.randint(1 if bounds else 0, 4))],
                )
            )
        layout = build_verify_layout(reqs)
        expected_mask, expected_pos, expected_ids = [], [], []
        for req in reqs:
            expected_mask.append(reference_qlen_mask(req).flatten())
            L, P = len(req.draft_ids), req.prefix_len
            expected_pos += [P + j for j in range(L + 1)]
            expected_ids += [req.last_token, *req.draft_ids]
            for b in req.boundaries:
                expected_pos += [P + 1 + b + i for i in range(len(req.suffix_ids))]
                expected_ids += list(req.suffix_ids)
        assert torch.equal(layout.mask_qlen_only, torch.cat(expected_mask))
        assert layout.positions.tolist() == expected_pos
        assert layout.input_ids.tolist() == expected_ids
        assert torch.equal(
            layout.mask_full, expand_qlen_only_mask(layout.mask_qlen_only, layout.prefix_lens, layout.window_lens)
        )
        # Chain rows hold c_n, d_1..d_L; probe rows are the last row of each block.
        assert layout.input_ids[layout.chain_rows].tolist() == [t for r in reqs for t in (r.last_token, *r.draft_ids)]
        assert layout.input_ids[layout.probe_rows].tolist() == [r.suffix_ids[-1] for r in reqs for _ in r.boundaries]


def test_expand_qlen_only_mask_size_check():
    with pytest.raises(ValueError, match=r"mask_qlen_only: has 5 elements.*= 4"):
        expand_qlen_only_mask(torch.ones(5, dtype=torch.bool), torch.tensor([3]), torch.tensor([2]))


def _req(**changes):
    fields = dict(prefix_len=2, last_token=1, draft_ids=[5, 6, 7], boundaries=[1, 3], suffix_ids=[9])
    fields.update(changes)
    return VerifyRequest(**fields)


@pytest.mark.parametrize(
    "bad, pattern",
    [
        (_req(draft_ids=[]), r"requests\[1\]\.draft_ids: empty"),
        (_req(boundaries=[2, 2]), r"requests\[1\]\.boundaries: \[2, 2\] is not strictly increasing"),
        (_req(boundaries=[3, 1]), r"requests\[1\]\.boundaries: \[3, 1\] is not strictly increasing"),
        (_req(boundaries=[0, 2]), r"requests\[1\]\.boundaries: \[0, 2\] has 0 at 0; each must lie in \[1, 3\]"),
        (_req(boundaries=[1, 4]), r"requests\[1\]\.boundaries: \[1, 4\] has 4 at 1; each must lie in \[1, 3\]"),
        (_req(suffix_ids=[]), r"requests\[1\]\.suffix_ids: empty with 2 boundaries"),
        (_req(prefix_len=-1), r"requests\[1\]\.prefix_len: -1 is negative"),
    ],
)
def test_request_validation(bad, pattern):
    with pytest.raises(ValueError, match=pattern):
        build_verify_layout([_req(), bad])


def test_kv_slots_validation():
    req = _req()  # prefix 2 + window 1 + 3 + 2*1 = 8
    with pytest.raises(ValueError, match=r"kv_slots\[0\]: shape \(7,\); must be 1-D of length .* = 8"):
        build_verify_layout([req], kv_slots=[torch.arange(7)])
    with pytest.raises(ValueError, match=r"kv_slots: 2 tensors for 1 requests"):
        build_verify_layout([req], kv_slots=[torch.arange(8), torch.arange(8)])
    with pytest.raises(ValueError, match=r"requests: empty"):
        build_verify_layout([])


def test_no_probe_suffix_is_ignored():
    layout = build_verify_layout([_req(boundaries=[], suffix_ids=[])])
    assert layout.window_lens.tolist() == [4]
    assert layout.probe_rows.numel() == 0 and layout.probe_indptr.tolist() == [0, 0]
