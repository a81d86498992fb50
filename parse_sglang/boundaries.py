"""Where segments end, and so where the probes go: prefix ends roughly every Δ draft tokens,
moved to a segment end.

A round reads the text of every draft token. `TokenTexts` decodes each token id once per
worker (its text as the tokenizer decodes it alone), so a round looks texts up instead of
calling the tokenizer.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate
from typing import Sequence


class TokenTexts:
    """Token id -> its text as `tokenizer.decode([id])` gives it, for every id of the model's
    vocabulary (ids the tokenizer does not know decode to ""), built once."""

    def __init__(self, tokenizer, vocab_size: int):
        size = max(vocab_size, len(tokenizer))
        self._texts = tokenizer.batch_decode([[i] for i in range(size)])

    def __call__(self, ids: Sequence[int]) -> list[str]:
        return [self._texts[i] for i in ids]


def _delimiter_hits(token_texts: Sequence[str], delimiters: Sequence[str]) -> list[tuple[int, int]]:
    """(anchor, end) of every occurrence of a delimiter in the tokens' joined text: the prefix
    length (1-based) whose last token holds the delimiter's last non-space character, and the
    character index just past the whole delimiter."""
    text = "".join(token_texts)
    token_ends = list(accumulate(len(piece) for piece in token_texts))  # exclusive char ends
    hits = []
    for delim in delimiters:
        start = text.find(delim)
        while start != -1:
            anchor = start + (len(delim.rstrip(" ")) or len(delim))
            hits.append((bisect_left(token_ends, anchor) + 1, start + len(delim)))
            start = text.find(delim, start + 1)
    return hits


def delimiter_ends(token_texts: Sequence[str], delimiters: Sequence[str]) -> list[int]:
    """Prefix lengths j (1-based) whose text ends a segment.

    A delimiter counts for the token holding its last non-space character: byte-level
    BPE glues a space to the word after it, so ". " ends at the "." token, not inside
    the next word; "\n" ends at the token holding the newline.
    """
    return sorted({anchor for anchor, _ in _delimiter_hits(token_texts, delimiters)})


def complete_delimiter_ends(token_texts: Sequence[str], delimiters: Sequence[str]) -> set[int]:
    """The prefix lengths j of `delimiter_ends` whose delimiter lies wholly within the first j
    tokens: `j in delimiter_ends(token_texts[:j])`, for every j at once."""
    token_ends = list(accumulate(len(piece) for piece in token_texts))
    return {anchor for anchor, end in _delimiter_hits(token_texts, delimiters) if end <= token_ends[anchor - 1]}


def probe_stride(stride: int, length: int) -> int:
    """Δ at a round of `length` drafts: the setting, at most half the round, so that every tier has
    room for an interior boundary (at L = Δ = 8 no segment end could be one)."""
    return max(1, min(stride, length // 2))


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
