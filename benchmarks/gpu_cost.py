"""GPU cost lab: a PARSE round on real model shapes in plain PyTorch (random weights, no SGLang).

A minimal decoder (embedding, RMSNorm, fused QKV with Qwen3's q/k norms, RoPE, SwiGLU MLP,
lm_head) with a preallocated static KV cache [layers, batch, max_ctx, kv_heads, head_dim]
and `torch.nn.functional.scaled_dot_product_attention`, built twice with random weights:
a Qwen3-8B-shaped target and a Qwen3-0.6B-shaped draft. Every request of a batch has the
same committed context of P tokens (random KV); for each context P and batch size it times

  decode             one decode step (target, draft), eager and as a CUDA graph
  verify_parse       ONE target pass over the PARSE window, N = 1 + L + K*m rows, with the
                     PARSE mask (parse_sglang.attention.layout): chain rows causal, probe k
                     sees chain rows 0..b_k and its own earlier rows, every row the context
  verify_prefill     ONE target pass over the L+1 chain rows, causal (token-level verify)
  verify_sequential  K target passes (SpecReason-style judging, each judged step's KV kept):
                     pass k extends the draft from b_{k-1} to b_k and appends the m-token
                     suffix; the next pass overwrites the suffix's KV (the PARSE pass's N
                     rows in K passes; what benchmarks/verify_cost.py times on CPU)
  verify_sequential_reread  K target passes, each over c_n, d_1..d_{b_k} and the suffix
                     straight from the committed context (nothing of the draft kept):
                     K(1+m) + sum b_k rows
  draft_loop         L+1 greedy draft decode steps (eager; graphed = the whole loop as one
                     graph, as SGLang captures EAGLE/STANDALONE draft steps)

Full-vocabulary logits are computed only for the rows PARSE reads (chain rows; the last row
of each probe); the other rows are pruned before the final norm and lm_head.
Timing: CUDA events after warm-up (time.perf_counter on CPU), median of --repeats. Then the
predicted speedup over target-only for an accepted length A (tokens per round A + 1):

  speedup(A) = (A+1) * t_target_step / (t_draft_loop + t_verify)

t_target_step = one graphed target decode step, t_draft_loop = the graphed L+1-step draft
loop, t_verify = one graphed PARSE verify pass (eager times where there are no CUDA graphs).

Memory: the models are measured one at a time; a (P, batch) case whose weights + KV +
activations would not fit --mem-gib (default 78) runs with fewer layers, or is skipped,
and its row says so.

Run:  python benchmarks/gpu_cost.py --check          (CUDA device: full shapes, bf16)
      python benchmarks/gpu_cost.py --tiny           (tiny shapes; runs on CPU in seconds)
--json prints one JSON object per row; --check first compares the verify pass's logits with
separate forwards on the device (2 target layers); --sdpa restricts SDPA's backends.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

# The verify mask comes from the project's own layout (pure torch, no SGLang). Put the checkout
# this script belongs to first on the path, so it is the one used, installed or not.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from parse_sglang.attention.layout import VerifyRequest, build_verify_layout  # noqa: E402

FORMULA = "speedup(A) = (A+1) * t_target_step / (t_draft_loop + t_verify)"
SWEEP = (2, 4, 8, 16)
MASK_ALIGN = 16  # attended KV length of a masked pass is padded to this (SDPA's aligned-mask path)
RESERVE_GIB = 2.0  # CUDA context, cuBLAS / attention workspaces, fragmentation
GIB = 2**30
SDPA_BACKENDS = {
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "math": "MATH",
}


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden: int
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    rope_theta: float = 1e6
    eps: float = 1e-6

    def weight_numel(self, layers: int) -> int:
        h, d = self.hidden, self.head_dim
        per_layer = (
            h * (self.q_heads + 2 * self.kv_heads) * d  # fused qkv
            + self.q_heads * d * h  # o
            + 3 * h * self.intermediate  # gate, up, down
            + 2 * h
            + 2 * d  # two RMSNorms, q/k norms
        )
        embeddings = self.vocab * h * (1 if self.tied_embeddings else 2)
        return embeddings + h + layers * per_layer

    def kv_bytes(self, layers: int, batch: int, max_ctx: int, itemsize: int) -> int:
        return 2 * layers * batch * max_ctx * self.kv_heads * self.head_dim * itemsize

    def describe(self, layers: int) -> str:
        return (
            f"{self.name} (hidden {self.hidden}, {layers}/{self.layers} layers, {self.q_heads} q / "
            f"{self.kv_heads} kv heads, head_dim {self.head_dim}, intermediate {self.intermediate}, "
            f"vocab {self.vocab})"
        )


QWEN3_8B = ModelShape("qwen3-8b-shaped", 4096, 36, 32, 8, 128, 12288, 151936, tied_embeddings=False)
QWEN3_06B = ModelShape("qwen3-0.6b-shaped", 1024, 28, 16, 8, 128, 3072, 151936, tied_embeddings=True)
TINY_TARGET = ModelShape("tiny-target", 64, 2, 4, 2, 16, 128, 512, tied_embeddings=False)
TINY_DRAFT = ModelShape("tiny-draft", 32, 2, 4, 2, 8, 64, 512, tied_embeddings=True)


@dataclass(frozen=True)
class Window:
    """PARSE's verify window of one request: draft length L, K probes of m suffix tokens."""

    draft_len: int
    probes: int
    suffix_len: int

    def __post_init__(self):
        if not 1 <= self.probes <= self.draft_len or self.suffix_len < 1:
            raise ValueError(f"need 1 <= K <= L and m >= 1; got L={self.draft_len} K={self.probes} m={self.suffix_len}")

    @property
    def rows(self) -> int:
        return 1 + self.draft_len + self.probes * self.suffix_len

    @property
    def boundaries(self) -> list[int]:
        """b_1 < ... < b_K = L, evenly spaced."""
        return [math.ceil(k * self.draft_len / self.probes) for k in range(1, self.probes + 1)]


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


