"""The judge head (`judge_mode: "head"`): a logistic regression on the target's own hidden state at
a draft token that differs from the target's, P(harmful) from features the verify pass already
computes (AutoJudge, arXiv 2504.20039). What a server reads: the features, the file and `load`;
the commands that mine, train and evaluate a head are `python -m parse_sglang.tools.judge_head`.

Features of draft token d_j (`features`): the target's final hidden state at chain row j (the row
that read d_j), log P_target(d_j) and log P_target(its own top token) at row j-1.

The head file (JSON) carries its weights (standardisation folded in), the target it was made for
(`TargetIdentity`), its calibration on held-out mismatches (accepted and harmful shares at each
bound), its recipe and a sha256 of the rest. It carries no bound of its own: the server's
`head_threshold` (a request's overrides it) is the bound, and the calibration says what each
bound accepts. A server refuses a head for another target or a damaged file at start-up (`load`).
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

FORMAT = "parse-sglang-judge-head/2"
LAYER = "final"  # the hidden state SGLang's logits processor hands to the lm_head (after the last norm)
EXTRA_FEATURES = ("logp_draft", "logp_top")  # after the hidden state
IDENTITY_KEYS = (
    "architectures",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
    "intermediate_size",
)
SETTING = "judge_head"
BOUND = (
    "none in this file: the server's head_threshold (a request's overrides it); calibration lists each bound's figures"
)


def to_base64(t: torch.Tensor) -> str:
    """A float tensor's fp32 bytes, base64 (how mined rows and head files store vectors)."""
    return base64.b64encode(t.to(torch.float32).contiguous().numpy().tobytes()).decode()


def from_base64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.float32).clone()


@dataclass(frozen=True)
class TargetIdentity:
    """What a head is bound to: the target's architecture, hidden size, the layer read and a hash of
    its config's shape fields (dtype and paths excluded: a bf16 and an fp32 copy share a head)."""

    architecture: str
    hidden_size: int
    layer: str
    config_hash: str

    @classmethod
    def of_config(cls, config) -> "TargetIdentity":
        """From a transformers config (SGLang's `model_config.hf_config`) or its dict."""
        values = config if isinstance(config, dict) else config.to_dict()
        shape = {k: values.get(k) for k in IDENTITY_KEYS}
        digest = hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]
        return cls(str((values.get("architectures") or ["?"])[0]), int(values["hidden_size"]), LAYER, digest)

    @classmethod
    def of_checkpoint(cls, path: str) -> "TargetIdentity":
        return cls.of_config(json.loads((Path(path) / "config.json").read_text()))


@dataclass(frozen=True, eq=False)
class JudgeHead:
    target: TargetIdentity
    weights: torch.Tensor  # [hidden_size + len(EXTRA_FEATURES)] fp32, standardisation folded in
    bias: float
    calibration: list  # [{threshold, accepted, false_accept, harmful_accepted}] on held-out mismatches
    recipe: dict  # the commands, data sizes and costs that made it

    def harm(self, hidden: torch.Tensor, logp_draft: torch.Tensor, logp_top: torch.Tensor) -> torch.Tensor:
        """P(harmful) [...] from hidden [..., H] and log-probabilities [...] (host or device)."""
        return torch.sigmoid(features(hidden, logp_draft, logp_top) @ self.weights.to(hidden.device) + self.bias)

    def to_json(self) -> dict:
        body = {
            "format": FORMAT,
            "target": asdict(self.target),
            "features": ["hidden", *EXTRA_FEATURES],
            "weights": to_base64(self.weights),
            "bias": self.bias,
            "bound": BOUND,
            "calibration": self.calibration,
            "recipe": self.recipe,
        }
        return {**body, "sha256": _digest(body)}

    def save(self, path: str) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")


def _digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def features(hidden: torch.Tensor, logp_draft: torch.Tensor, logp_top: torch.Tensor) -> torch.Tensor:
    """[..., H + 2] fp32: the hidden state, then log P(d_j) and log P(top) (clamped at -30)."""
    extra = torch.stack([logp_draft.float().clamp(min=-30.0), logp_top.float().clamp(min=-30.0)], dim=-1)
    return torch.cat([hidden.float(), extra], dim=-1)


def load(path: str, target_config=None) -> JudgeHead:
    """The head in `path`, checked whole (format, sha256, weights' size) and, given the serving
    target's config, against it; any defect is a ValueError naming the setting, the file and what
    is wrong."""
    where = f"{SETTING}={path!r}"
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{where} is invalid: the file cannot be read as a judge head ({e})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        got = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise ValueError(f"{where} is invalid: format is {got!r}, allowed is {FORMAT!r}")
    body = {k: v for k, v in raw.items() if k != "sha256"}
    if raw.get("sha256") != _digest(body):
        raise ValueError(f"{where} is invalid: the file is damaged (its sha256 does not match its contents)")
    try:
        head = JudgeHead(
            TargetIdentity(**raw["target"]),
            from_base64(raw["weights"]),
            float(raw["bias"]),
            list(raw["calibration"]),
            dict(raw["recipe"]),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where} is invalid: a field is missing or malformed ({e})") from None
    if head.weights.numel() != head.target.hidden_size + len(EXTRA_FEATURES):
        raise ValueError(
            f"{where} is invalid: {head.weights.numel()} weights for hidden size {head.target.hidden_size}"
        )
    if target_config is not None:
        serving = TargetIdentity.of_config(target_config)
        if serving != head.target:
            raise ValueError(
                f"{where} is invalid: it was made for {asdict(head.target)}, but the server's target is "
                f"{asdict(serving)}; allowed is a head trained on this target (python -m parse_sglang.tools.judge_head)"
            )
    return head
