"""The cache of models built offline (SmolLM2's conversion, the synthetic pair): a root
directory and an atomic build-once of a folder described by a recipe."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

CACHE_ENV = "PARSE_SGLANG_CACHE"
DEFAULT_CACHE = Path("~/.cache/parse-sglang")
RECIPE_FILE = "parse-sglang-recipe.json"


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """Where built models live: the argument, else $PARSE_SGLANG_CACHE, else ~/.cache/parse-sglang."""
    chosen = cache_dir if cache_dir is not None else os.environ.get(CACHE_ENV) or DEFAULT_CACHE
    return Path(chosen).expanduser().resolve()


def build_once(final: Path, recipe: dict, build) -> Path:
    """Return `final` if it holds a complete build of `recipe`; else build it in a temporary
    sibling folder and rename it into place (a concurrent builder's result wins, ours is dropped)."""
    if recipe_of(final) == recipe:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    work.chmod(0o755)  # mkdtemp's 0700 would make a shared cache unreadable to other users
    try:
        build(work)
        (work / RECIPE_FILE).write_text(json.dumps(recipe, indent=2))
        if final.exists() and recipe_of(final) != recipe:
            shutil.rmtree(final)  # an interrupted or outdated build of ours
        try:
            work.rename(final)
        except OSError:
            if recipe_of(final) != recipe:
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def recipe_of(folder: Path) -> dict | None:
    try:
        return json.loads((folder / RECIPE_FILE).read_text())
    except (OSError, ValueError):
        return None