@dataclass
class Pass:
    """Static inputs of one forward: the same buffers every call (what a CUDA graph replays)."""

    ids: torch.Tensor  # [B, T] token ids
    positions: torch.Tensor  # [T] RoPE positions
    slot: int  # rows' KV goes to cache slots slot..slot+T-1
    kv_len: int  # slots 0..kv_len-1 are attended
    bias: torch.Tensor | None  # [1, 1, G*T, kv_len] additive mask; None: every attended slot
    logit_rows: torch.Tensor | None  # rows whose logits are computed; None: all


class KVCache:
    def __init__(self, shape: ModelShape, layers: int, batch: int, max_ctx: int, device, dtype):
        self.layers = layers
        # Random committed KV: every method reads the same context, nothing prefilled.
        size = (layers, batch, max_ctx, shape.kv_heads, shape.head_dim)
        self.k = torch.empty(size, device=device, dtype=dtype).normal_()
        self.v = torch.empty(size, device=device, dtype=dtype).normal_()
        half = torch.arange(0, shape.head_dim, 2, device=device).float()
        inv_freq = 1.0 / shape.rope_theta ** (half / shape.head_dim)
        angles = torch.outer(torch.arange(max_ctx, device=device).float(), inv_freq)
        angles = torch.cat([angles, angles], -1)
        self.cos, self.sin = angles.cos().to(dtype), angles.sin().to(dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, -1)
    return x * cos[None, :, None] + torch.cat([-x2, x1], -1) * sin[None, :, None]


