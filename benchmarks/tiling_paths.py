"""IREE 3.13's two data-tiling paths on static programs: compile time and run time.

    python -m benchmarks.tiling_paths [--models mobilebert_b1,vit_b_16_b1] [--rounds 4] [-o DIR]

``--iree-opt-data-tiling`` (what a static program's tiled variant uses) and
``--iree-global-opt-data-tiling`` (what a dynamic one uses: the other path miscompiles
dynamic shapes), each with ``--iree-llvmcpu-enable-ukernels=all``. Each model is compiled
with every op IREE covers compiled (``placement="coverage"``) under each path, on an empty
cache; the two artifacts are then timed in fresh worker processes, one at a time, the
order alternating round by round (a worker: load, 5 untimed calls, timed calls for at
least a second; its median). Reported per model: both compile times, the median of the
workers' medians per path, and their ratio.
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

PATHS = {"opt": ("--iree-opt-data-tiling", "--iree-llvmcpu-enable-ukernels=all"),
         "global-opt": ("--iree-global-opt-data-tiling", "--iree-llvmcpu-enable-ukernels=all")}
DEFAULT_MODELS = ("mobilebert_b1", "hf_bert_base_b1", "distilbert_b1", "t5_small_enc_b1",
                  "llama_small_b1", "vit_b_16_b1", "timm_deit_tiny_b1", "convnext_tiny_b1",
                  "timm_mobilevit_s_b1", "timm_levit_128_b1")


def worker(model: str, path: str) -> float:
    """The median ms of ``path``'s artifact of ``model`` over at least a second of calls."""
    import torch

    import aot
    from aot.bench import suite

    _, example, _ = suite.load_model(model, "cpu")
    m = aot.load(path)
    with torch.no_grad():
        for _ in range(5):
            m(*example)
        times, t_end = [], time.perf_counter() + 1.0
        while time.perf_counter() < t_end or len(times) < 10:
            t0 = time.perf_counter()
            m(*example)
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _compile(model: str, flags: tuple[str, ...], out: str) -> float:
    import aot
    from aot.bench import suite

    os.environ["AOT_CACHE_DIR"] = tempfile.mkdtemp(prefix="aot-tiling-paths-")
    m, example, _ = suite.load_model(model, "cpu")
    t0 = time.perf_counter()
    cm = aot.compile(m, example, placement="coverage", extra_flags=flags)
    seconds = time.perf_counter() - t0
    cm.save(out)
    return seconds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("-o", "--out", default=None, help="folder for results.json/.md")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--compile", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        print(json.dumps(worker(*a.worker)))
        return 0
    if a.compile:
        model, path, out = a.compile
        print(json.dumps(_compile(model, PATHS[path], out)))
        return 0

    def run(*args) -> float:
        res = subprocess.run([sys.executable, "-m", "benchmarks.tiling_paths", *args],
                             capture_output=True, text=True, check=True)
        return json.loads(res.stdout.strip().splitlines()[-1])

    tmp = tempfile.mkdtemp(prefix="aot-tiling-paths-")
    rows = []
    for model in a.models.split(","):
        arts, compile_s = {}, {}
        for name in PATHS:
            arts[name] = os.path.join(tmp, f"{model}-{name}.aot")
            compile_s[name] = round(run("--compile", model, name, arts[name]), 1)
        ms: dict[str, list[float]] = {k: [] for k in PATHS}
        for r in range(a.rounds):
            order = list(PATHS) if r % 2 == 0 else list(PATHS)[::-1]
            for name in order:
                ms[name].append(round(run("--worker", model, arts[name]), 3))
        med = {k: statistics.median(v) for k, v in ms.items()}
        rows.append({"model": model, "compile_s": compile_s, "worker_medians_ms": ms,
                     "median_ms": med, "global_opt_vs_opt": round(med["opt"] / med["global-opt"], 3)})
        print(f"{model}: {rows[-1]}", file=sys.stderr, flush=True)

    from importlib.metadata import version

    from aot.bench.report import machine_info, publish
    info = machine_info(f"IREE {version('iree-base-compiler')}")
    md = [f"{info}. Every op IREE covers compiled, each data-tiling path; median of {a.rounds} "
          "fresh worker processes' medians per path, the order alternating. > 1: the "
          "global-opt path is faster.", "",
          "| model | compile s (opt) | compile s (global-opt) | ms (opt) | ms (global-opt) | "
          "opt / global-opt |", "|---|---|---|---|---|---|"]
    md += [f"| {r['model']} | {r['compile_s']['opt']} | {r['compile_s']['global-opt']} | "
           f"{r['median_ms']['opt']:.2f} | {r['median_ms']['global-opt']:.2f} | "
           f"{r['global_opt_vs_opt']} |" for r in rows]
    publish(a.out, "\n".join(md) + "\n", info, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
