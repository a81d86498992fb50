"""Mask bit packing vs numpy.packbits, whole and per segment (FlashInfer's layout)."""

import numpy as np
import pytest
import torch

from parse_sglang.attention.layout import VerifyRequest, build_verify_layout
from sglang_cpu.packbits import packbits, segment_packbits, unpack_segments, unpackbits


@pytest.mark.parametrize("bitorder", ["little", "big"])
def test_packbits_matches_numpy(bitorder):
    rng = np.random.default_rng(0)
    for n in [0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 100, 1001]:
        bits = rng.random(n) < 0.5
        packed = packbits(torch.from_numpy(bits), bitorder)
        assert packed.dtype == torch.uint8
        assert packed.numpy().tolist() == np.packbits(bits, bitorder=bitorder).tolist()
        assert unpackbits(packed, n, bitorder).numpy().tolist() == bits.tolist()


def test_little_order_example():
    # Bit i of a byte is element i: [1,0,1,1,0,0,1,1] -> 0b11001101.
    x = torch.tensor([1, 0, 1, 1, 0, 0, 1, 1], dtype=torch.bool)
    assert packbits(x).tolist() == [0b11001101]
    assert packbits(x, "big").tolist() == [0b10110011]


def test_flashinfer_docstring_example():
    # flashinfer.quantization.segment_packbits's documented example (bitorder="big").
    x = torch.tensor([1, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1], dtype=torch.bool)
    packed, indptr = segment_packbits(x, torch.tensor([0, 4, 7, 11]), bitorder="big")
    assert packed.tolist() == [0b10110000, 0b100000, 0b11010000]
    assert indptr.tolist() == [0, 1, 2, 3] and indptr.dtype == torch.int32


@pytest.mark.parametrize("seed", range(5))
def test_segment_packbits_matches_numpy_per_segment(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 40, size=rng.integers(1, 8))
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    bits = rng.random(indptr[-1]) < 0.5
    expected = [np.packbits(bits[s:e], bitorder="little") for s, e in zip(indptr, indptr[1:])]
    packed, packed_indptr = segment_packbits(torch.from_numpy(bits), torch.from_numpy(indptr))
    assert packed.numpy().tolist() == np.concatenate(expected).tolist()
    assert packed_indptr.tolist() == np.concatenate([[0], np.cumsum([len(e) for e in expected])]).tolist()
    assert unpack_segments(packed, torch.from_numpy(indptr)).numpy().tolist() == bits.tolist()


def test_verify_mask_round_trip():
    reqs = [
        VerifyRequest(prefix_len=5, last_token=1, draft_ids=[2] * 6, boundaries=[2, 4, 6], suffix_ids=[3, 4]),
        VerifyRequest(prefix_len=3, last_token=1, draft_ids=[2] * 3, boundaries=[], suffix_ids=[]),
    ]
    layout = build_verify_layout(reqs)
    packed, packed_indptr = segment_packbits(layout.mask_full, layout.mask_full_indptr)
    # 13 x 18 = 234 bits -> 30 bytes; 4 x 7 = 28 bits -> 4 bytes.
    assert packed_indptr.tolist() == [0, 30, 34]
    assert torch.equal(unpack_segments(packed, layout.mask_full_indptr), layout.mask_full)


def test_bad_arguments():
    with pytest.raises(ValueError, match="bitorder: 'middle'; allowed: little, big"):
        packbits(torch.ones(3, dtype=torch.bool), "middle")
    with pytest.raises(ValueError, match=r"x: shape \(2, 2\)"):
        packbits(torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"indptr: must be non-decreasing and end at len\(x\) = 5"):
        segment_packbits(torch.ones(5, dtype=torch.bool), torch.tensor([0, 3, 4]))