class Decoder:
    """Qwen3-style decoder with random weights; `forward` runs one Pass against a KVCache."""

    def __init__(self, shape: ModelShape, layers: int, device, dtype, seed: int = 0):
        self.shape = shape
        torch.manual_seed(seed)
        h, d, i = shape.hidden, shape.head_dim, shape.intermediate

        def w(*size):
            return torch.empty(size, device=device, dtype=dtype).normal_(0.0, 0.02)

        def ones(n):
            return torch.ones(n, device=device, dtype=dtype)

        self.embed = w(shape.vocab, h)
        self.lm_head = self.embed if shape.tied_embeddings else w(shape.vocab, h)
        self.norm = ones(h)
        self.layers = [
            dict(
                ln1=ones(h),
                qkv=w((shape.q_heads + 2 * shape.kv_heads) * d, h),
                q_norm=ones(d),
                k_norm=ones(d),
                o=w(h, shape.q_heads * d),
                ln2=ones(h),
                gate_up=w(2 * i, h),
                down=w(h, i),
            )
            for _ in range(layers)
        ]

    def forward(self, cache: KVCache, p: Pass) -> torch.Tensor:
        s = self.shape
        x = F.embedding(p.ids, self.embed)
        cos, sin = cache.cos[p.positions], cache.sin[p.positions]
        for layer in range(cache.layers):
            w = self.layers[layer]
            x = x + self._attention(layer, w, F.rms_norm(x, (s.hidden,), w["ln1"], s.eps), cache, p, cos, sin)
            gate, up = F.linear(F.rms_norm(x, (s.hidden,), w["ln2"], s.eps), w["gate_up"]).chunk(2, -1)
            x = x + F.linear(F.silu(gate) * up, w["down"])
        if p.logit_rows is not None:
            x = x[:, p.logit_rows]
        return F.linear(F.rms_norm(x, (s.hidden,), self.norm, s.eps), self.lm_head)

    def _attention(self, layer, w, x, cache, p, cos, sin):
        s = self.shape
        batch, rows, _ = x.shape
        hq, hkv, d = s.q_heads, s.kv_heads, s.head_dim
        group = hq // hkv
        q, k, v = F.linear(x, w["qkv"]).split([hq * d, hkv * d, hkv * d], -1)
        q = _rope(F.rms_norm(q.view(batch, rows, hq, d), (d,), w["q_norm"], s.eps), cos, sin)
        k = _rope(F.rms_norm(k.view(batch, rows, hkv, d), (d,), w["k_norm"], s.eps), cos, sin)
        cache.k[layer, :, p.slot : p.slot + rows] = k
        cache.v[layer, :, p.slot : p.slot + rows] = v.view(batch, rows, hkv, d)
        keys = cache.k[layer, :, : p.kv_len].transpose(1, 2)  # [B, Hkv, S, D], a view of the cache
        values = cache.v[layer, :, : p.kv_len].transpose(1, 2)
        # Grouped-query attention without copying KV: a KV head's `group` query heads become
        # group*rows query rows (row g*rows + t); any SDPA backend runs it.
        q = q.view(batch, rows, hkv, group, d).permute(0, 2, 3, 1, 4).reshape(batch, hkv, group * rows, d)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=p.bias)
        out = out.view(batch, hkv, group, rows, d).permute(0, 3, 1, 2, 4).reshape(batch, rows, hq * d)
        return F.linear(out, w["o"])


def _bias(allowed: torch.Tensor, group: int, dtype) -> torch.Tensor:
    """[T, S] allowed -> additive [1, 1, group*T, S] in the query's dtype (rows as in _attention)."""
    bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, float("-inf"))
    return bias.repeat(group, 1)[None, None].contiguous()


def _masked_pass(ids, positions, slot, allowed_upto, group, logit_rows, dtype) -> Pass:
    """A pass whose row t sees slots 0..allowed_upto[t] (a causal mask when allowed_upto = slot + t)."""
    rows = ids.shape[1]
    kv_len = _round_up(slot + rows, MASK_ALIGN)
    allowed = torch.arange(kv_len, device=ids.device)[None, :] <= allowed_upto[:, None]
    return Pass(ids, positions, slot, kv_len, _bias(allowed, group, dtype), logit_rows)


def _causal_pass(ids, first_position, slot, group, logit_rows, dtype) -> Pass:
    rows = torch.arange(ids.shape[1], device=ids.device)
    return _masked_pass(ids, first_position + rows, slot, slot + rows, group, logit_rows, dtype)


def _tokens(vocab: int, window: Window, seed: int) -> tuple[int, list[int], list[int]]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (1 + window.draft_len + window.suffix_len,), generator=gen).tolist()
    return ids[0], ids[1 : 1 + window.draft_len], ids[1 + window.draft_len :]


