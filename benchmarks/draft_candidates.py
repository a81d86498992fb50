"""Which draft for SmolLM2-135M-Instruct? Candidates built offline from the target alone.

Every candidate shares the target's tokenizer and is a plain Llama checkpoint: a copy of the
target that keeps some of its 30 decoder layers (embeddings, final norm and tied lm_head
kept), plus a bf16 copy as a reference point. Families:
  first k        the bottom k layers (the draft stops early: LayerSkip-style exit without training)
  every other    layers 0, 2, 4, ...
  drop last n    the first 30-n layers
  greedy k       layers removed one at a time, each time the one whose removal keeps top-1
                 agreement highest on CALIBRATION prompts (self-speculative "Draft & Verify"
                 layer skipping, searched greedily instead of by Bayesian optimisation)

Measured per candidate, on EVAL prompts (disjoint from the calibration prompts), along the
target's own greedy trajectory (chat template applied):
  agree     top-1 agreement with the target (teacher-forced over the target's tokens)
  tok/fwd   tokens per target forward of lossless speculative decoding (judge off), simulated
            exactly from the agreement sequence: a round emits min(run, L) + 1 tokens
  MACs      draft / target multiply-accumulates per decoded token (weights only, so also the
            ratio of weight bytes a decode step reads): hardware independent
  est x     estimated lossless speed-up at the best L (column "L"), the usual model of
            speculative decoding where a verify pass of L+1 tokens costs one target step:
            tok/fwd(L) / (1 + L * MACs)
  cost, est x meas.
            the same from wall-clock times on this machine: draft / target decode step
            (batch 1, 64-token context, min over interleaved repetitions) and
            tok/fwd(L) * t_step / (t_verify(L+1) + L * t_draft) at its best L. On a shared
            CPU these swing run to run; the MACs columns do not.
Then, for the best few, the HF reference PARSE generator (`support.reference`) with the
judge off (its tokens per target forward must match the simulated column) and on (how much
the target's own judge accepts beyond exact matches, and whether answers change).

    python benchmarks/draft_candidates.py [--threads 2] [--max-new-tokens 48]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from parse_sglang.demo import chat_prompt_ids

os.environ.setdefault("HF_HUB_OFFLINE", "1")

EVAL_PROMPTS = [
    "What is 12 times 7?",
    "What is the capital of France?",
    "Write a Python function that returns the square of a number.",
    "Explain in two sentences why the sky is blue.",
    "List three fruits that are red.",
    "Translate 'good morning' into Spanish.",
    "What is photosynthesis?",
    "Give me a tip for staying focused while studying.",
]
CALIBRATION_PROMPTS = [
    "What is 15 plus 27?",
    "Who wrote Romeo and Juliet?",
    "Write a Python function that checks whether a number is even.",
    "Why do leaves change colour in autumn?",
    "Name two planets in the solar system.",
    "How do I boil an egg?",
    "What is the boiling point of water in Celsius?",
    "Suggest a name for a pet cat.",
]
BUDGETS = (1, 2, 3, 4, 6, 8)  # L values of the simulation; --reference-budget must be one
CONTEXT = 64


@dataclass
class Candidate:
    name: str
    layers: tuple[int, ...]
    dtype: torch.dtype = torch.float32


@torch.no_grad()
def greedy_trajectories(model, tokenizer, prompts, max_new_tokens):
    """(prompt ids, target greedy output ids) per prompt, stopping at EOS."""
    out = []
    for ids in chat_prompt_ids(tokenizer, prompts):
        gen = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False)
        out.append((ids, gen[0, len(ids) :].tolist()))
    return out


class TeacherForced:
    """The target's residual stream over a padded batch of (prompt + target output) sequences,
    so any layer subset's top-1 along the target trajectory costs only the layers it runs."""

    def __init__(self, model, trajectories, pad_id):
        self.model = model
        seqs = [p + o for p, o in trajectories]
        width = max(map(len, seqs))
        self.input_ids = torch.tensor([s + [pad_id] * (width - len(s)) for s in seqs])
        # rows predicting output token i of sequence b: position len(prompt) - 1 + i
        self.rows_b = torch.cat([torch.full((len(o),), b) for b, (_, o) in enumerate(trajectories)])
        self.rows_t = torch.cat([torch.arange(len(o)) + len(p) - 1 for p, o in trajectories])
        self.targets = torch.cat([torch.tensor(o) for _, o in trajectories])
        self.lengths = [len(o) for _, o in trajectories]
        positions = torch.arange(width)[None].expand(len(seqs), -1)
        self.embeds = model.model.embed_tokens(self.input_ids)
        self.rope = model.model.rotary_emb(self.embeds, position_ids=positions)

    @torch.no_grad()
    def run(self, hidden, layers):
        for i in layers:  # right padding + causal attention: padding never reaches a real row
            hidden = self.model.model.layers[i](hidden, attention_mask=None, position_embeddings=self.rope)
        return hidden

    @torch.no_grad()
    def agreement_flags(self, hidden) -> torch.Tensor:
        """Per output token: does the top-1 after `hidden` (final norm + lm_head) equal the target's?"""
        h = self.model.model.norm(hidden[self.rows_b, self.rows_t])
        return self.model.lm_head(h).argmax(-1) == self.targets

    def flags(self, layers) -> torch.Tensor:
        return self.agreement_flags(self.run(self.embeds, layers))

    def split(self, flags) -> list[torch.Tensor]:
        return list(torch.split(flags, self.lengths))


