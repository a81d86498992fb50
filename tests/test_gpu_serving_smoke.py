"""benchmarks/gpu_serving.py on CPU, so the GPU serving benchmark never rots.

`--cpu-smoke --json` runs as a subprocess (tiny models, PARSE's graph path with the eager-replay
stand-in): every mode is present, every row has the schema, and what must hold does (lossless ==
target-only, every PARSE round replayed a graph, a round emits 1 to L + 1 tokens, the forced judge
accepts the whole draft or nothing). A second run serves the weightless pair path (config +
tokenizer, no weights, `load_format="dummy"`) at tiny shapes. The derived columns and the
`--gpu-cost` matching are checked on made-up rows and a real `gpu_cost.py --tiny --json` run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import load_benchmark
from support.eagle3_head import default_aux_layers

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_serving.py"
SMOKE_MODES = {
    "target_only",
    "standalone",
    "parse_lossless",
    "parse_judge_accept",
    "parse_judge_reject",
    "parse_likelihood",
}
REQUIRED = (
    "pair",
    "mode",
    "L",
    "batch",
    "tokens_per_s",
    "ratio_to_target_only",
    "tokens_per_round",
    "graph_replayed",
    "equal_to_target_only",
)


gpu_serving = load_benchmark("gpu_serving")


def run_script(*args: str, timeout: int = 600) -> tuple[list[dict], float, str]:
    """The script's --json rows, its wall time and its stderr."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    seconds = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")], seconds, proc.stderr


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    plot = tmp_path_factory.mktemp("gpu_serving") / "smoke.png"
    rows, seconds, stderr = run_script("--cpu-smoke", "--json", "--plot", str(plot))
    print(f"gpu_serving.py --cpu-smoke: {seconds:.0f} s")
    return rows, plot, stderr


@pytest.mark.sglang
def test_smoke_rows_have_every_mode_and_the_schema(smoke):
    rows, plot, _ = smoke
    assert {r["mode"] for r in rows} == SMOKE_MODES
    smoke = gpu_serving.SMOKE
    for key in {(r["mode"], r["L"]) for r in rows}:
        assert sorted(r["batch"] for r in rows if (r["mode"], r["L"]) == key) == smoke["batches"], key
    assert sorted({r["L"] for r in rows if r["mode"] == "parse_lossless"}) == smoke["steps"]
    for row in rows:
        assert set(REQUIRED) <= set(row), row
        assert row["pair"] == "tiny" and row["batch"] in smoke["batches"]
        assert row["output_tokens"] == row["batch"] * smoke["max_new_tokens"]  # ignore_eos: full batches
        assert 1.0 <= row["tokens_per_round"] <= (row["L"] or 0) + 1  # a round: its accepted drafts + 1
        assert row["predicted_ratio_gpu_cost"] is None
    assert plot.stat().st_size > 1000 and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.sglang
def test_each_row_is_printed_as_its_engine_finishes(smoke):
    """stderr carries every measured row as it came (a device call cut short keeps what ran)."""
    rows, _, stderr = smoke
    early = [json.loads(line.split("] row ", 1)[1]) for line in stderr.splitlines() if "] row {" in line]
    assert [(r["mode"], r["L"], r["batch"]) for r in early] == [(r["mode"], r["L"], r["batch"]) for r in rows]
    assert [r["output_tokens"] for r in early] == [r["output_tokens"] for r in rows]