def target_passes(shape: ModelShape, window: Window, context: int, batch: int, device, dtype, seed: int = 0) -> dict:
    """The target's passes over one committed context P: decode, PARSE verify, prefill, K judge passes."""
    group = shape.q_heads // shape.kv_heads
    last, draft, suffix = _tokens(shape.vocab, window, seed)
    bounds = window.boundaries
    P = context

    def ids_of(tokens):
        return torch.tensor(tokens, device=device).expand(batch, -1).contiguous()

    layout = build_verify_layout([VerifyRequest(P, last, draft, bounds, suffix)])
    n = int(layout.window_lens[0])
    kv_len = _round_up(P + n, MASK_ALIGN)
    allowed = torch.zeros(n, kv_len, dtype=torch.bool)
    allowed[:, :P] = True
    allowed[:, P : P + n] = layout.mask_qlen_only.view(n, n)
    parse = Pass(
        ids_of(layout.input_ids.tolist()),
        layout.positions.to(device),
        P,
        kv_len,
        _bias(allowed.to(device), group, dtype),
        torch.cat([layout.chain_rows, layout.probe_rows]).to(device),
    )
    prefill = _causal_pass(ids_of([last] + draft), P, P, group, None, dtype)

    def judge_passes(keep_steps: bool) -> list[Pass]:
        """Pass k: draft tokens up to b_k (from b_{k-1} if earlier steps' KV was kept), then the suffix."""
        passes, done = [], 0
        for b in bounds:
            tokens = ([last] if done == 0 else []) + draft[done:b] + suffix
            start = 0 if done == 0 else 1 + done  # window slot of the pass's first row
            chain = len(tokens) - len(suffix)
            rows = torch.tensor(list(range(chain)) + [len(tokens) - 1], device=device)
            passes.append(_causal_pass(ids_of(tokens), P + start, P + start, group, rows, dtype))
            done = b if keep_steps else 0
        return passes

    decode = Pass(ids_of([last]), torch.tensor([P], device=device), P, P + 1, None, None)
    return dict(
        decode=decode,
        verify_parse=parse,
        verify_prefill=prefill,
        verify_sequential=judge_passes(True),
        verify_sequential_reread=judge_passes(False),
    )


def draft_steps(window: Window, context: int, batch: int, device) -> list[Pass]:
    """L+1 greedy decode steps from position P; all share one ids buffer (the last drafted token)."""
    ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
    return [
        Pass(ids, torch.tensor([context + i], device=device), context + i, context + i + 1, None, None)
        for i in range(window.draft_len + 1)
    ]


def run_draft_loop(model: Decoder, cache: KVCache, steps: list[Pass], first: torch.Tensor, out: torch.Tensor):
    steps[0].ids.copy_(first)
    for i, step in enumerate(steps):
        token = model.forward(cache, step)[:, -1].argmax(-1)
        out[:, i] = token
        step.ids.copy_(token[:, None])
    return out


def verify_outputs(
    shape: ModelShape,
    window: Window,
    context: int,
    batch: int,
    device="cpu",
    dtype=torch.float32,
    seed: int = 0,
    layers: int | None = None,
) -> dict[str, torch.Tensor]:
    """Logits of the rows PARSE reads, three ways, over the same committed KV (tests, --check).

    parse_chain [B, L+1, V], parse_probes [B, K, V] from the PARSE pass; prefill [B, L+1, V];
    judge_last / reread_last [B, K, V], the last row of each sequential judge pass (steps kept /
    prefix re-read).
    """
    with torch.inference_mode():
        layers = layers or shape.layers
        model = Decoder(shape, layers, device, dtype, seed)
        cache = KVCache(shape, layers, batch, _round_up(context + window.rows, MASK_ALIGN), device, dtype)
        passes = target_passes(shape, window, context, batch, device, dtype, seed)
        parse = model.forward(cache, passes["verify_parse"])
        prefill = model.forward(cache, passes["verify_prefill"])
        judge_last, reread_last = (
            torch.stack([model.forward(cache, p)[:, -1] for p in passes[name]], 1)
            for name in ("verify_sequential", "verify_sequential_reread")
        )
    chain = window.draft_len + 1
    return dict(
        parse_chain=parse[:, :chain],
        parse_probes=parse[:, chain:],
        prefill=prefill,
        judge_last=judge_last,
        reread_last=reread_last,
    )


def check_line(shape: ModelShape, window: Window, context: int, batch: int, device, dtype, layers: int) -> dict:
    """--check: the verify pass vs separate forwards on this device and dtype (max |difference|)."""
    out = verify_outputs(shape, window, context, batch, device, dtype, layers=layers)
    diff = {
        "chain_vs_prefill": (out["parse_chain"] - out["prefill"]).abs().max().item(),
        "probes_vs_judge_passes": (out["parse_probes"] - out["judge_last"]).abs().max().item(),
        "probes_vs_reread_passes": (out["parse_probes"] - out["reread_last"]).abs().max().item(),
    }
    return dict(
        kind="check",
        model=shape.name,
        layers=layers,
        P=context,
        batch=batch,
        logit_scale=out["prefill"].float().abs().max().item(),
        max_abs_diff=diff,
    )


