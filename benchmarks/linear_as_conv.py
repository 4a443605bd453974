"""A linear's product three ways, per shape: what ``_LINEAR_AS_CONV`` in
``aot/fallback/dnnl_program.py`` rests on.

    python benchmarks/linear_as_conv.py [--shapes 197x768x3072,1x1024x1000] [--rounds 30]

For each ``MxKxN`` (rows, in, out; a bias added), in one process, interleaved (a block of
3 calls each per round, median of rounds, ms):

- ``matmul``: oneDNN 3.2's matrix-product primitive (``onednn-cpu-gomp``) on weights in
  the layout it picks, as the primitives program made it before; its kernel is named
  (``gemm:jit`` where oneDNN has no packed kernel for the ISA, e.g. AVX2);
- ``conv1x1``: the same product as a 1x1 convolution over the rows taken as NHWC pixels
  (``1 x K x M x 1``), weights packed for it, as the program now runs such a linear;
- ``torch``: torch's own oneDNN linear (``mkldnn._linear_pointwise`` on a weight
  reordered once), what the ``aten-prepacked`` candidate runs.

A measurement, not a test: nothing asserts. The host's speed swings between minutes;
read the ratios within one run.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

# ViT-B/16's four products (197 tokens), a classifier's at batch 1 and 8, BERT-base's
SHAPES = "197x768x2304,197x768x768,197x768x3072,197x3072x768,1x1024x1000,8x512x1000," \
         "128x768x3072"


def _programs(M: int, K: int, N: int, keep: list) -> dict:
    from aot.fallback import dnnl_api as D

    lib = D.lib()

    def mem(md, t=None):
        t = torch.randn(max(1, md.nbytes // 4) + 16) if t is None else t
        keep.append(t)
        return D.Memory(lib, md, t.data_ptr())

    def run(pd, args):
        scratch = lib.scratchpad_md(pd)
        if scratch is not None and scratch.nbytes:
            args.append((D.ARG_SCRATCHPAD, mem(scratch)))
        name = lib.implementation(pd)
        return name, D.Primitive(lib, pd, None, args, name).run

    x, w, b = torch.randn(M, K), torch.randn(N, K), torch.randn(N)
    src, dst, b2 = lib.md([M, K], [K, 1]), lib.md([M, N], [N, 1]), lib.md([1, N], [N, 1])
    pd = lib.matmul(src, lib.md_any([K, N]), b2, dst, D.post_ops(lib, []))
    mm = run(pd, [(D.ARG_SRC, mem(src, x)), (D.ARG_WEIGHTS, mem(lib.weights_md(pd))),
                  (D.ARG_BIAS, mem(b2, b)), (D.ARG_DST, mem(dst))])
    s4 = lib.md([1, K, M, 1], [M * K, 1, K, K])
    d4 = lib.md([1, N, M, 1], [M * N, 1, N, N])
    b1 = lib.md([N], [1])
    pd = lib.convolution(s4, lib.md_any([N, K, 1, 1]), b1, d4, [1, 1], [0, 0], [0, 0],
                         [0, 0], D.post_ops(lib, []))
    conv = run(pd, [(D.ARG_SRC, mem(s4, x)), (D.ARG_WEIGHTS, mem(lib.weights_md(pd))),
                    (D.ARG_BIAS, mem(b1, b)), (D.ARG_DST, mem(d4))])
    packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
    keep += [x, w, b, packed]

    def eager():
        torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")
    return {"matmul": mm, "conv1x1": conv, "torch": ("mkldnn._linear_pointwise", eager)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=SHAPES, help="MxKxN, comma-separated")
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    from aot.fallback import dnnl_api
    if not dnnl_api.available():
        raise SystemExit("oneDNN's library (onednn-cpu-gomp) is not installed")
    keep: list = []
    cases = {s: _programs(*map(int, s.split("x")), keep) for s in args.shapes.split(",")}
    ms = {(s, k): [] for s, progs in cases.items() for k in progs}
    for _ in range(args.rounds):
        for s, progs in cases.items():
            for k, (_, fn) in progs.items():
                fn()
                t = time.perf_counter()
                for _ in range(3):
                    fn()
                ms[(s, k)].append((time.perf_counter() - t) / 3 * 1e3)
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), median of {args.rounds} rounds, ms\n")
    print("| M x K x N | oneDNN 3.2 matmul (kernel) | as a 1x1 convolution (kernel) | torch's "
          "oneDNN linear | matmul / conv |")
    print("|---|---|---|---|---|")
    for s, progs in cases.items():
        med = {k: statistics.median(ms[(s, k)]) for k in progs}
        print(f"| {s} | {med['matmul']:.3f} ({progs['matmul'][0]}) | {med['conv1x1']:.3f} "
              f"({progs['conv1x1'][0]}) | {med['torch']:.3f} | "
              f"{med['matmul'] / med['conv1x1']:.2f} |")


if __name__ == "__main__":
    main()
