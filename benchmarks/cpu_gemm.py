"""What a linear layer costs on this CPU by rows, per dtype and GEMM path: why a multi-row
verify costs several decode steps in fp32 and about one in bf16.

    python benchmarks/cpu_gemm.py [--rows 1 2 3 5 9 17 33 41] [--shape 8960 1536] [--weights 10]

One linear of Qwen2.5-1.5B's MLP (out x in = 8960 x 1536 by default) at each row count (a decode
step of a batch of that many sequences, or a verify window of that many tokens). `--weights`
distinct weight matrices are cycled so that they do not stay in the L3 cache, as a real model's
28 layers do not. Columns, milliseconds per linear:
  fp32        torch.nn.functional.linear in fp32 (MKL sgemm / sgemv)
  fp32 packed MKL's packed GEMM (the weight packed once for the row count, as torch's
              freezing path does): `torch.ops.mkl._mkl_linear`, where torch has it
  bf16        torch.nn.functional.linear in bf16 (oneDNN; AVX512-BF16 or AMX where the CPU has
              them)
and each one over its own 1-row cost.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from parse_sglang.demo import table  # noqa: E402


def per_linear_ms(fn, count: int, reps: int) -> float:
    fn()  # warm-up (and oneDNN's primitive cache)
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps / count * 1e3


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/cpu_gemm.py", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 5, 9, 17, 33, 41])
    parser.add_argument("--shape", type=int, nargs=2, default=[8960, 1536], metavar=("OUT", "IN"))
    parser.add_argument("--weights", type=int, default=10, help="distinct weights cycled (cache-cold)")
    parser.add_argument("--reps", type=int, default=4)
    args = parser.parse_args(argv)
    if min(args.rows) < 1 or min(args.shape) < 1 or args.weights < 1 or args.reps < 1:
        parser.error("--rows, --shape, --weights and --reps take integers >= 1")
    import torch
    from torch.nn.functional import linear

    torch.manual_seed(0)
    weights = [torch.randn(*args.shape) * 0.02 for _ in range(args.weights)]
    weights_bf16 = [w.to(torch.bfloat16) for w in weights]
    mkl = getattr(torch.ops.mkl, "_mkl_linear", None) if torch.backends.mkl.is_available() else None
    rows, base = [], {}
    for m in args.rows:
        x = torch.randn(m, args.shape[1])
        cost = {
            "fp32": per_linear_ms(lambda: [linear(x, w) for w in weights], len(weights), args.reps),
            "bf16": per_linear_ms(lambda: [linear(x.bfloat16(), w) for w in weights_bf16], len(weights), args.reps),
        }
        if mkl is not None:
            packed = [torch.ops.mkl._mkl_reorder_linear_weight(w, m) for w in weights]
            run = lambda: [mkl(x, p, w, None, m) for p, w in zip(packed, weights)]  # noqa: E731
            cost["fp32 packed"] = per_linear_ms(run, len(weights), args.reps)
            del packed
        base = base or cost
        rows.append([str(m), *(f"{cost[k]:.2f} ({cost[k] / base[k]:.1f}x)" for k in cost)])
    print(f"linear {args.shape[0]}x{args.shape[1]}, {args.weights} weights cycled, {torch.get_num_threads()} threads")
    print(table(["rows", *(f"{k} ms (x 1 row)" for k in cost)], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