# ---- timing ----------------------------------------------------------------------------------


def time_ms(fn, device: torch.device, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def capture_graph(fn) -> torch.cuda.CUDAGraph:
    """Capture fn (which reads and writes only static buffers) as one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


@dataclass
class Row:
    model: str
    measurement: str
    P: int
    batch: int
    layers: int
    layers_full: int
    rows: int  # query rows per request (all passes / steps together)
    eager_ms: float | None = None
    graph_ms: float | None = None
    kv_gib: float | None = None
    peak_gib: float | None = None
    note: str = ""
    kind: str = "measurement"


def measure(row: Row, fn, device, graphs: bool, warmup: int, repeats: int) -> Row:
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    try:
        row.eager_ms = time_ms(fn, device, warmup, repeats)
    except torch.cuda.OutOfMemoryError:
        row.note = _join(row.note, "eager: out of memory")
        return row
    if graphs:
        try:
            graph = capture_graph(fn)
            row.graph_ms = time_ms(graph.replay, device, warmup, repeats)
            del graph
        except Exception as exc:  # noqa: BLE001 - report it in the row, keep the other rows
            row.note = _join(row.note, f"graph failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
    if cuda:
        row.peak_gib = torch.cuda.max_memory_allocated(device) / GIB
    return row


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b


# ---- memory plan -----------------------------------------------------------------------------


def activation_bytes(
    shape: ModelShape, tokens: int, logit_rows: int, kv_len: int, mask_rows: int, itemsize: int
) -> int:
    """Generous estimate of one pass's transient memory, times 3 (eager run, graph pool, slack)."""
    per_token = 4 * shape.hidden + (2 * shape.q_heads + 2 * shape.kv_heads) * shape.head_dim + 3 * shape.intermediate
    group = shape.q_heads // shape.kv_heads
    one = (tokens * per_token + 2 * logit_rows * shape.vocab + group * mask_rows * kv_len) * itemsize
    return 3 * one


def plan_layers(
    shape: ModelShape,
    layers: int,
    batch: int,
    max_ctx: int,
    rows: int,
    logit_rows: int,
    itemsize: int,
    budget_gib: float,
) -> tuple[int, str]:
    """Layers this (P, batch) case can run with inside the budget (0 = skip), and a note."""
    weights = shape.weight_numel(layers) * itemsize
    act = activation_bytes(shape, batch * rows, batch * logit_rows, max_ctx, rows, itemsize)
    free = budget_gib * GIB - RESERVE_GIB * GIB - weights - act
    per_layer = shape.kv_bytes(1, batch, max_ctx, itemsize)
    fit = max(0, min(layers, int(free // per_layer)))
    need = (weights + act + shape.kv_bytes(layers, batch, max_ctx, itemsize)) / GIB + RESERVE_GIB
    if fit == layers:
        return fit, ""
    if fit == 0:
        return 0, f"skipped: needs {need:.1f} GiB > {budget_gib:g} GiB budget"
    return fit, f"layers capped {layers}->{fit}: {layers} layers need {need:.1f} GiB > {budget_gib:g} GiB budget"


# ---- runs ------------------------------------------------------------------------------------


def run_model(
    role: str,
    shape: ModelShape,
    layers: int,
    window: Window,
    contexts,
    batches,
    device,
    dtype,
    graphs: bool,
    warmup: int,
    repeats: int,
    budget_gib: float,
    emit,
) -> list[Row]:
    """All of one model's measurements; only this model's weights and one KV cache are resident."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    model = Decoder(shape, layers, device, dtype)
    out = []
    for context in contexts:
        for batch in batches:
            if role == "target":
                max_ctx = _round_up(context + window.rows, MASK_ALIGN)
                rows, logit_rows = window.rows, window.draft_len + 1 + window.probes
                reread = window.probes * (1 + window.suffix_len) + sum(window.boundaries)
                names = {
                    "decode": 1,
                    "verify_parse": window.rows,
                    "verify_prefill": window.draft_len + 1,
                    "verify_sequential": window.rows,
                    "verify_sequential_reread": reread,
                }
            else:
                max_ctx, rows, logit_rows = _round_up(context + window.draft_len + 1, MASK_ALIGN), 1, 1
                names = {"decode": 1, "draft_loop": window.draft_len + 1}
            fit, note = plan_layers(shape, layers, batch, max_ctx, rows, logit_rows, itemsize, budget_gib)
            kv_gib = shape.kv_bytes(fit, batch, max_ctx, itemsize) / GIB
            case = [
                Row(role, name, context, batch, fit, shape.layers, n, kv_gib=kv_gib, note=note)
                for name, n in names.items()
            ]
            cache = None
            if fit:
                try:
                    cache = KVCache(shape, fit, batch, max_ctx, device, dtype)
                except torch.cuda.OutOfMemoryError:
                    for row in case:
                        row.note = _join(row.note, f"skipped: out of memory allocating {kv_gib:.1f} GiB of KV")
            if cache is None:
                for row in case:
                    emit(row)
                out += case
                continue
            if role == "target":
                passes = target_passes(shape, window, context, batch, device, dtype)
                fns = {
                    name: (lambda p=passes[name]: model.forward(cache, p))
                    for name in ("decode", "verify_parse", "verify_prefill")
                }
                for name in ("verify_sequential", "verify_sequential_reread"):
                    fns[name] = lambda ps=passes[name]: [model.forward(cache, p) for p in ps]
            else:
                steps = draft_steps(window, context, batch, device)
                first = torch.ones(batch, 1, dtype=torch.long, device=device)
                drafted = torch.zeros(batch, len(steps), dtype=torch.long, device=device)
                fns = {
                    "decode": lambda: model.forward(cache, steps[0]),
                    "draft_loop": lambda: run_draft_loop(model, cache, steps, first, drafted),
                }
            for row in case:
                emit(measure(row, fns[row.measurement], device, graphs, warmup, repeats))
            out += case
            cache = fns = None  # free the KV before the next case's
            if device.type == "cuda":
                torch.cuda.empty_cache()
    model = None
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def speedups(rows: list[Row], contexts, batches, accepted: int) -> list[dict]:
    """The formula applied to the measured rows of each (P, batch)."""
    out = []
    for context in contexts:
        for batch in batches:
            found = {(r.model, r.measurement): r for r in rows if r.P == context and r.batch == batch}
            parts = [found[("target", "decode")], found[("draft", "draft_loop")], found[("target", "verify_parse")]]
            graphed = all(r.graph_ms is not None for r in parts)
            times = [r.graph_ms if graphed else r.eager_ms for r in parts]
            base = dict(
                kind="speedup",
                P=context,
                batch=batch,
                timing="graph" if graphed else "eager",
                target_layers=parts[0].layers,
                draft_layers=parts[1].layers,
                formula=FORMULA,
            )
            for a in sorted(set(SWEEP) | {accepted}):
                row = dict(
                    base,
                    accepted=a,
                    t_target_step_ms=times[0],
                    t_draft_loop_ms=times[1],
                    t_verify_ms=times[2],
                    round_ms=None,
                    speedup=None,
                )
                if None not in times:
                    row["round_ms"] = times[1] + times[2]
                    row["speedup"] = (a + 1) * times[0] / row["round_ms"]
                out.append(row)
    return out


# ---- output ----------------------------------------------------------------------------------

LABELS = {
    "decode": "decode step",
    "verify_parse": "PARSE verify (1 pass)",
    "verify_prefill": "plain prefill (L+1 rows)",
    "verify_sequential": "sequential judge (K passes, steps kept)",
    "verify_sequential_reread": "sequential judge (K passes, prefix re-read)",
    "draft_loop": "draft loop (L+1 steps)",
}


def _ms(x):
    return "n/a" if x is None else f"{x:.3f}"


def table_line(row: Row, no_graph: str) -> str:
    graph = _ms(row.graph_ms) if row.graph_ms is not None else no_graph
    ratio = f"{row.eager_ms / row.graph_ms:.2f}x" if row.eager_ms and row.graph_ms else "n/a"
    peak = "n/a" if row.peak_gib is None else f"{row.peak_gib:.1f}"
    kv = "n/a" if row.kv_gib is None else f"{row.kv_gib:.2f}"
    return (
        f"| {row.model} | {LABELS[row.measurement]} | {row.P} | {row.batch} | {row.layers}/{row.layers_full} | "
        f"{row.rows} | {_ms(row.eager_ms)} | {graph} | {ratio} | {kv} | {peak} | {row.note} |"
    )


def print_header(config: dict, target: ModelShape, draft: ModelShape, window: Window) -> None:
    print(
        f"PARSE GPU cost lab: device={config['device']} ({config['device_name']}), dtype={config['dtype']}, "
        f"SDPA backends {config['sdpa']}, torch {config['torch']}, {torch.get_num_threads()} CPU threads, "
        f"random weights, median of {config['repeats']} after {config['warmup']} warm-up"
    )
    print(f"target: {target.describe(config['target_layers'])}, weights {config['target_weights_gib']:.2f} GiB")
    print(f"draft:  {draft.describe(config['draft_layers'])}, weights {config['draft_weights_gib']:.2f} GiB")
    print(
        f"verify window: N = 1 + L + K*m = 1 + {window.draft_len} + {window.probes}*{window.suffix_len} = "
        f"{window.rows} rows, boundaries b = {window.boundaries}; memory budget {config['mem_budget_gib']:g} GiB "
        f"per model (models measured one at a time)"
    )


def print_speedups(predicted: list[dict], window: Window, accepted: int) -> None:
    print()
    print(
        "Predicted PARSE speedup over target-only (tokens per round = A+1; graphed times where all three "
        "were captured, else eager):"
    )
    print(f"    {FORMULA}")
    print(
        f"    t_target_step = one target decode step; t_draft_loop = L+1 = {window.draft_len + 1} draft decode "
        f"steps; t_verify = one PARSE verify pass of N = {window.rows} rows"
    )
    sweep = sorted(set(SWEEP) | {accepted})
    heads = [f"A={a}" + (" (--accepted)" if a == accepted else "") for a in sweep]
    print()
    print(
        "| P | batch | layers target/draft | times | t_target_step ms | t_draft_loop ms | t_verify ms | round ms | "
        + " | ".join(heads)
        + " |"
    )
    print("| --- " * (8 + len(heads)) + "|")
    for i in range(0, len(predicted), len(sweep)):
        group = predicted[i : i + len(sweep)]
        r = group[0]
        cells = ["n/a" if g["speedup"] is None else f"{g['speedup']:.2f}x" for g in group]
        print(
            f"| {r['P']} | {r['batch']} | {r['target_layers']}/{r['draft_layers']} | {r['timing']} | "
            f"{_ms(r['t_target_step_ms'])} | {_ms(r['t_draft_loop_ms'])} | {_ms(r['t_verify_ms'])} | "
            f"{_ms(r['round_ms'])} | " + " | ".join(cells) + " |"
        )


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (CPU in seconds); proves the script runs")
    parser.add_argument("--json", action="store_true", help="one JSON object per row instead of tables")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--dtype", choices=["bfloat16", "float16", "float32"], help="default: bfloat16 on CUDA, float32 on CPU"
    )
    parser.add_argument(
        "--contexts", type=int, nargs="+", help="committed context lengths P (default 1024 8192; tiny 64 256)"
    )
    parser.add_argument("--batches", type=int, nargs="+", help="batch sizes (default 1 8 32; tiny 1 2)")
    parser.add_argument("--draft-len", type=int, default=32, help="L, draft tokens per round")
    parser.add_argument("--probes", type=int, default=4, help="K, probes per round")
    parser.add_argument("--suffix-len", type=int, default=23, help="m, judge-suffix tokens per probe")
    parser.add_argument("--accepted", type=int, default=8, help="A, accepted draft tokens per round for the prediction")
    parser.add_argument("--layers", type=int, help="cap both models at this many layers (default: all)")
    parser.add_argument(
        "--mem-gib",
        type=float,
        default=78.0,
        help="memory budget per model (CUDA: also <= the device's free memory at start)",
    )
    parser.add_argument("--warmup", type=int, help="default 3 (tiny 2)")
    parser.add_argument("--repeats", type=int, help="default 10 (tiny 5)")
    parser.add_argument("--threads", type=int, help="CPU threads (default: 1 with --tiny, else torch's default)")
    parser.add_argument("--no-graphs", action="store_true", help="eager only, also on CUDA")
    parser.add_argument(
        "--sdpa",
        nargs="+",
        choices=sorted(SDPA_BACKENDS),
        help="restrict SDPA to these backends (default: PyTorch chooses); flash runs no masked pass",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="first compare the verify pass with separate forwards (2 target layers, on this device)",
    )
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = getattr(torch, args.dtype or ("bfloat16" if cuda else "float32"))
    target, draft = (TINY_TARGET, TINY_DRAFT) if args.tiny else (QWEN3_8B, QWEN3_06B)
    contexts = args.contexts or ([64, 256] if args.tiny else [1024, 8192])
    batches = args.batches or ([1, 2] if args.tiny else [1, 8, 32])
    warmup = args.warmup if args.warmup is not None else (2 if args.tiny else 3)
    repeats = args.repeats if args.repeats is not None else (5 if args.tiny else 10)
    if args.threads or (args.tiny and not cuda):
        torch.set_num_threads(args.threads or 1)
    window = Window(args.draft_len, args.probes, args.suffix_len)
    graphs = cuda and not args.no_graphs
    budget = args.mem_gib
    if cuda:  # what is free now: the CUDA context and any other process's memory are already out of it
        budget = min(budget, torch.cuda.mem_get_info(device)[0] / GIB)
    t_layers = min(args.layers or target.layers, target.layers)
    d_layers = min(args.layers or draft.layers, draft.layers)
    itemsize = torch.empty((), dtype=dtype).element_size()

    config = dict(
        kind="config",
        device=str(device),
        device_name=torch.cuda.get_device_name(device) if cuda else "cpu",
        torch=torch.__version__,
        dtype=str(dtype).removeprefix("torch."),
        target=asdict(target),
        draft=asdict(draft),
        target_layers=t_layers,
        draft_layers=d_layers,
        L=window.draft_len,
        K=window.probes,
        m=window.suffix_len,
        N=window.rows,
        boundaries=window.boundaries,
        contexts=contexts,
        batches=batches,
        warmup=warmup,
        repeats=repeats,
        graphs=graphs,
        sdpa=args.sdpa or "auto",
        mem_budget_gib=budget,
        formula=FORMULA,
        target_weights_gib=target.weight_numel(t_layers) * itemsize / GIB,
        draft_weights_gib=draft.weight_numel(d_layers) * itemsize / GIB,
    )
    if args.json:
        print(json.dumps(config), flush=True)
    else:
        print_header(config, target, draft, window)

    no_graph = "n/a" if graphs else "n/a (--no-graphs)" if cuda else "n/a (no CUDA)"

    def emit(row: Row):
        print(json.dumps(asdict(row)) if args.json else table_line(row, no_graph), flush=True)

    def sdpa():  # a new context per use: sdpa_kernel's cannot be entered twice
        if not args.sdpa:
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[name]) for name in args.sdpa])

    if args.check:
        with sdpa():
            check = check_line(target, window, contexts[0], batches[0], device, dtype, min(2, t_layers))
        if args.json:
            print(json.dumps(check), flush=True)
        else:
            print(
                f"check ({check['model']}, {check['layers']} layers, P={check['P']}, batch {check['batch']}, "
                f"{config['dtype']}): max |difference| {check['max_abs_diff']}, logits up to "
                f"{check['logit_scale']:.3g}",
                flush=True,
            )
    if not args.json:
        print()
        print(
            "| model | measurement | P | batch | layers | rows/req | eager ms | graph ms | eager/graph | KV GiB | "
            "peak GiB | note |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    with torch.inference_mode(), sdpa():
        rows = run_model(
            "target", target, t_layers, window, contexts, batches, device, dtype, graphs, warmup, repeats, budget, emit
        )
        rows += run_model(
            "draft", draft, d_layers, window, contexts, batches, device, dtype, graphs, warmup, repeats, budget, emit
        )
    predicted = speedups(rows, contexts, batches, args.accepted)
    if args.json:
        for row in predicted:
            print(json.dumps(row))
        return
    print_speedups(predicted, window, args.accepted)


if __name__ == "__main__":
    main()
