"""EAGLE-3 heads for the tests' targets (test support, not installed): a random head (the
plumbing of SGLang's EAGLE3 on CPU) and a head distilled on the synthetic target.

    python -m support.eagle3_head build [--cache-dir DIR]   # the synthetic target's head, cached

A head is SGLang's `LlamaForCausalLMEagle3` (sglang/srt/models/llama_eagle3.py, 0.5.23) with one
decoder layer, written as an EAGLE-3 checkpoint (config.json with `eagle_config`, safetensors
named `midlayer.*`, `fc`, `norm`, `lm_head`, `embed_tokens`). `Head` is the same computation in
plain torch, so that it can be trained here:
- the target's aux hidden states at position i (the residual stream entering layer id + 1 for
  each id of `eagle_aux_hidden_state_layer_ids`, concatenated) go through `fc`;
- the layer reads [input_layernorm(embedding of token i + 1), hidden_norm(fc(aux_i))] (2h wide),
  attends causally with RoPE at position i, and adds to the fc output as its residual;
- its logits predict token i + 2; its pre-norm residual is the hidden state of the head's next
  chain step (width h: `fc` is skipped there, as in SGLang where the widths differ).

Distillation (`distill`): the target's own greedy solutions of training problems, its argmax as
the label, the first chain step (target features) and the second (the head's own hidden state,
attending to the first step's keys before it and to itself: EAGLE-3's training-time test) in one
loss. The embedding is the target's, frozen (SGLang replaces the head's by the target's); the
head's lm_head starts as the target's.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path
from typing import Optional, Sequence

import torch
from torch import nn

WEIGHTS_FILE = "model.safetensors"


def default_aux_layers(num_layers: int) -> list[int]:
    """Early, middle and late layer outputs (EAGLE-3's choice of [2, N/2, N-3], inside a small
    target); ids in [-1, N-2]: SGLang captures the input of layer id + 1."""
    return sorted({0, num_layers // 2 - 1, num_layers - 2})


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


_LAYER = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}
_NORMS = ("input_layernorm", "hidden_norm", "post_attention_layernorm")
_EAGLE3_NAMES = {  # Head's parameter names -> an EAGLE-3 checkpoint's
    **{f"{name}.weight": f"midlayer.{group}.{name}.weight" for name, group in _LAYER.items()},
    **{f"{norm}.weight": f"midlayer.{norm}.weight" for norm in _NORMS},
}


class Head(nn.Module):
    """SGLang's one-layer `LlamaForCausalLMEagle3` for a Llama target of config `target`."""

    def __init__(self, target: dict, aux_layer_ids: Sequence[int]):
        super().__init__()
        self.target, self.aux = target, [int(i) for i in aux_layer_ids]
        layers = target["num_hidden_layers"]
        if len(set(self.aux)) != len(self.aux) or not all(-1 <= i <= layers - 2 for i in self.aux):
            raise ValueError(f"aux_layer_ids={self.aux}: distinct ids in [-1, {layers - 2}] allowed")
        h, v, inter, eps = (
            target["hidden_size"],
            target["vocab_size"],
            target["intermediate_size"],
            target["rms_norm_eps"],
        )
        self.heads, self.kv_heads = target["num_attention_heads"], target["num_key_value_heads"]
        self.head_dim = target.get("head_dim") or h // self.heads
        rope = target.get("rope_theta") or (target.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        self.register_buffer("inv_freq", 1.0 / rope ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        self.embed_tokens = nn.Embedding(v, h)
        self.fc = nn.Linear(h * len(self.aux), h, bias=False)
        self.q_proj = nn.Linear(2 * h, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * h, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * h, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
        self.gate_proj, self.up_proj = nn.Linear(h, inter, bias=False), nn.Linear(h, inter, bias=False)
        self.down_proj = nn.Linear(inter, h, bias=False)
        self.input_layernorm, self.hidden_norm = RMSNorm(h, eps), RMSNorm(h, eps)
        self.post_attention_layernorm, self.norm = RMSNorm(h, eps), RMSNorm(h, eps)
        self.lm_head = nn.Linear(h, v, bias=False)

    def _rope(self, x, positions):  # x [B, T, heads, D], positions [T]
        freqs = positions[:, None].float() * self.inv_freq[None]  # [T, D/2]
        cos, sin = torch.cat([freqs, freqs], -1).cos()[:, None], torch.cat([freqs, freqs], -1).sin()[:, None]
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    def _qkv(self, tokens, hidden, positions):
        x = torch.cat([self.input_layernorm(self.embed_tokens(tokens)), self.hidden_norm(hidden)], dim=-1)
        B, T, _ = x.shape
        q = self._rope(self.q_proj(x).view(B, T, self.heads, self.head_dim), positions)
        k = self._rope(self.k_proj(x).view(B, T, self.kv_heads, self.head_dim), positions)
        v = self.v_proj(x).view(B, T, self.kv_heads, self.head_dim)
        return q, k, v

    def _attend(self, q, k, v, mask):  # mask [Tq, Tk] True: attend
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=2), v.repeat_interleave(repeat, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~mask, float("-inf"))
        out = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v)
        return self.o_proj(out.flatten(2))

    def _finish(self, attended, hidden):
        residual = attended + hidden
        residual = (
            self.down_proj(
                nn.functional.silu(self.gate_proj(x := self.post_attention_layernorm(residual))) * self.up_proj(x)
            )
            + residual
        )
        return self.lm_head(self.norm(residual)), residual

    def two_steps(self, aux, tokens):
        """aux [B, T, h * n_aux] (the target's, positions 0..T-1), tokens [B, T] (token i + 1 at
        position i): (logits of chain step 1 [B, T, V], of step 2 at positions 1..T-1 [B, T-1, V])."""
        T = tokens.shape[1]
        positions = torch.arange(T)
        hidden = self.fc(aux)
        q, k, v = self._qkv(tokens, hidden, positions)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        logits1, residual = self._finish(self._attend(q, k, v, causal), hidden)
        # step 2 at position j: the head's own hidden state of j - 1, attending to step 1's keys
        # before j and to its own key (not step 1's at j)
        hidden2 = residual[:, :-1]
        q2, k2, v2 = self._qkv(tokens[:, 1:], hidden2, positions[1:])
        keys, values = torch.cat([k, k2], dim=1), torch.cat([v, v2], dim=1)
        before = torch.ones(T - 1, T, dtype=torch.bool).tril(0)  # query j (row j - 1) sees step-1 keys < j
        own = torch.eye(T - 1, dtype=torch.bool)
        logits2, _ = self._finish(self._attend(q2, keys, values, torch.cat([before, own], dim=1)), hidden2)
        return logits1, logits2

    def greedy_chain(self, aux, tokens, steps: int) -> tuple[list[int], list[float]]:
        """The head's `steps` greedy drafts as SGLang's chain makes them, and each one's margin
        (its logit over the runner-up's): aux [T, h * n_aux] the target's at positions 0..T-1 of
        the committed tokens, tokens [T] the token after each (the last: the round's input token);
        step 1 reads position T-1, each later step its own hidden state and draft at the next
        position, attending to every position before it."""
        drafts, margins = [], []

        def pick(logits):
            top = logits[0, -1].topk(2)
            drafts.append(int(top.indices[0]))
            margins.append(float(top.values[0] - top.values[1]))

        with torch.no_grad():
            T = tokens.shape[0]
            hidden = self.fc(aux[None])
            q, keys, values = self._qkv(tokens[None], hidden, torch.arange(T))
            causal = torch.ones(T, T, dtype=torch.bool).tril()
            logits, residual = self._finish(self._attend(q, keys, values, causal), hidden)
            pick(logits)
            hidden = residual[:, -1:]
            for step in range(1, steps):
                q, k, v = self._qkv(torch.tensor([[drafts[-1]]]), hidden, torch.tensor([T - 1 + step]))
                keys, values = torch.cat([keys, k], dim=1), torch.cat([values, v], dim=1)
                every = torch.ones(1, keys.shape[1], dtype=torch.bool)
                logits, hidden = self._finish(self._attend(q, keys, values, every), hidden)
                pick(logits)
        return drafts, margins

    @classmethod
    def load(cls, head_dir, target_dir) -> "Head":
        """A head checkpoint (`save`'s names) for the target in target_dir."""
        from safetensors.torch import load_file

        config = json.loads((Path(head_dir) / "config.json").read_text())
        head = cls(_target_config(target_dir), config["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
        names = {saved: own for own, saved in _EAGLE3_NAMES.items()}
        weights = load_file(str(Path(head_dir) / WEIGHTS_FILE))
        head.load_state_dict({names.get(k, k): t for k, t in weights.items()}, strict=False)
        return head.eval()

    def state_dict_eagle3(self) -> dict:
        """The weights under an EAGLE-3 checkpoint's names (what SGLang's loader maps)."""
        weights = self.state_dict().items()
        return {_EAGLE3_NAMES.get(k, k): t.detach().float().contiguous() for k, t in weights if k != "inv_freq"}

    def save(self, out_dir) -> Path:
        from safetensors.torch import save_file

        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "config.json").write_text(json.dumps(head_config(self.target, self.aux), indent=2))
        save_file(self.state_dict_eagle3(), str(out_dir / WEIGHTS_FILE))
        return out_dir


def head_config(target: dict, aux_layer_ids: Sequence[int], dtype: str = "float32") -> dict:
    """config.json of a one-layer EAGLE-3 head (`LlamaForCausalLMEagle3`) of the target's shape
    (`target`: its config.json) over its vocabulary, reading `aux_layer_ids`."""
    kept = (
        "hidden_act",
        "rms_norm_eps",
        "max_position_embeddings",
        "rope_theta",
        "rope_parameters",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "intermediate_size",
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
    )
    return {
        **{key: target[key] for key in kept if key in target},
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "draft_vocab_size": target["vocab_size"],  # the target's vocabulary: no d2t map
        "target_hidden_size": target["hidden_size"],
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux_layer_ids), "use_aux_hidden_state": True},
    }


