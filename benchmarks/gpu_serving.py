"""PARSE served by stock SGLang with CUDA graphs, against target-only and STANDALONE, ratios in one run.

    python benchmarks/gpu_serving.py [--pairs qwen3-dummy synthetic] [--batches 1 8 32 max]
        [--steps 4 8 16 32] [--judge-steps 8 32] [--modes ...] [--context 1000] [--max-new-tokens 128]
        [--attention-backend triton] [--sampling-backend pytorch] [--json] [--plot PNG] [--gpu-cost FILE]
    python benchmarks/gpu_serving.py --cpu-smoke [--json]      # tiny models on CPU, ~1 minute (CI)

In-process `sglang.Engine`s, one per pair and engine setting (target-only, STANDALONE, a PARSE
engine per L and judge kind, the adaptive one, draft-only), started one after another (never two
at once), with the same prompts and settings: CUDA graphs on (decode graphs for batch buckets up
to the largest batch; SGLang's prefill graph unless --no-prefill-graph), radix cache off (each timed call
prefills again, and SGLang's STANDALONE radix keys are wrong for shared prefixes:
benchmarks/README.md), greedy. On an H100 the default run starts 24 engines (12 per pair); split
it with --pairs / --modes / --steps / --batches (keep target_only in each run: every ratio is
to the target-only row of the same run), and build the synthetic pair beforehand
(`python -m support.synthetic build`: it trains on the CPU).

PAIRS
  qwen3-dummy  a Qwen3-8B-shaped target and a Qwen3-0.6B-shaped draft (the hyper-parameters of
               gpu_cost.QWEN3_8B / QWEN3_06B: hidden 4096 / 1024, 36 / 28 layers, 32 / 16 q heads,
               8 KV heads, head_dim 128, vocab 151936), bf16, `load_format="dummy"` (SGLang's random
               weights). Each directory holds config.json and a tokenizer only, no weights: the
               tokenizer of support.tiny_models (byte-level BPE trained locally, ChatML) padded
               with added tokens to the config's 151936 ids, so every id the random model emits
               decodes. Built once under ~/.cache/parse-sglang (parse_sglang.model_cache). Prompts:
               random token ids, --context tokens each (seeded; the same for every mode), outputs
               with ignore_eos (every request runs --max-new-tokens). Random weights mean nothing:
               exact acceptance is whatever two random models happen to share, which is why the
               judge is also forced to accept everything / nothing (modes below).
  synthetic    the synthetic trained pair (support.synthetic: real weights, built once in the
               cache, ~6 min on 2 CPU cores), fp32 (--synthetic-dtype), its held-out problems as
               chat prompts (~60 tokens), stopping at EOS: behaviour that needs meaning (what the
               probe and likelihood judges accept). A stand-in, not evidence about large models.
  tiny         support.tiny_models.build_pair (random fp32 Llama, draft = target + 5% noise),
               built in a temporary directory (the --cpu-smoke pair).
  tiny-dummy   gpu_cost's tiny shapes with dummy weights and a padded tokenizer: the qwen3-dummy
               path at a size a CPU runs (tests/test_gpu_serving_smoke.py).

MODES (--modes)
  target_only         the target alone (the reference of every ratio)
  standalone          SGLang's STANDALONE with the same draft at its usual settings
                      (--standalone-steps 3, topk 1, 4 draft tokens)
  parse_lossless      PARSE, judge off (parse_config {"judge": false}), at every L of --steps
  parse_judge_accept  PARSE, probe judge with threshold 0: every round accepts its whole draft
                      (the last boundary is the draft's end), the ceiling of a round
  parse_judge_reject  PARSE, probe judge with threshold 1.0: the judge never takes a token, the
                      floor of a round (exact matches only, with the probe rows paid for)
  parse_likelihood    PARSE, judge_mode "likelihood" (λ = --likelihood-threshold), no probe rows
  (the three judge modes at every L of --judge-steps; accept and reject share one probe-judge
  engine, through per-request settings)
  parse_adaptive      PARSE, judge off, {"adaptive": true} at L = max(--steps): each round's L
                      among the default tiers (L = 32: {0, 4, 8, 16, 32}), costs measured online
                      (no cost table): what a user should run. Lossless. Always its own engine
                      (adaptive is server-wide, never a request's setting); its rounds are not
                      server_L + 1 draft steps, so it has no verify_ms and no gpu_cost prediction
                      (in the default modes; not in --cpu-smoke's)
  draft_only          the draft alone, target-only style: its decode step is the draft step of
                      the cost columns (in the default modes; not in --cpu-smoke)
  parse_head          parse_adaptive with an EAGLE-3 head (`eagle3_head`, k = --eagle3-steps):
                      head rounds as one more tier (docs/eagle3.md). The pair's head: for the
                      dummy pairs a weightless one-layer head of the target's shape (config only,
                      aux layers early / middle / late, served by the dummy loader: its acceptance
                      means nothing, its cost is what the row prices), the synthetic target's
                      distilled head, a random head for tiny. Graphs as for every PARSE engine
                      (the head's chain and extend, the verify with its aux capture). Lossless.
  eagle3              SGLang's own EAGLE3 with the same head, topk 1, k = --eagle3-steps (graphs
                      on a GPU)
  (parse_head and eagle3 are in the default modes, not in --cpu-smoke's)
With --share-engines (the default of --cpu-smoke, where --no-share-engines turns it off) ONE
PARSE engine, at the largest L and with the probe judge on, serves every PARSE row through
per-request settings (custom_params {"parse": {...}}, a smaller L as the request's draft_budget):
fewer engine starts, but every row pays for that engine's round (server_L + 1 draft steps, its
fixed window with probe rows), so its times say nothing about L and there is no draft-step fit.

TIMING. Per engine and batch, a warm-up call (up to 8 new tokens); then per row the timed call
(all `batch` prompts in one generate, --max-new-tokens each) and the same prompts with
max_new_tokens 1 (prefill and first token only, timed too). decode_s = wall_s - prefill_s.
PARSE's server counters (`get_server_info()["internal_states"][0]["parse"]`) are read before and
after the timed call.

COLUMNS (one JSON object per row with --json; the table shows the main ones)
  pair, mode, engine        the pair, the mode, and which engine served the row
  L                         draft tokens per round the row's requests may accept (the request's
                            draft_budget; PARSE rows: parse_adaptive's largest tier),
                            STANDALONE's --standalone-steps; null else
  server_L                  the engine's L (--speculative-num-steps): the draft chain runs
                            server_L + 1 steps and the verify window has server_L + 1 chain rows
                            whatever the request's budget
  batch                     requests in the timed call, all sent at once
  context                   mean prompt length (tokens)
  output_tokens             completion tokens of the timed call, all requests
  wall_s, prefill_s, decode_s   the timed call; the prefill-only call; their difference
  tokens_per_s              output_tokens / wall_s (end to end, prefill included)
  ratio_to_target_only      tokens_per_s / target_only's tokens_per_s (same pair, same batch)
  decode_tokens_per_s       (output_tokens - batch) / decode_s (tokens after the first)
  decode_ratio_to_target_only   the same ratio from decode_tokens_per_s
  rounds                    batch rounds of the timed call: PARSE verify passes (server counter
                            delta; each decode step of an adaptive tier-0 round is one), STANDALONE
                            max spec_verify_ct, target-only max(completion) - 1
  round_ms                  decode_s / rounds (target_only: one decode step, target_step_ms)
  tokens_per_round          tokens after the first per request-round (PARSE: meta_info["parse"]
                            ["rounds"]; STANDALONE: spec_verify_ct; 1 for target-only / draft-only)
  accepted_per_round        A = tokens_per_round - 1 (draft tokens kept per round)
  target_step_ms            target_only's round_ms at this pair and batch
  a_break                   round_ms / target_step_ms - 1: the accepted length per round at which
                            this row's round costs what its tokens cost target-only (break-even)
  draft_step_ms             one draft decode step at this batch: draft_only's round_ms where it
                            ran, else draft_step_fit_ms
  draft_step_fit_ms, fit_intercept_ms   least squares over this pair and batch's parse_lossless
                            rows of round_ms = fit_intercept_ms + (server_L + 1) * draft_step_fit_ms
                            (needs two server L; with a verify pass whose cost does not change
                            with its rows the slope is the draft step; a verify that grows with
                            its rows adds its per-row cost to the slope)
  verify_ms                 round_ms - (server_L + 1) * draft_step_ms: one verify pass (plus the
                            round's host work), PARSE rows
  verify_rows_per_round     PARSE's verify-window rows per request-round (server counters)
  mean_L                    the mean draft length L of the call's request-rounds (parse_adaptive:
                            the tiers it chose; server counters)
  verify_passes, graph_passes   server counter deltas over the timed call (PARSE)
  head_rounds               request-rounds an EAGLE-3 head drafted (server counter delta; PARSE)
  graph_replayed            graph_passes == verify_passes > 0: every round replayed the draft
                            chain's and the verify's graphs (PARSE rows; null for others, whose
                            graph use SGLang does not count per call)
  equal_to_target_only      parse_lossless and parse_adaptive rows: every output equals
                            target_only's, token for token (same pair and batch); null where not
                            lossless
  outputs_equal             share of this row's outputs equal to target_only's (all rows)
  judged_share              draft tokens the judge took beyond exact matches / tokens after the first
  cuda_graphs, attention_backend, dtype, device   the engine's settings, the device name
  predicted_ratio_gpu_cost, gpu_cost_match   with --gpu-cost FILE (below)

COSTS AND BREAK-EVEN. A PARSE round costs (L+1) draft steps + one verify pass whatever it
accepts (docs/gpu.md §9): round_ms = (server_L + 1) * draft_step + verify(server_L). The draft
step is measured directly (draft_only, the draft model served alone at the same batch) and
fitted from the lossless rows at several L (slope above); verify(L) is what remains of the
measured round. The round yields A + 1 tokens where target-only takes A + 1 steps, so PARSE
breaks even at A_break = round_ms / target_step_ms - 1 and gains above it. The judge-accept
rows show the ceiling (A = L), the judge-reject rows the floor.

--gpu-cost FILE: the `--json` output of benchmarks/gpu_cost.py (one or more runs concatenated,
e.g. one per --draft-len). Each run's config line gives its L; its measurement lines give, per
(P, batch), the target decode step, the L+1-step draft loop, the PARSE verify pass and the
plain (L+1)-row prefill. A PARSE row matches the run with L == server_L and the same batch, at
the P nearest to context + max_new_tokens / 2 (the mean committed length while decoding). Its
prediction, at the row's measured A:
(A+1) * t_target_step / (t_draft_loop + t_verify), t_verify = the PARSE verify pass for engines
whose window has probe rows, the plain prefill for chain-only windows (judge off, likelihood),
graph times where all three were captured, else eager ones (as gpu_cost.py predicts): printed
beside the measured decode_ratio_to_target_only (both leave prefill out).

CAVEATS. SGLang's dummy loader seeds every parameter alike (values depend on a tensor's size
and dtype only), so all layers of a dummy model are equal and every engine loads the same
weights: outputs are comparable across modes, and meaningless. In bf16, lossless output may part
from target-only's at a near-tie of the target's logits (the verify pass and a decode step round
differently); outputs_equal says how often. The padded tiny tokenizer's judge suffix is m = 40
tokens (Qwen3's own tokenizer: about 23), so a probe window here has more rows than a real Qwen3
pair's (N_max = 1 + L + K_max * m: 193 at L = 32, Δ = 8). Forced reject is threshold 1.0: a score
of exactly 1.0 (the yes logit ahead by about 17 in fp32) still passes; judged_share shows it.

On a machine without CUDA the CPU runtime is enabled (sglang_cpu, its engine_settings():
fp32, torch-native attention) and PARSE's graph path runs with the eager-replay stand-in
(PARSE_CPU_GRAPHS=1, decode graphs on, prefill graphs off); SGLang's CPU decode graphs cover
TARGET_VERIFY only, so target-only and draft-only run eagerly there.
--cpu-smoke is the small run CI makes (tests/test_gpu_serving_smoke.py): the tiny pair, batches
1 and 4, L 2 and 4, 16 new tokens, one shared PARSE engine; where CUDA is available the same
small run goes to the GPU, graphs on for every engine.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # gpu_cost (its model shapes, its JSON rows)
sys.path.insert(0, str(HERE.parent))  # this checkout's parse_sglang first

from parse_sglang.settings import ParseConfig  # noqa: E402
from parse_sglang.demo import table  # noqa: E402
from parse_sglang.settings import parse_engine_kwargs  # noqa: E402

# λ of the likelihood rows: on SmolLM2 at L = Δ = 4 it gave 3.41 tokens per target forward against
# lossless's 2.67 (benchmarks/README.md, "Judge trade-off curve"), so its rows accept tokens.
LIKELIHOOD_THRESHOLD = 0.05
PAIRS = ("qwen3-dummy", "synthetic", "tiny", "tiny-dummy")
MODES = (
    "target_only",
    "standalone",
    "parse_lossless",
    "parse_judge_accept",
    "parse_judge_reject",
    "parse_likelihood",
    "draft_only",
    "parse_adaptive",
    "parse_head",
    "eagle3",
)
HEAD_MODES = ("parse_head", "eagle3")  # modes that need the pair's EAGLE-3 head
JUDGE_MODES = ("parse_judge_accept", "parse_judge_reject", "parse_likelihood")
PARSE_MODES = ("parse_lossless", *JUDGE_MODES, "parse_adaptive", "parse_head")
LOSSLESS_MODES = ("parse_lossless", "parse_adaptive", "parse_head")
# Every round of these drafts server_L + 1 steps: the cost model (verify_ms, --gpu-cost) holds for them.
FIXED_L_MODES = ("parse_lossless", *JUDGE_MODES)
ATTENTION_BACKENDS = ("triton", "flashinfer", "fa3", "torch_native")
SAMPLING_BACKENDS = ("pytorch", "flashinfer")
DTYPES = ("bfloat16", "float16", "float32")
# Per-request PARSE settings of each mode (custom_params["parse"]); a row adds its draft_budget.
REQUEST_SETTINGS = {
    "parse_lossless": {"judge": False},
    "parse_adaptive": {"judge": False},
    "parse_head": {"judge": False},
    "parse_judge_accept": {"judge_mode": "probe", "threshold": 0.0},
    "parse_judge_reject": {"judge_mode": "probe", "threshold": 1.0},
}
GRAPH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)
TABLE_KEYS = (
    "pair",
    "mode",
    "L",
    "batch",
    "tokens_per_s",
    "ratio_to_target_only",
    "decode_ratio_to_target_only",
    "round_ms",
    "tokens_per_round",
    "a_break",
    "verify_ms",
    "graph_replayed",
    "equal_to_target_only",
)


# ---- pairs -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Pair:
    """A target/draft pair and the prompts it is measured on."""

    name: str
    target: str
    draft: str
    dtype: str
    prompts: list[list[int]]  # at least as many as the largest batch
    ignore_eos: bool
    load_format: str | None = None
    head: str | None = None  # an EAGLE-3 head for the target (modes parse_head, eagle3)

    @property
    def max_position(self) -> int:
        config = json.loads((Path(self.target) / "config.json").read_text())
        return config.get("max_position_embeddings") or 2048


def padded_tokenizer(out_dir: Path, vocab_size: int):
    """tiny_models' locally trained tokenizer (ChatML), padded with added tokens to vocab_size ids."""
    from support.tiny_models import build_tokenizer

    tokenizer = build_tokenizer(out_dir, template="chatml")
    if len(tokenizer) > vocab_size:
        raise ValueError(f"the tokenizer has {len(tokenizer)} ids, more than the config's vocabulary {vocab_size}")
    tokenizer.add_tokens([f"<|pad_{i}|>" for i in range(len(tokenizer), vocab_size)])
    tokenizer.save_pretrained(out_dir)
    return tokenizer


