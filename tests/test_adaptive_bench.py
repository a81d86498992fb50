"""benchmarks/adaptive.py's and gpu_serving.py's issue-30 parts without an engine (one test serves
gpu_serving's parse_adaptive on CPU): the `default` engine (no PARSE settings at all), the open
loop (its seeded Poisson schedule, its rate, its throughput and latency arithmetic, requests in
flight together), ratios and merging per load, and gpu_serving's parse_adaptive mode."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import statistics
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import load_benchmark

bench = load_benchmark("adaptive", "adaptive_benchmark")
gpu_serving = bench.gpu_serving
# what ../shared/gpu-kit/check.sh passes
KIT_ARGV = (
    "--modes target_only standalone parse_lossless parse_judge_accept parse_adaptive --steps 8 --judge-steps 32 "
    "--batches 1 8"
).split()


def pair(name="useless", prompts=20):
    return gpu_serving.Pair(name, "T", "D", "float32", [[i, i + 1] for i in range(prompts)], ignore_eos=False)


def bench_args(**overrides):
    modes = [m for m in bench.MODES if m not in ("eagle3", "head")]  # they build the head: test_eagle3_engine...
    args = dict(
        modes=modes,
        steps=[4, 8],
        likelihood_threshold=0.05,
        batches=[1, 8],
        open_loop=True,
        seed=0,
        max_new_tokens=4,
        eagle3_steps=3,
        cache_dir=None,
        one_by_one=0,
        adaptive_tiers=[],
        adaptive_budget=8,
        twin=None,
    )
    return SimpleNamespace(**{**args, **overrides})


# ---- the default engine ------------------------------------------------------------------------


def test_default_engine_has_no_parse_settings_and_the_packages_config():
    plan = bench.engines(bench_args(), pair())
    assert [s.rows[0].mode for s in plan] == [
        "target_only",
        "target_only_sync",
        "fixed",
        "fixed",
        "adaptive",
        "default",
    ]
    default = plan[-1]
    # what a user types first: no --parse-config, no --speculative-num-steps
    assert default.settings == {"speculative_algorithm": "PARSE", "speculative_draft_model_path": "D"}
    from parse_sglang.settings import server_parse_config

    assert default.config == server_parse_config(SimpleNamespace(), None)  # whatever the package's defaults are
    assert default.server_L == default.config.draft_budget and default.rows[0].L is None
    fixed, adaptive = plan[2:4], plan[4]
    settings = [(s.config.draft_budget, s.config.adaptive, s.config.judge) for s in fixed]
    assert settings == [(4, False, False), (8, False, False)]
    assert (adaptive.config.draft_budget, adaptive.config.adaptive, adaptive.config.judge) == (8, True, False)
    assert adaptive.config.tiers == (0, 4, 8)  # the package's default tiers at L = 8
    assert fixed[0].settings["speculative_num_steps"] == 4
    adaptive = bench.engines(bench_args(adaptive_tiers=[0, 2, 4]), pair())[4]  # --adaptive-tiers
    assert adaptive.rows[0].mode == "adaptive" and adaptive.config.tiers == (0, 2, 4, 8)
    adaptive = bench.engines(bench_args(adaptive_tiers=[0, 4, 8], adaptive_budget=32), pair())[4]  # beside L = 4, 8
    assert (adaptive.config.draft_budget, adaptive.config.tiers) == (32, (0, 4, 8, 32))
    assert adaptive.server_L == 32 and adaptive.rows[0].L is None


def test_judged_pair_names_its_judge_and_modes_pick_engines():
    plan = bench.engines(bench_args(), pair("synthetic"))
    for spec in plan[2:5]:  # fixed and adaptive judge on the synthetic pair, whatever the defaults
        judge = (spec.config.judge, spec.config.judge_mode, spec.config.likelihood_threshold)
        assert judge == (True, "likelihood", 0.05)
    plan = bench.engines(bench_args(modes=["target_only", "default"]), pair())
    assert [s.rows[0].mode for s in plan] == ["target_only", "default"]


def test_eagle3_engine_serves_the_distilled_head_on_headed_pairs(monkeypatch):
    from support import eagle3_head

    monkeypatch.setattr(eagle3_head, "build", lambda cache_dir=None, log=None: Path("/cache/head"))
    plan = bench.engines(bench_args(modes=["target_only", "eagle3"], eagle3_steps=5), pair("synthetic"))
    assert [s.rows[0].mode for s in plan] == ["target_only", "eagle3"]
    assert plan[1].settings == {
        "speculative_algorithm": "EAGLE3",
        "speculative_draft_model_path": "/cache/head",
        "speculative_eagle_topk": 1,
        "speculative_num_steps": 5,
        "speculative_num_draft_tokens": 6,
    }
    plan = bench.engines(bench_args(modes=["target_only", "eagle3", "head"]), pair("smollm2"))
    assert [s.rows[0].mode for s in plan] == ["target_only"]  # no head for SmolLM2's target
    plan = bench.engines(bench_args(modes=["target_only", "head"], eagle3_steps=5), pair("synthetic"))
    composed = plan[1].config  # the package's defaults, with the head
    assert plan[1].rows[0].mode == "head" and (composed.eagle3_head, composed.eagle3_steps) == ("/cache/head", 5)
    assert dataclasses.replace(composed, eagle3_head="", eagle3_steps=3) == bench.default_config()


def test_modes_and_open_loop_flags(capsys):
    args = bench.parse_args(["--modes", "target_only", "default", "default", "--open-loop", "--seed", "7"])
    assert (args.modes, args.open_loop, args.seed) == (["target_only", "default"], True, 7)
    assert bench.parse_args(["--steps", "4", "8"]).adaptive_budget == 8  # the largest fixed L
    args = bench.parse_args(["--steps", "4", "--adaptive-budget", "32", "--adaptive-tiers", "0", "4", "8"])
    assert (args.steps, args.adaptive_budget, args.adaptive_tiers) == ([4], 32, [0, 4, 8])
    assert bench.parse_args([]).modes == list(bench.MODES) and "default" in bench.MODES
    for argv, message in (
        (["--modes", "default"], "--modes=default is invalid: allowed is a list with target_only"),
        (["--modes", "target_only", "eagle"], "--modes=eagle is invalid: allowed is one of target_only, "),
        (
            ["--steps", "8", "--adaptive-tiers", "0", "8"],
            "--adaptive-tiers=8 is invalid: allowed is an integer in [0, 7]",
        ),
        (
            ["--steps", "4", "--adaptive-budget", "8", "--adaptive-tiers", "0", "8"],
            "--adaptive-tiers=8 is invalid: allowed is an integer in [0, 7]",
        ),
        (["--adaptive-budget", "0"], "--adaptive-budget=0 is invalid: allowed is an integer in [1, 1024]"),
    ):
        with pytest.raises(SystemExit):
            bench.parse_args(argv)
        assert message in capsys.readouterr().err


# ---- the open loop -----------------------------------------------------------------------------


def test_poisson_schedule_is_seeded_and_has_the_rate():
    times = bench.poisson_arrivals(20001, rate=4.0, seed="0 8")
    assert times == bench.poisson_arrivals(20001, rate=4.0, seed="0 8")  # every engine and round alike
    assert times[:50] != bench.poisson_arrivals(50, rate=4.0, seed="0 1")
    assert times[0] == 0.0 and all(b > a for a, b in zip(times, times[1:]))
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert statistics.mean(gaps) == pytest.approx(1 / 4.0, rel=0.03)  # 20000 gaps: sd of the mean 0.7%
    assert statistics.stdev(gaps) == pytest.approx(1 / 4.0, rel=0.05)  # exponential: sd = mean
    assert len(bench.poisson_arrivals(8, 2.0, "s")) == 8 and bench.poisson_arrivals(1, 2.0, "s") == [0.0]


def test_offered_rate_keeps_batch_requests_in_flight():
    outs = [{"meta_info": {"e2e_latency": 0.5}}, {"meta_info": {"e2e_latency": 1.5}}]
    assert bench.offered_rate(outs, batch=4, wall=9.0) == pytest.approx(4.0)  # 4 / mean latency 1.0
    assert bench.offered_rate([{"meta_info": {}}], batch=2, wall=0.5) == pytest.approx(4.0)  # the call's wall
    assert [bench.open_requests(b) for b in (1, 4, 8, 32)] == [8, 8, 16, 64]
    assert bench.most_requests(bench_args(batches=[1, 8, 32])) == 64
    assert bench.most_requests(bench_args(batches=[1, 8, 32], open_loop=False)) == 32


def test_open_loop_throughput_and_latency_on_a_timeline():
    wall, latency = bench.open_loop_timing(sends=[10.0, 11.0, 12.5], finishes=[13.0, 12.0, 16.0])
    assert wall == pytest.approx(6.0)  # last finish - first send
    assert latency == pytest.approx((3.0 + 1.0 + 3.5) / 3)


class FakeServer:
    """A server answering each prompt alone with max_new_tokens tokens in 2 rounds of L = 4, once
    every request of the run has arrived (a barrier: requests sent one after another's reply
    would never meet there); a batch (a warm-up call) is answered at once, uncounted."""

    def __init__(self, count: int):
        self.barrier, self.lock = threading.Barrier(count, timeout=30), threading.Lock()
        self.totals = {"verify_passes": 0, "rounds": 0, "draft_length": 0, "verify_rows": 0, "graph_passes": 0}

    @staticmethod
    def answer(ids, new: int) -> dict:
        return {"output_ids": [ids[0]] * new, "meta_info": {"completion_tokens": new, "parse": {"rounds": 2}}}

    def generate(self, input_ids, sampling_params):
        new = sampling_params["max_new_tokens"]
        if isinstance(input_ids[0], list):
            return [self.answer(ids, new) for ids in input_ids]
        self.barrier.wait()
        with self.lock:
            for key, value in {"verify_passes": 2, "rounds": 2, "draft_length": 8}.items():
                self.totals[key] += value
        return self.answer(input_ids, new)

    def get_server_info(self):
        return {"internal_states": [{"parse": dict(self.totals)}], "attention_backend": "fake"}


def test_open_loop_requests_are_in_flight_together_and_make_a_row():
    server, count = FakeServer(8), bench.open_requests(2)
    arrivals = bench.poisson_arrivals(count, rate=200.0, seed="0 2")
    outs, sends, finishes = bench.send_open_loop(server, pair().prompts[:count], arrivals, {"max_new_tokens": 4})
    assert [o["output_ids"][0] for o in outs] == list(range(count))  # in the prompts' order
    assert sends == sorted(sends) and all(f >= s for s, f in zip(sends, finishes))

    spec = bench.engines(bench_args(), pair())[-1]  # the default engine: PARSE counters read
    row = bench.measure_open(FakeServer(8), pair(), spec, batch=2, rate=200.0, args=bench_args())
    assert (row["load"], row["requests"], row["batch"], row["rate_per_s"]) == ("open", 8, 2, 200.0)
    assert row["output_tokens"] == 32 and [ids[0] for ids in row["output_ids"]] == list(range(8))
    assert row["prefill_s"] is None and row["decode_s"] is None and row["round_ms"] is None
    assert row["rounds"] == 16 and row["mean_L"] == 4.0 and row["tokens_per_round"] == pytest.approx(24 / 16)
    assert row["mode"] == "default"  # (its seconds: open_loop_timing's arithmetic, tested above on fixed times)


def test_one_by_one_sends_each_prompt_after_the_last_and_makes_a_row():
    """Each prompt alone (the fake server's barrier of 1: none waits for another), 6 of them,
    counted as one batch-1 row of 6 requests; the flag loads enough prompts."""
    spec = bench.engines(bench_args(), pair())[-1]
    row = bench.measure_one_by_one(FakeServer(1), pair(), spec, args=bench_args(one_by_one=6))
    assert (row["load"], row["requests"], row["batch"], row["rate_per_s"]) == ("one_by_one", 6, 1, None)
    assert row["output_tokens"] == 24 and row["rounds"] == 12 and row["mean_L"] == 4.0
    assert [ids[0] for ids in row["output_ids"]] == list(range(6))
    assert row["prefill_s"] is None and row["round_ms"] is None
    assert bench.parse_args(["--one-by-one", "6"]).one_by_one == 6
    assert bench.most_requests(bench_args(batches=[1, 8], open_loop=False, one_by_one=12)) == 12


# ---- ratios per load, merging ------------------------------------------------------------------


def row(mode, L, load, tps, latency=None, lossless=True, outputs=([1], [2])):
    return {
        "pair": "p",
        "batch": 2,
        "mode": mode,
        "L": L,
        "load": load,
        "requests": 2 if load == "closed" else 8,
        "tokens_per_s": statistics.median(tps),
        "tokens_per_s_runs": tps,
        "output_tokens": 32,
        "tokens_per_round": 2.0,
        "output_ids": list(outputs),
        "lossless": lossless,
        "mean_L": 4.0,
        "mean_latency_s": statistics.median(latency) if latency else None,
        "mean_latency_s_runs": latency,
    }


def test_derive_pairs_within_each_load_and_keeps_the_default_honest():
    rows = [
        row("target_only", None, "closed", [100, 80]),
        row("fixed", 4, "closed", [50, 60]),
        row("default", None, "closed", [90, 88], lossless=False, outputs=([1], [3])),
        row("target_only", None, "open", [40, 50], latency=[1.0, 2.0]),
        row("fixed", 4, "open", [20, 25], latency=[3.0, 4.0]),
        row("fixed", 8, "open", [30, 20], latency=[2.0, 5.0]),
        row("default", None, "open", [45, 45], latency=[0.5, 3.0]),
    ]
    bench.derive(rows)
    closed, open_ = rows[2], rows[6]
    assert closed["ratio_to_target_only_runs"] == pytest.approx([0.9, 1.1])
    assert closed["ratio_to_best_fixed_runs"] == pytest.approx([90 / 50, 88 / 60])
    assert closed["ratio_to_target_only_sync"] is None  # no sync engine in this run
    assert closed["equal_to_target_only"] is None and closed["outputs_equal"] == 0.5  # judged: only the share
    assert open_["ratio_to_target_only_runs"] == pytest.approx([45 / 40, 45 / 50])  # open to open
    assert open_["ratio_to_best_fixed_runs"] == pytest.approx([45 / 30, 45 / 25])  # the best fixed per round
    assert open_["latency_ratio_to_target_only_runs"] == pytest.approx([0.5, 1.5])
    assert open_["latency_ratio_to_target_only"] == pytest.approx(1.0)
    assert open_["equal_to_target_only"] is True and open_["outputs_equal"] == 1.0
    # 8 requests: 8 prefills + (32 - 8) / 2 verify passes; closed: 2 + (32 - 2) / 2
    assert open_["tokens_per_target_forward"] == pytest.approx(32 / 20)
    assert closed["tokens_per_target_forward"] == pytest.approx(32 / 17)
    assert rows[1]["latency_ratio_to_target_only"] is None and rows[4]["ratio_to_best_fixed"] is None
    assert rows[0]["mean_L"] is None and rows[3]["latency_ratio_to_target_only"] == 1.0


def test_twin_is_the_fixed_engine_again_scored_as_adaptive_is(capsys):
    plan = bench.engines(bench_args(twin=8), pair())
    fixed, twin = next(s for s in plan if s.rows[0] == gpu_serving.RowSpec("fixed", 8)), plan[-1]
    assert twin.rows == [gpu_serving.RowSpec("twin", 8)] and twin.name == "PARSE L=8 (twin)"
    assert (twin.settings, twin.config, twin.server_L) == (fixed.settings, fixed.config, fixed.server_L)
    assert "twin" not in [s.rows[0].mode for s in bench.engines(bench_args(), pair())]
    rows = [
        row("target_only", None, "closed", [100, 80]),
        row("fixed", 4, "closed", [50, 90]),
        row("fixed", 8, "closed", [110, 70]),
        row("twin", 8, "closed", [100, 77]),
    ]
    bench.derive(rows)
    assert rows[3]["ratio_to_best_fixed_runs"] == pytest.approx([100 / 110, 77 / 90])  # as adaptive: per round
    assert rows[3]["ratio_to_target_only_runs"] == pytest.approx([1.0, 77 / 80])
    assert rows[2]["ratio_to_best_fixed"] is None  # the fixed engines themselves are not compared
    assert bench.parse_args(["--steps", "4", "8", "--twin", "8"]).twin == 8
    for argv in (["--steps", "4", "8", "--twin", "16"], ["--modes", "target_only", "adaptive", "--twin", "8"]):
        with pytest.raises(SystemExit):
            bench.parse_args(argv)
        assert f"--twin={argv[-1]} is invalid: allowed is one of --steps" in capsys.readouterr().err


def test_engines_take_turns_backwards_every_other_round(monkeypatch):
    served = []
    monkeypatch.setattr(bench.gpu_serving, "common_settings", lambda *args, **kwargs: {})
    monkeypatch.setattr(bench, "served", lambda settings, logs, progress: contextlib.nullcontext(range(len(settings))))
    monkeypatch.setattr(bench, "warm_up", lambda *args: {})

    def measure(server, pair, spec, batch, load, rates, args):
        served.append((server, batch))
        return {
            "mode": spec.rows[0].mode,
            "tokens_per_s": 100.0 + len(served),
            "mean_L": float(len(served)),
            "load": load,
            "mean_latency_s": None,
        }

    monkeypatch.setattr(bench, "measure_load", measure)
    args = bench_args(modes=["target_only", "fixed", "adaptive"], open_loop=False, repeats=3, cuda=False)
    rows = bench.run_pair(args, pair(), progress=lambda line: None)
    assert served == [(0, 1), (1, 1), (2, 1), (3, 1), (0, 8), (1, 8), (2, 8), (3, 8),  # round 1: as started
                      (3, 1), (2, 1), (1, 1), (0, 1), (3, 8), (2, 8), (1, 8), (0, 8),  # round 2: backwards
                      (0, 1), (1, 1), (2, 1), (3, 1), (0, 8), (1, 8), (2, 8), (3, 8)]  # fmt: skip
    assert bench.turn(3, 0) == [0, 1, 2] and bench.turn(3, 1) == [2, 1, 0] and bench.turn(3, 4) == [0, 1, 2]
    # a row's runs stay in round order whatever its place: engine 0, batch 1 ran 1st, 12th and 17th
    first = rows[0]
    assert (first["mode"], first["tokens_per_s_runs"]) == ("target_only", [101.0, 112.0, 117.0])
    assert first["mean_L_runs"] == [1.0, 12.0, 17.0] and first["mean_L"] == 12.0  # every run's beside the median's
    assert [r["mode"] for r in rows] == ["target_only", "fixed", "fixed", "adaptive"] * 2


def test_median_interval_covers_the_median_as_it_says():
    assert bench.median_interval([5, 1, 4, 2, 3, 7, 6]) == [1, 7]  # 7 rounds: 1 - 2 / 2**7 = 98% at k = 1
    assert bench.median_interval(list(range(11))) == [2, 8]  # 11 rounds: k = 3, 93% (k = 4: 77%)
    assert bench.median_interval([1, 2, 3, 4]) is None and bench.median_interval(None) is None  # 4 rounds: 88%
    # Coverage over 4000 seeded draws of 11 from a distribution of median 0: >= 90% is stated
    # (exact 93.5%; 4000 draws: sd 0.4 points). Control: the next-narrower interval (k = 4, exact 77.3%)
    # fails the same bound, so the count can fail.
    rng = random.Random(0)
    draws = [[rng.gauss(0, 1) for _ in range(11)] for _ in range(4000)]
    covered = sum(lo <= 0 <= hi for lo, hi in map(bench.median_interval, draws)) / len(draws)
    narrower = sum(sorted(d)[3] <= 0 <= sorted(d)[7] for d in draws) / len(draws)
    assert covered >= 0.90 and narrower < 0.90


def test_merge_keeps_loads_apart_and_reads_old_runs(tmp_path, capsys):
    files = []
    for i, (closed, open_) in enumerate([(100, 40), (80, 60), (120, 50)]):
        rows = [row("target_only", None, "closed", [closed]), row("target_only", None, "open", [open_], latency=[i])]
        for r in rows:
            r.update(ratio_to_target_only=1.0, ratio_to_target_only_runs=[1.0], latency_ratio_to_target_only=i or None)
        path = tmp_path / f"run{i}.jsonl"
        path.write_text("\n".join(json.dumps(r) for r in rows))
        files.append(str(path))
    merged = bench.merge(files)
    assert [(r["load"], r["tokens_per_s"]) for r in merged] == [("closed", 100), ("open", 50)]  # median runs
    assert merged[0]["tokens_per_s_runs"] == [100, 80, 120] and merged[0]["mean_latency_s_runs"] is None
    assert merged[0]["mean_L_runs"] == [4.0] * 3  # files without mean_L_runs: each file's own mean_L
    assert merged[1]["mean_latency_s_runs"] == [0, 1, 2] and merged[1]["latency_ratio_to_target_only"] == 1.5
    old = {k: v for k, v in row("target_only", None, "closed", [70]).items() if k != "load"}  # before --open-loop
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(old))
    (merged,) = bench.merge([str(path), files[0]])
    assert merged["tokens_per_s_runs"] == [70, 100]  # no load: a closed row
    bench.print_rows(bench.merge(files), as_json=False)
    out = capsys.readouterr().out
    assert "| load |" in out and "| p | target_only | - | 2 | open | 8 | 50 |" in out


# ---- gpu_serving.py's parse_adaptive -----------------------------------------------------------


def test_gpu_serving_plans_parse_adaptive_at_the_largest_L(capsys):
    args = gpu_serving.parse_args(["--cpu-smoke", *KIT_ARGV])  # the GPU kit's command line
    assert "parse_adaptive" in gpu_serving.MODES and 8 in args.all_L and 32 in args.all_L
    plan = gpu_serving.plan_engines(args, pair("tiny"))
    (spec,) = [s for s in plan if any(r.mode == "parse_adaptive" for r in s.rows)]
    assert len(spec.rows) == 1  # its own engine, even with --share-engines (adaptive is server-wide)
    assert (spec.config.adaptive, spec.config.judge, spec.config.draft_budget, spec.server_L) == (True, False, 8, 8)
    assert spec.settings["speculative_num_steps"] == 8 and spec.rows[0].request == {"judge": False}
    from parse_sglang.settings import server_parse_config

    served = SimpleNamespace(_parse_config=spec.settings["parse_config"])  # as the server resolves its flags
    assert server_parse_config(served, spec.settings["speculative_num_steps"]) == spec.config
    others = [s.config for s in plan if s.config is not None and s is not spec]
    assert others and all(c.adaptive is False for c in others)  # fixed L whatever the package's defaults
    args = gpu_serving.parse_args(
        ["--cpu-smoke", "--no-share-engines", "--modes", "target_only", "parse_adaptive", "--steps", "4", "16"]
    )
    (spec,) = [s for s in gpu_serving.plan_engines(args, pair("tiny")) if s.config is not None]
    assert (spec.config.draft_budget, spec.rows[0].L) == (16, 16) and args.all_L == [1, 16]
    assert "parse_adaptive" in gpu_serving.parse_args(["--pairs", "tiny"]).modes  # the default modes measure it
    assert "parse_adaptive" not in gpu_serving.SMOKE["modes"]


def test_gpu_serving_plans_the_head_modes():
    """parse_head: the adaptive engine at the largest L with the pair's head, graphs on; eagle3:
    SGLang's EAGLE3 with the same head; both in the default modes (the first GPU run prices them),
    neither in the smoke's."""
    args = gpu_serving.parse_args(
        ["--cpu-smoke", "--modes", "target_only", "parse_head", "eagle3", "--steps", "4", "16", "--eagle3-steps", "2"]
    )
    headed = dataclasses.replace(pair("tiny"), head="H")
    plan = gpu_serving.plan_engines(args, headed)
    (spec,) = [s for s in plan if s.config is not None]
    assert (spec.config.adaptive, spec.config.judge, spec.config.draft_budget) == (True, False, 16)
    assert (spec.config.eagle3_head, spec.config.eagle3_steps, spec.graphs) == ("H", 2, True)
    assert spec.rows[0].mode == "parse_head" and 16 in args.all_L
    (eagle3,) = [s for s in plan if s.settings.get("speculative_algorithm") == "EAGLE3"]
    assert eagle3.settings["speculative_draft_model_path"] == "H" and eagle3.settings["speculative_num_steps"] == 2
    assert {"parse_head", "eagle3"} <= set(gpu_serving.parse_args(["--pairs", "tiny"]).modes)
    assert not {"parse_head", "eagle3"} & set(gpu_serving.SMOKE["modes"])


def test_gpu_serving_derive_and_tables_take_parse_adaptive(tmp_path, capsys):
    def made_up(mode, round_ms, tps, server_L=None, per_round=1.0, output_ids=([1, 2],)):
        return dict(
            pair="p",
            mode=mode,
            batch=8,
            round_ms=round_ms,
            tokens_per_s=tps,
            decode_tokens_per_s=tps,
            server_L=server_L,
            L=server_L,
            tokens_per_round=per_round,
            output_ids=list(output_ids),
            context=100,
            max_new_tokens=16,
            window_has_probes=False,
            graph_replayed=True,
        )

    rows = [
        made_up("target_only", 10.0, 100.0),
        made_up("parse_lossless", 30.0, 80.0, 4, 3.0),
        made_up("parse_lossless", 40.0, 70.0, 8, 3.0),
        made_up("parse_adaptive", 14.0, 120.0, 8, 2.0),
        made_up("parse_adaptive", 14.0, 120.0, 8, 2.0, output_ids=([9],)),
    ]
    gpu_serving.derive(rows)
    adaptive = rows[3]
    assert adaptive["equal_to_target_only"] is True and adaptive["ratio_to_target_only"] == pytest.approx(1.2)
    assert adaptive["verify_ms"] is None and adaptive["draft_step_fit_ms"] == pytest.approx(2.5)  # fit: lossless only
    assert rows[1]["verify_ms"] == pytest.approx(30.0 - 5 * 2.5)
    assert rows[4]["equal_to_target_only"] is False and rows[4]["outputs_equal"] == 0.0
    costs = {
        (8, 128, 8): {
            "capped": False,
            "target/decode": (1.0, 1.0),
            "draft/draft_loop": (1.0, 1.0),
            "target/verify_prefill": (1.0, 1.0),
        }
    }
    gpu_serving.add_gpu_cost(rows, costs)
    assert adaptive["predicted_ratio_gpu_cost"] is None and rows[2]["predicted_ratio_gpu_cost"] is not None
    gpu_serving.print_tables(rows, gpu_cost=True)
    out = capsys.readouterr().out
    assert "parse_adaptive" in out.split("Costs per pair")[0]
    assert "parse_adaptive" not in out.split("gpu_cost.py prediction")[1]
    gpu_serving.plot(rows, str(tmp_path / "plot.png"), "made-up rows")
    assert (tmp_path / "plot.png").stat().st_size > 1000


@pytest.mark.sglang
def test_gpu_serving_parse_adaptive_on_cpu_equals_target_only(tmp_path):
    """The mode on real engines (tiny pair, CPU runtime, its eager-replay graph path): lossless,
    every round replayed, its draft lengths among the tiers."""
    from test_gpu_serving_smoke import run_script

    rows, _, _ = run_script(
        "--cpu-smoke",
        "--json",
        "--modes",
        "target_only",
        "parse_adaptive",
        "--batches",
        "2",
        "--steps",
        "4",
        "--plot",
        str(tmp_path / "plot.png"),
    )
    (adaptive,) = [r for r in rows if r["mode"] == "parse_adaptive"]
    assert adaptive["equal_to_target_only"] is True and adaptive["outputs_equal"] == 1.0
    assert adaptive["server_L"] == adaptive["L"] == 4 and 0.0 <= adaptive["mean_L"] <= 4.0
    assert adaptive["graph_replayed"] is True and adaptive["verify_ms"] is None
