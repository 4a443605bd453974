"""Where does IREE's time go in a compiled model? Per dispatch, on this CPU.

    python benchmarks/dispatch_profile.py mobilenet_v3_small_b1
    python benchmarks/dispatch_profile.py efficientnet_b0_b1 --flag=--iree-opt-data-tiling
    python benchmarks/dispatch_profile.py bert_base_b1 --placement coverage --top 40

The model (a name of ``aot bench``'s, e.g. ``resnet18_b1``, ``bert_base_b8``) is
partitioned as ``aot.compile`` partitions it (``placement="coverage"`` by default:
everything IREE covers compiled, the compiled forms of ``aot/forms/compiled_forms.py``
included), compiled with the target's flags (plus ``--flag``s) by the wheel's
``iree-compile``, and run by ``iree-benchmark-module`` on the ``local-task`` driver
with IREE's HAL profiling (``--device_profiling_mode=host-execution``; the
``dispatch-events`` family is not implemented for local devices). ``iree-profile
statistics`` then gives each dispatch's time; the table groups them by kind (the
dispatch name without its number and shapes) and lists the slowest. Dispatch time
sums the wall time of each dispatch; the call's median minus that sum is what the
task system spends between dispatches. ``--sources DIR`` also dumps every dispatch's
code (``--iree-hal-dump-executable-sources-to``); ``--run-flag`` passes a flag to
``iree-benchmark-module`` (the task system's, e.g. ``--task_worker_spin_us=50``).

The program must be all compiled (``iree-benchmark-module`` cannot run kernel calls):
a placement with kernel calls is refused, naming them. This is a measurement, not a
test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _tool(name: str) -> str:
    """An IREE tool from the wheels (beside this Python, or on PATH)."""
    here = os.path.join(os.path.dirname(sys.executable), name)
    path = here if os.path.exists(here) else shutil.which(name)
    if path is None:
        raise SystemExit(f"dispatch_profile: {name} not found (pip install iree-base-compiler "
                         "iree-base-runtime)")
    return path


def compiled_program(name: str, placement: str, flags: list[str], portable: bool = False):
    """``(mlir, target, example)`` of bench model ``name``, partitioned as aot.compile does
    (``portable``: ops as written, without the compiled forms)."""
    import torch  # noqa: F401
    from aot.importer import import_model
    from aot.passes.prepare import prepare
    from aot.partition.partitioner import partition
    from aot.backend.lower import lower
    from aot.partition.placement import PlacementPolicy
    from aot.toolchain.targets import get_target
    from aot.bench.suite import BENCH_MODELS

    if name not in BENCH_MODELS:
        raise SystemExit(f"dispatch_profile: unknown model {name!r}; choose from "
                         f"{', '.join(sorted(BENCH_MODELS))}")
    model, example = BENCH_MODELS[name]()
    policy = PlacementPolicy("auto", (), placement)
    imported, _ = prepare(import_model(model, example), policy)
    # a module IREE's own tools run: its weights inline, not parameters aot's runtime serves
    target = dataclasses.replace(get_target("cpu", tuple(flags)), parameters=False)
    p = lower(partition(imported, target, policy), portable=portable)
    calls = [f"{pl.op} ({pl.reason})" for pl in p.placements if pl.where != "compiled"]
    if calls:
        raise SystemExit(f"dispatch_profile: {name} has kernel calls under placement="
                         f"{placement!r}, which iree-benchmark-module cannot run: "
                         + "; ".join(calls[:5]))
    return p.mlir, p.target, example


def _inputs(example, work: str) -> list[str]:
    import numpy as np
    args = []
    for i, x in enumerate(example):
        path = os.path.join(work, f"input{i}.npy")
        np.save(path, x.detach().contiguous().numpy())
        args.append(f"--input=@{path}")
    return args


def _run(cmd: list[str]) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"dispatch_profile: {os.path.basename(cmd[0])} failed:\n"
                         + (r.stderr or r.stdout)[-2000:])
    return r.stdout


def _median_ms(out: str) -> float:
    m = re.search(r"real_time_median\s+([\d.]+) (ms|us)", out)
    if not m:
        raise SystemExit("dispatch_profile: no median in iree-benchmark-module's output")
    return float(m.group(1)) / (1000.0 if m.group(2) == "us" else 1.0)


def _kind(fn: str) -> str:
    k = re.sub(r"^.*?_dispatch_\d+_", "", fn)
    return re.sub(r"_\d+(x\d+)*", "", k)


def profile(name: str, placement: str, flags: list[str], calls: int, sources: str | None,
            run_flags: list[str] = (), portable: bool = False) -> dict:
    mlir, target, example = compiled_program(name, placement, flags, portable)
    work = tempfile.mkdtemp(prefix="aot-dispatch-profile-")
    try:
        src, vmfb = os.path.join(work, "model.mlir"), os.path.join(work, "model.vmfb")
        with open(src, "w") as f:
            f.write(mlir)
        cmd = [_tool("iree-compile"), "--iree-input-type=torch",
               f"--iree-hal-target-backends={target.backend}", *target.flags, src, "-o", vmfb]
        if sources:
            cmd.append(f"--iree-hal-dump-executable-sources-to={sources}")
        _run(cmd)
        run = [_tool("iree-benchmark-module"), f"--module={vmfb}", "--function=main",
               "--device=local-task", *run_flags, *_inputs(example, work)]
        median = _median_ms(_run(run + ["--benchmark_repetitions=10"]))
        prof = os.path.join(work, "p.ireeprof")
        _run(run + [f"--benchmark_min_time={calls}x", "--device_profiling_mode=host-execution",
                    f"--device_profiling_output={prof}"])
        stats = _run([_tool("iree-profile"), "statistics", "--format=jsonl", prof])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = [json.loads(ln) for ln in stats.splitlines() if ln.strip()]
    ops = [r for r in rows if r.get("row_type") == "host_execution_command_operation"]
    runs = max((r["sample_count"] for r in ops), default=1)
    dispatches = [{"name": r["function_name"], "us": r["total_duration_ns"] / runs / 1e3,
                   "tiles": r["tile_count"] // runs} for r in ops]
    kinds = collections.Counter()
    for d in dispatches:
        kinds[_kind(d["name"])] += d["us"]
    return {"model": name, "placement": placement, "flags": list(target.flags),
            "run_flags": list(run_flags),
            "median_ms": median, "dispatches": len(dispatches),
            "dispatch_ms": sum(d["us"] for d in dispatches) / 1e3,
            "kinds_us": dict(kinds.most_common()),
            "slowest": sorted(dispatches, key=lambda d: -d["us"])}


def table(r: dict, top: int) -> str:
    run = f", run flags {' '.join(r['run_flags'])}" if r.get("run_flags") else ""
    lines = [f"{r['model']} (placement={r['placement']!r}, flags {' '.join(r['flags'])}{run}): "
             f"median {r['median_ms']:.2f} ms a call, {r['dispatches']} dispatches, "
             f"{r['dispatch_ms']:.2f} ms of dispatch time "
             f"({max(r['median_ms'] - r['dispatch_ms'], 0):.2f} ms between dispatches)",
             "", "| kind | us per call | share |", "|---|---|---|"]
    total = sum(r["kinds_us"].values()) or 1.0
    lines += [f"| {k} | {v:.1f} | {v / total:.0%} |" for k, v in r["kinds_us"].items()]
    lines += ["", "| dispatch | us per call | tiles |", "|---|---|---|"]
    lines += [f"| {d['name']} | {d['us']:.1f} | {d['tiles']} |" for d in r["slowest"][:top]]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="an aot bench model name, e.g. mobilenet_v3_small_b1")
    ap.add_argument("--placement", default="coverage", help="coverage (default) or auto")
    ap.add_argument("--flag", action="append", default=[], help="extra iree-compile flag")
    ap.add_argument("--run-flag", action="append", default=[],
                    help="extra iree-benchmark-module flag (e.g. --task_worker_spin_us=50)")
    ap.add_argument("--calls", type=int, default=20, help="profiled calls (default 20)")
    ap.add_argument("--top", type=int, default=25, help="slowest dispatches listed")
    ap.add_argument("--sources", help="dump every dispatch's code into this folder")
    ap.add_argument("--json", help="also write the whole result as JSON here")
    ap.add_argument("--as-written", action="store_true",
                    help="compile the ops as written (no compiled forms), as the portable "
                         "exports do: convolutions stay linalg convolutions")
    a = ap.parse_args(argv)
    if a.placement not in ("coverage", "auto"):
        raise SystemExit("dispatch_profile: --placement is coverage or auto")
    r = profile(a.model, a.placement, a.flag, a.calls, a.sources, a.run_flag, a.as_written)
    print(table(r, a.top))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
