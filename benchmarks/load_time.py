"""What loading an artifact costs, phase by phase, for this tree and others (before/after).

    python -m benchmarks.load_time [--tree OTHER_CHECKOUT ...] [--rounds 3] [-o DIR]

Compiles ResNet18 twice (every op compiled, ``placement="coverage"``; every op one ATen
kernel-call group, ``fallback="all"``) with this tree, then times, in a fresh process
per tree and round (rounds interleaved), the median of 15 repetitions of: the manifest
checks alone (``aot.manifest`` and ``aot.limits``), ``load_artifact`` (read,
digests, checks) and ``aot.load`` (the same, then the module opened). A tree given with
``--tree`` is another checkout (say ``git worktree add /tmp/base HEAD~1``), imported in
its place: the same files measured by both. Reported: the median over rounds.
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
PHASES = ("manifest checks", "load_artifact", "aot.load")


def _median_ms(fn, repeat: int) -> float:
    try:
        from aot import timing
    except ImportError:  # a tree from before aot.timing: this checkout's, loaded by its path
        import importlib.util
        spec = importlib.util.spec_from_file_location("_timing", os.path.join(ROOT, "aot", "timing.py"))
        timing = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(timing)
    return timing.median_ms(fn, repeat, warmup=0)


def worker(paths: list[str], repeat: int) -> dict:
    """Times of each phase per artifact, in this process (imports the tree on sys.path)."""
    import aot
    from aot.artifact import load_artifact
    from aot.manifest import check_manifest
    try:
        from aot.limits import check_document
    except ImportError:  # a tree from before the bounds existed
        check_document = None
    out = {}
    for path in paths:
        art = load_artifact(path)
        m, n = art.manifest.to_json(), len(art.constants)

        def checks():
            if check_document is not None:
                check_document(m, "manifest")
            check_manifest(m, n, path)
        aot.load(path)  # warm: imports, device
        out[os.path.basename(path)] = {
            "manifest checks": _median_ms(checks, repeat),
            "load_artifact": _median_ms(lambda: load_artifact(path), repeat),
            "aot.load": _median_ms(lambda: aot.load(path), repeat)}
    return out


def _label(tree: str) -> str:
    """A tree's column: its commit (``+`` when it has uncommitted changes)."""
    def git(*a):
        return subprocess.run(["git", "-C", tree, *a], capture_output=True,
                              text=True).stdout.strip()
    rev = git("rev-parse", "--short", "HEAD") or os.path.basename(tree)
    return rev + ("+" if git("status", "--porcelain", "--untracked-files=no") else "")


def _artifacts(folder: str) -> list[str]:
    import aot
    from aot.models import resnet18
    model, (x,) = resnet18.resnet18()
    paths = []
    for name, kwargs in (("resnet18-coverage.aot", {"placement": "coverage"}),
                         ("resnet18-fallback-all.aot", {"fallback": "all"})):
        path = os.path.join(folder, name)
        aot.compile(model, (x,), **kwargs).save(path)
        paths.append(path)
    return paths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tree", action="append", default=[],
                   help="another checkout of this project to time beside this one")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("-o", "--out", help="write results.md / results.json here")
    p.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        import aot
        print(f"aot from {os.path.dirname(os.path.dirname(aot.__file__))}", file=sys.stderr)
        print(json.dumps(worker(args.worker, args.repeat)))
        return 0
    from aot.bench.report import machine_info, publish, table_head
    trees = [os.path.abspath(t) for t in args.tree] + [ROOT]
    with tempfile.TemporaryDirectory() as folder:
        print("compiling ResNet18 (coverage, fallback=all)...", flush=True)
        paths = _artifacts(folder)
        runs: dict[str, list[dict]] = {t: [] for t in trees}
        for r in range(args.rounds):
            for tree in trees:  # each tree in its own process, rounds interleaved
                env = {**os.environ, "PYTHONPATH": tree}
                # run as a script: its folder, not the cwd, leads sys.path, so ``aot``
                # is the tree's
                res = subprocess.run([sys.executable, os.path.abspath(__file__), "--repeat",
                                      str(args.repeat), "--worker", *paths],
                                     env=env, capture_output=True, text=True, check=True)
                runs[tree].append(json.loads(res.stdout.strip().splitlines()[-1]))
                print(f"round {r + 1}: {tree} done", flush=True)
    info = machine_info()
    lines = table_head("Artifact load time (ms, median of rounds of medians)", info,
                       ["artifact", "phase"] + [_label(t) for t in trees])
    rows = []
    for path in paths:
        name = os.path.basename(path)
        for phase in PHASES:
            ms = [statistics.median(run[name][phase] for run in runs[t]) for t in trees]
            rows.append({"artifact": name, "phase": phase, "ms": dict(zip(trees, ms))})
            lines.append(f"| {name} | {phase} | " + " | ".join(f"{v:.2f}" for v in ms) + " |")
    publish(args.out, "\n".join(lines) + "\n", info, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