@pytest.mark.sglang
def test_smoke_values_that_must_hold(smoke):
    rows, _, _ = smoke
    for row in rows:
        # clock-derived columns (tokens_per_s, its ratios, round_ms, a_break) are derive()'s arithmetic,
        # tested on fixed rows below
        assert row["accepted_per_round"] == pytest.approx(row["tokens_per_round"] - 1)
        if row["mode"].startswith("parse_"):
            # graphs on (the CPU stand-in): every round replayed the draft chain's and the verify's graph
            assert row["cuda_graphs"] and row["graph_replayed"] is True
            assert row["verify_passes"] == row["graph_passes"] == row["rounds"] > 0
            assert row["server_L"] == max(gpu_serving.SMOKE["steps"])  # one shared engine
        else:
            assert row["graph_replayed"] is None and row["verify_passes"] is None
        if row["mode"] == "parse_lossless":
            assert row["equal_to_target_only"] is True and row["judged_share"] == 0
        else:
            assert row["equal_to_target_only"] is None
        if row["mode"] == "parse_judge_accept":  # threshold 0: every round takes its whole draft
            assert row["tokens_per_round"] == row["L"] + 1 and row["judged_share"] > 0
        if row["mode"] == "parse_judge_reject":  # threshold 1: exact matches only, the lossless output
            assert row["judged_share"] == 0 and row["outputs_equal"] == 1.0
        if row["mode"] == "target_only":  # one decode step per token after the prefill's
            assert row["rounds"] == gpu_serving.SMOKE["max_new_tokens"] - 1 and row["tokens_per_round"] == 1.0


@pytest.mark.sglang
def test_weightless_pair_served_by_the_dummy_loader(tmp_path):
    """config.json + a padded tokenizer, no weights: SGLang's dummy loader serves it, every id of
    the config's vocabulary decodes, and (same seeded dummy weights in both engines) PARSE
    lossless equals target-only."""
    rows, _, _ = run_script(
        "--cpu-smoke",
        "--json",
        "--pairs",
        "tiny-dummy",
        "--modes",
        "target_only",
        "parse_lossless",
        "--batches",
        "2",
        "--steps",
        "3",
        "--cache-dir",
        str(tmp_path),
        "--plot",
        str(tmp_path / "plot.png"),
    )
    assert {r["mode"] for r in rows} == {"target_only", "parse_lossless"}
    (lossless,) = [r for r in rows if r["mode"] == "parse_lossless"]
    assert lossless["equal_to_target_only"] is True and lossless["graph_replayed"] is True
    (folder,) = [p for p in tmp_path.iterdir() if p.name.startswith("tiny-target-dummy-")]
    for model in ("target", "draft"):
        files = {p.name for p in (folder / model).iterdir()}
        assert "config.json" in files and "tokenizer.json" in files
        assert not [f for f in files if f.endswith((".safetensors", ".bin", ".pt"))], files


def test_weightless_qwen3_8b_config_and_padded_tokenizer(tmp_path, cpu_runtime):
    """The Qwen3-8B-shaped directory: gpu_cost's hyper-parameters, a tokenizer of exactly the
    config's 151936 ids (the random model's highest id decodes), and SGLang's ModelConfig takes it."""
    import gpu_cost
    from sglang.srt.configs.model_config import ModelConfig
    from transformers import AutoConfig, AutoTokenizer

    shape = gpu_cost.QWEN3_8B
    gpu_serving.write_weightless_model(tmp_path, shape)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "chat_template.jinja",
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    config = AutoConfig.from_pretrained(tmp_path)
    assert (
        config.hidden_size,
        config.num_hidden_layers,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
        config.intermediate_size,
        config.vocab_size,
        config.tie_word_embeddings,
    ) == (4096, 36, 32, 8, 128, 12288, 151936, False)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert len(tokenizer) == 151936 and tokenizer.decode([151935]) == "<|pad_151935|>"
    model = ModelConfig(str(tmp_path))
    assert model.hf_config.architectures == ["Qwen3ForCausalLM"] and model.vocab_size == 151936


def _row(mode, batch, round_ms, tokens_per_s, server_L=None, tokens_per_round=1.0, **extra):
    row = dict(
        pair="p",
        mode=mode,
        batch=batch,
        round_ms=round_ms,
        tokens_per_s=tokens_per_s,
        decode_tokens_per_s=tokens_per_s,
        server_L=server_L,
        L=server_L,
        tokens_per_round=tokens_per_round,
        output_ids=[[1, 2]],
        context=1000,
        max_new_tokens=128,
        window_has_probes=False,
        graph_replayed=None,
    )
    row.update(extra)
    return row


