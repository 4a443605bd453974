"""PT2E (torchao) models: aot's default artifact against inductor's int8 CPU path.

Usage: python benchmarks/pt2e.py [--models resnet18,mobilenet_v2,transformer]
       [--size 224] [--runs 20] [--out benchmarks/results/<dir>]

For each model of ``aot/models/pt2e.py`` (random weights, calibrated on generated data,
``X86InductorQuantizer``): the converted model run as it is (eager Q/DQ), the same
model under ``torch.compile`` with ``freezing`` (inductor's int8 CPU path, the
anchor the issue names) and ``aot.compile`` with the defaults; latency at batch 1,
calls interleaved in one process, medians of ``--runs``, and each system's ratio
against inductor. Also the largest difference from the converted model's outputs.
Compile times are printed: inductor's is part of what a user pays. Not a test.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import aot  # noqa: E402
from aot.bench.report import machine_info, publish, speedups, table_head  # noqa: E402
from benchmarks.quantized_resnet18 import latency  # noqa: E402
from aot.models import pt2e  # noqa: E402

BUILDERS = {"resnet18": lambda size: pt2e.resnet18(size=size, batch=1),
            "mobilenet_v2": lambda size: pt2e.mobilenet_v2(size=size, batch=1),
            "transformer": lambda size: pt2e.transformer(batch=1)}


def _first(out):
    return out[-1] if isinstance(out, (tuple, list)) else out


def run(name: str, size: int, runs: int) -> dict:
    converted, x = BUILDERS[name](size)
    with torch.no_grad():
        want = _first(converted(x))
    t0 = time.perf_counter()
    cm = aot.compile(converted, (x,))
    aot_s = time.perf_counter() - t0
    got_aot = _first(cm(x))
    # inductor gets a model of its own (built again, same seed): freezing rewrites the
    # module it compiles, and the other systems must run the converted model as it was
    import torch._inductor.config as inductor_config
    inductor_config.freezing = True
    t0 = time.perf_counter()
    compiled = torch.compile(BUILDERS[name](size)[0])
    with torch.no_grad():
        got_inductor = _first(compiled(x))  # compiles here
    inductor_s = time.perf_counter() - t0
    row = {"model": name, "input": list(x.shape),
           "compile_s": {"inductor": round(inductor_s, 1), "aot": round(aot_s, 1)},
           "max_abs_diff": {"inductor": float((got_inductor - want).abs().max()),
                            "aot": float((got_aot - want).abs().max())},
           "aot_region": (cm.manifest.get("region") or {}).get("chosen")}
    ms = latency({"converted (eager Q/DQ)": converted, "inductor (freezing)": compiled,
                  "aot default": cm}, x, runs)
    row["latency_ms"] = ms
    row["vs_inductor"], line = speedups(ms, "inductor (freezing)")
    print(f"  {name}: {line}  compile inductor {inductor_s:.0f}s aot {aot_s:.0f}s", flush=True)
    return row


def markdown(rows: list[dict], info: str, runs: int) -> str:
    out = table_head("PT2E: aot default against torch.compile (freezing)", info, [
        "model", "input", "converted ms", "inductor ms", "aot ms", "aot vs inductor",
        "max diff aot / inductor", "compile s aot / inductor"])
    for r in rows:
        ms = r["latency_ms"]
        out.append(f"| {r['model']} | {r['input']} | {ms['converted (eager Q/DQ)']:.2f} | "
                   f"{ms['inductor (freezing)']:.2f} | {ms['aot default']:.2f} | "
                   f"{r['vs_inductor']['aot default']:.2f}x | "
                   f"{r['max_abs_diff']['aot']:.3g} / {r['max_abs_diff']['inductor']:.3g} | "
                   f"{r['compile_s']['aot']} / {r['compile_s']['inductor']} |")
    out.append(f"\nBatch 1, medians of {runs} interleaved calls; max diff: against the "
               "converted model's output.")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(BUILDERS))
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--out", default=None, help="folder for results.md and results.json")
    a = ap.parse_args(argv)
    names = a.models.split(",")
    if not set(names) <= set(BUILDERS):
        ap.error(f"--models: {sorted(set(names) - set(BUILDERS))} not among {list(BUILDERS)}")
    info = machine_info()
    print(info, flush=True)
    rows = [run(n, a.size, a.runs) for n in names]
    publish(a.out, markdown(rows, info, a.runs), info, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