def greedy_layer_removal(tf: TeacherForced, total: int, down_to: int, width: int, log) -> dict[int, tuple[int, ...]]:
    """Remove one layer at a time, each time the one whose removal keeps agreement highest.

    Only the `width` layers that change the residual stream least (lowest block influence,
    1 - cos(input, output), as in ShortGPT) are tried at each step, and hidden states before
    each kept layer are cached, so trying layer j reruns only the layers after it.
    Returns {k: kept layers} for k = total-1 .. down_to.
    """
    kept = list(range(total))
    path = {}
    while len(kept) > down_to:
        states = [tf.embeds]
        for i in kept:
            states.append(tf.run(states[-1], [i]))
        rows = lambda h: h[tf.rows_b, tf.rows_t]
        influence = torch.stack(
            [1 - torch.cosine_similarity(rows(a), rows(b), dim=-1).mean() for a, b in zip(states[:-1], states[1:])]
        )
        tried = influence.argsort()[:width].tolist()
        scores = {pos: float(tf.agreement_flags(tf.run(states[pos], kept[pos + 1 :])).float().mean()) for pos in tried}
        best = max(scores, key=lambda pos: (scores[pos], pos))
        log(f"  greedy: drop layer {kept[best]:2d} -> {len(kept) - 1} layers, calibration agreement {scores[best]:.3f}")
        del kept[best]
        path[len(kept)] = tuple(kept)
    return path


def lossless_tokens_per_forward(flags_per_prompt, budget: int) -> float:
    """Exact for greedy lossless speculative decoding along the target trajectory: a round at
    output position p accepts the run of agreeing draft tokens (at most `budget`) plus a bonus."""
    tokens = rounds = 0
    for flags in flags_per_prompt:
        disagree = torch.nonzero(~flags).flatten().tolist() + [len(flags)]
        n, p = len(flags), 0
        while p < n:
            run = next(d for d in disagree if d >= p) - p
            p += min(run, budget) + 1
            rounds += 1
        tokens += n
    return tokens / rounds


def macs_per_token(config, layers: int) -> int:
    """Weight multiply-accumulates of one decoded token: attention and MLP projections, lm_head."""
    hidden, head_dim = config.hidden_size, config.head_dim
    q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    per_layer = hidden * (2 * q + 2 * kv) + 3 * hidden * config.intermediate_size
    return layers * per_layer + hidden * config.vocab_size


def timing_model(config, layers: int, dtype):
    from transformers import LlamaForCausalLM

    cfg = copy.deepcopy(config)
    cfg.num_hidden_layers = layers
    return LlamaForCausalLM(cfg).to(dtype).eval()


@torch.no_grad()
def step_and_verify_times(models: dict, target_key, repeats: int, budgets) -> tuple[dict, dict]:
    """Decode-step time of every model and target verify time for each window L+1, interleaved
    round-robin over `repeats` passes; the minimum per measurement is kept."""
    from transformers import DynamicCache

    ctx = torch.randint(100, 40000, (1, CONTEXT))
    caches = {}
    for key, model in models.items():
        caches[key] = DynamicCache()
        model(ctx, past_key_values=caches[key], use_cache=True)
    steps = {key: float("inf") for key in models}
    verify = {L: float("inf") for L in budgets}
    token = torch.tensor([[1234]])
    for _ in range(repeats):
        for key, model in models.items():
            start = time.perf_counter()
            model(token, past_key_values=caches[key], use_cache=True)
            steps[key] = min(steps[key], time.perf_counter() - start)
            caches[key].crop(-1)
        for L in budgets:
            window = torch.randint(100, 40000, (1, L + 1))
            start = time.perf_counter()
            models[target_key](window, past_key_values=caches[target_key], use_cache=True)
            verify[L] = min(verify[L], time.perf_counter() - start)
            caches[target_key].crop(-(L + 1))
    return steps, verify


