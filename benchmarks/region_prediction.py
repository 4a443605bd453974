"""Is the region decision reproducible, and does a candidate's measured time predict its speed?

    python benchmarks/region_prediction.py                      # the default models
    python benchmarks/region_prediction.py --models resnet18,mobilenet_v3_small --compiles 2

For each model: ``--compiles`` compiles with the default placement, each measuring
afresh (``AOT_REMEASURE=1``, an empty cache). The script records the chosen candidate
and every candidate's median ± spread. Then it runs a third compile with the cache
of the first, to check that the decision is reused. Last, it times the chosen
artifact by itself (``--calls`` calls after a warm-up, median), and every candidate
of the first compile by itself the same way (the candidates are captured as the
compile times them). The prediction ratio is the run time divided by the time
measured at compile time: 1.0 means the measurement predicted the run exactly; "best
alone" says whether the chosen candidate was also the fastest run alone (or within
the decision's near-tie margin of it). Writes ``region_prediction.md`` to ``--out``.
Random weights; no denormal handling is needed for these models (no EfficientNet).
This is a benchmark, not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DEFAULT = "custom_op,mobilenet_v3_small,resnet18,bert"


def _model(name: str):
    import torch
    if name == "small":
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, 10)).eval()
        return m, (torch.randn(8, 256),)
    if name in ("mobilenet_v3_small", "mobilenet_v2", "resnet50"):
        import torchvision
        torch.manual_seed(0)
        return getattr(torchvision.models, name)().eval(), (torch.randn(1, 3, 224, 224),)
    from aot.models import get
    return get(name)


def _time(cm, args, calls: int) -> float:
    import torch
    with torch.no_grad():
        for _ in range(3):
            cm(*args)
        ts = []
        for _ in range(calls):
            t = time.perf_counter()
            cm(*args)
            ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)


class _Capture:
    """The candidates a compile times (wraps ``regions._time_candidates``; a benchmark's
    look inside, not an API)."""

    def __init__(self):
        from aot.tuning import regions
        self.regions, self.cands = regions, {}
        self.orig = regions._time_candidates

    def __enter__(self):
        def spy(cands, example, target, *args, **kwargs):
            self.cands = dict(cands)
            return self.orig(cands, example, target, *args, **kwargs)
        self.regions._time_candidates = spy
        return self

    def __exit__(self, *exc):
        self.regions._time_candidates = self.orig


def _alone(cands: dict, args, calls: int) -> dict:
    """Each candidate's median run by itself (the others closed)."""
    from aot.runtime.module import CompiledModule
    out = {}
    for k, art in cands.items():
        m = CompiledModule(art)
        out[k] = _time(m, args, calls)
        m.close()
    return out


def run(models: list[str], compiles: int, calls: int) -> list[dict]:
    import aot
    from aot.tuning.regions import MARGIN
    rows = []
    for name in models:
        model, args = _model(name)
        decisions = []
        first_cache = None
        cands = {}
        for i in range(compiles):
            cache = tempfile.mkdtemp(prefix="aot-regions-")
            first_cache = first_cache or cache
            os.environ["AOT_CACHE_DIR"] = cache
            os.environ["AOT_REMEASURE"] = "1"
            t = time.perf_counter()
            with _Capture() as cap:
                cm = aot.compile(model, args)
            secs = time.perf_counter() - t
            if i == 0:
                cands = cap.cands
            # a program without ATen-region candidates may still have had its compiled
            # variants timed (``variant``): the same measurement, the same record
            region = cm.manifest.get("region") or cm.manifest.get("variant") or {}
            decisions.append((cm, region, secs))
            print(f"{name} compile {i + 1}: {region.get('chosen')} "
                  f"{region.get('candidates_ms')} ±{region.get('spread_ms')} ({secs:.1f} s)",
                  flush=True)
        os.environ.pop("AOT_REMEASURE", None)
        os.environ["AOT_CACHE_DIR"] = first_cache
        reused = aot.compile(model, args)
        cm, region, _ = decisions[0]
        chosen = region.get("chosen")
        run_ms = _time(cm, args, calls)
        measured = (region.get("candidates_ms") or {}).get(chosen)
        alone = _alone(cands, args, calls) if cands else {}
        best_alone = min(alone.values()) if alone else None
        rows.append({
            "model": name, "choices": [d[1].get("chosen") for d in decisions],
            "reused": (reused.manifest.get("region") or reused.manifest.get("variant")
                       or {}).get("chosen"),
            "candidates": region.get("candidates_ms"), "spread": region.get("spread_ms"),
            "measured_ms": measured, "run_ms": run_ms,
            "ratio": (run_ms / measured) if measured else None,
            "alone": alone,
            "best_alone": (alone.get(chosen, float("inf")) <= best_alone * (1 + MARGIN))
            if alone else None})
        print(rows[-1], flush=True)
    return rows


def table(rows: list[dict]) -> str:
    from aot.bench.suite import machine_info
    m = machine_info("cpu")
    lines = ["# Region decisions: reproducible? predictive?", "",
             f"{m['cpu']}, {m['cores']} cores, torch {m['torch']}, "
             f"{m['torch_threads']} threads", "",
             "| model | choice per fresh compile | reused by a cached compile | measured ms "
             "(chosen) | run ms (median) | run / measured | chosen best alone |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['ratio']:.2f}" if r["ratio"] else "-"
        meas = f"{r['measured_ms']:.3f}" if r["measured_ms"] else "-"
        lines.append(f"| {r['model']} | {', '.join(map(str, r['choices']))} | {r['reused']} | "
                     f"{meas} | {r['run_ms']:.3f} | {ratio} | {r['best_alone']} |")
    lines += ["", "Candidates, first compile: measured median ms ± half the interquartile "
              "range -> median run alone (run alone / measured):", ""]
    ratios = []
    for r in rows:
        c = r["candidates"] or {}
        s = r["spread"] or {}
        a = r.get("alone") or {}
        parts = []
        for k, v in c.items():
            if k in a and v:
                ratios.append(a[k] / v)
                parts.append(f"{k} {v:.3f} ±{s.get(k, 0):.3f} -> {a[k]:.3f} ({a[k] / v:.2f})")
            else:
                parts.append(f"{k} {v:.3f} ±{s.get(k, 0):.3f}")
        lines.append(f"- {r['model']}: " + ", ".join(parts))
    if ratios:
        ratios.sort()
        within = sum(abs(x - 1) <= 0.10 for x in ratios)
        lines += ["", f"Over all {len(ratios)} candidates: run alone / measured from "
                  f"{ratios[0]:.2f} to {ratios[-1]:.2f}, median "
                  f"{statistics.median(ratios):.2f}; {within} of {len(ratios)} within ±10%."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=DEFAULT)
    ap.add_argument("--compiles", type=int, default=2)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--out", default="region-prediction")
    a = ap.parse_args(argv)
    import logging
    logging.disable(logging.WARNING)
    rows = run(a.models.split(","), a.compiles, a.calls)
    os.makedirs(a.out, exist_ok=True)
    text = table(rows)
    with open(os.path.join(a.out, "region_prediction.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
