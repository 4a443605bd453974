"""One dynamic-batch artifact against eager at every batch size, and its compile time
against a static artifact's.

For each model: ``aot.compile`` once with the batch dimension dynamic (1..32,
``suite.dynamic_batch``) and once static at the example's batch; then, per batch size
(1, 2, 4, 8, 16, 32 by default), eager and the dynamic artifact are timed in interleaved
blocks (``suite.BLOCK`` calls each, after untimed warm-up calls), medians of ``--runs``
blocks; the output is checked against eager at each size. Writes Markdown, JSON and a
PNG (latency per item against batch size) to ``--out``. Both compiles start from an empty
cache (``$AOT_CACHE_DIR``), so their times compare cold with cold.

    python benchmarks/dynamic_sweep.py [--models resnet18,bert] [--batches 1,2,4,8,16,32]
                                       [--runs 10] [--out bench-results/dynamic]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch

import aot
from aot import timing
from aot.importer.dynamic import resized
from aot.bench import suite

MODELS = {"resnet18": "resnet18_b1", "bert": "bert", "mobilenet_v2": "mobilenet_v2_b1"}


def _at_batch(example: tuple, n: int) -> tuple:
    """The example's tensors with ``n`` rows (rows repeated, then cut)."""
    return tuple(resized(x, 0, n) if isinstance(x, torch.Tensor) else x for x in example)


def _interleaved(fns: dict, args: tuple, runs: int) -> dict[str, float]:
    return timing.medians(timing.interleaved({k: (lambda f=f: f(*args)) for k, f in fns.items()},
                                             runs, warm_s=suite.WARM_S, per_call=suite.BLOCK))


def sweep(name: str, batches: list[int], runs: int, log) -> dict:
    model, example = suite.BENCH_MODELS[MODELS.get(name, name)]()
    args, dyn = suite.dynamic_batch(example)
    dynamic, dyn_s = _cold_compile(model, args, dynamic_shapes=dyn)
    static, static_s = _cold_compile(model, example)
    log(f"{name}: compiled dynamic ({dyn_s:.1f}s, {_choice(dynamic)}) and static at its "
        f"example ({static_s:.1f}s, {_choice(static)})")
    rows = []
    with torch.no_grad():
        for n in batches:
            x = _at_batch(example, n)
            err = suite._rel_err(dynamic(*x), model(*x))
            t = _interleaved({"eager": model, "aot-dynamic": dynamic}, x, runs)
            rows.append({"batch": n, "eager_ms": round(t["eager"], 3),
                         "dynamic_ms": round(t["aot-dynamic"], 3),
                         "speed_vs_eager": round(t["eager"] / t["aot-dynamic"], 3),
                         "rel_err": err})
            log(f"{name} batch {n}: eager {t['eager']:.2f} ms, aot-dynamic "
                f"{t['aot-dynamic']:.2f} ms ({t['eager'] / t['aot-dynamic']:.2f}x), "
                f"error {err:.1e}")
    return {"model": name, "compile_s_dynamic": round(dyn_s, 2),
            "compile_s_static": round(static_s, 2), "dynamic_region": _choice(dynamic),
            "static_region": _choice(static), "example_batch": _batch(example), "rows": rows}


def _cold_compile(model, args, **kw):
    """``aot.compile`` with an empty cache (coverage verdicts, costs and region decisions
    all measured): the compile times compared are both cold."""
    old = os.environ.get("AOT_CACHE_DIR")
    with tempfile.TemporaryDirectory() as d:
        os.environ["AOT_CACHE_DIR"] = d
        try:
            t0 = time.perf_counter()
            cm = aot.compile(model, args, **kw)
            return cm, time.perf_counter() - t0
        finally:
            if old is None:
                os.environ.pop("AOT_CACHE_DIR", None)
            else:
                os.environ["AOT_CACHE_DIR"] = old


def _choice(cm) -> str:
    m = cm.manifest
    return (m.get("region") or m.get("variant") or {}).get("chosen") or "per-op"


def _batch(example) -> int:
    return next(x.shape[0] for x in example if isinstance(x, torch.Tensor))


def markdown(results: list[dict], info: dict, runs: int) -> str:
    out = [f"Machine: {info['cpu']}, {info['cores']} cores, torch {info['torch']} "
           f"({info['torch_threads']} threads), IREE {info['iree']}. One artifact per model "
           f"with the batch dimension dynamic ({suite.DYNAMIC_BATCH[0]}.."
           f"{suite.DYNAMIC_BATCH[1]}), against eager at each batch size: medians of {runs} "
           f"interleaved blocks of {suite.BLOCK} calls. Denormals: left as they come (no "
           "flush-to-zero set).\n"]
    for r in results:
        out.append(f"\n{r['model']}: compile {r['compile_s_dynamic']:.1f} s dynamic "
                   f"({r['dynamic_region']}) against {r['compile_s_static']:.1f} s static at "
                   f"batch {r['example_batch']} ({r['static_region']})\n")
        out.append("| batch | eager ms | aot-dynamic ms | speed vs eager | error |")
        out.append("|---|---|---|---|---|")
        for row in r["rows"]:
            out.append(f"| {row['batch']} | {row['eager_ms']:.2f} | {row['dynamic_ms']:.2f} | "
                       f"{row['speed_vs_eager']:.2f}x | {row['rel_err']:.1e} |")
    return "\n".join(out) + "\n"


def plot(results: list[dict], path: str) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.6), squeeze=False)
    for ax, r in zip(axes[0], results):
        b = [row["batch"] for row in r["rows"]]
        ax.plot(b, [row["eager_ms"] / row["batch"] for row in r["rows"]], "o-", label="eager")
        ax.plot(b, [row["dynamic_ms"] / row["batch"] for row in r["rows"]], "s-",
                label="aot, one dynamic artifact")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_ylabel("ms per item")
        ax.set_title(r["model"], fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="resnet18,bert")
    p.add_argument("--batches", default="1,2,4,8,16,32")
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--out", default="bench-results/dynamic")
    a = p.parse_args(argv)
    batches = [int(b) for b in a.batches.split(",")]
    if not all(suite.DYNAMIC_BATCH[0] <= b <= suite.DYNAMIC_BATCH[1] for b in batches):
        p.error(f"--batches: each in {suite.DYNAMIC_BATCH[0]}..{suite.DYNAMIC_BATCH[1]}")
    log = lambda msg: print(f"[sweep] {msg}", flush=True)  # noqa: E731
    results = [sweep(m, batches, a.runs, log) for m in a.models.split(",")]
    info = suite.machine_info("cpu")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "sweep.md"), "w") as f:
        f.write(markdown(results, info, a.runs))
    with open(os.path.join(a.out, "sweep.json"), "w") as f:
        json.dump({"machine": info, "results": results}, f, indent=1)
    plot(results, os.path.join(a.out, "sweep.png"))
    print(markdown(results, info, a.runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
