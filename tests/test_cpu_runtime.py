"""The CPU runtime switch (`sglang_cpu.enable`): what it changes, and when it must not.

Every scenario runs in a fresh interpreter, because enabling is a process-wide side effect
(sys.path, PYTHONPATH, SGLANG_USE_CPU_ENGINE) that this pytest process may already carry.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import CPU_FLAGS
from sglang_cpu import STANDIN_DIRS

SNAPSHOT = """
import json, os, sys
def snapshot():
    return {
        "modules": sorted(m for m in sys.modules if m.split(".")[0] in ("sgl_kernel", "torchvision")),
        "standins_on_path": [p for p in sys.path if "standin_" in p],
        "env": {k: os.environ.get(k) for k in ("SGLANG_USE_CPU_ENGINE", "PYTHONPATH")},
    }
"""


def run_python(code: str, pythonpath: str | None = None) -> dict:
    """Run code in a fresh interpreter (clean CPU-runtime env); return the JSON it prints last."""
    env = {k: v for k, v in os.environ.items() if k not in ("SGLANG_USE_CPU_ENGINE", "PYTHONPATH")}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    proc = subprocess.run(
        [sys.executable, "-c", SNAPSHOT + textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_inactive_unless_asked():
    out = run_python(
        """
        before = snapshot()
        import parse_sglang, sglang_cpu, parse_sglang.plugin, sglang_cpu.launch_server
        print(json.dumps({"before": before, "after": snapshot()}))
        """
    )
    assert out["after"] == out["before"]
    assert out["after"]["modules"] == [] and out["after"]["standins_on_path"] == []
    assert out["after"]["env"] == {"SGLANG_USE_CPU_ENGINE": None, "PYTHONPATH": None}


def test_inactive_where_cuda_is_available():
    out = run_python(
        """
        import torch
        torch.cuda.is_available = lambda: True
        before = snapshot()
        import sglang_cpu
        status = sglang_cpu.enable()
        print(json.dumps({"before": before, "after": snapshot(), "active": status.active, "standins": status.standins}))
        """
    )
    assert out["active"] is False and out["standins"] == []
    assert out["after"] == out["before"]


def test_enable_reaches_child_processes():
    out = run_python(
        """
        import subprocess
        import sglang_cpu
        first = sglang_cpu.enable()
        second = sglang_cpu.enable()
        import sgl_kernel, torchvision
        from torchvision.transforms import InterpolationMode
        from sgl_kernel.speculative import reconstruct_indices_from_tree_mask
        try:
            torchvision.transforms.Compose([])
            call_error = None
        except RuntimeError as e:
            call_error = str(e)
        child = subprocess.run(
            [sys.executable, "-c", "import sgl_kernel, torchvision, os; "
             "print(sgl_kernel.PARSE_STANDIN, torchvision.PARSE_STANDIN, os.environ['SGLANG_USE_CPU_ENGINE'])"],
            capture_output=True, text=True,
        )
        print(json.dumps({
            "active": first.active, "standins": first.standins, "same": first == second,
            "after": snapshot(), "kernel_file": sgl_kernel.__file__,
            "placeholder": InterpolationMode.BICUBIC.__qualname__, "call_error": call_error,
            "child": child.stdout.split(),
        }))
        """
    )
    assert out["active"] is True and out["standins"] == ["sgl_kernel", "torchvision"] and out["same"]
    assert out["after"]["env"]["SGLANG_USE_CPU_ENGINE"] == "1"
    path_entries = out["after"]["env"]["PYTHONPATH"].split(os.pathsep)
    assert path_entries == [STANDIN_DIRS["torchvision"], STANDIN_DIRS["sgl_kernel"]]  # each once, first
    assert out["after"]["standins_on_path"] == path_entries
    assert out["kernel_file"].startswith(STANDIN_DIRS["sgl_kernel"])
    assert out["placeholder"] == "transforms.InterpolationMode.BICUBIC"
    assert "import-only stand-in" in out["call_error"]
    assert out["child"] == ["True", "True", "1"]


@pytest.mark.parametrize("works", [True, False])
def test_installed_sgl_kernel_is_shadowed_only_when_broken(tmp_path, works):
    """A working installed sgl_kernel (GPU build, CPU AMX build) is kept; a broken one
    (e.g. the CUDA wheel failing on libcuda.so.1) is replaced by the stand-in."""
    package = tmp_path / "site" / "sgl_kernel"
    package.mkdir(parents=True)
    body = "REAL = True\n" if works else "raise OSError('libcuda.so.1: cannot open shared object file')\n"
    (package / "__init__.py").write_text(body)
    out = run_python(
        """
        import sglang_cpu
        status = sglang_cpu.enable()
        import sgl_kernel
        print(json.dumps({"standins": status.standins, "real": getattr(sgl_kernel, "REAL", False)}))
        """,
        pythonpath=str(tmp_path / "site"),
    )
    if works:
        assert out == {"standins": ["torchvision"], "real": True}
    else:
        assert out == {"standins": ["sgl_kernel", "torchvision"], "real": False}


def test_bind_syntax_names_each_core():
    """SGLANG_CPU_OMP_THREADS_BIND's per-rank entries ('|' separates the ranks) as core ids."""
    from sglang_cpu.threads_binding import cores_of

    assert cores_of("0") == [0] and cores_of("0-3") == [0, 1, 2, 3] and cores_of("0,2,4-5") == [0, 2, 4, 5]


def test_the_launcher_adds_the_cpu_settings_a_user_left_out():
    from sglang_cpu.launch_server import cpu_defaults, has_fast_bf16

    base = ["--model-path", "m"]
    assert cpu_defaults(base, fast_bf16=True) == [*base, *CPU_FLAGS, "--dtype", "bfloat16", "--sleep-on-idle"]
    assert cpu_defaults(base, fast_bf16=False)[-3:] == ["--dtype", "float32", "--sleep-on-idle"]
    # a user's own flag wins, in either spelling
    own = [*base, "--dtype=float16", "--attention-backend", "intel_amx", "--sleep-on-idle"]
    added = cpu_defaults(own, fast_bf16=True)[len(own) :]
    assert added == ["--device", "cpu", "--disable-cuda-graph"]
    assert has_fast_bf16("flags : fpu avx512f amx_bf16 amx_tile") and has_fast_bf16("flags : avx512_bf16")
    assert not has_fast_bf16("flags : fpu avx2 avx512f") and not has_fast_bf16("")
