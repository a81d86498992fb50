"""Which settings of a machine change the synthetic pair's trained weights.

    python benchmarks/synthetic_builds.py [--steps-scale 0.02]

Trains a short run of the synthetic recipe (`support.synthetic.RECIPE`, every phase scaled by
--steps-scale) in a fresh process per row, each into its own temporary cache, with one thing of
the machine changed per row: the training thread count, ATen's CPU kernel dispatch
(`ATEN_CPU_CAPABILITY`: which vector instructions its kernels use, normally the best the CPU
has), MKL's GEMM code path (`MKL_CBWR`), oneDNN's instruction set (`ONEDNN_MAX_CPU_ISA`). Prints
the first 12 hex digits of each checkpoint's weights hash (`synthetic.weights_hash`). A row equal
to the first is a setting the build does not depend on; a different row is one that makes builds
of the same recipe differ between machines.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = r"""
import dataclasses, json, sys, tempfile
sys.path.insert(0, sys.argv[1])
from support import synthetic
recipe = dataclasses.replace(synthetic.RECIPE, steps_scale=float(sys.argv[2]), threads=int(sys.argv[3]))
target, draft = synthetic.build(tempfile.mkdtemp(), recipe, log=lambda *_: None)
print(json.dumps({"target": synthetic.weights_hash(target)[:12], "draft": synthetic.weights_hash(draft)[:12]}))
"""
ROWS = (
    ("the recipe (2 threads)", 2, {}),
    ("the recipe again", 2, {}),
    ("1 thread", 1, {}),
    ("ATEN_CPU_CAPABILITY=avx2", 2, {"ATEN_CPU_CAPABILITY": "avx2"}),
    ("ATEN_CPU_CAPABILITY=default", 2, {"ATEN_CPU_CAPABILITY": "default"}),
    ("MKL_CBWR=COMPATIBLE", 2, {"MKL_CBWR": "COMPATIBLE"}),
    ("ONEDNN_MAX_CPU_ISA=AVX2", 2, {"ONEDNN_MAX_CPU_ISA": "AVX2"}),
)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/synthetic_builds.py", description=__doc__.splitlines()[0])
    parser.add_argument("--steps-scale", type=float, default=0.02, help="share of the recipe's training steps")
    args = parser.parse_args(argv)
    if not 0 < args.steps_scale <= 1:
        parser.error(f"--steps-scale={args.steps_scale} is invalid: allowed is a number in (0, 1]")
    import torch

    print(
        f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
        f"steps scale {args.steps_scale}"
    )
    for name, threads, env in ROWS:
        run = subprocess.run(
            [sys.executable, "-c", CHILD, str(ROOT), str(args.steps_scale), str(threads)],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
        )
        if run.returncode:
            print(f"{name:30s} failed: {run.stderr.strip().splitlines()[-1:]}")
            continue
        hashes = json.loads(run.stdout.strip().splitlines()[-1])
        print(f"{name:30s} target {hashes['target']}  draft {hashes['draft']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