def write_weightless_model(out_dir: Path, shape) -> None:
    """config.json (Qwen3 architecture, `shape`'s hyper-parameters) and a padded tokenizer, no
    weights: what SGLang's `load_format="dummy"` serves with random weights."""
    from transformers import Qwen3Config

    tokenizer = padded_tokenizer(out_dir, shape.vocab)
    Qwen3Config(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.q_heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=40960,
        rope_theta=shape.rope_theta,
        rms_norm_eps=shape.eps,
        tie_word_embeddings=shape.tied_embeddings,
        architectures=["Qwen3ForCausalLM"],
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="bfloat16",
    ).save_pretrained(out_dir)


def weightless_pair(target_shape, draft_shape, cache_dir=None) -> tuple[Path, Path]:
    """(target_dir, draft_dir) of a weightless pair of these shapes, built once into the cache."""
    import hashlib

    from parse_sglang.model_cache import build_once, cache_root

    recipe = {
        "pair": "weightless-qwen3",
        "target": dataclasses.asdict(target_shape),
        "draft": dataclasses.asdict(draft_shape),
        "tokenizer": "tiny_models chatml, padded with added tokens",
    }
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]

    def build(work: Path) -> None:
        write_weightless_model(work / "target", target_shape)
        write_weightless_model(work / "draft", draft_shape)

    folder = build_once(cache_root(cache_dir) / f"{target_shape.name}-dummy-{digest}", recipe, build)
    return folder / "target", folder / "draft"


