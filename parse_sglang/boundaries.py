"""Where the probes go: prefix ends roughly every Δ draft tokens, moved to a segment end."""

from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate
from typing import Sequence


def delimiter_ends(token_texts: Sequence[str], delimiters: Sequence[str]) -> list[int]:
    """Prefix lengths j (1-based) whose text ends a segment.

    A delimiter counts for the token holding its last non-space character: byte-level
    BPE glues a space to the word after it, so ". " ends at the "." token, not inside
    the next word; "\n" ends at the token holding the newline.
    """
    text = "".join(token_texts)
    token_ends = list(accumulate(len(piece) for piece in token_texts))  # exclusive char ends
    found = set()
    for delim in delimiters:
        start = text.find(delim)
        while start != -1:
            anchor = start + (len(delim.rstrip(" ")) or len(delim))
            found.add(bisect_left(token_ends, anchor) + 1)
            start = text.find(delim, start + 1)
    return sorted(found)


def select_boundaries(token_texts: Sequence[str], stride: int, delimiters: Sequence[str]) -> list[int]:
    """b_1 < … < b_K: after each boundary, the next is the first segment end at least
    `stride` tokens later; the last boundary is always the end of the draft."""
    length = len(token_texts)
    if length == 0:
        raise ValueError("draft is empty: boundaries need at least one draft token")
    if stride < 1:
        raise ValueError(f"probe_stride={stride!r} is invalid: allowed is an integer >= 1")
    bounds: list[int] = []
    for end in delimiter_ends(token_texts, delimiters):
        if end < length and end >= (bounds[-1] if bounds else 0) + stride:
            bounds.append(end)
    bounds.append(length)
    return bounds


def draft_boundaries(tokenizer, draft_ids: Sequence[int], stride: int, delimiters: Sequence[str]) -> list[int]:
    """select_boundaries on the draft's per-token text (each token decoded on its own)."""
    texts = tokenizer.batch_decode([[int(t)] for t in draft_ids])
    return select_boundaries(texts, stride, delimiters)