@torch.no_grad()
def reference_runs(target, tokenizer, trajectories, draft_dirs, budget, log):
    """PARSE through the HF reference generator, judge off (checks the simulated tok/fwd) and on.

    No wall times: the reference is the readable implementation, not the fast path."""
    from transformers import AutoModelForCausalLM

    from parse_sglang.settings import ParseConfig
    from support.reference import ParseGenerator

    max_new = max(len(o) for _, o in trajectories)
    rows = []
    for name, path in draft_dirs.items():
        draft = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        for judge in (False, True):
            gen = ParseGenerator(
                target,
                draft,
                tokenizer,
                ParseConfig(draft_budget=budget, judge=judge, judge_mode="probe", threshold=0.5),
            )
            generated = forwards = judged = same = 0
            for ids, reference in trajectories:
                out, stats = gen.generate(ids, max_new)
                generated += stats.generated
                forwards += stats.target_forwards
                judged += stats.accepted_judged
                same += out == reference
            rows.append(
                (
                    name,
                    "on" if judge else "off",
                    generated / forwards,
                    judged / generated,
                    f"{same}/{len(trajectories)}",
                )
            )
            log(f"  reference PARSE {name} judge={'on' if judge else 'off'}: {rows[-1][2]:.2f} tok/fwd")
    return rows


