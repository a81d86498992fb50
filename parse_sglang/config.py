"""PARSE settings, validated once where they enter (CLI, Engine kwargs, per-request params)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from parse_sglang.judge import DEFAULT_QUESTION

ALGORITHM = "PARSE"  # the name SGLang knows the algorithm by (--speculative-algorithm)
DEFAULT_DELIMITERS = ("\n", ". ", "? ", "! ")
AFTER_REJECTION_POLICIES = ("redraft", "target_to_delimiter")
VERIFY_WINDOWS = ("auto", "fixed", "variable")
JUDGE_MODES = ("probe", "likelihood", "both")


@dataclass(frozen=True)
class ParseConfig:
    """One PARSE policy.

    draft_budget: L, draft tokens per round.
    probe_stride: Δ, a probe roughly every Δ draft tokens (moved forward to a delimiter).
    delimiters: text that ends a segment; a boundary is placed right after one.
    threshold: τ, a prefix is accepted when P(yes)/(P(yes)+P(no)) >= τ.
    judge_question: what the probe asks the target.
    judge: off = lossless token-level speculative decoding (output == target greedy).
    judge_mode: "probe" (the judge probe, τ), "likelihood" (every draft token of the prefix
        has target probability >= likelihood_threshold, read from the chain rows: no probe
        rows in the verify window at all) or "both" (both must pass).
    likelihood_threshold: λ of the likelihood judge.
    after_rejection: "redraft" (draft again at once) or "target_to_delimiter" (the target
        decodes up to the next delimiter first, as SpecReason/HoVer do).
    verify_window: "fixed" gives every round K_max probes (N_max rows, the width a captured
        CUDA graph replays), "variable" the batch's own probe count (fewer rows, but an
        eager verify on a GPU whenever it is below K_max), "auto" fixed exactly when the
        target's decode CUDA graph is captured. Server-wide.
    """

    draft_budget: int = 32
    probe_stride: int = 8
    delimiters: tuple[str, ...] = DEFAULT_DELIMITERS
    threshold: float = 0.5
    judge_question: str = DEFAULT_QUESTION
    judge: bool = True
    judge_mode: str = "probe"
    likelihood_threshold: float = 0.5
    after_rejection: str = "redraft"
    verify_window: str = "auto"

    def __post_init__(self):
        _check_int("draft_budget", self.draft_budget, 1, 1024)
        _check_int("probe_stride", self.probe_stride, 1, 1024)
        delims = self.delimiters
        if isinstance(delims, str) or not delims or not all(isinstance(d, str) and d for d in delims):
            raise ValueError(f"delimiters={delims!r} is invalid: allowed is a non-empty list of non-empty strings")
        object.__setattr__(self, "delimiters", tuple(delims))
        for name in ("threshold", "likelihood_threshold"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0.0 <= float(value) <= 1.0):
                raise ValueError(f"{name}={value!r} is invalid: allowed is a number in [0, 1]")
            object.__setattr__(self, name, float(value))
        if not isinstance(self.judge_question, str) or not self.judge_question.strip():
            raise ValueError(f"judge_question={self.judge_question!r} is invalid: allowed is a non-empty string")
        if not isinstance(self.judge, bool):
            raise ValueError(f"judge={self.judge!r} is invalid: allowed is true or false")
        if self.judge_mode not in JUDGE_MODES:
            raise ValueError(f"judge_mode={self.judge_mode!r} is invalid: allowed is one of {JUDGE_MODES}")
        if self.after_rejection not in AFTER_REJECTION_POLICIES:
            raise ValueError(
                f"after_rejection={self.after_rejection!r} is invalid: allowed is one of {AFTER_REJECTION_POLICIES}"
            )
        if self.verify_window not in VERIFY_WINDOWS:
            raise ValueError(f"verify_window={self.verify_window!r} is invalid: allowed is one of {VERIFY_WINDOWS}")

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], base: "ParseConfig | None" = None) -> "ParseConfig":
        """Build from a mapping (JSON settings, Engine kwargs), refusing unknown keys by name."""
        if not isinstance(values, Mapping):
            raise ValueError(f"PARSE settings={values!r} are invalid: allowed is a mapping of setting names")
        known = cls.field_names()
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"unknown PARSE setting(s) {unknown}: allowed are {list(known)}")
        return dataclasses.replace(base or cls(), **values)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls) if f.init)

    @property
    def uses_probe(self) -> bool:
        """The judge asks the probe (its verify window has probe rows)."""
        return self.judge and self.judge_mode != "likelihood"

    @property
    def uses_likelihood(self) -> bool:
        return self.judge and self.judge_mode != "probe"

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.field_names()}


def _check_int(name: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not (low <= value <= high):
        raise ValueError(f"{name}={value!r} is invalid: allowed is an integer in [{low}, {high}]")
