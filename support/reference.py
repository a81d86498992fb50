"""PARSE on Hugging Face causal LMs: the readable reference the SGLang worker is checked against.

One round (`ParseGenerator.round`): the draft writes up to L tokens, ONE masked target
forward reads the target's next token after every draft prefix and the judge's answer
after every boundary-ending prefix, the longest acceptable prefix plus a bonus token is
kept, and the target KV of that prefix (already at the front of the window) is kept in
place. Greedy decoding only.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from typing import Sequence

import torch

from parse_sglang import judge_head
from parse_sglang.acceptance import accept_lengths, emitted_tokens
from parse_sglang.attention.layout import VerifyRequest, build_verify_layout
from parse_sglang.boundaries import delimiter_ends, draft_boundaries, probe_stride
from parse_sglang.settings import ParseConfig
from parse_sglang.judge import (
    build_judge_probe,
    chain_statistics,
    judge_scores,
    judged_tokens,
    probe_reach,
    token_passes,
)


def hf_greedy(model, prompt_ids: list[int], max_new: int, ignore_eos: bool = False) -> list[int]:
    """`model`'s greedy continuation of prompt_ids (transformers, KV cache), up to max_new tokens,
    ending with the first EOS unless ignore_eos (as SGLang's `ignore_eos`)."""
    eos = model.generation_config.eos_token_id
    eos = set() if ignore_eos or eos is None else {eos} if isinstance(eos, int) else set(eos)
    tokens, threads = [], torch.get_num_threads()
    torch.set_num_threads(1)  # a small model: on a busy machine a second thread only waits (6x slower)
    try:
        with torch.no_grad():
            out = model(torch.tensor([prompt_ids]), use_cache=True)
            while len(tokens) < max_new:
                tokens.append(int(out.logits[0, -1].argmax()))
                if tokens[-1] in eos:
                    break
                out = model(torch.tensor([tokens[-1:]]), past_key_values=out.past_key_values, use_cache=True)
    finally:
        torch.set_num_threads(threads)
    return tokens


def _ids(values, name: str) -> list[int]:
    if isinstance(values, torch.Tensor):
        if values.dim() != 1:
            raise ValueError(f"{name} has shape {tuple(values.shape)}: allowed is a 1-D sequence of token ids")
        values = values.tolist()
    return [int(v) for v in values]


def _masked_forward(model, input_ids, positions, allowed, rows, cache=None, hidden: bool = False):
    """Logits at `rows` of one forward with an explicit [query, key] visibility matrix; with `hidden`
    also the final hidden states there (the lm_head's input, what SGLang hands a judge head)."""
    dtype = model.dtype
    bias = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    seen = []
    hook = model.get_output_embeddings().register_forward_hook(lambda _m, args, _out: seen.append(args[0]))
    try:
        out = model(
            input_ids=input_ids[None],
            position_ids=positions[None],
            attention_mask=bias[None, None],
            past_key_values=cache,
            use_cache=cache is not None,
            logits_to_keep=rows,
        )
    finally:
        hook.remove()
    logits = out.logits[0].float()
    return (logits, seen[0][0].float()) if hidden else logits


def _window(prefix_len, last_token, draft, boundaries, suffix):
    """Layout of one request's window [c_n, d_1..d_L, probe_1..probe_K], its visibility
    over [prefix + window] keys, and the rows whose logits are needed (chain, probe ends)."""
    layout = build_verify_layout([VerifyRequest(prefix_len, last_token, draft, boundaries, suffix)])
    window = int(layout.window_lens[0])
    allowed = layout.mask_full.view(window, prefix_len + window)
    rows = torch.cat([layout.chain_rows, layout.probe_rows])
    return layout, allowed, rows


@dataclass(frozen=True)
class VerifyInputs:
    """The whole-sequence input of one verify forward without a KV cache: context + window."""

    input_ids: torch.Tensor  # [T] int64, T = len(context) - 1 + window
    positions: torch.Tensor  # [T] int64
    allowed: torch.Tensor  # [T, T] bool, query row sees key column
    chain_rows: torch.Tensor  # [L+1] rows of c_n, d_1..d_L
    probe_rows: torch.Tensor  # [K] last row of each probe block


def verify_inputs(context_ids, draft_ids, boundaries, suffix_ids) -> VerifyInputs:
    """Rows, positions and visibility of parallel_verify's forward: the context causal, then the
    window (chain rows c_n d_1..d_L, one probe block per boundary) laid out as in SGLang."""
    return verify_inputs_batch([(context_ids, draft_ids, boundaries, suffix_ids)])[0]


def verify_inputs_batch(items) -> list[VerifyInputs]:
    """verify_inputs of many (context_ids, draft_ids, boundaries, suffix_ids), one layout call."""
    requests, contexts = [], []
    for context_ids, draft_ids, boundaries, suffix_ids in items:
        context = _ids(context_ids, "context_ids")
        if not context:
            raise ValueError("context_ids is empty: allowed is at least one token (the last committed token)")
        requests.append(
            VerifyRequest(
                len(context) - 1,
                context[-1],
                _ids(draft_ids, "draft_ids"),
                _ids(boundaries, "boundaries"),
                _ids(suffix_ids, "suffix_ids"),
            )
        )
        contexts.append(context)
    layout = build_verify_layout(requests)
    row_ptr = layout.qo_indptr.tolist()
    mask_ptr, chain_ptr, probe_ptr = (
        p.tolist() for p in (layout.mask_full_indptr, layout.chain_indptr, layout.probe_indptr)
    )
    out = []
    for r, context in enumerate(contexts):
        prefix_len, window = len(context) - 1, row_ptr[r + 1] - row_ptr[r]
        rows = slice(row_ptr[r], row_ptr[r + 1])
        window_allowed = layout.mask_full[mask_ptr[r] : mask_ptr[r + 1]].view(window, prefix_len + window)
        causal = torch.ones(prefix_len, prefix_len, dtype=torch.bool).tril()
        allowed = torch.cat([torch.cat([causal, torch.zeros(prefix_len, window, dtype=torch.bool)], 1), window_allowed])
        shift = prefix_len - row_ptr[r]  # global window row -> row of this request's sequence
        out.append(
            VerifyInputs(
                input_ids=torch.cat([torch.tensor(context[:-1], dtype=torch.long), layout.input_ids[rows]]),
                positions=torch.cat([torch.arange(prefix_len), layout.positions[rows]]),
                allowed=allowed,
                chain_rows=layout.chain_rows[chain_ptr[r] : chain_ptr[r + 1]] + shift,
                probe_rows=layout.probe_rows[probe_ptr[r] : probe_ptr[r + 1]] + shift,
            )
        )
    return out


def parallel_verify(model, context_ids, draft_ids, boundaries, suffix_ids):
    """ONE target forward judging every boundary-ending prefix of the draft.

    Returns (chain_logits [L+1, V], probe_logits [K, V]): chain_logits[j] = next-token
    logits after context + draft[:j]; probe_logits[k] = logits at the last suffix token
    after context + draft[:b_k] + suffix.
    """
    inputs = verify_inputs(context_ids, draft_ids, boundaries, suffix_ids)
    rows = torch.cat([inputs.chain_rows, inputs.probe_rows])
    logits = _masked_forward(model, inputs.input_ids, inputs.positions, inputs.allowed, rows)
    chain = len(inputs.chain_rows)
    return logits[:chain], logits[chain:]


@dataclass
class ParseStats:
    rounds: int = 0
    target_forwards: int = 0
    draft_forwards: int = 0
    draft_tokens: int = 0
    accepted_exact: int = 0
    accepted_judged: int = 0
    generated: int = 0


@dataclass
class _State:
    """Committed tokens and the two KV caches; the target cache holds all but the last token."""

    tokens: list[int]
    target_cache: object
    draft_cache: object
    stats: ParseStats = field(default_factory=ParseStats)


class ParseGenerator:
    def __init__(self, target, draft, tokenizer, config: ParseConfig = ParseConfig()):
        target_vocab = target.get_output_embeddings().out_features
        draft_vocab = draft.get_output_embeddings().out_features
        if target_vocab != draft_vocab:
            raise ValueError(
                f"draft vocabulary size {draft_vocab} differs from target vocabulary size {target_vocab}: "
                "PARSE needs a draft that shares the target's tokenizer"
            )
        self.target, self.draft, self.tokenizer, self.config = target, draft, tokenizer, config
        self.probe = build_judge_probe(tokenizer, config.judge_question) if config.uses_probe else None
        self.head = judge_head.load(config.judge_head, target.config) if config.judge_head else None
        eos = target.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        self.eos_ids = sorted(set(eos) | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()))

    @torch.no_grad()
    def generate(self, prompt_ids, max_new_tokens: int) -> tuple[list[int], ParseStats]:
        from transformers import DynamicCache

        prompt = _ids(prompt_ids, "prompt_ids")
        if not prompt:
            raise ValueError("prompt_ids is empty: allowed is at least one token")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens!r} is invalid: allowed is an integer >= 1")
        state = _State(list(prompt), DynamicCache(), DynamicCache())
        self._target_prefill(state)
        out: list[int] = []
        finished = False
        while not finished:
            tokens, finished, rejected = self.round(state, max_new_tokens - len(out))
            out += tokens
            if rejected and not finished and self.config.after_rejection == "target_to_delimiter":
                tokens, finished = self._target_to_delimiter(state, max_new_tokens - len(out))
                out += tokens
        state.stats.generated = len(out)
        return out, state.stats

    def round(self, state: _State, remaining: int) -> tuple[list[int], bool, bool]:
        """One PARSE round; returns (emitted tokens, finished, judge rejected part of the draft)."""
        cfg = self.config
        draft = self._draft(state, budget=min(cfg.draft_budget, max(remaining - 1, 1)))
        stride = probe_stride(cfg.probe_stride, cfg.draft_budget)  # the worker's: Δ at the round's L
        bounds = draft_boundaries(self.tokenizer, draft, stride, cfg.delimiters) if cfg.judge else []
        probed = bounds if self.probe else []
        chain_logits, probe_logits, hidden = self._verify(
            state, draft, probed, list(self.probe.suffix_ids) if probed else []
        )
        drafts, lens = torch.tensor([draft]), torch.tensor([len(draft)])
        stats = chain_statistics(chain_logits[None], drafts)
        reach = torch.zeros(1, dtype=torch.int64)
        if probed:
            reach = probe_reach(
                judge_scores(probe_logits, self.probe)[None], torch.tensor([cfg.threshold]), torch.tensor([bounds])
            )
        harm = self.head.harm(hidden[None, 1:], stats.draft_probs.log(), stats.top_probs.log()) if self.head else None
        token_ok, _ = token_passes(
            stats,
            drafts == stats.top_tokens[:, :-1],
            lens,
            torch.tensor([cfg.token_judge]),
            torch.tensor([cfg.token_threshold]),
            torch.tensor([cfg.divergence_window]),
            harm,
        )
        passed = judged_tokens(len(draft), torch.tensor([cfg.judge]), torch.tensor([cfg.uses_probe]), reach, token_ok)
        lengths = accept_lengths(drafts, lens, stats.top_tokens, passed)
        target_next = stats.top_tokens[0]
        a = int(lengths.accepted[0])
        tokens, finished = emitted_tokens(draft, a, int(target_next[a]), self.eos_ids, remaining)
        self._commit(state, draft_kept=a, tokens=tokens)
        stats = state.stats
        stats.rounds += 1
        stats.draft_tokens += len(draft)
        stats.accepted_exact += int(lengths.exact[0])
        stats.accepted_judged += int(lengths.judged[0])
        return tokens, finished, a < len(draft)

    def _target_prefill(self, state: _State) -> None:
        if len(state.tokens) > 1:
            self.target(torch.tensor([state.tokens[:-1]]), past_key_values=state.target_cache, use_cache=True)

    def _draft(self, state: _State, budget: int) -> list[int]:
        """Greedy draft of up to `budget` tokens from the last committed token; stops at EOS."""
        cache = state.draft_cache
        pending = state.tokens[cache.get_seq_length() :]
        draft: list[int] = []
        while len(draft) < budget:
            logits = self.draft(torch.tensor([pending]), past_key_values=cache, use_cache=True).logits
            state.stats.draft_forwards += 1
            token = int(logits[0, -1].argmax())
            draft.append(token)
            if token in self.eos_ids:
                break
            pending = [token]
        return draft

    def _verify(self, state: _State, draft, bounds, suffix):
        """(chain logits [L+1, V], probe logits [K, V], the chain rows' final hidden states [L+1, H])."""
        prefix_len = len(state.tokens) - 1
        layout, allowed, rows = _window(prefix_len, state.tokens[-1], draft, bounds, suffix)
        logits, hidden = _masked_forward(
            self.target, layout.input_ids, layout.positions, allowed, rows, state.target_cache, hidden=True
        )
        state.stats.target_forwards += 1
        chain = len(layout.chain_rows)
        return logits[:chain], logits[chain:], hidden[:chain]

    def _commit(self, state: _State, draft_kept: int, tokens: list[int]) -> None:
        """Keep the KV of c_n d_1..d_a (the window's first rows) in both caches; drop the rest."""
        kept = len(state.tokens) + draft_kept
        for cache in (state.target_cache, state.draft_cache):
            excess = cache.get_seq_length() - kept
            if excess > 0:
                cache.crop(-excess)
        state.tokens += tokens

    def _target_to_delimiter(self, state: _State, remaining: int) -> tuple[list[int], bool]:
        """After a rejection, the target decodes on its own up to the next segment end
        (at most probe_stride tokens), as SpecReason/HoVer do."""
        out: list[int] = []
        while len(out) < min(remaining, self.config.probe_stride):
            logits = self.target(
                torch.tensor([state.tokens[-1:]]), past_key_values=state.target_cache, use_cache=True
            ).logits
            state.stats.target_forwards += 1
            token = int(logits[0, -1].argmax())
            state.tokens.append(token)
            out.append(token)
            if token in self.eos_ids:
                return out, True
            if len(out) in delimiter_ends(self.tokenizer.batch_decode([[t] for t in out]), self.config.delimiters):
                break
        return out, len(out) >= remaining


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m support.reference", description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="target model directory (Hugging Face format)")
    parser.add_argument("--draft", required=True, help="draft model directory sharing the target's tokenizer")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--lossless", action="store_true", help="judge off: output equals the target's greedy output")
    parser.add_argument("--threshold", type=float, default=ParseConfig.threshold)
    parser.add_argument("--draft-budget", type=int, default=ParseConfig.draft_budget)
    parser.add_argument("--probe-stride", type=int, default=ParseConfig.probe_stride)
    parser.add_argument("--after-rejection", default=ParseConfig.after_rejection)
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the target's chat template")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args(argv)
    try:
        config = ParseConfig(
            draft_budget=args.draft_budget,
            probe_stride=args.probe_stride,
            threshold=args.threshold,
            judge=not args.lossless,
            judge_mode="probe",
            after_rejection=args.after_rejection,
        )
        output, stats, text = _run(args, config)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"text": text, "token_ids": output, "stats": asdict(stats)}))
    else:
        print(text)
        print(json.dumps(asdict(stats)), file=sys.stderr)
    return 0


def _run(args, config: ParseConfig):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.target)
    if AutoTokenizer.from_pretrained(args.draft).get_vocab() != tokenizer.get_vocab():
        raise ValueError(f"--draft {args.draft} has a different vocabulary from --target {args.target}")
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=torch.float32).eval()
    if args.chat:
        prompt_ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": args.prompt}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        prompt_ids = prompt_ids["input_ids"] if isinstance(prompt_ids, dict) else prompt_ids
    else:
        prompt_ids = tokenizer(args.prompt)["input_ids"]
    output, stats = ParseGenerator(target, draft, tokenizer, config).generate(prompt_ids, args.max_new_tokens)
    return output, stats, tokenizer.decode(output, skip_special_tokens=True)


if __name__ == "__main__":
    sys.exit(main())
