"""Kernel-call boundary cost: median added latency of one ATen kernel call.

Compiles the same tiny model twice — all compiled, and with N ops forced to
ATen, each between compiled ops so every one is its own crossing — and reports (median_fallback - median_compiled) / N over many calls.

    python benchmarks/boundary_cost.py [--calls 8] [--runs 2000]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

import aot


class Chain(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.n = n

    def forward(self, x):
        for _ in range(self.n):
            x = torch.neg(x) * 2  # the compiled mul keeps neighbouring negs from grouping
        return x


def _median_us(fn, x, runs):
    for _ in range(20):
        fn(x)
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn(x)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=8)
    p.add_argument("--runs", type=int, default=2000)
    a = p.parse_args()
    x = torch.randn(64)
    m = Chain(a.calls)
    compiled = aot.compile(m, (x,))
    fallback = aot.compile(m, (x,), fallback_ops=["aten.neg"])
    assert len(fallback.kernel_calls) == a.calls
    base = _median_us(compiled, x, a.runs)
    fb = _median_us(fallback, x, a.runs)
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads")
    print(f"all compiled: median {base:.1f} us/call of the module")
    print(f"{a.calls} kernel calls: median {fb:.1f} us/call of the module")
    print(f"boundary cost: {(fb - base) / a.calls:.1f} us per kernel call (median of {a.runs})")


if __name__ == "__main__":
    main()
