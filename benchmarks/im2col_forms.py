"""A kxk convolution's im2col columns in IREE: one gathering copy
(``linalg_kernels.im2col``) against a slice per tap (unstrided) or ``unfold`` views and
a transposing copy (strided), each followed by the same matmul.

For each convolution shape, both compiled forms of the one-op program (as the cost
module compiles it) are compiled here, their compile times taken, and each is timed by
``iree-benchmark-module`` in its own process (``--benchmark_repetitions``), the two
alternating for ``--rounds`` rounds; the table gives the median of the rounds' medians.
On a 2-core machine, run nothing else at the same time.

    python -m benchmarks.im2col_forms [--rounds 3] [-o DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# (input shape, weight shape): ResNet's 3x3 stages, MobileViT-S's 3x3 convolutions, a
# batch-8 stage, a 7x7 stem and MobileViT's 3x3 stem
SHAPES = [((1, 64, 56, 56), (64, 64, 3, 3)), ((1, 128, 28, 28), (128, 128, 3, 3)),
          ((1, 256, 14, 14), (256, 256, 3, 3)), ((1, 512, 7, 7), (512, 512, 3, 3)),
          ((1, 96, 32, 32), (96, 96, 3, 3)), ((1, 192, 32, 32), (96, 192, 3, 3)),
          ((1, 128, 16, 16), (128, 128, 3, 3)), ((8, 64, 56, 56), (64, 64, 3, 3)),
          ((1, 3, 224, 224), (64, 3, 7, 7)), ((1, 3, 256, 256), (16, 3, 3, 3))]


class _Conv(torch.nn.Module):
    def __init__(self, w, stride):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(w))
        self.b = torch.nn.Parameter(torch.randn(w[0]))
        self.stride = stride

    def forward(self, x):
        return torch.nn.functional.conv2d(x, self.w, self.b, self.stride, self.w.shape[-1] // 2)


def _forms(node, target):
    """``{form: module text}`` of the one-op program of ``node``, both ways."""
    from aot.forms import conv_rewrites
    from aot.partition import cost
    from aot.partition.coverage import _probe_graph
    out = {}
    real = conv_rewrites._gathers_well
    for name, gathers in (("gather", True), ("slices", False)):
        conv_rewrites._gathers_well = lambda wo, stride, gathers=gathers: gathers
        try:
            out[name] = cost._module_text([cost._compiled_form(_probe_graph(node), target)])
        finally:
            conv_rewrites._gathers_well = real
    return out


def _bench(path: str, shapes) -> float:
    cmd = ["iree-benchmark-module", f"--module={path}", "--function=op0", "--device=local-task",
           "--benchmark_repetitions=5"] + [f"--input={'x'.join(map(str, s))}xf32" for s in shapes]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return float(re.search(r"real_time_median\s+([\d.]+) ms", out).group(1))


def main(argv=None) -> int:
    from aot.bench.report import machine_info, publish
    from aot.toolchain.iree_compile import try_compile
    from aot.toolchain.targets import get_target
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-o", "--out")
    args = ap.parse_args(argv)
    target = get_target("cpu")
    info = machine_info()
    tmp = tempfile.mkdtemp(prefix="aot-im2col-")
    lines = [info, "", f"Median of {args.rounds} rounds of iree-benchmark-module "
             "medians (5 repetitions each).", "",
             "| input | weight | stride | gather ms | slices/unfold ms | gather / other "
             "| gather compile s | other compile s |", "|---|---|---|---|---|---|---|---|"]
    rows = []
    for stride in (1, 2):
        for xs, ws in SHAPES:
            ep = torch.export.export(_Conv(ws, stride), (torch.randn(xs),))
            node = next(n for n in ep.graph.nodes if n.op == "call_function"
                        and n.target == torch.ops.aten.conv2d.default)
            paths, secs = {}, {}
            for name, text in _forms(node, target).items():
                t0 = time.perf_counter()
                vmfb, diag = try_compile(text, target)
                secs[name] = time.perf_counter() - t0
                if vmfb is None:
                    raise SystemExit(f"{name} form of {xs} {ws} failed: {diag[:500]}")
                paths[name] = os.path.join(tmp, f"{name}.vmfb")
                with open(paths[name], "wb") as f:
                    f.write(vmfb)
            times = {k: [] for k in paths}
            for _ in range(args.rounds):
                for k, p in paths.items():
                    times[k].append(_bench(p, [xs, ws, ws[:1]]))
            g, o = (statistics.median(times[k]) for k in ("gather", "slices"))
            row = {"input": xs, "weight": ws, "stride": stride, "gather_ms": g, "other_ms": o,
                   "gather_compile_s": secs["gather"], "other_compile_s": secs["slices"]}
            rows.append(row)
            lines.append(f"| {xs} | {ws} | {stride} | {g:.3f} | {o:.3f} | {g / o:.2f} | "
                         f"{secs['gather']:.2f} | {secs['slices']:.2f} |")
            print(lines[-1], flush=True)
    publish(args.out, "\n".join(lines) + "\n", info, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