def weightless_head(target_dir: Path, cache_dir=None) -> Path:
    """A one-layer EAGLE-3 head's config.json for the target at `target_dir` (its shape and
    vocabulary, aux layers early / middle / late), no weights: what SGLang's dummy loader serves
    beside the weightless target. Built once into the cache."""
    import hashlib

    from parse_sglang.model_cache import build_once, cache_root
    from support.eagle3_head import default_aux_layers, head_config

    target = json.loads((Path(target_dir) / "config.json").read_text())
    config = head_config(target, default_aux_layers(target["num_hidden_layers"]), dtype="bfloat16")
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]

    def build(work: Path) -> None:
        (work / "head").mkdir()
        (work / "head" / "config.json").write_text(json.dumps(config, indent=2))

    return build_once(cache_root(cache_dir) / f"eagle3-head-dummy-{digest}", {"head": config}, build) / "head"


def pair_head(pair: Pair, cache_dir=None) -> str:
    """The pair's EAGLE-3 head (MODES: parse_head)."""
    if pair.load_format == "dummy":
        return str(weightless_head(Path(pair.target), cache_dir))
    from support import eagle3_head

    if pair.name == "synthetic":
        return str(eagle3_head.build(cache_dir, log=lambda line: print(line, file=sys.stderr, flush=True)))
    return str(eagle3_head.build_random_head(Path(tempfile.mkdtemp(prefix="gpu_serving_head_")), pair.target))


def random_prompts(count: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """`count` prompts of `length` random token ids (the same for every mode of a run)."""
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(count)]


def load_pair(name: str, args, count: int) -> Pair:
    """The pair `name` with `count` prompts."""
    if name in ("qwen3-dummy", "tiny-dummy"):
        import gpu_cost

        shapes = (
            (gpu_cost.QWEN3_8B, gpu_cost.QWEN3_06B)
            if name == "qwen3-dummy"
            else (gpu_cost.TINY_TARGET, gpu_cost.TINY_DRAFT)
        )
        target, draft = weightless_pair(*shapes, cache_dir=args.cache_dir)
        dtype = "bfloat16" if args.cuda else "float32"
        return Pair(
            name,
            str(target),
            str(draft),
            args.dtype or dtype,
            random_prompts(count, args.context, shapes[0].vocab),
            ignore_eos=True,
            load_format="dummy",
        )
    if name == "tiny":
        from support.tiny_models import build_pair

        target, draft = build_pair(Path(tempfile.mkdtemp(prefix="gpu_serving_")) / "pair")
        return Pair(
            name,
            str(target),
            str(draft),
            args.dtype or "float32",
            random_prompts(count, args.context, 400),
            ignore_eos=True,
        )
    from support import synthetic
    from transformers import AutoTokenizer

    target, draft = synthetic.build(args.cache_dir, log=lambda line: print(line, file=sys.stderr, flush=True))
    enc = synthetic.Encoder(AutoTokenizer.from_pretrained(target))
    prompts = [enc.prompt_ids(p) for p in synthetic.problems(synthetic.TEST_SEED, count)]
    return Pair(name, str(target), str(draft), args.synthetic_dtype, prompts, ignore_eos=False)