def table(header, rows) -> str:
    cells = [header] + [
        [c if isinstance(c, str) else f"{c:.3f}" if isinstance(c, float) else str(c) for c in r] for r in rows
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"
    return "\n".join(
        [line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in cells[1:]]
    )


def layer_text(layers, total) -> str:
    if len(layers) == total:
        return "all"
    return ",".join(map(str, layers))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--search-down-to", type=int, default=12, help="greedy removal stops at this many layers")
    parser.add_argument("--search-width", type=int, default=6, help="layers tried per greedy step (lowest influence)")
    parser.add_argument("--repeats", type=int, default=25, help="timing passes (min kept)")
    parser.add_argument("--reference-top", type=int, default=3, help="run the HF PARSE reference on the best N")
    parser.add_argument("--reference-budget", type=int, default=4, help="draft budget L of those runs")
    parser.add_argument("--cache-dir", default=None, help="model cache (default: parse_sglang.smollm2's)")
    args = parser.parse_args(argv)
    if args.reference_budget not in BUDGETS:
        parser.error(f"--reference-budget={args.reference_budget} is invalid: allowed is one of {BUDGETS}")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    began = time.perf_counter()
    log = lambda msg: print(f"[{time.perf_counter() - began:6.0f} s] {msg}", file=sys.stderr, flush=True)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from parse_sglang import smollm2

    target_path = smollm2.target_dir(args.cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(target_path)
    target = AutoModelForCausalLM.from_pretrained(target_path, dtype=torch.float32).eval()
    total = target.config.num_hidden_layers

    log("target greedy trajectories ...")
    eval_traj = greedy_trajectories(target, tokenizer, EVAL_PROMPTS, args.max_new_tokens)
    calib_traj = greedy_trajectories(target, tokenizer, CALIBRATION_PROMPTS, args.max_new_tokens)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    eval_tf, calib_tf = TeacherForced(target, eval_traj, pad), TeacherForced(target, calib_traj, pad)
    self_agree = float(eval_tf.flags(range(total)).float().mean())
    if self_agree < 0.999:
        raise RuntimeError(f"teacher-forced target agrees with its own greedy output only {self_agree:.3f}")

    log("greedy layer removal on the calibration prompts ...")
    greedy = greedy_layer_removal(calib_tf, total, args.search_down_to, args.search_width, log)

    candidates = [
        Candidate("target (reference)", tuple(range(total))),
        Candidate("bf16 copy", tuple(range(total)), torch.bfloat16),
    ]
    for k in (8, 15, 20):
        candidates.append(Candidate(f"first {k}", tuple(range(k))))
    candidates.append(Candidate("every other (even)", tuple(range(0, total, 2))))
    candidates.append(Candidate("every other (odd)", tuple(range(1, total, 2))))
    candidates.append(Candidate("drop last 6", tuple(range(total - 6))))
    candidates.append(Candidate("first 10 + last 5", tuple(range(10)) + tuple(range(total - 5, total))))
    for k in (27, 24, 20, 15, 12):
        if k in greedy:
            candidates.append(Candidate(f"greedy {k}", greedy[k]))

    log("agreement ...")
    flags = {}
    bf16_target = copy.deepcopy(target).to(torch.bfloat16)
    for c in candidates:
        if c.dtype == torch.bfloat16:
            tf = TeacherForced(bf16_target, eval_traj, pad)
            flags[c.name] = tf.split(tf.flags(range(total)).cpu())
        else:
            flags[c.name] = eval_tf.split(eval_tf.flags(c.layers))

    log("timing ...")
    depths = sorted({(len(c.layers), c.dtype) for c in candidates}, key=lambda d: (d[0], str(d[1])))
    models = {(total, torch.float32): target}
    for depth, dtype in depths:
        if (depth, dtype) not in models:
            models[(depth, dtype)] = (
                bf16_target if (depth, dtype) == (total, torch.bfloat16) else timing_model(target.config, depth, dtype)
            )
    steps, verify = step_and_verify_times(models, (total, torch.float32), args.repeats, BUDGETS)
    t_step = steps[(total, torch.float32)]

    rows, scored = [], []
    for c in candidates:
        f = flags[c.name]
        agree = float(torch.cat(f).float().mean())
        macs = macs_per_token(target.config, len(c.layers)) / macs_per_token(target.config, total)
        cost = steps[(len(c.layers), c.dtype)] / t_step
        per_budget = {L: lossless_tokens_per_forward(f, L) for L in BUDGETS}
        est = {L: per_budget[L] / (1 + L * macs) for L in BUDGETS}
        measured = {L: per_budget[L] * t_step / (verify[L] + L * cost * t_step) for L in BUDGETS}
        best_L, best_measured = max(est, key=est.get), max(measured, key=measured.get)
        rows.append(
            [
                c.name + (" (chosen)" if c.layers == smollm2.DRAFT_LAYERS else ""),
                len(c.layers),
                agree,
                per_budget[args.reference_budget],
                macs,
                est[best_L],
                best_L,
                cost,
                f"{measured[best_measured]:.3f} (L={best_measured})",
                layer_text(c.layers, total),
            ]
        )
        if c.name != "target (reference)" and c.dtype == torch.float32:
            scored.append((est[best_L], agree, c))

    out = [
        "## Draft candidates for SmolLM2-135M-Instruct (fp32 target, 30 layers)",
        "",
        f"{len(EVAL_PROMPTS)} eval prompts, {args.max_new_tokens} target greedy tokens each "
        f"({sum(eval_tf.lengths)} tokens), torch threads={args.threads}; measured: target decode step "
        f"{t_step * 1e3:.1f} ms, verify windows of 2 / 5 / 9 tokens "
        f"{verify[1] * 1e3:.1f} / {verify[4] * 1e3:.1f} / {verify[8] * 1e3:.1f} ms.",
        "",
        table(
            [
                "candidate",
                "layers",
                "agree",
                f"tok/fwd L={args.reference_budget}",
                "MACs",
                "est x",
                "L",
                "cost",
                "est x meas.",
                "kept layers",
            ],
            rows,
        ),
        "",
    ]

    scored.sort(key=lambda s: (s[0], s[1]), reverse=True)
    top = [c for _, _, c in scored[: args.reference_top]]
    if top:
        log("HF reference PARSE runs ...")
        with tempfile.TemporaryDirectory(prefix="parse-draft-candidates-") as tmp:
            dirs = {}
            for c in top:
                dirs[c.name] = Path(tmp) / c.name.replace(" ", "_")
                smollm2.write_layer_subset(target_path, dirs[c.name], c.layers)
            ref_rows = reference_runs(target, tokenizer, eval_traj, dirs, args.reference_budget, log)
        out += [
            f"HF reference generator (support.reference), draft budget L={args.reference_budget}, "
            "default ParseConfig otherwise (judge threshold 0.5, probe every ~8 tokens); judged share = "
            "tokens kept only because the judge said yes; == target = answers identical to target greedy:",
            "",
            table(["draft", "judge", "tok/fwd", "judged share", "== target"], ref_rows),
            "",
        ]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