def test_derived_columns_and_the_draft_step_fit(tmp_path, capsys):
    """round = intercept + (L+1) * draft step over the lossless rows; verify(L) what is left;
    A_break = round / target step - 1; ratios against target-only at the same batch."""
    rows = [_row("target_only", 8, 10.0, 100.0), _row("draft_only", 8, 2.5, 300.0)]
    rows += [
        _row("parse_lossless", 8, 12.0 + 2.0 * (L + 1), 50.0, server_L=L, tokens_per_round=3.0) for L in (4, 8, 16)
    ]
    rows.append(_row("parse_judge_accept", 8, 80.0, 120.0, server_L=32, tokens_per_round=33.0, output_ids=[[9]]))
    gpu_serving.derive(rows)
    lossless = [r for r in rows if r["mode"] == "parse_lossless"]
    for r in lossless:
        assert r["draft_step_fit_ms"] == pytest.approx(2.0) and r["fit_intercept_ms"] == pytest.approx(12.0)
        assert r["draft_step_ms"] == 2.5  # measured (draft-only) wins over the fit
        assert r["verify_ms"] == pytest.approx(r["round_ms"] - (r["server_L"] + 1) * 2.5)
        assert r["equal_to_target_only"] is True and r["ratio_to_target_only"] == 0.5
        assert r["a_break"] == pytest.approx(r["round_ms"] / 10.0 - 1) and r["accepted_per_round"] == 2.0
    accept = rows[-1]
    assert accept["equal_to_target_only"] is None and accept["outputs_equal"] == 0.0
    assert accept["ratio_to_target_only"] == 1.2 and accept["a_break"] == pytest.approx(7.0)
    assert rows[1]["ratio_to_target_only"] is None  # draft-only is no target
    assert gpu_serving.fit_line([(1, 2.0), (1, 3.0)]) is None
    for row in rows:
        row["predicted_ratio_gpu_cost"], row["gpu_cost_match"] = None, None
    gpu_serving.print_tables(rows, gpu_cost=True)
    out = capsys.readouterr().out
    assert "L=4: 9.500, L=8: 7.500, L=16: 3.500" in out and "gpu_cost.py prediction" in out
    gpu_serving.plot(rows, str(tmp_path / "plot.png"), "made-up rows")
    assert (tmp_path / "plot.png").stat().st_size > 1000


def test_gpu_cost_rows_match_by_L_batch_and_nearest_context(tmp_path, capsys):
    """--gpu-cost: gpu_cost.py --json runs (one per L) predict (A+1) * t_target / (t_draft_loop + t_verify)
    at the row's measured A; t_verify is the PARSE pass where the window has probes, else the prefill."""
    import gpu_cost

    lines = []
    for L in (4, 8):
        gpu_cost.main(
            [
                "--tiny",
                "--device",
                "cpu",
                "--json",
                "--contexts",
                "256",
                "1024",
                "--batches",
                "8",
                "--draft-len",
                str(L),
                "--probes",
                "2",
                "--suffix-len",
                "3",
                "--warmup",
                "0",
                "--repeats",
                "1",
            ]
        )
        lines.append(capsys.readouterr().out)
    path = tmp_path / "gpu_cost.jsonl"
    path.write_text("".join(lines))
    costs = gpu_serving.read_gpu_cost(str(path))
    assert set(costs) == {(L, P, 8) for L in (4, 8) for P in (256, 1024)}
    rows = [
        _row("parse_lossless", 8, 1.0, 1.0, server_L=8, tokens_per_round=3.0, accepted_per_round=2.0),
        _row(
            "parse_judge_accept",
            8,
            1.0,
            1.0,
            server_L=4,
            tokens_per_round=5.0,
            accepted_per_round=4.0,
            window_has_probes=True,
        ),
        _row("parse_lossless", 1, 1.0, 1.0, server_L=8, accepted_per_round=0.0),  # no batch-1 run
        _row("standalone", 8, 1.0, 1.0, server_L=3, accepted_per_round=1.0),
    ]
    gpu_serving.add_gpu_cost(rows, costs)
    eager = {key: {name: ms[1] for name, ms in entry.items() if name != "capped"} for key, entry in costs.items()}
    c = eager[(8, 1024, 8)]  # context 1000 + 128 / 2 is nearest 1024; no CUDA: eager times
    assert rows[0]["predicted_ratio_gpu_cost"] == pytest.approx(
        3 * c["target/decode"] / (c["draft/draft_loop"] + c["target/verify_prefill"])
    )
    assert rows[0]["gpu_cost_match"] == "L=8 P=1024 batch=8 verify_prefill eager"
    c = eager[(4, 1024, 8)]
    assert rows[1]["predicted_ratio_gpu_cost"] == pytest.approx(
        5 * c["target/decode"] / (c["draft/draft_loop"] + c["target/verify_parse"])
    )
    assert rows[2]["predicted_ratio_gpu_cost"] is None and rows[3]["predicted_ratio_gpu_cost"] is None


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--batches", "0"], "--batches=0 is invalid: allowed is an integer >= 1 or 'max'"),
        (["--modes", "eagle"], "--modes=eagle is invalid: allowed is one of target_only, standalone"),
        (["--pairs", "llama"], "--pairs=llama is invalid: allowed is one of qwen3-dummy, synthetic, tiny, tiny-dummy"),
        (["--attention-backend", "fa4"], "--attention-backend=fa4 is invalid: allowed is one of triton, flashinfer"),
        (["--sampling-backend", "x"], "--sampling-backend=x is invalid: allowed is one of pytorch, flashinfer"),
        (["--steps", "0"], "--steps=0 is invalid: allowed is an integer in [1, 1024]"),
        (["--max-new-tokens", "1"], "--max-new-tokens=1 is invalid: allowed is an integer in [2, "),
        (["--likelihood-threshold", "2"], "--likelihood-threshold=2.0 is invalid: allowed is a number in [0, 1]"),
        (["--gpu-cost", "/nonexistent/gpu_cost.jsonl"], "--gpu-cost=/nonexistent/gpu_cost.jsonl cannot be read"),
    ],
)
def test_bad_values_are_refused_by_flag(argv, message, capsys):
    with pytest.raises(SystemExit):
        gpu_serving.parse_args(argv)
    assert message in capsys.readouterr().err