# ---- engines and what each serves --------------------------------------------------------------


@dataclasses.dataclass
class RowSpec:
    mode: str
    L: int | None
    request: dict | None = None  # custom_params["parse"]


@dataclasses.dataclass
class EngineSpec:
    name: str
    settings: dict  # sglang.Engine keyword arguments beyond the common ones
    rows: list[RowSpec]
    server_L: int | None = None
    config: ParseConfig | None = None  # PARSE's server config
    graphs: bool = True


def parse_config_for(args, L: int, mode: str) -> ParseConfig:
    """The server ParseConfig of an engine serving `mode` at L. Judge and adaptive are named in
    every mode, so that a change of the package's defaults changes no mode."""
    base = dict(draft_budget=L, probe_stride=args.probe_stride, likelihood_threshold=args.likelihood_threshold)
    if mode == "parse_adaptive":
        return ParseConfig(**base, judge=False, adaptive=True)
    if mode == "parse_lossless":
        return ParseConfig(**base, judge=False, adaptive=False)
    if mode == "parse_likelihood":
        return ParseConfig(**base, judge=True, judge_mode="likelihood", adaptive=False)
    # the probe judge (accept / reject per request; shared engines)
    return ParseConfig(**base, judge=True, judge_mode="probe", adaptive=False)


def request_settings(args, mode: str, L: int, server_L: int) -> dict:
    settings = dict(
        REQUEST_SETTINGS.get(mode, {"judge_mode": "likelihood", "likelihood_threshold": args.likelihood_threshold})
    )
    if L != server_L:
        settings["draft_budget"] = L
    return settings


def plan_engines(args, pair: Pair) -> list[EngineSpec]:
    """Every engine of a pair, PARSE engines with the widest window first (the first engine
    started resolves the "max" batch)."""
    modes, plan = args.modes, []
    parse_rows: dict[tuple[str, int], RowSpec] = {}
    for mode in modes:
        if mode in FIXED_L_MODES:
            for L in args.steps if mode == "parse_lossless" else args.judge_steps:
                parse_rows[(mode, L)] = RowSpec(mode, L)
    if args.share_engines and parse_rows:
        server_L = max(L for _, L in parse_rows)
        config = parse_config_for(args, server_L, "parse_judge_accept")
        rows = [RowSpec(m, L, request_settings(args, m, L, server_L)) for (m, L) in parse_rows]
        plan.append(
            EngineSpec(f"PARSE L={server_L} shared", parse_engine_kwargs(pair.draft, config), rows, server_L, config)
        )
    else:
        groups: dict[tuple[str, int], list[RowSpec]] = {}
        for (mode, L), row in parse_rows.items():
            kind = {"parse_judge_accept": "probe", "parse_judge_reject": "probe"}.get(mode, mode)
            row.request = request_settings(args, mode, L, L)
            groups.setdefault((kind, L), []).append(row)
        order = {"probe": 0, "parse_likelihood": 1, "parse_lossless": 2}
        for (kind, L), rows in sorted(groups.items(), key=lambda item: (order[item[0][0]], -item[0][1])):
            config = parse_config_for(args, L, rows[0].mode)
            label = {"probe": "probe judge", "parse_likelihood": "likelihood", "parse_lossless": "lossless"}[kind]
            plan.append(EngineSpec(f"PARSE L={L} {label}", parse_engine_kwargs(pair.draft, config), rows, L, config))
    if "parse_adaptive" in modes:  # server-wide, so never shared: its own engine even with --share-engines
        L = max(args.steps)
        config = parse_config_for(args, L, "parse_adaptive")
        row = RowSpec("parse_adaptive", L, request_settings(args, "parse_adaptive", L, L))
        plan.append(EngineSpec(f"PARSE adaptive L<={L}", parse_engine_kwargs(pair.draft, config), [row], L, config))
    if "parse_head" in modes:  # the head is server-wide too
        L = max(args.steps)
        config = dataclasses.replace(
            parse_config_for(args, L, "parse_adaptive"), eagle3_head=pair.head, eagle3_steps=args.eagle3_steps
        )
        row = RowSpec("parse_head", L, request_settings(args, "parse_head", L, L))
        name = f"PARSE adaptive L<={L} + EAGLE-3 head k={args.eagle3_steps}"
        plan.append(EngineSpec(name, parse_engine_kwargs(pair.draft, config), [row], L, config))
    if "eagle3" in modes:
        steps = args.eagle3_steps
        settings = dict(
            speculative_algorithm="EAGLE3",
            speculative_draft_model_path=pair.head,
            speculative_num_steps=steps,
            speculative_eagle_topk=1,
            speculative_num_draft_tokens=steps + 1,
        )
        plan.append(EngineSpec(f"EAGLE3 k={steps}", settings, [RowSpec("eagle3", steps)], graphs=args.cuda))
    if "standalone" in modes:
        steps = args.standalone_steps
        plan.append(
            EngineSpec(
                "STANDALONE",
                dict(
                    speculative_algorithm="STANDALONE",
                    speculative_draft_model_path=pair.draft,
                    speculative_num_steps=steps,
                    speculative_eagle_topk=1,
                    speculative_num_draft_tokens=steps + 1,
                ),
                [RowSpec("standalone", steps)],
            )
        )
    # SGLang's CPU decode graphs capture TARGET_VERIFY only: a CPU target-only engine runs eagerly.
    plain_graphs = args.cuda
    if "target_only" in modes:
        plan.append(EngineSpec("target-only", {}, [RowSpec("target_only", None)], graphs=plain_graphs))
    if "draft_only" in modes:
        plan.append(
            EngineSpec("draft-only", {"model_path": pair.draft}, [RowSpec("draft_only", None)], graphs=plain_graphs)
        )
    return plan


def window_rows(pair: Pair, config: ParseConfig | None) -> int:
    """N_max of a PARSE server config (verify rows per request), 0 for other engines."""
    if config is None:
        return 0
    from parse_sglang.attention.window import WindowGeometry

    return WindowGeometry.of_server(config, pair.target).max_rows


