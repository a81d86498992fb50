"""Tiny random-weight models with a locally trained tokenizer, for offline tests and examples.

Nothing here downloads: the tokenizer is trained by `tokenizers` on a synthetic corpus
and the models are built from a config. A draft is the target plus weight noise, so the
pair shares a vocabulary and agrees on most (not all) greedy tokens — enough to make
token-level acceptance and judged acceptance both visible.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

CHAT_TEMPLATES = {
    # ChatML (Qwen, SmolLM2).
    "chatml": (
        "{% for message in messages %}"
        "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
    # Llama-3.
    "llama3": (
        "{{ bos_token }}{% for message in messages %}"
        "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] + '<|eot_id|>' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
    ),
}
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]
_WORDS = (
    "the a model draft target token prefix answer question correct yes no is are was "
    "step one two three four five six seven eight nine ten add sum total so we then "
    "first next finally result value number equals plus minus times because therefore "
    "def return if else for in range print x y z list code line python function data "
    "cat dog sun moon tree river city house book road light water fire stone green red"
).split()


def _corpus(seed: int = 0, lines: int = 3000) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 14))]
        sentence = " ".join(words).capitalize()
        end = rng.choice([". ", ".\n", "?\n", "!\n\n", ":\n", ".\n\n", "\n"])
        out.append(sentence + end)
    out += ["Yes", "No", " Yes", " No", "Correct", "Incorrect", "Is the response so far correct?"]
    return out


def build_tokenizer(out_dir: str | Path, template: str | None = "chatml", vocab_size: int = 400):
    """Train a byte-level BPE tokenizer and save it (with `template`'s chat template) to out_dir."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    eos = {"chatml": "<|im_end|>", "llama3": "<|eot_id|>", None: "<|endoftext|>"}[template]
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin_of_text|>" if template == "llama3" else None,
        eos_token=eos,
        pad_token="<|endoftext|>",
        unk_token=None,
    )
    if template is not None:
        fast.chat_template = CHAT_TEMPLATES[template]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    return fast


def build_model(
    out_dir: str | Path,
    arch: str = "llama",
    seed: int = 0,
    template: str | None = "chatml",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    vocab_size: int = 400,
    noise_of: str | Path | None = None,
    noise: float = 0.0,
    logit_scale: float = 1.0,
):
    """Build a tiny random fp32 causal LM (+ tokenizer) in out_dir and return its path.

    arch: "llama", "qwen2" or "qwen3" (all with grouped-query attention when
    num_kv_heads < num_heads). With `noise_of`, the weights are those of the model in
    that directory plus Gaussian noise of relative size `noise` (a draft for it).
    logit_scale: the lm_head is multiplied by it (> 1: sharper next-token distributions, a
    few likely tokens instead of a near-uniform spread; a draft inherits its target's).
    """
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

    out_dir = Path(out_dir)
    tokenizer = build_tokenizer(out_dir, template=template, vocab_size=vocab_size)
    config_cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}[arch]
    config = config_cls(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=2048,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.25 / p.shape[-1] ** 0.5 * 4)
        if noise_of is not None:
            base = AutoModelForCausalLM.from_pretrained(noise_of, dtype=torch.float32)
            gen = torch.Generator().manual_seed(seed + 1)
            for p, q in zip(model.parameters(), base.parameters()):
                p.copy_(q + noise * q.std() * torch.randn(q.shape, generator=gen))
        else:
            model.lm_head.weight.mul_(logit_scale)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def build_pair(out_dir: str | Path, arch: str = "llama", noise: float = 0.05, **kwargs):
    """A target and a draft (target + `noise` weight noise) under out_dir/target, out_dir/draft."""
    out_dir = Path(out_dir)
    target = build_model(out_dir / "target", arch=arch, **kwargs)
    draft = build_model(out_dir / "draft", arch=arch, noise_of=target, noise=noise, seed=1, **kwargs)
    (out_dir / "pair.json").write_text(json.dumps({"target": str(target), "draft": str(draft)}))
    return target, draft
