"""torchvision's quantized zoo: agreement with eager int8 and latency, model by model.

Usage: python benchmarks/quantized_zoo.py [--models googlenet,mobilenet_v2,...]
       [--backend x86|fbgemm|qnnpack] [--size 224] [--inputs 100] [--runs 20]
       [--modes default,coverage,aten] [--out benchmarks/results/<dir>]

For each model of ``aot/models/quantized_zoo.py`` (random weights, batch norms measured
and calibrated on generated data): compiles with the defaults, with every ``aot_q``
op compiled (``placement="coverage"``) and with every ``aot_q`` op in ATen, and gives
per mode the share of logits within one quantization step of eager int8, the largest
difference in steps, the top-1 agreement over ``--inputs`` random inputs, and the
compile time; then the latency at batch 1 of eager int8 and the three artifacts,
interleaved in one process (medians of ``--runs``), and the speed against eager int8.
Also: how far one activation of the first convolution moved by one step moves the
logits in eager int8 itself (the model's own sensitivity, which bounds what any
computation that is not bit-exact can agree on). Not a test: numbers depend on the
machine, which is printed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.ao.nn.quantized as nnq  # noqa: E402

import aot  # noqa: E402
from aot.bench.report import machine_info, publish, speedups, table_head  # noqa: E402
from benchmarks.quantized_resnet18 import agreement, latency  # noqa: E402
from aot.models.quantized_zoo import MIN_SIZE, QUANTIZED_ZOO, quantized_model  # noqa: E402

MODES = {"default": {}, "coverage": {"placement": "coverage"},
         "aten": {"fallback_ops": ["aot_q"]}}


def one_step_sensitivity(model, inputs, step: float) -> float:
    """Share of logits that stay within one step when one activation of the first
    quantized convolution moves by one step, in eager int8."""
    first = next(m for m in model.modules() if isinstance(m, nnq.Conv2d))

    def moved(mod, args, out):
        r = out.int_repr().clone()
        i = (0, 0, r.shape[2] // 2, r.shape[3] // 2)
        r[i] = r[i] + 1 if r[i] < 255 else r[i] - 1
        return torch._make_per_tensor_quantized_tensor(r, out.q_scale(), out.q_zero_point())

    within = total = 0
    with torch.no_grad():
        for x in inputs:
            ref = model(x)
            handle = first.register_forward_hook(moved)
            d = (model(x) - ref).abs() / step
            handle.remove()
            within += int((d <= 1 + 1e-3).sum())
            total += d.numel()
    return within / total


def run(name: str, backend: str, size: int, n_inputs: int, runs: int,
        modes=tuple(MODES)) -> dict:
    size = max(size, MIN_SIZE.get(name, 0))
    model, (x,) = quantized_model(name, backend, size=size)
    step = float([m.scale for m in model.modules() if isinstance(m, nnq.Linear)][-1])
    g = torch.Generator().manual_seed(1)
    inputs = [torch.randn(x.shape, generator=g) for _ in range(n_inputs)]
    row = {"model": name, "backend": backend, "size": size,
           "one_step_sensitivity": one_step_sensitivity(model, inputs[:20], step)}
    systems = {f"int8 eager ({torch.backends.quantized.engine})": model}
    for mode in modes:
        kw = MODES[mode]
        t0 = time.perf_counter()
        cm = aot.compile(model, (x,), **kw)
        row[mode] = {"compile_s": round(time.perf_counter() - t0, 1),
                     **agreement(model, cm, inputs, step)}
        systems[f"aot {mode}"] = cm
        print(f"  {name} {mode:8s} compile {row[mode]['compile_s']:6.1f}s  within one step "
              f"{100 * row[mode]['within_one_step']:.2f}%  max {row[mode]['max_steps']:.0f} "
              f"steps  top-1 {100 * row[mode]['top1_agree']:.0f}%", flush=True)
    ms = latency(systems, x, runs)
    row["latency_ms"] = ms
    row["speed_vs_eager_int8"], line = speedups(ms, next(iter(ms)))
    print("  " + line, flush=True)
    return row


def markdown(rows: list[dict], info: str, runs: int) -> str:
    out = table_head("Quantized zoo: agreement with eager int8 and latency", info, [
        "model", "size", "one-step sensitivity", "mode", "within one step", "max steps",
        "top-1", "compile s", "ms", "vs eager int8"])
    for r in rows:
        eager = next(iter(r["latency_ms"]))
        out.append(f"| {r['model']} | {r['size']} | {100 * r['one_step_sensitivity']:.1f}% "
                   f"| eager int8 | | | | | {r['latency_ms'][eager]:.2f} | 1.00x |")
        for mode in (m for m in MODES if m in r):
            m = r[mode]
            out.append(f"| | | | {mode} | {100 * m['within_one_step']:.2f}% | "
                       f"{m['max_steps']:.0f} | {100 * m['top1_agree']:.0f}% | {m['compile_s']} | "
                       f"{r['latency_ms'][f'aot {mode}']:.2f} | "
                       f"{r['speed_vs_eager_int8'][f'aot {mode}']:.2f}x |")
    out.append(f"\nLatency: batch 1, medians of {runs} interleaved calls. One-step sensitivity: "
               "the share of logits within one step of eager int8 after one activation of the "
               "first convolution moved by one step, in eager int8.")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(QUANTIZED_ZOO))
    ap.add_argument("--backend", default="x86")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--inputs", type=int, default=100)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--modes", default=",".join(MODES),
                    help=f"artifacts to build, of {','.join(MODES)} (coverage is slow to run)")
    ap.add_argument("--out", default=None, help="folder for results.md and results.json")
    a = ap.parse_args(argv)
    info = machine_info(f"engine {a.backend}")
    print(info, flush=True)
    modes = a.modes.split(",")
    if not set(modes) <= set(MODES):
        ap.error(f"--modes: {sorted(set(modes) - set(MODES))} not among {list(MODES)}")
    rows = [run(n, a.backend, a.size, a.inputs, a.runs, modes) for n in a.models.split(",")]
    publish(a.out, markdown(rows, info, a.runs), info, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
