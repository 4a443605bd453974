"""torchvision's classification zoo with a dynamic batch: correctness, not speed.

For each model (random weights; heads that torchvision initialises to zero, as
ViT's, are re-drawn so the output depends on the input): ``aot.compile`` with the
batch dimension dynamic (1..8) from a batch-2 example, under the given placements,
then the artifact against eager at batch 1, 3 and 8: the largest |aot - eager| over
the largest |eager|. A model whose eager outputs do not depend on the input at this
resolution (dead activations with random weights) is reported as such: comparing it
would prove nothing.

    python benchmarks/dynamic_zoo.py [--models resnet50,vit_b_16,...] [--placements auto,coverage]
                                     [--resolution 64]
"""

from __future__ import annotations

import argparse
import time

import torch
import torchvision
from torch.export import Dim

import aot

ZOO = ("resnet50", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny",
       "vit_b_16", "googlenet", "densenet121", "shufflenet_v2_x1_0", "squeezenet1_1",
       "regnet_y_400mf", "mnasnet0_5")
BATCHES = (1, 3, 8)


def make(name: str, resolution: int) -> torch.nn.Module:
    torch.manual_seed(0)
    kw = {"image_size": resolution} if name.startswith("vit") else {}
    m = getattr(torchvision.models, name)(**kw).eval()
    for mod in m.modules():  # zero-initialised heads (ViT's) make every output equal
        if isinstance(mod, torch.nn.Linear) and not mod.weight.detach().any():
            torch.nn.init.normal_(mod.weight, std=0.02)
    return m


def check(name: str, placement: str, resolution: int) -> str:
    m = make(name, resolution)
    g = torch.Generator().manual_seed(1)
    xs = {n: torch.randn(n, 3, resolution, resolution, generator=g) for n in BATCHES}
    with torch.no_grad():
        refs = {n: m(x) for n, x in xs.items()}
    if (refs[3] - refs[3][:1]).abs().max() == 0:
        return f"{name}: eager's outputs do not depend on the input at {resolution}px: not compared"
    t0 = time.perf_counter()
    try:
        cm = aot.compile(m, (torch.randn(2, 3, resolution, resolution, generator=g),),
                         dynamic_shapes=({0: Dim("batch", min=1, max=8)},), placement=placement)
    except aot.AotError as e:
        return f"{name} {placement}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    secs = time.perf_counter() - t0
    chosen = (cm.manifest.get("region") or cm.manifest.get("variant") or {}).get("chosen")
    errs = [((cm(xs[n]) - refs[n]).abs().max() / refs[n].abs().max()).item() for n in BATCHES]
    return (f"{name} {placement} ({chosen or 'per-op'}): compile {secs:.1f} s, error at batch "
            + ", ".join(f"{n}: {e:.1e}" for n, e in zip(BATCHES, errs)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(ZOO))
    p.add_argument("--placements", default="auto,coverage")
    p.add_argument("--resolution", type=int, default=64)
    a = p.parse_args(argv)
    for placement in a.placements.split(","):
        for name in a.models.split(","):
            print(check(name, placement, a.resolution), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
