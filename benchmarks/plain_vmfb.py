"""A plain IREE module under IREE's own benchmark tool against the same program loaded
with ``aot.load`` (torch tensors, and numpy arrays without torch), and its size with
and without a parameter archive.

For each model: ``aot.export_vmfb`` writes the module twice (weights inside; weights in
an ``.irpa``), and ``aot.compile(placement="coverage")`` the artifact whose module is
the same program. Rounds alternate ``iree-benchmark-module`` (both modules), the
artifact through ``aot.load`` (torch and numpy runtimes) and eager; each round's time
is the median of its calls (the tool's median of its repetitions), and the table gives
the median over rounds. Not a test; the machine is printed. Random weights (no
denormals arise in these models; eager runs with PyTorch's defaults).

    python benchmarks/plain_vmfb.py [--models resnet18,bert] [--rounds 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

import aot
from aot import models

TOOL = os.path.join(os.path.dirname(sys.executable), "iree-benchmark-module")


def _tool_ms(vmfb: str, inputs: list[str], extra: list[str], reps: int) -> float:
    """``iree-benchmark-module``'s median over ``reps`` repetitions, in ms."""
    done = subprocess.run([TOOL, f"--module={vmfb}", *extra, "--device=local-task",
                           "--function=main", *[f"--input=@{i}" for i in inputs],
                           f"--benchmark_repetitions={reps}", "--benchmark_format=json"],
                          capture_output=True, text=True, check=True)
    rows = json.loads(done.stdout)["benchmarks"]
    med = next(r for r in rows if r.get("aggregate_name") == "median")
    scale = {"ms": 1.0, "us": 1e-3, "ns": 1e-6, "s": 1e3}[med["time_unit"]]
    return med["real_time"] * scale


def _calls_ms(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def bench(name: str, rounds: int, calls: int, work: str) -> dict:
    model, example = models.get(name)
    with torch.no_grad():
        want = model(*example)
    vmfb, pvmfb, irpa = (os.path.join(work, f"{name}{s}") for s in (".vmfb", "-p.vmfb", ".irpa"))
    aot.export_vmfb(model, example, vmfb)
    aot.export_vmfb(model, example, pvmfb, parameters=irpa)
    art = os.path.join(work, f"{name}.aot")
    compiled = aot.compile(model, example, placement="coverage")
    compiled.save(art)
    tm, nm = aot.load(art), aot.load(art, arrays="numpy")
    arrays = [t.numpy() for t in example]
    npys = []
    for i, a in enumerate(arrays):
        npys.append(os.path.join(work, f"{name}-in{i}.npy"))
        np.save(npys[-1], a)
    got = nm(*arrays)
    err = float(np.abs(got - want.numpy()).max())
    rows = {k: [] for k in ("tool_default", "tool", "tool_irpa", "aot_torch", "aot_numpy",
                            "eager")}
    # IREE's tools place one worker per physical core by default (one on a 2-vCPU VM
    # whose vCPUs are SMT siblings); the Python runtime starts one per CPU: the tool is
    # also run with as many workers as the Python runtime has
    workers = [f"--task_topology_group_count={os.cpu_count()}"]
    with torch.no_grad():
        for _ in range(3):  # warm up
            tm(*example), nm(*arrays), model(*example)
        for _ in range(rounds):
            rows["tool_default"].append(_tool_ms(vmfb, npys, [], calls))
            rows["tool"].append(_tool_ms(vmfb, npys, workers, calls))
            rows["tool_irpa"].append(_tool_ms(pvmfb, npys, [f"--parameters=model={irpa}", *workers],
                                              calls))
            rows["aot_torch"].append(_calls_ms(lambda: tm(*example), calls))
            rows["aot_numpy"].append(_calls_ms(lambda: nm(*arrays), calls))
            rows["eager"].append(_calls_ms(lambda: model(*example), calls))
    return {"model": name, "shapes": [list(a.shape) for a in arrays],
            "flags": compiled.manifest["flags"],
            "vmfb_bytes": os.path.getsize(vmfb), "vmfb_with_irpa_bytes": os.path.getsize(pvmfb),
            "irpa_bytes": os.path.getsize(irpa), "aot_bytes": os.path.getsize(art),
            "max_abs_err_vs_eager": err,
            "median_ms": {k: round(statistics.median(v), 3) for k, v in rows.items()},
            "rounds_ms": {k: [round(x, 3) for x in v] for k, v in rows.items()}}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="resnet18,bert")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=20, help="calls (tool repetitions) per round")
    p.add_argument("--out", help="folder for results.json and results.md")
    a = p.parse_args()
    machine = (f"{platform.machine()} {os.cpu_count()} cores ({_cpu_name()}), torch "
               f"{torch.__version__} {torch.get_num_threads()} threads, iree-base-runtime "
               f"{_iree_version()}")
    with tempfile.TemporaryDirectory() as work:
        results = [bench(n, a.rounds, a.calls, work) for n in a.models.split(",")]
    lines = [f"machine: {machine}", f"{a.rounds} rounds of {a.calls} calls; median over rounds "
             "(fastest and slowest round in brackets)", "",
             f"| model | vmfb (weights inside) | vmfb + irpa | iree-benchmark-module "
             f"(default workers) | iree-benchmark-module ({os.cpu_count()} workers) | same, "
             "with irpa | aot.load (torch) | aot.load (numpy, no torch) | eager | "
             "max abs err | flags |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        m, rr = r["median_ms"], r["rounds_ms"]
        cell = {k: f"{m[k]:.2f} ms [{min(rr[k]):.2f}-{max(rr[k]):.2f}]" for k in m}
        lines.append(
            f"| {r['model']} {r['shapes']} | {r['vmfb_bytes'] / 1e6:.2f} MB | "
            f"{r['vmfb_with_irpa_bytes'] / 1e6:.2f} MB + {r['irpa_bytes'] / 1e6:.2f} MB | "
            f"{cell['tool_default']} | {cell['tool']} | {cell['tool_irpa']} | {cell['aot_torch']} | "
            f"{cell['aot_numpy']} | {cell['eager']} | {r['max_abs_err_vs_eager']:.1e} | "
            f"{' '.join(r['flags'])} |")
    text = "\n".join(lines)
    print(text)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "results.json"), "w") as f:
            json.dump({"machine": machine, "results": results}, f, indent=1)
        with open(os.path.join(a.out, "results.md"), "w") as f:
            f.write(text + "\n")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def _iree_version() -> str:
    from importlib.metadata import version
    return version("iree-base-runtime")


if __name__ == "__main__":
    main()
