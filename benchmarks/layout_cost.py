"""What an input in another layout costs: ResNet18 given channels-last inputs.

A module compiled from contiguous examples converts an input with another memory
layout (a copy; ``CompiledModule.layout_conversions`` counts them). This script
compiles the bundled ResNet18 (batch 1, 224x224, random weights) with the
default placement. It then times calls with a contiguous input against calls
with a channels-last input of the same values, interleaved in blocks, medians
over ``--rounds`` rounds, and checks that both give eager's answer (rtol/atol
1e-4). On a 2-core machine, run nothing else at the same time.

    python benchmarks/layout_cost.py [--rounds 15] [--block 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from aot import timing  # noqa: E402


def main(argv=None) -> int:
    import aot
    from aot.models import get
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--block", type=int, default=5)
    a = ap.parse_args(argv)
    model, (x,) = get("resnet18")
    cm = aot.compile(model, (x,))
    xs = {"contiguous": x, "channels_last": x.contiguous(memory_format=torch.channels_last)}
    with torch.no_grad():
        want = model(x)
        for name, inp in xs.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.testing.assert_close(cm(inp), want, rtol=1e-4, atol=1e-4)
        times = timing.interleaved({k: (lambda v=v: cm(v)) for k, v in xs.items()}, a.rounds,
                                   a.block)
    med = timing.medians(times)
    region = (cm.manifest.get("region") or {}).get("chosen")
    print(f"ResNet18 b1, region {region}, {os.cpu_count()} cores, torch {torch.__version__}")
    for k, v in med.items():
        print(f"  {k:14s} median {v:.3f} ms over {len(times[k])} calls")
    print(f"  conversion cost: {med['channels_last'] - med['contiguous']:+.3f} ms "
          f"({med['channels_last'] / med['contiguous']:.3f}x); "
          f"layout_conversions counted: {cm.layout_conversions}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
