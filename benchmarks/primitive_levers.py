"""One lever of the oneDNN-primitives candidate on and off, in one process, interleaved.

    python benchmarks/primitive_levers.py --lever LEVER MODEL [MODEL ...]

Levers (module constants of ``aot/fallback/dnnl_program.py``):
- ``se``: squeeze-excitation scales taken into the 1x1 projection's weights
  (``_WEIGHT_SCALE_COST``; off: the image is multiplied as before);
- ``stem``: a small stem reading the NCHW image and writing oneDNN's layout, reordered
  after (``_STEM_CHANNELS``; off: the image reordered to NHWC first);
- ``linear-as-conv``: a linear that oneDNN would run on its generic GEMM run as a 1x1
  convolution over its rows (``_LINEAR_AS_CONV``; off: the matrix product);
- ``mkl-linear``: a linear over its rows run as MKL's packed GEMM with its bias and
  post-ops after it, where timed faster (``_MKL_LINEARS``; off: oneDNN's product);
- ``swap-products``: an RMS norm's per-row and per-feature products as one primitive,
  the feature's first (``_SWAP_PRODUCTS``; off: two primitives);
- ``native-loop``: stretches of primitives run by one call into a C loop
  (``_NATIVE_LOOP``; off: one ctypes call each);
- ``winograd``: 3x3 convolutions as Winograd F(4x4, 3x3) where timed faster
  (``_WINOGRAD``; off: oneDNN's convolution);
- ``depthwise``: depthwise convolutions (and the mean after them) by our own C kernel
  where timed faster (``_DEPTHWISE``; off: oneDNN's convolution and pooling);
- ``attention``: attention as one C kernel of our own where timed faster
  (``_ATTENTION``; off: oneDNN's three primitives);
- ``rms-norm``: ``x * rsqrt(mean(x^2) + eps) * w`` as one C kernel of our own
  (``_RMS_NORM``; off: three primitives).

Each model (an ``aot bench`` model name) is compiled twice with the candidate pinned
(``plan=``), once per setting; both programs are checked against eager, then called in
alternating blocks of 5 calls for 40 rounds. The host swings by tens of percent from
minute to minute, so only this side-by-side ratio is read: the median over rounds of
off / on (above 1: the lever is faster).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

# this folder's kernels.py would shadow the ``kernels`` package transformers imports
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

LEVERS = {"se": ("_WEIGHT_SCALE_COST", 10 ** 9), "stem": ("_STEM_CHANNELS", 0),
          "linear-as-conv": ("_LINEAR_AS_CONV", ()), "mkl-linear": ("_MKL_LINEARS", False),
          "swap-products": ("_SWAP_PRODUCTS", False), "native-loop": ("_NATIVE_LOOP", False),
          "winograd": ("_WINOGRAD", False), "depthwise": ("_DEPTHWISE", False),
          "attention": ("_ATTENTION", False), "rms-norm": ("_RMS_NORM", False)}
PLAN = {"format": 1, "program": None, "region": "aten-onednn-primitives", "candidates_ms": {}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lever", choices=list(LEVERS), required=True)
    p.add_argument("models", nargs="+")
    p.add_argument("--rounds", type=int, default=40)
    args = p.parse_args()

    import torch

    import aot
    from aot.bench.suite import BENCH_MODELS
    from aot.fallback import dnnl_program

    name, off = LEVERS[args.lever]
    on = getattr(dnnl_program, name)
    print(f"lever {args.lever} ({name}: on {on}, off {off}); {args.rounds} rounds of 5 calls")
    print("| model | on ms | off ms | off / on (median of rounds) | max error vs eager |")
    print("|---|---|---|---|---|")
    for model_name in args.models:
        model, example = BENCH_MODELS[model_name]()
        cms, err = {}, 0.0
        with torch.no_grad():
            want = model(*example)
            for label, value in (("on", on), ("off", off)):
                setattr(dnnl_program, name, value)
                try:  # the program is built at the first call: made under the setting
                    cms[label] = aot.compile(model, example, plan=PLAN)
                    got = cms[label](*example)
                finally:
                    setattr(dnnl_program, name, on)
                err = max(err, float((got - want).abs().max() / want.abs().max()))
            for cm in cms.values():
                for _ in range(3):
                    cm(*example)
            ms = {k: [] for k in cms}
            for _ in range(args.rounds):
                for k, cm in cms.items():
                    t = time.perf_counter()
                    for _ in range(5):
                        cm(*example)
                    ms[k].append((time.perf_counter() - t) / 5 * 1e3)
        ratio = statistics.median(a / b for a, b in zip(ms["off"], ms["on"]))
        print(f"| {model_name} | {statistics.median(ms['on']):.2f} | "
              f"{statistics.median(ms['off']):.2f} | {ratio:.3f} | {err:.1e} |", flush=True)


if __name__ == "__main__":
    main()
