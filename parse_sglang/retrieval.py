"""Free drafts: what a request writes next, copied from text it has already seen (docs/retrieval.md).

A request's copy is the continuation that followed the longest earlier occurrence of its text's
last tokens (prompt lookup decoding; SuffixDecoding's per-request tree), in its own prompt and
output, or in the outputs of requests that finished on this server: the longer match wins, the
request's own on a tie. It is drafted on the host, from tokens the host already holds: no model,
no device work, no host sync. The worker verifies it in the round's one target forward, like the
draft model's chain (parse_sglang/worker.py), and the adaptive controller prices it beside the
draft model's tiers (parse_sglang/adaptive.py).

- `SuffixAutomaton`: an online suffix automaton over a token stream (O(1) amortised per token):
  the longest suffix of the stream that also ends earlier in it, and the longest suffix of any
  token sequence that occurs in the stream, each with where its first occurrence ends.
- `RecentOutputs`: the server-wide corpus, finished requests' outputs, at most `max_tokens` tokens
  in one automaton (2 states a token at most), rebuilt from the newer outputs when full.
- `CopyKeep`: P(a reached copied token is kept), a Beta posterior per match-length bin.
- `Retrieval`: the server's copies for a batch (`propose`) and its corpus's upkeep.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from parse_sglang.request_state import state_of

CORPUS_MATCH = 64  # the last tokens of a request matched against the corpus (a longer match counts as this)
MATCH_BINS = (4, 8, 16, 32)  # CopyKeep's bins of match length: < 4, 4-7, 8-15, 16-31, >= 32
KEEP_DECAY = 0.98  # weight of the past per observed copy, per bin
KEEP_PRIOR = (1.0, 1.0)  # (kept, rejected) positions' worth before any copy of a bin: Beta(1, 1)


class SuffixAutomaton:
    """The suffix automaton of `tokens` (Blumer et al.), built one token at a time; state 0 is the
    root. A state is a class of substrings with the same end positions; `end` holds the first
    of them (the index of the substring's last token in `tokens`)."""

    __slots__ = ("tokens", "next", "link", "length", "end", "last")

    def __init__(self, tokens: Sequence[int] = ()):
        self.tokens: list[int] = []
        self.next: list[dict] = [{}]  # state -> {token: state}
        self.link = [-1]  # suffix link
        self.length = [0]  # the longest substring of the state
        self.end = [-1]  # where its first occurrence ends
        self.last = 0  # the state of the whole stream
        for token in tokens:
            self.extend(token)

    @property
    def states(self) -> int:
        return len(self.next)

    def _state(self, length: int, link: int, end: int, moves: dict) -> int:
        self.next.append(moves)
        self.link.append(link)
        self.length.append(length)
        self.end.append(end)
        return len(self.next) - 1

    def extend(self, token: int) -> None:
        self.tokens.append(token)
        cur = self._state(self.length[self.last] + 1, 0, len(self.tokens) - 1, {})
        p = self.last
        while p != -1 and token not in self.next[p]:
            self.next[p][token] = cur
            p = self.link[p]
        if p != -1:
            q = self.next[p][token]
            if self.length[p] + 1 == self.length[q]:
                self.link[cur] = q
            else:
                clone = self._state(self.length[p] + 1, self.link[q], self.end[q], dict(self.next[q]))
                while p != -1 and self.next[p].get(token) == q:
                    self.next[p][token] = clone
                    p = self.link[p]
                self.link[q] = self.link[cur] = clone
        self.last = cur

    def earlier(self) -> tuple[int, int]:
        """(n, e): the longest suffix of the stream, n tokens, that also ends earlier, first at
        index e < len(tokens) - 1; n = 0 where the last token is new."""
        state = self.link[self.last]
        return self.length[state], self.end[state]

    def match(self, tokens: Sequence[int]) -> tuple[int, int]:
        """(n, e): the longest suffix of `tokens`, n tokens, that occurs in the stream, first
        ending at index e (n = 0: none)."""
        state, n = 0, 0
        for token in tokens:
            while state and token not in self.next[state]:
                state = self.link[state]
                n = self.length[state]
            if token in self.next[state]:
                state, n = self.next[state][token], n + 1
        return n, self.end[state]


@dataclass(frozen=True)
class Copy:
    """A request's retrieved continuation for this round."""

    tokens: tuple[int, ...]  # what followed the match, at most the round's length
    match: int  # tokens of the request's text that matched


def continuation(stream: Sequence[int], end: int, length: int) -> tuple[int, ...]:
    """Up to `length` tokens after index `end` of `stream`, stopping at a separator (< 0)."""
    out = []
    for token in stream[end + 1 : end + 1 + length]:
        if token < 0:
            break
        out.append(token)
    return tuple(out)


class RecentOutputs:
    """Finished requests' outputs, newest last, at most `max_tokens` tokens with their separators
    (a distinct negative token before each output, so that no match crosses two), in one
    `SuffixAutomaton`; when an output does not fit, the oldest are dropped until the rest fill
    at most half and the automaton is rebuilt from them (amortised O(1) a token)."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self.outputs: collections.deque = collections.deque()
        self.index = SuffixAutomaton()
        self._separator = 0

    def add(self, output: Sequence[int]) -> None:
        output = list(output[-(self.max_tokens // 2 - 1) :]) if self.max_tokens > 2 else []
        if not output:
            return
        if len(self.index.tokens) + len(output) + 1 > self.max_tokens:
            kept = sum(len(o) + 1 for o in self.outputs)
            while self.outputs and kept + len(output) + 1 > self.max_tokens // 2:
                kept -= len(self.outputs.popleft()) + 1
            self.index = SuffixAutomaton()
            for old in self.outputs:
                self._feed(old)
        self.outputs.append(output)
        self._feed(output)

    def _feed(self, output: list) -> None:
        self._separator -= 1
        self.index.extend(self._separator)
        for token in output:
            self.index.extend(token)

    def copy(self, text: Sequence[int], length: int) -> Optional[Copy]:
        """The continuation of `text`'s longest suffix match here, or None."""
        n, end = self.index.match(text[-CORPUS_MATCH:])
        tokens = continuation(self.index.tokens, end, length) if n else ()
        return Copy(tokens, n) if tokens else None


@dataclass
class CopyKeep:
    """P(a reached copied token is kept | its copy's match length): per bin of MATCH_BINS, decayed
    (KEEP_DECAY per copy) kept and rejected positions and a Beta(KEEP_PRIOR) prior; a copy of n
    tokens keeps its j-th with E[r^j] = prod_{i<j} (a + i) / (a + b + i), as a request's draft curve
    does (`adaptive.KeepRate`)."""

    kept: list = field(default_factory=lambda: [0.0] * (len(MATCH_BINS) + 1))
    rejected: list = field(default_factory=lambda: [0.0] * (len(MATCH_BINS) + 1))

    @staticmethod
    def bin(match: int) -> int:
        return sum(match >= edge for edge in MATCH_BINS)

    def alive(self, match: int, length: int) -> list[float]:
        """[1, S(1), ..., S(length)]: the chance that each copied position is kept."""
        k = self.bin(match)
        a, b = self.kept[k] + KEEP_PRIOR[0], self.rejected[k] + KEEP_PRIOR[1]
        alive = [1.0]
        for i in range(length):
            alive.append(alive[-1] * (a + i) / (a + b + i))
        return alive

    def observe(self, match: int, copied: int, accepted: int) -> None:
        k = self.bin(match)
        self.kept[k] = KEEP_DECAY * self.kept[k] + accepted
        self.rejected[k] = KEEP_DECAY * self.rejected[k] + float(accepted < copied)


def copy_budgets(policies) -> list[int]:
    """Each request's most copied tokens a round (`RequestPolicy`s): its draft budget where its
    settings retrieve, else 0."""
    return [p.budget if p.config.retrieval else 0 for p in policies]


class Retrieval:
    """The server's copies (module docstring): `min_match` tokens of a request's text must match;
    `corpus_tokens` bound the finished outputs it also searches (0: only the request's own text)."""

    def __init__(self, min_match: int, corpus_tokens: int):
        self.min_match = min_match
        self.corpus = RecentOutputs(corpus_tokens) if corpus_tokens else None
        self._running: dict = {}  # rid -> req, the requests of the last batch

    def propose(self, reqs, budgets: Sequence[int]) -> list[Optional[Copy]]:
        """Each request's copy of at most budgets[i] tokens (None: no match of min_match tokens).
        Its own text, prompt and output up to c_n, is indexed once and extended by what each round
        committed; requests of the last batch that left it finished feed the corpus."""
        self._retire(reqs)
        copies = []
        for req, budget in zip(reqs, budgets):
            index = self._text_index(req)
            n, end = index.earlier()
            best = Copy(continuation(index.tokens, end, budget), n) if n >= self.min_match else None
            if self.corpus is not None:
                other = self.corpus.copy(index.tokens, budget)
                if other is not None and other.match >= self.min_match and (best is None or other.match > best.match):
                    best = other
            copies.append(best if best is not None and best.tokens and budget > 0 else None)
        return copies

    @staticmethod
    def _text_index(req) -> SuffixAutomaton:
        """The request's own text, prompt then output up to c_n (the round's input), indexed: its
        prompt once, then what each round committed (no per-round work that grows with the text)."""
        state = state_of(req)
        prompt = len(req.origin_input_ids)
        index = state.text_index
        if index is None or len(index.tokens) > prompt + len(req.output_ids):  # first round, or output cut back
            index = state.text_index = SuffixAutomaton(req.origin_input_ids)
        for token in req.output_ids[len(index.tokens) - prompt :]:
            index.extend(token)
        return index

    def _retire(self, reqs) -> None:
        """The corpus takes the outputs of the last batch's requests that are gone and finished."""
        current = {req.rid: req for req in reqs}
        if self.corpus is not None:
            for rid, req in self._running.items():
                if rid not in current and req.finished():
                    self.corpus.add(req.output_ids)
        self._running = current


def window_length(tiers: Sequence[int], drafted: int, copies: Sequence[Optional[Copy]], copying) -> int:
    """The round's window L: the shortest of the server's `tiers` that holds the draft model's
    `drafted` tokens and every copy a request uses (copying[i]); copies are at most the longest tier."""
    need = max([drafted] + [len(c.tokens) for c, used in zip(copies, copying) if used])
    return min(t for t in tiers if t >= need) if need else 0


def with_copies(drafts, confidence, copies, copying, width: int):
    """(drafts [bs, width], confidence [bs, width], real drafts per request): each row the draft
    model's (drafts, confidence: [bs, L] on the host, L <= width) or, where copying[i], request i's
    copy (confidence 1: no model proposed it), then 0s that `place_probes` keeps no request from."""
    bs, length = drafts.shape
    out = torch.zeros(bs, width, dtype=drafts.dtype)
    sure = torch.zeros(bs, width, dtype=confidence.dtype)
    out[:, :length], sure[:, :length] = drafts, confidence
    counts = [length] * bs
    for i, (copy, used) in enumerate(zip(copies, copying)):
        if used:
            tokens = copy.tokens[:width]
            out[i, : len(tokens)] = torch.tensor(tokens, dtype=drafts.dtype)
            out[i, len(tokens) :] = 0
            sure[i] = 1.0
            counts[i] = len(tokens)
    return out, sure, counts
