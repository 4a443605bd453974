"""Quantized ResNet18: agreement with eager quantized PyTorch, and latency.

Usage: python benchmarks/quantized_resnet18.py [--backend x86|fbgemm|qnnpack]
       [--inputs 200] [--batch 8] [--runs 20]

Agreement: compiles the quantized ResNet18 with ``fallback="auto"`` (int8
compiled by IREE) and with every ``aot_q`` op forced to ATen, runs ``--inputs``
random images through eager and both, and prints the share of output elements
within one quantization step of eager (the output scale), the largest
difference in steps, and the share of inputs whose top-1 class matches eager.

Latency (batch 1, interleaved in one process, medians of ``--runs``): fp32
eager, int8 eager (the backend's engine), ours by default (cost-based placement),
ours with every aot_q op compiled (``placement="coverage"``), ours ATen fallback.
Not a test: numbers depend on the machine, which is printed.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import aot  # noqa: E402
from aot.models.quantized_resnet18 import quantized_resnet18  # noqa: E402

AOT_Q_OPS = ["aot_q.quantize", "aot_q.dequantize", "aot_q.conv2d", "aot_q.linear", "aot_q.add",
             "aot_q.cat", "aot_q.max_pool2d", "aot_q.adaptive_avg_pool2d"]


def agreement(model, compiled, inputs, step: float) -> dict:
    within = total = top1 = 0
    worst = 0.0
    for x in inputs:
        ref, out = model(x), compiled(x)
        d = (out - ref).abs() / step
        within += int((d <= 1 + 1e-3).sum())
        total += d.numel()
        worst = max(worst, float(d.max()))
        top1 += int((out.argmax(1) == ref.argmax(1)).sum())
    n = sum(x.shape[0] for x in inputs)
    return {"within_one_step": within / total, "max_steps": worst, "top1_agree": top1 / n,
            "inputs": n}


def latency(systems: dict, x, runs: int) -> dict[str, float]:
    """Median ms per system, calls interleaved so drift hits every system alike."""
    times = {k: [] for k in systems}
    with torch.no_grad():
        for f in systems.values():
            for _ in range(3):
                f(x)
        for _ in range(runs):
            for k, f in systems.items():
                t = time.perf_counter()
                f(x)
                times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="x86")
    ap.add_argument("--inputs", type=int, default=200)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--runs", type=int, default=20)
    a = ap.parse_args(argv)
    model, (x,) = quantized_resnet18(a.backend, batch=a.batch)
    step = float(model.fc.scale)
    g = torch.Generator().manual_seed(1)
    inputs = [torch.randn(a.batch, 3, 224, 224, generator=g)
              for _ in range((a.inputs + a.batch - 1) // a.batch)]
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}, "
          f"engine {torch.backends.quantized.engine}")
    for name, kw in [("compiled int8", {"placement": "coverage"}),
                     ("ATen fallback", {"fallback_ops": AOT_Q_OPS})]:
        t0 = time.perf_counter()
        cm = aot.compile(model, (x,), **kw)
        secs = time.perf_counter() - t0
        r = agreement(model, cm, inputs, step)
        del cm
        print(f"{name:14s} compile {secs:5.1f}s  within one step {100 * r['within_one_step']:.3f}%"
              f"  max {r['max_steps']:.2f} steps  top-1 agree {100 * r['top1_agree']:.1f}% "
              f"({r['inputs']} inputs)")

    from aot import models
    fp32, (x1,) = models.get("resnet18")
    q1, _ = quantized_resnet18(a.backend, batch=1)
    systems = {"fp32 eager": fp32, f"int8 eager ({torch.backends.quantized.engine})": q1,
               "aot default": aot.compile(q1, (x1,)),
               "aot int8 compiled": aot.compile(q1, (x1,), placement="coverage"),
               "aot int8 ATen fallback": aot.compile(q1, (x1,), fallback_ops=AOT_Q_OPS)}
    ms = latency(systems, x1, a.runs)
    base = ms[f"int8 eager ({torch.backends.quantized.engine})"]
    print(f"latency, ResNet18 batch 1, median of {a.runs} (interleaved), "
          f"{torch.get_num_threads()} threads:")
    for k, v in ms.items():
        print(f"  {k:26s} {v:8.2f} ms   speed vs int8 eager {base / v:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
