"""Depthwise convolutions' compiled forms end to end: the named channels-last one against
shifted multiply-adds, in the same models.

Each model (``aot.bench.suite`` names) is compiled twice in this process with
``placement="coverage"`` (every op compiled): as the CPU target compiles it
(``linalg_kernels.named_kernels``: strided and larger-than-3x3 depthwise convolutions
channels-last) and as a target without named kernels compiles it (every depthwise
convolution shifted). Both are timed interleaved, in blocks of ``--block`` calls after
untimed ones, the order alternating each round; both are checked against eager (rtol
and atol 1e-4). On a 2-core machine, run nothing else at the same time.

    python -m benchmarks.depthwise_forms [--models mobilenet_v3_small_b1,efficientnet_b0_b1]
        [--rounds 30] [--block 10] [-o DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from aot import timing  # noqa: E402


def _compile(model, example, named: bool):
    import aot
    from aot.toolchain import linalg_kernels
    from aot.partition import partitioner as partition
    real = linalg_kernels.named_kernels
    if not named:
        partition.named_kernels = linalg_kernels.named_kernels = lambda target: False
    try:
        t0 = time.perf_counter()
        cm = aot.compile(model, example, placement="coverage")
        return cm, time.perf_counter() - t0
    finally:
        partition.named_kernels = linalg_kernels.named_kernels = real


def main(argv=None) -> int:
    from aot.bench.report import machine_info, publish
    from aot.bench.suite import load_model
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mobilenet_v3_small_b1,efficientnet_b0_b1")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("-o", "--out")
    args = ap.parse_args(argv)
    os.environ.setdefault("AOT_CACHE_DIR", tempfile.mkdtemp(prefix="aot-forms-"))
    info = machine_info()
    lines = [info, "", "| model | form | compile s | median ms | p10 | p90 |", "|---|---|---|---|---|---|"]
    rows = []
    for name in args.models.split(","):
        model, example, _ = load_model(name, "cpu")
        mods = {form: _compile(model, example, form == "channels-last")
                for form in ("channels-last", "shifted")}
        with torch.no_grad():
            ref = model(*example)
            for form, (cm, _) in mods.items():
                torch.testing.assert_close(cm(*example), ref, rtol=1e-4, atol=1e-4)
                for _ in range(20):
                    cm(*example)
            samples = timing.interleaved(
                {form: (lambda cm=cm: cm(*example)) for form, (cm, _) in mods.items()},
                args.rounds, args.block, warm_s=0.005)
        for form, v in samples.items():
            v = sorted(v)
            row = {"model": name, "form": form, "compile_s": round(mods[form][1], 1),
                   "median_ms": round(statistics.median(v), 3), "p10_ms": round(v[len(v) // 10], 3),
                   "p90_ms": round(v[9 * len(v) // 10], 3)}
            rows.append(row)
            lines.append(f"| {name} | {form} | {row['compile_s']} | {row['median_ms']} | "
                         f"{row['p10_ms']} | {row['p90_ms']} |")
    publish(args.out, "\n".join(lines), info, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
