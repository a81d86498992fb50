"""benchmarks/gpu_cost.py: the --tiny rows, the speedup formula, the verify pass's numbers.

On CPU; the two gpu-marked tests repeat the run and the equivalence under CUDA where there is a device.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_cost.py"
gpu_cost = load_benchmark("gpu_cost")

# Query rows per request: N = 1 + 32 + 4*23; re-read judge passes 4*(1+23) + (8+16+24+32).
TARGET_MEASUREMENTS = {
    "decode": 1,
    "verify_parse": 125,
    "verify_prefill": 33,
    "verify_sequential": 125,
    "verify_sequential_reread": 176,
}
DRAFT_MEASUREMENTS = {"decode": 1, "draft_loop": 33}


def _tiny_run(*extra: str) -> list[dict]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--json", *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.fixture(scope="module")
def tiny_run() -> list[dict]:
    return _tiny_run("--device", "cpu")


def _check_measurements(run: list[dict], graphs: bool) -> None:
    """Every expected row is there, with positive times (graph times iff graphs)."""
    config, rows = run[0], [r for r in run if r["kind"] == "measurement"]
    assert config["kind"] == "config" and config["N"] == 125 and config["boundaries"] == [8, 16, 24, 32]
    assert config["graphs"] is graphs
    expected = {
        (model, name, P, batch): n
        for model, names in (("target", TARGET_MEASUREMENTS), ("draft", DRAFT_MEASUREMENTS))
        for name, n in names.items()
        for P in (64, 256)
        for batch in (1, 2)
    }
    assert {(r["model"], r["measurement"], r["P"], r["batch"]): r["rows"] for r in rows} == expected
    assert len(rows) == len(expected)
    for r in rows:
        assert r["eager_ms"] > 0, r
        assert r["layers"] == r["layers_full"] == 2 and r["note"] == "", r
        if graphs:
            assert r["graph_ms"] > 0 and r["peak_gib"] > 0, r
        else:
            assert r["graph_ms"] is None and r["peak_gib"] is None, r


def _check_speedups(run: list[dict], timing: str) -> None:
    """The printed speedups are the formula applied to the printed times."""
    rows = {(r["model"], r["measurement"], r["P"], r["batch"]): r for r in run if r["kind"] == "measurement"}
    predicted = [r for r in run if r["kind"] == "speedup"]
    assert {(r["P"], r["batch"], r["accepted"]) for r in predicted} == {
        (P, batch, a) for P in (64, 256) for batch in (1, 2) for a in (2, 4, 8, 16)
    }
    time_of = "graph_ms" if timing == "graph" else "eager_ms"
    for r in predicted:
        P, batch, a = r["P"], r["batch"], r["accepted"]
        assert r["formula"] == "speedup(A) = (A+1) * t_target_step / (t_draft_loop + t_verify)"
        assert r["timing"] == timing
        assert r["t_target_step_ms"] == rows[("target", "decode", P, batch)][time_of]
        assert r["t_draft_loop_ms"] == rows[("draft", "draft_loop", P, batch)][time_of]
        assert r["t_verify_ms"] == rows[("target", "verify_parse", P, batch)][time_of]
        assert r["round_ms"] == pytest.approx(r["t_draft_loop_ms"] + r["t_verify_ms"])
        assert r["speedup"] == pytest.approx((a + 1) * r["t_target_step_ms"] / r["round_ms"])


def test_tiny_run_prints_every_measurement(tiny_run):
    _check_measurements(tiny_run, graphs=False)


def test_tiny_run_applies_the_speedup_formula(tiny_run):
    _check_speedups(tiny_run, timing="eager")


def test_table_output_names_the_formula_and_no_graphs(capsys):
    gpu_cost.main(
        [
            "--tiny",
            "--device",
            "cpu",
            "--contexts",
            "32",
            "--batches",
            "1",
            "--draft-len",
            "4",
            "--probes",
            "2",
            "--suffix-len",
            "3",
            "--warmup",
            "0",
            "--repeats",
            "1",
            "--accepted",
            "3",
        ]
    )
    out = capsys.readouterr().out
    assert "N = 1 + L + K*m = 1 + 4 + 2*3 = 11 rows" in out
    assert "speedup(A) = (A+1) * t_target_step / (t_draft_loop + t_verify)" in out
    assert out.count("n/a (no CUDA)") == 7  # 5 target rows + 2 draft rows
    assert "A=3 (--accepted)" in out and "A=16" in out


@pytest.mark.parametrize("context,batch", [(64, 2), (50, 1)])
def test_verify_pass_equals_separate_forwards(context, batch):
    """Chain rows == the plain prefill's rows; probe k's last row == judge pass k's last row (both kinds)."""
    window = gpu_cost.Window(draft_len=32, probes=4, suffix_len=23)
    out = gpu_cost.verify_outputs(gpu_cost.TINY_TARGET, window, context, batch)
    assert out["parse_chain"].shape == out["prefill"].shape == (batch, 33, 512)
    assert out["parse_probes"].shape == out["judge_last"].shape == (batch, 4, 512)
    torch.testing.assert_close(out["parse_chain"], out["prefill"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out["parse_probes"], out["judge_last"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out["parse_probes"], out["reread_last"], rtol=1e-4, atol=1e-5)
    # The comparison can tell probes apart: each reads a different prefix.
    for k in range(3):
        assert not torch.allclose(out["parse_probes"][:, k], out["judge_last"][:, k + 1], rtol=1e-3, atol=1e-4)


def test_memory_plan_fits_the_full_target_at_8192_batch_32_in_78_gib():
    window = gpu_cost.Window(32, 4, 23)
    max_ctx = 8192 + 128  # P + N rounded up to 16
    for shape, rows, logit_rows in ((gpu_cost.QWEN3_8B, window.rows, 37), (gpu_cost.QWEN3_06B, 1, 1)):
        assert gpu_cost.plan_layers(shape, shape.layers, 32, max_ctx, rows, logit_rows, 2, 78.0) == (shape.layers, "")
    target = gpu_cost.QWEN3_8B
    layers, note = gpu_cost.plan_layers(target, 36, 32, max_ctx, window.rows, 37, 2, 40.0)
    assert 0 < layers < 36 and note.startswith(f"layers capped 36->{layers}")
    assert gpu_cost.plan_layers(target, 36, 32, max_ctx, window.rows, 37, 2, 10.0)[0] == 0


def test_weight_counts_match_the_model_shapes():
    """Qwen3-8B has 8.19 B parameters, Qwen3-0.6B 0.60 B (tied embeddings): the planner's sizes."""
    assert gpu_cost.QWEN3_8B.weight_numel(36) / 1e9 == pytest.approx(8.19, abs=0.01)
    assert gpu_cost.QWEN3_06B.weight_numel(28) / 1e9 == pytest.approx(0.596, abs=0.005)
    model = gpu_cost.Decoder(gpu_cost.TINY_TARGET, 2, "cpu", torch.float32)
    tensors = [model.embed, model.lm_head, model.norm] + [t for w in model.layers for t in w.values()]
    tensors = {id(t): t for t in tensors}  # the untied lm_head counts once
    assert sum(t.numel() for t in tensors.values()) == gpu_cost.TINY_TARGET.weight_numel(2)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
def test_cuda_tiny_run_captures_graphs():
    """On a GPU: every row also has a graph time and a peak memory; the prediction uses graph times."""
    run = _tiny_run("--device", "cuda", "--check")
    check = next(r for r in run if r["kind"] == "check")
    assert max(check["max_abs_diff"].values()) <= 0.05 * check["logit_scale"], check  # bf16
    run = [r for r in run if r["kind"] != "check"]
    _check_measurements(run, graphs=True)
    _check_speedups(run, timing="graph")


@pytest.mark.gpu
@needs_cuda
def test_cuda_verify_pass_equals_separate_forwards():
    window = gpu_cost.Window(draft_len=32, probes=4, suffix_len=23)
    out = gpu_cost.verify_outputs(gpu_cost.TINY_TARGET, window, 200, 3, device="cuda", dtype=torch.float32)
    torch.testing.assert_close(out["parse_chain"], out["prefill"], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out["parse_probes"], out["judge_last"], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out["parse_probes"], out["reread_last"], rtol=1e-4, atol=1e-4)
