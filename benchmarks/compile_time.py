"""Cold compile time, stage by stage, for this tree and others (before/after).

    python -m benchmarks.compile_time [--models mobilenet_v3_small_b1,resnet50_b1]
        [--tree OTHER_CHECKOUT ...] [--rounds 1] [--onnxruntime] [-o DIR]

Each compile runs in a fresh process with an empty cache (``$AOT_CACHE_DIR``: nothing
probed, measured or decided before), under the default options with the example (what
``aot compile`` does). Reported per model and tree: the wall time of ``aot.compile``
(the median over rounds), the number of IREE compiler runs and their summed wall time,
and the progress lines with their times (the last round's). ``--tree`` imports another
checkout (``git worktree add /tmp/base HEAD~1``) in this one's place, so both compile
the same models on the same machine, rounds interleaved. ``--onnxruntime`` also times
ONNX Runtime's build (``torch.onnx.export`` and the session) in its own process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODELS = ("mobilenet_v3_small_b1", "resnet18_b1", "efficientnet_b0_b1", "resnet50_b1",
                  "bert")


def worker(model: str, system: str) -> dict:
    """Compile ``model`` once in this process (imports the tree on ``sys.path``)."""
    import io
    import logging
    import time

    try:
        from aot.bench import peers, suite
    except ImportError:  # a tree from before the bench driver moved into aot
        from benchmarks import peers, suite
    model_, example, _ = suite.load_model(model, "cpu")
    if system == "onnxruntime":
        build_peer = peers.build_peer
        t0 = time.perf_counter()
        build_peer("onnxruntime", model_, example, "cpu")
        return {"seconds": time.perf_counter() - t0}

    import aot
    import importlib
    users = ("aot.tuning.compile", "aot.backend.build", "aot.partition.coverage",
             "aot.partition.cost", "aot.tuning.regions", "aot.tuning.specialize")
    try:
        from aot.toolchain import iree_compile
    except ImportError:  # a tree from before aot.toolchain, or before the stage packages
        try:
            iree_compile = importlib.import_module("aot.backend.iree_compile")
        except ImportError:  # everything in aot.lower
            iree_compile = importlib.import_module("aot.lower.iree_compile")
            users = tuple(f"aot.lower.{m}" for m in ("compile", "backend", "coverage", "cost",
                                                      "regions", "specialize"))
    runs = []
    real = iree_compile.try_compile

    def counted(*a, **k):
        t = time.perf_counter()
        try:
            return real(*a, **k)
        finally:
            runs.append(time.perf_counter() - t)
    iree_compile.try_compile = counted
    for mod in users:
        try:
            m = importlib.import_module(mod)
        except ImportError:
            continue
        if getattr(m, "try_compile", None) is real:
            m.try_compile = counted
    lines = io.StringIO()
    t0 = time.perf_counter()

    class Since(logging.Formatter):
        def format(self, r):
            return f"{time.perf_counter() - t0:6.1f}s  {r.getMessage()}"
    h = logging.StreamHandler(lines)
    h.setFormatter(Since())
    log = logging.getLogger("aot.progress")
    log.addHandler(h)
    log.setLevel(logging.INFO)
    t0 = time.perf_counter()
    cm = aot.compile(model_, example)
    seconds = time.perf_counter() - t0
    region = cm.manifest.get("region") or {}
    return {"seconds": seconds, "iree_runs": len(runs), "iree_seconds": sum(runs),
            "chosen": region.get("chosen"), "candidates_ms": region.get("candidates_ms"),
            "progress": lines.getvalue().splitlines()}


def _run(tree: str, model: str, system: str) -> dict:
    env = {**os.environ, "AOT_CACHE_DIR": tempfile.mkdtemp(prefix="aot-cold-"),
           "PYTHONPATH": tree}
    # this file runs as the worker, the tree's packages first on the path
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", model, system],
                         cwd=tree, env=env, capture_output=True, text=True, timeout=1800)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")), None)
    if line is None:
        return {"error": (out.stderr.strip().splitlines() or ["no output"])[-1][:300]}
    return json.loads(line[6:])


def _spread(seconds: list[float]) -> str:
    return f"{min(seconds)}-{max(seconds)}" if seconds else ""


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        sys.path.insert(0, os.environ["PYTHONPATH"])
        print("RESULT" + json.dumps(worker(argv[1], argv[2])), flush=True)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--tree", action="append", default=[],
                    help="another checkout to time the same way (before/after)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--onnxruntime", action="store_true")
    ap.add_argument("-o", "--out", default=None, help="folder for results.json/.md")
    a = ap.parse_args(argv)
    models = [m for m in a.models.split(",") if m]
    trees = [ROOT] + [os.path.abspath(t) for t in a.tree]
    systems = [("aot", t) for t in trees] + ([("onnxruntime", ROOT)] if a.onnxruntime else [])
    res: dict = {}
    for r in range(a.rounds):
        for model in models:
            for system, tree in systems:
                key = f"{model}|{system}|{tree}"
                got = _run(tree, model, system)
                res.setdefault(key, []).append(got)
                print(f"round {r + 1} {model} {system} {tree}: "
                      f"{got.get('seconds', got.get('error'))}", file=sys.stderr, flush=True)
    from importlib.metadata import version

    from aot.bench.report import machine_info, publish
    info = machine_info(f"IREE {version('iree-base-compiler')}")
    rows = []
    for key, runs in res.items():
        model, system, tree = key.split("|")
        ok = [x for x in runs if "seconds" in x]
        rows.append({"model": model, "system": system, "tree": tree,
                     "median_s": round(statistics.median(x["seconds"] for x in ok), 1)
                     if ok else None, "rounds": len(ok),
                     "seconds": [round(x["seconds"], 1) for x in ok],
                     "iree_runs": ok[-1].get("iree_runs") if ok else None,
                     "iree_s": round(ok[-1].get("iree_seconds", 0), 1) if ok else None,
                     "chosen": ok[-1].get("chosen") if ok else None,
                     "candidates_ms": ok[-1].get("candidates_ms") if ok else None,
                     "progress": ok[-1].get("progress", []) if ok else [],
                     "error": None if ok else runs[-1].get("error")})
    md = [f"{info}. Cold compiles (empty cache), each in its own process; median of "
          f"{a.rounds} round(s).", "",
          "| model | system | tree | compile s | min-max s | IREE runs | IREE s (summed) | chosen |",
          "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['model']} | {r['system']} | {os.path.basename(r['tree'])} | "
                  f"{r['median_s'] if r['median_s'] is not None else r['error']} | "
                  f"{_spread(r['seconds'])} | "
                  f"{r['iree_runs'] if r['iree_runs'] is not None else ''} | "
                  f"{r['iree_s'] if r['iree_s'] is not None else ''} | {r['chosen'] or ''} |")
    for r in rows:
        if r["progress"]:
            cands = ", ".join(f"{k} {v}" for k, v in (r["candidates_ms"] or {}).items())
            md += ["", f"{r['model']} ({os.path.basename(r['tree'])}):", "```", *r["progress"],
                   *([f"candidates (median ms): {cands}"] if cands else []), "```"]
    publish(a.out, "\n".join(md) + "\n", info, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
