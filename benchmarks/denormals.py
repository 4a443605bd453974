"""Do the benchmark models produce denormal floats, and what would flushing them buy?

    python benchmarks/denormals.py                       # the zoo at batch 1
    python benchmarks/denormals.py --models efficientnet_b0 --out results/

For each model (random weights as ``aot/models/zoo.py`` makes them, or with
``--torchvision-init`` as torchvision's constructor leaves them, batch-norm statistics
at 0 and 1; a standard-normal input): the share of denormal values among all float32 activations (every leaf
module's outputs, by forward hooks), eager's median latency as is and with
``torch.set_flush_denormal(True)`` (FTZ/DAZ on the calling thread), and the largest
output difference flushing makes. Then a probe of whether the flag reaches
ATen's intra-op worker threads: a multiply of denormal inputs, large enough to be
split across threads, gives zeros only where the thread flushed. Last, what a
denormal operand costs this CPU per op (a 3x3 convolution, a multiply, a sigmoid on
normal against denormal inputs, and on denormal inputs with FTZ/DAZ).
This is a measurement, not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from aot import timing  # noqa: E402

TINY = 1.1754943508222875e-38  # the smallest normal float32


def _denormal_share(model, args) -> tuple[int, int]:
    import torch
    counts = [0, 0]

    def hook(_m, _i, out):
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                a = t.abs()
                counts[0] += int(((a > 0) & (a < TINY)).sum())
                counts[1] += t.numel()
    hs = [m.register_forward_hook(hook) for m in model.modules() if not list(m.children())]
    with torch.no_grad():
        model(*args)
    for h in hs:
        h.remove()
    return counts[0], counts[1]


def _median_ms(fn, n: int) -> float:
    return timing.median_ms(fn, n, warmup=1)


def _torchvision_init(name: str):
    import torch
    import torchvision
    torch.manual_seed(0)
    return getattr(torchvision.models, name)(weights=None).eval(), (torch.randn(1, 3, 224, 224),)


def measure(name: str, runs: int, torchvision_init: bool = False) -> dict:
    import torch
    from aot.models.zoo import bert_base, vision_model
    if torchvision_init and name != "bert_base":
        model, args = _torchvision_init(name)
    else:
        model, args = bert_base() if name == "bert_base" else vision_model(name)
    den, total = _denormal_share(model, args)
    with torch.no_grad():
        want = model(*args)
        keep = _median_ms(lambda: model(*args), runs)
        torch.set_flush_denormal(True)
        try:
            got = model(*args)
            flush = _median_ms(lambda: model(*args), runs)
        finally:
            torch.set_flush_denormal(False)
    return {"model": name, "denormal": den, "values": total, "keep_ms": keep,
            "flush_ms": flush, "max_diff": float((got - want).abs().max()),
            "max_out": float(want.abs().max())}


def thread_probe() -> dict:
    """How many of a large denormal multiply's outputs flush to zero with the flag set."""
    import torch
    x = torch.full((1 << 22,), 1e-39)
    torch.set_flush_denormal(True)
    try:
        y = x * 1.0
    finally:
        torch.set_flush_denormal(False)
    return {"threads": torch.get_num_threads(), "flushed": int((y == 0).sum()), "n": y.numel()}


def op_probe(runs: int) -> list[tuple[str, float, float, float]]:
    """``(op, normal ms, denormal ms, denormal with FTZ/DAZ ms)`` per op."""
    import torch
    g = torch.Generator().manual_seed(0)
    conv = torch.nn.Conv2d(64, 64, 3, padding=1).eval()
    x = torch.randn(1, 64, 56, 56, generator=g)
    ops = {"conv 3x3 64ch 56^2": conv, "multiply": lambda t: t * 0.5, "sigmoid": torch.sigmoid}
    out = []
    with torch.no_grad():
        for name, f in ops.items():
            normal = _median_ms(lambda: f(x), runs)
            den = x * 1e-39
            slow = _median_ms(lambda: f(den), runs)
            torch.set_flush_denormal(True)
            try:
                flushed = _median_ms(lambda: f(den), runs)
            finally:
                torch.set_flush_denormal(False)
            out.append((name, normal, slow, flushed))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18,resnet50,mobilenet_v2,mobilenet_v3_small,"
                                        "efficientnet_b0,vit_b_16,convnext_tiny,bert_base")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", help="folder for denormals.md")
    ap.add_argument("--torchvision-init", action="store_true",
                    help="torchvision's own initialisation (batch-norm statistics 0 and 1) "
                         "instead of aot/models/zoo.py's")
    a = ap.parse_args(argv)
    from aot.bench.suite import machine_info
    m = machine_info("cpu")
    lines = ["# Denormal floats in the benchmark models", "",
             f"{m['cpu']}, {m['cores']} cores, torch {m['torch']}, {m['torch_threads']} threads; "
             "random weights ("
             + ("torchvision's constructor" if a.torchvision_init else "aot/models/zoo.py")
             + "), batch 1, eager, median of "
             f"{a.runs} calls", "",
             "| model | denormal activations | eager ms | eager ms, FTZ/DAZ | output change "
             "(max abs / max output) |", "|---|---|---|---|---|"]
    for name in a.models.split(","):
        r = measure(name, a.runs, a.torchvision_init)
        print(r, flush=True)
        lines.append(f"| {name} | {r['denormal']:,} of {r['values']:,} | {r['keep_ms']:.2f} | "
                     f"{r['flush_ms']:.2f} | {r['max_diff']:.1e} / {r['max_out']:.1e} |")
    p = thread_probe()
    print(p, flush=True)
    lines += ["", f"Does `torch.set_flush_denormal(True)` reach ATen's worker threads? A "
              f"multiply of {p['n']:,} denormal inputs with {p['threads']} threads flushed "
              f"{p['flushed']:,} of them ({100 * p['flushed'] / p['n']:.0f}%).", "",
              f"What a denormal operand costs per op (median of {a.runs * 4} calls, ms):", "",
              "| op | normal inputs | denormal inputs | denormal, FTZ/DAZ |", "|---|---|---|---|"]
    for name, normal, slow, flushed in op_probe(a.runs * 4):
        lines.append(f"| {name} | {normal:.3f} | {slow:.3f} | {flushed:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "denormals.md"), "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