def _target_config(target_dir) -> dict:
    return json.loads((Path(target_dir) / "config.json").read_text())


def build_random_head(out_dir, target_dir, seed: int = 0, aux_layer_ids: Optional[Sequence[int]] = None) -> Path:
    """A random head for the Llama target in target_dir (default aux layers: -1 and 0, the
    embeddings and the first layer's output, which a 2-layer target has)."""
    torch.manual_seed(seed)
    return Head(_target_config(target_dir), aux_layer_ids or (-1, 0)).save(out_dir)


def aux_states(target, ids: torch.Tensor, aux_layer_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(aux [B, T, h * n_aux]: the residual stream entering layer id + 1 per id, the target's
    argmax [B, T]) of the transformers Llama `target` over ids [B, T]."""
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    return torch.cat([out.hidden_states[i + 1] for i in aux_layer_ids], dim=-1), out.logits.argmax(-1)


def distill(target_dir, out_dir, steps: int = 600, num_problems: int = 384, seed: int = 0, log=print) -> Path:
    """The synthetic target's head, distilled on its own greedy solutions (module docstring)."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    from support import synthetic

    torch.manual_seed(seed)
    config = _target_config(target_dir)
    target = LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    enc = synthetic.Encoder(AutoTokenizer.from_pretrained(target_dir))
    items = synthetic.problems(seed + 1, num_problems)  # training problems: seeds below TEST_SEED
    rows = [enc.prompt_ids(p) + solution for p, solution in zip(items, synthetic.greedy_ids(target, enc, items))]
    head = Head(config, default_aux_layers(config["num_hidden_layers"]))
    head.embed_tokens.weight.data.copy_(target.model.embed_tokens.weight)
    head.embed_tokens.weight.requires_grad_(False)
    head.lm_head.weight.data.copy_(target.lm_head.weight)
    optimizer = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=3e-3, weight_decay=0.0)
    rng = random.Random(seed)
    pad = enc.tokenizer.convert_tokens_to_ids(synthetic.PAD_TOKEN)
    for step in range(steps):
        batch = rng.sample(rows, 16)
        width = max(map(len, batch))
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in batch])
        valid = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in batch], dtype=torch.bool)
        aux, argmax = aux_states(target, ids, head.aux)
        # position i: aux_i, token i + 1 -> the target's argmax at i + 1
        aux, tokens, labels, mask = aux[:, :-1], ids[:, 1:], argmax[:, 1:], valid[:, 1:]
        logits1, logits2 = head.two_steps(aux, tokens)
        ce = nn.functional.cross_entropy
        loss1 = ce(logits1[mask], labels[mask])
        loss2 = ce(logits2[mask[:, 1:]], labels[:, 1:][mask[:, 1:]])
        loss = loss1 + 0.5 * loss2
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if (step + 1) % max(1, steps // 4) == 0:
            with torch.no_grad():
                hit1 = (logits1[mask].argmax(-1) == labels[mask]).float().mean()
            log(
                f"[eagle3 head] step {step + 1}/{steps}: loss {loss1.item():.3f} / {loss2.item():.3f}, step-1 top-1 {hit1:.3f}"
            )
    head.save(out_dir)
    return Path(out_dir)


HEAD_RECIPE = {"steps": 600, "num_problems": 384, "seed": 0, "version": 1}  # bump version when `distill` changes


def build(cache_dir=None, log=print) -> Path:
    """The synthetic target's distilled head, built once into the cache (about a minute on 2
    cores, after the synthetic pair's own build) and reused after."""
    import hashlib
    import importlib.metadata

    from parse_sglang.model_cache import build_once, cache_root
    from support import synthetic

    target, _ = synthetic.build(cache_dir, log=log)
    record = {
        "head": "eagle3",
        **HEAD_RECIPE,
        "target": synthetic.weights_hash(target),
        "torch": importlib.metadata.version("torch"),
    }
    digest = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:12]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the same weights on any machine with the same software

    def train(out: Path) -> None:
        distill(target, out / "head", HEAD_RECIPE["steps"], HEAD_RECIPE["num_problems"], HEAD_RECIPE["seed"], log)

    try:
        return build_once(cache_root(cache_dir) / f"synthetic-eagle3-head-{digest}", record, train) / "head"
    finally:
        torch.set_num_threads(threads)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m support.eagle3_head", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["build"])
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args(argv)
    print(build(args.cache_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
