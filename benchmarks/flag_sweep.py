"""Which IREE flags make a model fastest on this machine? (How compile profiles are chosen.)

Usage: python benchmarks/flag_sweep.py [resnet18|bert|...] [--runs 10] [--target cpu]

Compiles the bundled model once per candidate flag set (on top of the target's
base flags) and prints the median latency of each next to eager, interleaved.
The winning set is what ``aot/toolchain/targets.py`` records as the default
profile, with the numbers that chose it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import aot  # noqa: E402
from aot import models, timing  # noqa: E402

CANDIDATES = {
    "base": [],
    "O3": ["--iree-opt-level=O3"],
    "data-tiling+ukernels": ["--iree-opt-data-tiling", "--iree-llvmcpu-enable-ukernels=all"],
    "O3+data-tiling+ukernels": ["--iree-opt-level=O3", "--iree-opt-data-tiling",
                                "--iree-llvmcpu-enable-ukernels=all"],
    "channels-last+O3": [
        "--iree-opt-level=O3",
        "--iree-preprocessing-pass-pipeline=builtin.module(util.func("
        "iree-preprocessing-convert-conv-to-channels-last))"],
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="resnet18")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--target", default="cpu")
    ap.add_argument("--only", default="", help="comma-separated candidate names")
    a = ap.parse_args(argv)
    model, example = models.get(a.model)
    names = a.only.split(",") if a.only else list(CANDIDATES)
    fns = {"eager": model}
    for n in names:
        t0 = time.perf_counter()
        try:
            fns[n] = aot.compile(model, example, target=a.target, profile="iree-default",
                                 extra_flags=CANDIDATES[n])
            print(f"{n}: compiled in {time.perf_counter() - t0:.1f}s", flush=True)
        except aot.AotError as e:
            print(f"{n}: failed: {str(e).splitlines()[0][:200]}", flush=True)
    with torch.no_grad():
        times = timing.interleaved({k: (lambda f=f: f(*example)) for k, f in fns.items()},
                                   a.runs, warmup=1)
    e = statistics.median(times["eager"])
    print(f"{a.model} on {a.target}, median of {a.runs} interleaved runs:")
    for k, v in times.items():
        m = statistics.median(v)
        print(f"  {k:26s} {m:9.2f} ms  speed vs eager {e / m:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
