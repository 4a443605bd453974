"""Compile time and latency of a bundled model through aot vs eager PyTorch.

Interleaves eager and compiled calls (same inputs, same process) and prints
medians. Not a test; numbers depend on the machine, which is printed.

    python benchmarks/compare_eager.py resnet18 [--runs 20]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch

import aot
from aot import timing
from aot import models


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model", nargs="?", default="resnet18")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--fallback", default="auto")
    a = p.parse_args()
    model, example = models.get(a.model)
    t0 = time.perf_counter()
    cm = aot.compile(model, example, fallback=a.fallback)
    compile_s = time.perf_counter() - t0
    with torch.no_grad():
        med = timing.medians(timing.interleaved(
            {"eager": lambda: model(*example), "aot": lambda: cm(*example)}, a.runs, warmup=3))
    e, o = med["eager"], med["aot"]
    kc = len(cm.kernel_calls)
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(f"{a.model} fallback={a.fallback}: compile {compile_s:.1f}s, {kc} kernel calls; "
          f"median of {a.runs}: eager {e:.2f} ms, aot {o:.2f} ms, speed ratio {e / o:.2f}x eager")


if __name__ == "__main__":
    main()
