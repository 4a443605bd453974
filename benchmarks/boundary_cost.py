"""Kernel-call boundary cost: median added latency of one ATen kernel call, per CPU driver.

Compiles the same tiny model twice — all compiled, and with N ops forced to
ATen, each between compiled ops so every one is its own crossing — and runs
both artifacts on IREE's two CPU drivers: ``local-task`` (compiled code on a
pool of worker threads) and ``local-sync`` (compiled code on the calling
thread). The four modules are timed interleaved, in blocks of calls, so the
machine's drifts hit them alike; the cost per crossing is
``(median(fallback) - median(compiled)) / N``. It includes what splitting the
compiled code costs (each crossing separates two IREE dispatches that would
otherwise fuse).

    python benchmarks/boundary_cost.py [--calls 8] [--rounds 40] [--block 50]
"""

from __future__ import annotations

import argparse
import platform

import torch

import aot
from aot import timing
from aot.artifact import CompiledArtifact
from aot.runtime.module import CompiledModule


class Chain(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.n = n

    def forward(self, x):
        for _ in range(self.n):
            x = torch.neg(x) * 2  # the compiled mul keeps neighbouring negs from grouping
        return x


def on_driver(cm, driver: str) -> CompiledModule:
    """The same artifact, opened on another CPU driver."""
    a = cm.artifact
    return CompiledModule(CompiledArtifact(a.vmfb, {**a.manifest, "driver": driver}, a.constants))


def interleaved_us(mods: dict, x, rounds: int, block: int) -> dict:
    """Median microseconds per call of each module, blocks of calls interleaved."""
    samples = timing.interleaved({k: (lambda m=m: m(x)) for k, m in mods.items()}, rounds,
                                 warmup=20, per_call=block)
    return {k: v * 1e3 for k, v in timing.medians(samples).items()}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=8)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--block", type=int, default=50)
    a = p.parse_args()
    x = torch.randn(64)
    m = Chain(a.calls)
    compiled = aot.compile(m, (x,))
    fallback = aot.compile(m, (x,), fallback_ops=["aten.neg"])
    assert len(fallback.kernel_calls) == a.calls
    mods = {}
    for driver in ("local-task", "local-sync"):
        mods[("compiled", driver)] = on_driver(compiled, driver)
        mods[("fallback", driver)] = on_driver(fallback, driver)
    us = interleaved_us(mods, x, a.rounds, a.block)
    print(f"machine: {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} torch threads; {a.rounds} rounds of {a.block} calls")
    for driver in ("local-task", "local-sync"):
        base, fb = us[("compiled", driver)], us[("fallback", driver)]
        print(f"{driver}: all compiled {base:.1f} us/call, {a.calls} kernel calls {fb:.1f} us/call"
              f" -> boundary cost {(fb - base) / a.calls:.1f} us per kernel call")


if __name__ == "__main__":
    main()