@pytest.mark.sglang
def test_head_modes_serve_a_weightless_head(tmp_path):
    """parse_head and eagle3 on the weightless pair path at tiny shapes: the head is a config.json
    of the target's shape (one layer, the target's vocabulary, aux layers inside the target) with
    no weights, served by the dummy loader as the first GPU run serves a Qwen3-8B-shaped one; PARSE
    with it stays lossless, runs head rounds and replays graphs (the CPU stand-in) in every round,
    SGLang's EAGLE3 serves the same head."""
    rows, _, _ = run_script(
        "--cpu-smoke",
        "--json",
        "--pairs",
        "tiny-dummy",
        "--modes",
        "target_only",
        "parse_head",
        "eagle3",
        "--batches",
        "2",
        "--steps",
        "4",
        "--max-new-tokens",
        "48",
        "--cache-dir",
        str(tmp_path),
        "--plot",
        str(tmp_path / "plot.png"),
    )
    assert {r["mode"] for r in rows} == {"target_only", "parse_head", "eagle3"}
    (head,) = [r for r in rows if r["mode"] == "parse_head"]
    assert head["equal_to_target_only"] is True and head["graph_replayed"] is True and head["head_rounds"] > 0, head
    (eagle3,) = [r for r in rows if r["mode"] == "eagle3"]
    assert eagle3["output_tokens"] == 2 * 48 and eagle3["tokens_per_round"] >= 1.0
    (folder,) = [p for p in tmp_path.iterdir() if p.name.startswith("eagle3-head-dummy-")]
    assert sorted(p.name for p in (folder / "head").iterdir()) == ["config.json"]
    config = json.loads((folder / "head" / "config.json").read_text())
    (target,) = [p for p in tmp_path.iterdir() if p.name.startswith("tiny-target-dummy-")]
    target_config = json.loads((target / "target" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
    assert config["target_hidden_size"] == target_config["hidden_size"]
    assert config["vocab_size"] == config["draft_vocab_size"] == target_config["vocab_size"]
    aux = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert aux == default_aux_layers(target_config["num_hidden_layers"])  # [0] of 2 layers; Qwen3-8B's: [0, 17, 34]
    assert default_aux_layers(36) == [0, 17, 34]
