"""How long a round drafts: a policy the worker asks before each round (`choose`) and tells
after it (`after_round`); what it measures, it times itself (docs/adaptive.md).

- `FixedDraftLength`: every round drafts the server's L (`adaptive: false`).
- `adaptive.AdaptiveDraftLength` (`adaptive: true`): the tier whose expected tokens per second,
  by its measured costs and each request's acceptance so far, is the best, and the requests that
  verify their retrieved copy instead (`retrieval: true`, parse_sglang/retrieval.py).
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence


class Tier(NamedTuple):
    """What a round runs: plain decode steps (`DECODE`), PARSE's draft model's L drafts a request
    (`drafting(L)`), or an EAGLE-3 head's k drafts, a chain-only verify (`HEAD`, k: the server's
    `eagle3_steps`)."""

    kind: str  # one of KINDS
    length: int  # the draft model's L: 0 unless kind is "draft"


KINDS = ("decode", "draft", "head")  # Tier.kind's values; a kind's index is how TP ranks share it
DECODE = Tier("decode", 0)
HEAD = Tier("head", 0)


def drafting(length: int) -> Tier:
    """The tier of the draft model's L (0: `DECODE`, a server's tier 0)."""
    return Tier("draft", length) if length > 0 else DECODE


class DraftLengthPolicy:
    per_round = False  # True: L changes from round to round (a TP server's ranks take rank 0's)
    copying: Sequence[bool] = ()  # the requests whose retrieved copy this round verifies (empty: none)

    def choose(self, reqs, policies: Sequence, rows_of: Callable[[int], int], steps: int, copies=None) -> Tier:
        """This round's `Tier` (and `copying`). reqs and their `window_plan.RequestPolicy`s;
        rows_of(L): verify rows per request at L; steps: the decode steps a `DECODE` round would
        run; copies: each request's `retrieval.Copy` or None (None: the server retrieves nothing)."""
        raise NotImplementedError

    def prefills_draft(self, batch_size: int, prefill_tokens: int, rows_of: Callable[[int], int]) -> bool:
        """Whether the draft's prefill of `prefill_tokens` (requests joining a batch of `batch_size`)
        is expected to pay (else the prefill defers the draft's: `ParseWorker._defers_draft`);
        rows_of as in `choose`."""
        return True

    def drafts_on_host(self, caught_up: int = 0) -> None:
        """The round's drafts reached the host: its draft part ends; caught_up > 0: it held a
        catch-up over that many tokens the draft missed (`Draft.caught_up`), no cost of the round's tier."""

    def after_round(self, reqs, window, result, steps: int) -> None:
        """The round's `window_plan.Window` and its host result (`acceptance.RoundResult`);
        steps: its verify passes."""

    def server_state(self) -> dict:
        """What get_server_info()'s "parse" entry shows of the policy."""
        return {}


class FixedDraftLength(DraftLengthPolicy):
    def __init__(self, length: int):
        self.length = length

    def choose(self, reqs, policies, rows_of, steps, copies=None) -> Tier:
        return drafting(self.length)
