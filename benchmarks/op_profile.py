"""Where a model's time goes, by op type: ONNX Runtime's own profile beside aot's.

    python benchmarks/op_profile.py efficientnet_b0_b1
    python benchmarks/op_profile.py timm_levit_128_b1 --calls 100 --json levit.json

For an ``aot bench`` model, each side runs in its own process (their thread pools
interfere inside one):

- **ONNX Runtime**: the model exported as ``aot bench`` exports it, run with all graph
  optimisations and torch's thread count, with ``enable_profiling``; each node's
  kernel time is summed per op type (ORT's own fused types: ``FusedConv``,
  ``FusedMatMul``, ``QuickGelu``...) and divided by the calls.
- **aot**: the model compiled as ``aot.compile`` compiles it (its cache, ``$AOT_CACHE_DIR``,
  as usual). Where the chosen candidate is an ATen region, ``torch.profiler`` over the
  artifact's calls gives each ATen op's self time; where it is IREE code, the program is
  compiled again as ``benchmarks/dispatch_profile.py`` does (the same partition and
  flags) and IREE's host-execution profile gives each dispatch kind's time (on
  ``local-task``; the time between dispatches is a row of its own).

Both sides' op types are also put in coarse groups (matmul, convolution, attention,
normalisation, elementwise, data movement, other) for a side-by-side table. Per-call
medians without profiling head the table. A measurement, not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# (group, substrings of an op type's lower-cased name), first match wins: an IREE dispatch
# kind with "elementwise" in it counts as elementwise even where a layout change
# (pack, unpack, transpose) is fused into it
_GROUPS = [
    ("elementwise", ("elementwise",)),
    ("attention", ("attention", "softmax", "sdpa", "flash")),
    ("data movement", ("pack", "transpose", "memcpy", "copy", "reshape", "concat", "cat",
                       "slice", "gather", "split", "expand", "permute", "reorder",
                       "clone", "contiguous", "view", "squeeze", "unsqueeze", "empty")),
    ("convolution", ("conv",)),
    ("matmul", ("matmul", "gemm", "mmt4d", "linear", "addmm", "bmm", "mm")),
    ("normalisation", ("norm", "reduction", "reducemean", "mean", "pool")),
    ("elementwise", ("add", "mul", "sub", "div", "gelu", "relu", "sigmoid", "swish",
                     "silu", "hardswish", "hardsigmoid", "clip", "tanh", "erf", "elementwise",
                     "generic", "sqrt", "pow", "where", "exp")),
]


def group(op: str) -> str:
    low = op.lower()
    for name, keys in _GROUPS:
        if any(k in low for k in keys):
            return name
    return "other"


def _model(name: str):
    from aot.bench.suite import BENCH_MODELS
    if name not in BENCH_MODELS:
        raise SystemExit(f"op_profile: unknown model {name!r}; choose from "
                         f"{', '.join(sorted(BENCH_MODELS))}")
    return BENCH_MODELS[name]()


def _median_ms(fn, calls: int) -> float:
    for _ in range(10):
        fn()
    ts = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def ort_side(name: str, calls: int) -> dict:
    import onnxruntime as ort
    import torch

    from aot.bench.peers import _onnx_file, _scratch
    model, example = _model(name)
    with _onnx_file(model, example) as path, _scratch("aot-ort-prof-") as prof_dir:
        return _ort_profile(ort, torch, path, prof_dir, example, calls)


def _ort_profile(ort, torch, path: str, prof_dir: str, example, calls: int) -> dict:
    from aot.bench.peers import _numpy

    def session(profile: bool):
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.intra_op_num_threads = torch.get_num_threads()
        if profile:
            opts.enable_profiling = True
            opts.profile_file_prefix = os.path.join(prof_dir, "p")
        return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])

    plain = session(False)
    feeds = dict(zip([i.name for i in plain.get_inputs()], _numpy(example)))
    median = _median_ms(lambda: plain.run(None, feeds), calls)
    prof = session(True)
    for _ in range(calls):
        prof.run(None, feeds)
    with open(prof.end_profiling()) as f:
        events = json.load(f)
    per_op: dict[str, float] = collections.Counter()
    runs = sum(1 for e in events if e.get("name") == "model_run")
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            per_op[e.get("args", {}).get("op_name", "?")] += e["dur"] / 1e3
    runs = max(runs, 1)
    return {"median_ms": median, "ops_ms": {k: v / runs for k, v in per_op.items()},
            "what": "ONNX Runtime, per op type (its kernel time)"}


def aot_side(name: str, calls: int) -> dict:
    import torch

    import aot
    model, example = _model(name)
    cm = aot.compile(model, example)
    chosen = (cm.manifest.region or {}).get("chosen", "iree")
    with torch.no_grad():
        median = _median_ms(lambda: cm(*example), calls)
        if not chosen.startswith("iree"):
            with torch.profiler.profile() as p:
                for _ in range(calls):
                    cm(*example)
            ops = {e.key: e.self_cpu_time_total / 1e3 / calls for e in p.key_averages()
                   if e.self_cpu_time_total > 0}
            return {"median_ms": median, "chosen": chosen, "ops_ms": ops,
                    "what": f"aot ({chosen}), per ATen op (self time)"}
    from benchmarks.dispatch_profile import profile
    from aot.toolchain.tiling_flags import TILING_FLAGS
    flags = list(TILING_FLAGS) if chosen.startswith("iree-tiled") else []
    placement = "coverage" if chosen.startswith(("iree-tiled", "iree-coverage")) else "auto"
    r = profile(name, placement, flags, calls, None)
    ops = dict(r["kinds_us"])
    ops = {k: v / 1e3 for k, v in ops.items()}
    ops["(between dispatches)"] = max(r["median_ms"] - r["dispatch_ms"], 0.0)
    return {"median_ms": median, "chosen": chosen, "ops_ms": ops,
            "what": f"aot ({chosen}), per IREE dispatch kind (the program rebuilt as "
                    f"dispatch_profile builds it, placement={placement!r}, local-task)"}


def _side(which: str, name: str, calls: int) -> dict:
    """Run one side in its own process; its result as JSON on the last line."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), name, "--side", which,
                          "--calls", str(calls)], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"op_profile: the {which} side failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(name: str, ort: dict, ours: dict, top: int) -> str:
    lines = [f"# {name}: where the time goes",
             "",
             f"- ONNX Runtime: {ort['median_ms']:.3f} ms a call (median, unprofiled)",
             f"- aot ({ours.get('chosen')}): {ours['median_ms']:.3f} ms a call "
             f"({ort['median_ms'] / ours['median_ms']:.2f}x ONNX Runtime's speed)",
             "", "| group | ONNX Runtime ms | aot ms | aot - ORT ms |", "|---|---|---|---|"]
    g_ort, g_aot = collections.Counter(), collections.Counter()
    for k, v in ort["ops_ms"].items():
        g_ort[group(k)] += v
    for k, v in ours["ops_ms"].items():
        g_aot["between dispatches" if k.startswith("(between") else group(k)] += v
    for g in sorted(set(g_ort) | set(g_aot), key=lambda g: -(g_aot[g] - g_ort[g])):
        lines.append(f"| {g} | {g_ort[g]:.3f} | {g_aot[g]:.3f} | {g_aot[g] - g_ort[g]:+.3f} |")
    for side in (ort, ours):
        lines += ["", f"{side['what']}:", "", "| op | ms per call | group |", "|---|---|---|"]
        for k, v in sorted(side["ops_ms"].items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"| {k} | {v:.3f} | {group(k)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="an aot bench model name, e.g. efficientnet_b0_b1")
    ap.add_argument("--calls", type=int, default=50, help="profiled calls (default 50)")
    ap.add_argument("--top", type=int, default=15, help="op types listed per side")
    ap.add_argument("--json", help="also write both sides as JSON here")
    ap.add_argument("--side", choices=("ort", "aot"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.side:
        r = (ort_side if a.side == "ort" else aot_side)(a.model, a.calls)
        print(json.dumps(r))
        return 0
    ort, ours = _side("ort", a.model, a.calls), _side("aot", a.model, a.calls)
    print(table(a.model, ort, ours, a.top))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "onnxruntime": ort, "aot": ours}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
