"""Per-round cost of a PARSE verify window's metadata, by context length.

Side by side, for one decode batch at contexts 1k / 8k / 32k:
- host-built (the reference layout `build_verify_layout`, how the worker built every round
  before the window moved to the device): everything, the FULL mask included, is made on
  the host and would be copied to the device;
- device-built (`window_plan.plan_window`, what the worker runs now): the host places the
  boundaries and sends one packed plan; ids, positions and both masks are built on the device,
  the FULL mask written into a buffer reserved once (`attention.window.FullMaskBuffer`).
Bytes are counted with `support.host_traffic.HostTraffic` (device tensors on `meta`, so
no GPU is needed to count them; new tensors only, not views or in-place writes) after one
warm-up round (the per-shape constants a worker makes once); times are wall-clock medians of building on this machine's
CPU (for the device-built path that is the device work on a CPU, not a GPU figure).

Run:  python benchmarks/metadata_cost.py [--batch 8] [--draft 32] [--stride 8] [--suffix 23]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's `support` package
from parse_sglang.attention.layout import VerifyRequest, build_verify_layout  # noqa: E402
from support.host_traffic import HostTraffic  # noqa: E402

CONTEXTS = (1024, 8192, 32768)


def median_ms(fn, repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--draft", type=int, default=32, help="L")
    parser.add_argument("--stride", type=int, default=8, help="Δ (K = L / Δ probes)")
    parser.add_argument("--suffix", type=int, default=23, help="m, judge-suffix tokens (SmolLM2: 23)")
    args = parser.parse_args()

    import sglang_cpu

    sglang_cpu.enable()  # the window planner builds SGLang's verify input
    from parse_sglang.settings import ParseConfig
    from parse_sglang.window_plan import RequestPolicy
    from support.offline_round import OfflineRound
    from support.tiny_models import build_tokenizer

    torch.set_num_threads(1)
    probes = args.draft // args.stride
    bounds = [args.stride * (k + 1) for k in range(probes)]
    tokenizer = build_tokenizer(tempfile.mkdtemp())
    drafts_host = torch.randint(0, len(tokenizer), (args.batch, args.draft))
    policy = RequestPolicy(
        ParseConfig(draft_budget=args.draft, probe_stride=args.stride, judge=True, judge_mode="probe"),
        args.draft,
        True,
        frozenset(),
    )

    def host_built(context):
        reqs = [VerifyRequest(context, 0, row, bounds, [0] * args.suffix) for row in drafts_host.tolist()]
        return lambda: build_verify_layout(reqs)

    window = 1 + args.draft + probes * args.suffix
    planners = {
        device: OfflineRound(tokenizer, policy, args.batch, args.suffix, window, max(CONTEXTS), device)
        for device in ("meta", "cpu")
    }
    for planner in planners.values():
        planner.plan(drafts_host, CONTEXTS[0], probes)  # warm-up: the per-shape constants

    def device_built(context, device):
        return lambda: planners[device].plan(drafts_host, context, probes)

    def counted(build) -> HostTraffic:
        with HostTraffic() as traffic:
            build()
        return traffic

    print(f"batch {args.batch}, L={args.draft}, K={probes}, m={args.suffix}: N = {window} rows per request")
    print(
        f"{'context':>8} | {'host-built ms':>13} {'host KiB':>9} | {'device-built ms':>15} {'host KiB':>9} {'to-device KiB':>13} {'device KiB':>11}"
    )
    for context in CONTEXTS:
        old = counted(host_built(context))
        new = counted(device_built(context, "meta"))
        print(
            f"{context:>8} | {median_ms(host_built(context)):>13.1f} {old.host_bytes / 1024:>9.0f} | "
            f"{median_ms(device_built(context, 'cpu')):>15.1f} {new.host_bytes / 1024:>9.1f} "
            f"{new.to_device_bytes / 1024:>13.1f} {new.device_bytes / 1024:>11.0f}"
        )
    print("host KiB (host-built) would all cross to the device each round; device KiB is what the device-built")
    print("round allocates on the device (the FULL mask goes into a buffer reserved once, N x N written per request).")


if __name__ == "__main__":
    main()
