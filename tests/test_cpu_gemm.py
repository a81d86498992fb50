"""benchmarks/cpu_gemm.py on a small shape: one row per row count, each column's 1-row entry 1.0x."""

from __future__ import annotations

import re

import pytest

from conftest import load_benchmark

cpu_gemm = load_benchmark("cpu_gemm")


def test_small_run_prints_every_row_count(capsys):
    assert cpu_gemm.main(["--rows", "1", "4", "--shape", "64", "32", "--weights", "2", "--reps", "1"]) == 0
    out = capsys.readouterr().out
    assert "linear 64x32, 2 weights cycled" in out
    lines = [line for line in out.splitlines() if re.match(r"^\d+\s", line)]
    assert [line.split()[0] for line in lines] == ["1", "4"]
    assert all(cell == "(1.0x)" for cell in re.findall(r"\([\d.]+x\)", lines[0]))
    assert len(re.findall(r"[\d.]+ \([\d.]+x\)", lines[1])) >= 2  # fp32 and bf16 at least


@pytest.mark.parametrize("argv", [["--rows", "0"], ["--weights", "0"], ["--shape", "0", "4"]])
def test_bad_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cpu_gemm.main(argv)
    assert exc.value.code == 2 and "take integers >= 1" in capsys.readouterr().err
