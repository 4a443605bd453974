"""A causal LM's prefill over a dynamic prompt length, per region candidate, per length.

    python benchmarks/prefill_lengths.py [--model llama_small] [--max-length 576]
        [--lengths 8,64,256,512] [--regions iree-tiled,iree,aten-prepacked]
        [--fallback-ops aten.scaled_dot_product_attention]

The prefill (the model's forward with ``logits_to_keep=1``: the last position's logits,
as ``generate`` asks for) is compiled with the prompt length dynamic in
``1..max_length - 1``, captured at 8 tokens, once per region candidate, each pinned
with ``plan=`` (no race), then timed at each length against eager PyTorch. In one
process, calls alternated; medians of ``--calls``. This is what
``aot.causal_lm._long_prefill`` rests on: the race, timed at one length, cannot see how
each candidate's time grows with the prompt. A measurement, not a test: nothing here
asserts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama_small")
    p.add_argument("--max-length", type=int, default=576)
    p.add_argument("--lengths", default="8,64,256,512")
    p.add_argument("--regions", default="iree-tiled,iree,aten-prepacked,aten-onednn-primitives")
    p.add_argument("--fallback-ops", default="")
    p.add_argument("--calls", type=int, default=5)
    args = p.parse_args()

    import torch
    from torch.export import Dim

    import aot
    from aot.bench.generate import MODELS, _model

    model = _model(args.model)
    vocab = MODELS[args.model]["vocab_size"]

    class Prefill(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, ids):
            return self.m(input_ids=ids, use_cache=False, logits_to_keep=1).logits[:, -1]

    lengths = [int(n) for n in args.lengths.split(",")]
    ids = {n: torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(n))
           for n in [8, *lengths]}
    fallback_ops = [o for o in args.fallback_ops.split(",") if o]
    print(f"{args.model}, prompt length dynamic in 1..{args.max_length - 1}, captured at 8; "
          f"medians of {args.calls} calls, ms")
    print("| region | compile s | " + " | ".join(str(n) for n in lengths) + " |")
    print("|---|---|" + "---|" * len(lengths))
    eager = {}
    for region in args.regions.split(","):
        plan = {"format": 1, "program": None, "region": region, "candidates_ms": {}}
        t0 = time.perf_counter()
        cm = aot.compile(Prefill().eval(), (ids[8],), plan=plan, fallback_ops=fallback_ops,
                         dynamic_shapes=({1: Dim("prompt", min=1, max=args.max_length - 1)},))
        built = time.perf_counter() - t0
        row = []
        for n in lengths:
            with torch.no_grad():
                cm(ids[n])
                ours, theirs = [], []
                for _ in range(args.calls):
                    t = time.perf_counter()
                    cm(ids[n])
                    ours.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    model(input_ids=ids[n], use_cache=True, logits_to_keep=1)
                    theirs.append(time.perf_counter() - t)
            eager.setdefault(n, []).extend(theirs)
            row.append(f"{statistics.median(ours) * 1e3:.1f}")
        print(f"| {region} | {built:.0f} | " + " | ".join(row) + " |", flush=True)
    print("| eager | | " + " | ".join(f"{statistics.median(eager[n]) * 1e3:.1f}"
                                    for n in lengths) + " |")


if __name__ == "__main__":
    main()
