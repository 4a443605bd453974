"""One thread budget, before and after: mixed plans with their light kernel calls on
the calling thread alone (``executor.one_thread_calls``, ``aot.partition.threads``) or on
torch's threads (the two pools competing), and eager PyTorch in the same process
before and after the artifact ran.

    python -m benchmarks.thread_budget [--rounds 5] [--calls 30] [-o DIR]

Builds two mixed plans with this tree (``placement="coverage"``, ops forced to ATen):
MobileNetV3-Small with its hardswish ops as kernel calls (light calls between
compiled convolutions) and ResNet18 with its convolutions as kernel calls (heavy
calls, which keep torch's threads either way). Each configuration runs in a fresh
process per round, rounds interleaved by this coordinator:

- ``budget``: the artifact as compiled;
- ``two pools``: the same artifact with ``one_thread_calls`` emptied;
- ``eager alone``: the eager model in a process that never loads an artifact.

A worker times eager first (``eager before``), then the artifact, then eager again
(``eager after``), ``--calls`` calls each after warm-up calls; reported: the median
over rounds of the per-round medians, and the p10-p90 of all calls.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

MODELS = {"mobilenet_v3_small": ["aten.hardswish"], "resnet18": ["aten.conv2d"]}
CONFIGS = ("budget", "two pools", "eager alone")


def _times(fn, x, calls: int) -> list[float]:
    for _ in range(3):
        fn(x)
    out = []
    for _ in range(calls):
        t = time.perf_counter()
        fn(x)
        out.append((time.perf_counter() - t) * 1e3)
    return out


def worker(model: str, path: str, config: str, calls: int) -> dict:
    import torch

    from aot.artifact import CompiledArtifact, load_artifact
    from aot.runtime.module import CompiledModule
    from aot.models.zoo import vision_model
    m, (x,) = vision_model(model, 1)
    with torch.no_grad():
        out = {"eager before": _times(m, x, calls)}
        if config == "eager alone":
            out["eager after"] = _times(m, x, calls)
            return out
        art = load_artifact(path)
        if config == "two pools":
            ex = {**art.manifest["executor"], "one_thread_calls": []}
            art = CompiledArtifact(art.vmfb, {**art.manifest, "executor": ex}, art.constants)
        cm = CompiledModule(art)
        out["aot"] = _times(cm, x, calls)
        out["eager after"] = _times(m, x, calls)
        out["one_thread_calls"] = len(art.manifest["executor"].get("one_thread_calls") or [])
        out["kernel_calls"] = len(art.manifest["kernel_calls"])
    return out


def _build(folder: str) -> dict[str, str]:
    import aot
    from aot.models.zoo import vision_model
    paths = {}
    for name, ops in MODELS.items():
        m, (x,) = vision_model(name, 1)
        paths[name] = os.path.join(folder, f"{name}.aot")
        aot.compile(m, (x,), placement="coverage", fallback_ops=ops).save(paths[name])
    return paths


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("-o", "--out", help="write results.md / results.json here")
    p.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(*args.worker, args.calls)))
        return 0
    from aot.bench.report import machine_info, publish, table_head
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runs: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory() as folder:
        print("compiling the mixed plans ...", flush=True)
        paths = _build(folder)
        for r in range(args.rounds):
            for name, path in paths.items():
                order = CONFIGS[r % 3:] + CONFIGS[:r % 3]  # rotate: no config always first
                for config in order:
                    res = subprocess.run(
                        [sys.executable, "-m", "benchmarks.thread_budget", "--calls",
                         str(args.calls), "--worker", name, path, config],
                        cwd=root, capture_output=True, text=True, check=True)
                    runs.setdefault((name, config), []).append(
                        json.loads(res.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} of {args.rounds} done", flush=True)
    info = machine_info()
    lines = table_head("Thread budget: mixed plans, each configuration in its own process "
                       "(ms: median of per-round medians, p10-p90 of all calls)", info,
                       ["model", "configuration", "kernel calls (one thread)", "aot",
                        "eager before", "eager after"])
    rows = []
    for (name, config), rs in runs.items():
        cells, row = [], {"model": name, "config": config}
        for phase in ("aot", "eager before", "eager after"):
            if phase not in rs[0]:
                cells.append("—")
                continue
            med = statistics.median(statistics.median(r[phase]) for r in rs)
            every = [v for r in rs for v in r[phase]]
            row[phase] = {"median": med, "p10": _pct(every, 0.1), "p90": _pct(every, 0.9)}
            cells.append(f"{med:.2f} ({_pct(every, 0.1):.2f}–{_pct(every, 0.9):.2f})")
        calls = (f"{rs[0]['kernel_calls']} ({rs[0]['one_thread_calls']})"
                 if "kernel_calls" in rs[0] else "—")
        rows.append(row)
        lines.append(f"| {name} | {config} | {calls} | " + " | ".join(cells) + " |")
    publish(args.out, "\n".join(lines) + "\n", info, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