def common_settings(args, pair: Pair, max_batch: int, graphs: bool) -> dict:
    """Engine keyword arguments every mode of a pair shares."""
    longest = max(len(p) for p in pair.prompts)
    needed = longest + args.max_new_tokens + 4 * max(args.all_L) + 512  # prompt, output, two windows, slack
    context_length = min(pair.max_position, -(-needed // 256) * 256)
    kwargs = dict(
        model_path=pair.target,
        log_level="error",
        disable_radix_cache=True,
        max_running_requests=max_batch,
        context_length=context_length,
    )
    if args.cuda:
        kwargs.update(
            dtype=pair.dtype, attention_backend=args.attention_backend, sampling_backend=args.sampling_backend
        )
        if args.mem_fraction_static is not None:
            kwargs["mem_fraction_static"] = args.mem_fraction_static
    else:
        from sglang_cpu import engine_settings

        kwargs.update(
            engine_settings(),
            dtype=pair.dtype,
            mem_fraction_static=0.5,
            max_total_tokens=max(8192, 2 * max_batch * context_length),
        )
    if pair.load_format:
        kwargs["load_format"] = pair.load_format
    if graphs and not args.no_graphs:
        buckets = sorted({b for b in GRAPH_BUCKETS if b < max_batch} | {max_batch})
        kwargs.update(disable_cuda_graph=False, cuda_graph_bs_decode=buckets)
        if args.no_prefill_graph or not args.cuda:
            kwargs["disable_prefill_cuda_graph"] = True
    else:
        kwargs["disable_cuda_graph"] = True
    return kwargs


@contextlib.contextmanager
def started(kwargs: dict, cpu_graphs: bool):
    """A running sglang.Engine; with cpu_graphs, PARSE_CPU_GRAPHS=1 while it starts (read by this
    process's server-argument resolution and by the scheduler it spawns)."""
    import sglang

    from sglang_cpu import CPU_GRAPHS_ENV

    before = os.environ.get(CPU_GRAPHS_ENV)
    if cpu_graphs:
        os.environ[CPU_GRAPHS_ENV] = "1"
    try:
        engine = sglang.Engine(**kwargs)
    finally:
        if before is None:
            os.environ.pop(CPU_GRAPHS_ENV, None)
        else:
            os.environ[CPU_GRAPHS_ENV] = before
    try:
        yield engine
    finally:
        engine.shutdown()


def parse_totals(engine) -> dict:
    return engine.get_server_info()["internal_states"][0].get("parse") or {}


# ---- measuring -------------------------------------------------------------------------------


def sampling_params(pair: Pair, row: RowSpec, max_new_tokens: int) -> dict:
    """Greedy, the row's per-request PARSE settings."""
    params = {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": pair.ignore_eos}
    if row.request:
        params["custom_params"] = {"parse": row.request}
    return params


def measure(engine, pair: Pair, spec: EngineSpec, row: RowSpec, batch: int, max_new_tokens: int, warm_up: bool) -> dict:
    """One row: a warm-up call (if warm_up), the timed call, the prefill-only call; counters and outputs."""
    prompts = pair.prompts[:batch]
    params = sampling_params(pair, row, max_new_tokens)
    if warm_up:
        engine.generate(input_ids=prompts, sampling_params=dict(params, max_new_tokens=min(max_new_tokens, 8)))
    before = parse_totals(engine)
    start = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    wall = time.perf_counter() - start
    after = parse_totals(engine)
    start = time.perf_counter()
    engine.generate(input_ids=prompts, sampling_params=dict(params, max_new_tokens=1))
    prefill = time.perf_counter() - start
    return summarize(
        engine, pair, spec, row, batch, TimedCall(prompts, outs, max_new_tokens, wall, prefill, before, after)
    )


@dataclasses.dataclass
class TimedCall:
    """What a timed call gave: its prompts and outputs, wall time, the prefill-only call's time
    (None where the requests did not start together, as in an open loop: then no decode or round
    time), the engine's PARSE counters (parse_totals) before and after."""

    prompts: list[list[int]]
    outs: list[dict]
    max_new_tokens: int
    wall: float
    prefill: float | None
    before: dict
    after: dict


def summarize(engine, pair: Pair, spec: EngineSpec, row: RowSpec, batch: int, call: TimedCall) -> dict:
    """The row of a timed call (module docstring's COLUMNS)."""
    prompts, outs, wall, prefill = call.prompts, call.outs, call.wall, call.prefill
    metas = [o["meta_info"] for o in outs]
    completions = [m["completion_tokens"] for m in metas]
    tokens, after_first = sum(completions), sum(c - 1 for c in completions)
    delta = {
        k: call.after.get(k, 0) - call.before.get(k, 0)
        for k in ("verify_passes", "graph_passes", "rounds", "verify_rows", "draft_length", "head_rounds")
    }
    judged = sum((m.get("parse") or {}).get("accepted_judged", 0) for m in metas)
    if spec.config is not None:
        rounds, request_rounds = delta["verify_passes"], sum((m.get("parse") or {}).get("rounds", 0) for m in metas)
    elif spec.settings.get("speculative_algorithm"):  # SGLang's own speculation (STANDALONE, EAGLE3): its verify counts
        counts = [m.get("spec_verify_ct", 0) for m in metas]
        rounds, request_rounds = max(counts), sum(counts)
    else:  # decode steps: the longest request's, where all of them started together
        rounds, request_rounds = max(completions) - 1 if prefill is not None else None, after_first
    decode = wall - prefill if prefill is not None else None
    parse_row = spec.config is not None
    return {
        "pair": pair.name,
        "mode": row.mode,
        "engine": spec.name,
        "L": row.L,
        "server_L": spec.server_L,
        "batch": batch,
        "context": sum(map(len, prompts)) / len(prompts),
        "max_new_tokens": call.max_new_tokens,
        "output_tokens": tokens,
        "wall_s": wall,
        "prefill_s": prefill,
        "decode_s": decode,
        "tokens_per_s": tokens / wall,
        "decode_tokens_per_s": after_first / decode if decode and decode > 0 and after_first else None,
        "rounds": rounds,
        "round_ms": 1000 * decode / rounds if rounds and decode and decode > 0 else None,
        "tokens_per_round": after_first / request_rounds if request_rounds else None,
        "verify_rows_per_round": delta["verify_rows"] / delta["rounds"] if parse_row and delta["rounds"] else None,
        "mean_L": delta["draft_length"] / delta["rounds"] if parse_row and delta["rounds"] else None,
        "verify_passes": delta["verify_passes"] if parse_row else None,
        "head_rounds": delta["head_rounds"] if parse_row else None,
        "graph_passes": delta["graph_passes"] if parse_row else None,
        "graph_replayed": (delta["verify_passes"] > 0 and delta["graph_passes"] == delta["verify_passes"])
        if parse_row
        else None,
        "judged_share": judged / after_first if after_first else 0.0,
        "cuda_graphs": spec.graphs and not engine_disables_graphs(engine),
        "attention_backend": engine.get_server_info().get("attention_backend"),
        "dtype": pair.dtype,
        "output_ids": [o["output_ids"] for o in outs],
    }


def engine_disables_graphs(engine) -> bool:
    return bool(engine.get_server_info().get("disable_cuda_graph"))


def resolve_max_batch(engine, pair: Pair, spec: EngineSpec, args) -> int:
    """The largest batch whose requests all fit this engine's KV pool at once (prompt, output,
    and SGLang's 2 * N_max slots per speculative request), at most --max-batch."""
    pool = engine.get_server_info()["max_total_num_tokens"]
    need = max(len(p) for p in pair.prompts) + args.max_new_tokens + 2 * max(window_rows(pair, spec.config), 8)
    return max(1, min(args.max_batch, pool // need))


def run_pair(args, pair: Pair, progress) -> list[dict]:
    """Every engine of the pair, one after another; returns the measured rows."""
    batches = [b for b in args.batches if b != "max"]
    want_max = "max" in args.batches
    max_batch = max(batches + ([args.max_batch] if want_max else []))
    rows = []
    for spec in plan_engines(args, pair):
        kwargs = {**common_settings(args, pair, max_batch, spec.graphs), **spec.settings}
        progress(f"{pair.name}: starting {spec.name}")
        start = time.perf_counter()
        with started(kwargs, cpu_graphs=not args.cuda and spec.graphs and not args.no_graphs) as engine:
            progress(f"{pair.name}: {spec.name} started in {time.perf_counter() - start:.0f} s")
            if want_max:
                resolved = resolve_max_batch(engine, pair, spec, args)
                batches = sorted(set(batches) | {resolved})
                want_max = False
                progress(f"{pair.name}: batch 'max' = {resolved} (KV pool of {spec.name})")
            warm = set()
            for row in spec.rows:
                for batch in batches:
                    rows.append(measure(engine, pair, spec, row, batch, args.max_new_tokens, batch not in warm))
                    warm.add(batch)
                    rows[-1]["window_has_probes"] = bool(spec.config and spec.config.uses_probe)
                    progress(
                        f"{pair.name}: {row.mode} L={row.L} batch {batch}: {rows[-1]['tokens_per_s']:.1f} tokens/s"
                    )
                    # the measured row now (its derived columns come at the end): a run cut short keeps it
                    progress("row " + json.dumps({k: v for k, v in rows[-1].items() if k != "output_ids"}))
    return rows


# ---- derived columns -------------------------------------------------------------------------


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """(slope, intercept) of least squares over (x, y) points with >= 2 distinct x."""
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return slope, my - slope * mx


def derive(rows: list[dict]) -> None:
    """Ratios, equality, break-even and cost columns, in place (see the module docstring)."""
    by_key: dict[tuple, dict] = {}
    for row in rows:
        by_key.setdefault((row["pair"], row["batch"], row["mode"]), row)
    for row in rows:
        base = by_key.get((row["pair"], row["batch"], "target_only"))
        draft = by_key.get((row["pair"], row["batch"], "draft_only"))
        lossless = [
            (r["server_L"] + 1, r["round_ms"])
            for r in rows
            if r["pair"] == row["pair"]
            and r["batch"] == row["batch"]
            and r["mode"] == "parse_lossless"
            and r["round_ms"] is not None
        ]
        fit = fit_line(lossless)
        row["draft_step_fit_ms"], row["fit_intercept_ms"] = fit if fit else (None, None)
        row["draft_step_ms"] = draft["round_ms"] if draft else row["draft_step_fit_ms"]
        if row["mode"] != "draft_only":
            row["accepted_per_round"] = None if row["tokens_per_round"] is None else row["tokens_per_round"] - 1
        else:
            row["accepted_per_round"] = None
        row["verify_ms"] = None
        if row["mode"] in FIXED_L_MODES and row["round_ms"] is not None and row["draft_step_ms"] is not None:
            row["verify_ms"] = row["round_ms"] - (row["server_L"] + 1) * row["draft_step_ms"]
        ok = base is not None and row["mode"] != "draft_only"
        row["ratio_to_target_only"] = row["tokens_per_s"] / base["tokens_per_s"] if ok else None
        row["decode_ratio_to_target_only"] = (
            row["decode_tokens_per_s"] / base["decode_tokens_per_s"]
            if ok and row["decode_tokens_per_s"] and base["decode_tokens_per_s"]
            else None
        )
        row["target_step_ms"] = base["round_ms"] if base else None
        row["a_break"] = row["round_ms"] / base["round_ms"] - 1 if ok and row["round_ms"] and base["round_ms"] else None
        same = [a == b for a, b in zip(row["output_ids"], base["output_ids"])] if ok else []
        row["outputs_equal"] = sum(same) / len(same) if same else None
        row["equal_to_target_only"] = all(same) if row["mode"] in LOSSLESS_MODES and same else None


def read_gpu_cost(path: str) -> dict[tuple[int, int, int], dict]:
    """gpu_cost.py --json lines -> {(L, P, batch): {"model/measurement": (graph_ms, eager_ms), "capped": bool}}."""
    costs: dict[tuple[int, int, int], dict] = {}
    L = None
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip().startswith("{"):
            continue
        try:
            item = json.loads(line)
        except ValueError as err:
            raise ValueError(
                f"--gpu-cost {path}: line {number} is not JSON ({err}): allowed is gpu_cost.py --json output"
            ) from None
        if item.get("kind") == "config":
            L = item["L"]
        elif item.get("kind") == "measurement" and L is not None:
            entry = costs.setdefault((L, item["P"], item["batch"]), {"capped": False})
            entry[f"{item['model']}/{item['measurement']}"] = (item.get("graph_ms"), item.get("eager_ms"))
            entry["capped"] |= item.get("layers") != item.get("layers_full")
    if not costs:
        raise ValueError(
            f"--gpu-cost {path}: no measurement rows after a config line: allowed is gpu_cost.py --json output"
        )
    return costs


def add_gpu_cost(rows: list[dict], costs: dict[tuple[int, int, int], dict]) -> None:
    """predicted_ratio_gpu_cost / gpu_cost_match on each PARSE row a gpu_cost run matches (graph
    times where all three were captured, else eager ones, as gpu_cost.py's own prediction)."""
    for row in rows:
        row["predicted_ratio_gpu_cost"], row["gpu_cost_match"] = None, None
        if row["mode"] not in FIXED_L_MODES or row["accepted_per_round"] is None:
            continue
        contexts = [P for (L, P, b) in costs if L == row["server_L"] and b == row["batch"]]
        if not contexts:
            continue
        committed = row["context"] + row["max_new_tokens"] / 2
        P = min(contexts, key=lambda p: abs(p - committed))
        entry = costs[(row["server_L"], P, row["batch"])]
        verify = "target/verify_parse" if row["window_has_probes"] else "target/verify_prefill"
        parts = [entry.get(name, (None, None)) for name in ("target/decode", "draft/draft_loop", verify)]
        timing = "graph" if all(graph is not None for graph, _ in parts) else "eager"
        times = [graph if timing == "graph" else eager for graph, eager in parts]
        if None in times:
            continue
        row["predicted_ratio_gpu_cost"] = (row["accepted_per_round"] + 1) * times[0] / (times[1] + times[2])
        row["gpu_cost_match"] = f"L={row['server_L']} P={P} batch={row['batch']} {verify.split('/')[1]} {timing}" + (
            " (layers capped)" if entry["capped"] else ""
        )


# ---- output ----------------------------------------------------------------------------------


def fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def print_tables(rows: list[dict], gpu_cost: bool) -> None:
    print(table(TABLE_KEYS, [[fmt(r[k]) for k in TABLE_KEYS] for r in rows]))
    print()
    print(
        "Costs per pair and batch (ms): draft step = the draft-only decode step, and the slope of lossless round "
        "time over L+1 (fit); verify(L) = lossless round - (L+1) * draft step:"
    )
    cost_rows = []
    for pair, batch in dict.fromkeys((r["pair"], r["batch"]) for r in rows):
        group = [r for r in rows if r["pair"] == pair and r["batch"] == batch]
        verify = {r["server_L"]: r["verify_ms"] for r in group if r["mode"] == "parse_lossless"}
        one = group[0]
        cost_rows.append(
            [
                pair,
                str(batch),
                fmt(one["target_step_ms"]),
                fmt(next((r["round_ms"] for r in group if r["mode"] == "draft_only"), None)),
                fmt(one["draft_step_fit_ms"]),
                fmt(one["fit_intercept_ms"]),
                ", ".join(f"L={L}: {fmt(v)}" for L, v in sorted(verify.items()) if v is not None) or "-",
            ]
        )
    print(
        table(
            [
                "pair",
                "batch",
                "target step",
                "draft step (alone)",
                "draft step (fit)",
                "fit intercept",
                "verify(L) lossless",
            ],
            cost_rows,
        )
    )
    if all(r["draft_step_fit_ms"] is None for r in rows):
        print("(no fit: it needs parse_lossless engines at two L or more; --share-engines runs one PARSE engine)")
    if gpu_cost:
        print()
        print("gpu_cost.py prediction at the measured A beside the measured decode ratio:")
        keys = (
            "pair",
            "mode",
            "L",
            "batch",
            "accepted_per_round",
            "decode_ratio_to_target_only",
            "predicted_ratio_gpu_cost",
            "gpu_cost_match",
        )
        print(table(keys, [[fmt(r[k]) for k in keys] for r in rows if r["mode"] in FIXED_L_MODES]))


def plot(rows: list[dict], path: str, title: str) -> None:
    """Throughput ratio to target-only against accepted draft tokens per round, a panel per pair:
    filled markers end to end, hollow ones decode only; colour = batch, marker = mode."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    pairs = list(dict.fromkeys(r["pair"] for r in rows))
    fig, axes = plt.subplots(1, len(pairs), figsize=(6.5 * len(pairs), 5), squeeze=False)
    markers = dict(zip(MODES, "sDo^v*xPh<"))
    batches = sorted({r["batch"] for r in rows})
    colours = {b: plt.cm.viridis(i / max(len(batches) - 1, 1)) for i, b in enumerate(batches)}
    for ax, pair in zip(axes[0], pairs):
        shown = [
            r
            for r in rows
            if r["pair"] == pair and r["accepted_per_round"] is not None and r["ratio_to_target_only"] is not None
        ]
        for r in shown:
            c, m = colours[r["batch"]], markers[r["mode"]]
            ax.scatter(r["accepted_per_round"], r["ratio_to_target_only"], color=c, marker=m)
            if r["decode_ratio_to_target_only"] is not None:
                ax.scatter(
                    r["accepted_per_round"],
                    r["decode_ratio_to_target_only"],
                    facecolors="none",
                    edgecolors=[c],
                    marker=m,
                )
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("accepted draft tokens per round (A)")
        ax.set_ylabel("throughput / target-only")
        ax.set_title(f"{pair} (filled: end to end, hollow: decode only)", fontsize=9)
        handles = [
            Line2D([], [], color="k", marker=markers[mode], ls="", label=mode)
            for mode in dict.fromkeys(r["mode"] for r in shown)
        ]
        handles += [Line2D([], [], color=colours[b], marker="o", ls="", label=f"batch {b}") for b in batches]
        ax.legend(handles=handles, fontsize=7)
    fig.suptitle("\n".join(textwrap.wrap(title, 110)), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---- command line ----------------------------------------------------------------------------


def kit_flags() -> dict[str, str]:
    """`--flag value` pairs of $GPUKIT_SERVER_FLAGS (set by the gpu-kit's env.sh), the defaults of
    --attention-backend / --sampling-backend where it names them."""
    import shlex

    words = shlex.split(os.environ.get("GPUKIT_SERVER_FLAGS", ""))
    return {flag: value for flag, value in zip(words, words[1:]) if flag.startswith("--")}


SMOKE = dict(
    pairs=["tiny"],
    batches=[1, 4],
    steps=[2, 4],
    judge_steps=[4],
    context=48,
    max_new_tokens=16,
    probe_stride=2,
    # parse_adaptive's own engine would double the smoke's PARSE starts: --modes names it where wanted
    modes=[m for m in MODES if m not in ("draft_only", "parse_adaptive", *HEAD_MODES)],
    max_batch=4,
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python benchmarks/gpu_serving.py", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="tiny models on CPU, PARSE's graph path with the eager-replay stand-in (~1 minute)",
    )
    parser.add_argument("--pairs", nargs="+", help=f"allowed: {', '.join(PAIRS)} (default qwen3-dummy synthetic)")
    parser.add_argument("--modes", nargs="+", help=f"allowed: {', '.join(MODES)} (default all)")
    parser.add_argument("--batches", nargs="+", help="batch sizes, integers >= 1 or 'max' (default 1 8 32 max)")
    parser.add_argument("--max-batch", type=int, help="largest batch 'max' may resolve to (default 64)")
    parser.add_argument("--steps", nargs="+", type=int, help="L of parse_lossless (default 4 8 16 32)")
    parser.add_argument("--judge-steps", nargs="+", type=int, help="L of the judge modes (default 8 32)")
    parser.add_argument("--standalone-steps", type=int, default=3, help="STANDALONE's --speculative-num-steps")
    parser.add_argument("--eagle3-steps", type=int, default=3, help="head steps per round (parse_head, eagle3)")
    parser.add_argument("--probe-stride", type=int, help="Δ of the probe judge (default 8)")
    parser.add_argument(
        "--likelihood-threshold", type=float, default=LIKELIHOOD_THRESHOLD, help="λ of parse_likelihood"
    )
    parser.add_argument("--context", type=int, help="prompt tokens of the random-prompt pairs (default 1000)")
    parser.add_argument("--max-new-tokens", type=int, help="output tokens per request (default 128)")
    parser.add_argument(
        "--share-engines",
        action=argparse.BooleanOptionalAction,
        help="one PARSE engine serves every PARSE row (default with --cpu-smoke only)",
    )
    parser.add_argument(
        "--attention-backend",
        help=f"CUDA; allowed: {', '.join(ATTENTION_BACKENDS)} (default: $GPUKIT_SERVER_FLAGS's, else triton)",
    )
    parser.add_argument(
        "--sampling-backend",
        help=f"CUDA; allowed: {', '.join(SAMPLING_BACKENDS)} (default: $GPUKIT_SERVER_FLAGS's, else pytorch)",
    )
    parser.add_argument(
        "--dtype", help=f"random-prompt pairs; allowed: {', '.join(DTYPES)} (default bfloat16 on CUDA, float32 on CPU)"
    )
    parser.add_argument("--synthetic-dtype", default="float32", help=f"allowed: {', '.join(DTYPES)}")
    parser.add_argument("--mem-fraction-static", type=float, help="SGLang's --mem-fraction-static (CUDA)")
    parser.add_argument("--no-graphs", action="store_true", help="every engine eager (for comparison)")
    parser.add_argument("--no-prefill-graph", action="store_true", help="SGLang's prefill CUDA graph off")
    parser.add_argument("--gpu-cost", help="gpu_cost.py --json output to set its predictions beside the ratios")
    parser.add_argument("--json", action="store_true", help="one JSON object per row on stdout, no tables")
    parser.add_argument("--plot", help="PNG path (default benchmarks/gpu_serving.png; --cpu-smoke: a temp file)")
    parser.add_argument(
        "--cache-dir", help="cache root of built models (default $PARSE_SGLANG_CACHE or ~/.cache/parse-sglang)"
    )
    args = parser.parse_args(argv)
    import torch

    args.cuda = torch.cuda.is_available()
    defaults = dict(
        pairs=["qwen3-dummy", "synthetic"],
        batches=["1", "8", "32", "max"],
        steps=[4, 8, 16, 32],
        judge_steps=[8, 32],
        context=1000,
        max_new_tokens=128,
        probe_stride=8,
        modes=list(MODES),
        max_batch=64,
        share_engines=False,
    )
    if args.cpu_smoke:
        defaults.update(SMOKE, batches=[str(b) for b in SMOKE["batches"]], share_engines=True)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    kit = kit_flags()
    args.attention_backend = args.attention_backend or kit.get("--attention-backend", "triton")
    args.sampling_backend = args.sampling_backend or kit.get("--sampling-backend", "pytorch")

    def refuse(flag, value, allowed):
        parser.error(f"--{flag}={value} is invalid: allowed is {allowed}")

    for flag, values, allowed in (
        ("pairs", args.pairs, PAIRS),
        ("modes", args.modes, MODES),
        ("attention-backend", [args.attention_backend], ATTENTION_BACKENDS),
        ("sampling-backend", [args.sampling_backend], SAMPLING_BACKENDS),
        ("synthetic-dtype", [args.synthetic_dtype], DTYPES),
        ("dtype", [args.dtype] if args.dtype else [], DTYPES),
    ):
        for value in values:
            if value not in allowed:
                refuse(flag, value, "one of " + ", ".join(allowed))
    batches = []
    for value in args.batches:
        if value != "max" and not (value.isdigit() and int(value) >= 1):
            refuse("batches", value, "an integer >= 1 or 'max'")
        batches.append(value if value == "max" else int(value))
    args.batches = list(dict.fromkeys(batches))
    for flag, values, low, high in (
        ("steps", args.steps, 1, 1024),
        ("judge-steps", args.judge_steps, 1, 1024),
        ("standalone-steps", [args.standalone_steps], 1, 1024),
        ("probe-stride", [args.probe_stride], 1, 1024),
        ("context", [args.context], 1, 1 << 20),
        ("max-new-tokens", [args.max_new_tokens], 2, 1 << 20),
        ("max-batch", [args.max_batch], 1, 4096),
    ):
        for value in values:
            if not low <= value <= high:
                refuse(flag, value, f"an integer in [{low}, {high}]")
    if not 0.0 <= args.likelihood_threshold <= 1.0:
        refuse("likelihood-threshold", args.likelihood_threshold, "a number in [0, 1]")
    if args.mem_fraction_static is not None and not 0.0 < args.mem_fraction_static < 1.0:
        refuse("mem-fraction-static", args.mem_fraction_static, "a number in (0, 1)")
    if args.gpu_cost:
        try:
            args.gpu_cost_table = read_gpu_cost(args.gpu_cost)
        except OSError as err:
            parser.error(
                f"--gpu-cost={args.gpu_cost} cannot be read ({err.strerror}): allowed is a file of "
                "gpu_cost.py --json output"
            )
        except ValueError as err:
            parser.error(str(err))
    if "qwen3-dummy" in args.pairs and not args.cuda:
        parser.error(
            "--pairs=qwen3-dummy needs a CUDA device (an 8B model): allowed here are tiny, tiny-dummy, "
            "synthetic (or --cpu-smoke)"
        )
    parse_modes = [m for m in args.modes if m in PARSE_MODES]
    args.all_L = sorted(
        set(args.steps if "parse_lossless" in parse_modes else [])
        | set(args.judge_steps if set(parse_modes) & set(JUDGE_MODES) else [])
        | ({max(args.steps)} if {"parse_adaptive", "parse_head"} & set(parse_modes) else set())
        | {1}
    )
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.cuda:
        import sglang_cpu

        sglang_cpu.enable()

    def progress(line: str) -> None:
        print(f"[gpu_serving {time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)

    count = max([b for b in args.batches if b != "max"] + ([args.max_batch] if "max" in args.batches else []))
    rows = []
    for name in args.pairs:
        pair = load_pair(name, args, count)
        if set(HEAD_MODES) & set(args.modes):
            pair.head = pair_head(pair, args.cache_dir)
        rows += run_pair(args, pair, progress)
    derive(rows)
    if args.gpu_cost:
        add_gpu_cost(rows, args.gpu_cost_table)
    else:
        for row in rows:
            row["predicted_ratio_gpu_cost"], row["gpu_cost_match"] = None, None
    import sglang
    import torch

    device = torch.cuda.get_device_name() if args.cuda else "cpu"
    for row in rows:
        row["device"] = device
    backends = f"{args.attention_backend} attention, {args.sampling_backend} sampling" if args.cuda else "torch_native"
    title = (
        f"gpu_serving on {device} ({backends}; SGLang {sglang.__version__}, torch {torch.__version__})"
        f"{' smoke run, tiny random models: not a speed claim' if args.cpu_smoke else ''}: context "
        f"{args.context}, {args.max_new_tokens} new tokens, steps {args.steps}, judge steps {args.judge_steps}, "
        f"STANDALONE {args.standalone_steps}, Δ={args.probe_stride}, λ={args.likelihood_threshold:g}"
        f"{', graphs off' if args.no_graphs else ''}"
    )
    path = args.plot or (
        str(Path(tempfile.mkdtemp(prefix="gpu_serving_")) / "gpu_serving.png")
        if args.cpu_smoke
        else str(HERE / "gpu_serving.png")
    )
    plot(rows, path, title)
    if args.json:
        for row in rows:
            print(json.dumps({k: v for k, v in row.items() if k != "output_ids"}))
    else:
        print(title)
        print_tables(rows, bool(args.gpu_cost))
        print(f"plot: {path}")
    progress(f"plot: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
