"""IREE's per-pass IR checks (``--verify``): do they change a module, and what do they cost?

    python -m benchmarks.iree_checks [--models resnet18_b1,timm_mobilevit_s_b1] [-o DIR]

Compiles each model as ``aot compile`` does (empty cache, default options, the example)
and compiles every IREE input of that compile once more without the checks
(``--verify=false``). Reported per compile: both wall times, whether both succeeded, and
whether the two modules are the same bytes. ``aot`` keeps the checks up to the
executables' sources (``iree_compile.SPLIT_AT``): they catch the invalid IR IREE 3.13 makes
of one integer convolution of a PT2E-quantized ResNet18 under ``placement="coverage"``
(checked, the compile fails and that convolution runs in ATen; unchecked, it compiles to
wrong results), although every bench model's modules come out the same bytes. The
compiles ``aot`` times here are its own: two runs for a program of
``iree_compile.SPLIT_MIN_BYTES`` or more, checked up to the sources.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from benchmarks.compile_time import DEFAULT_MODELS


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("-o", "--out", default=None, help="folder for results.json/.md")
    a = ap.parse_args(argv)
    os.environ["AOT_CACHE_DIR"] = tempfile.mkdtemp(prefix="aot-iree-checks-")

    from importlib.metadata import version

    import aot
    from aot.bench import suite
    from aot.bench.report import machine_info, publish
    import dataclasses

    from aot.toolchain import iree_compile

    rows, real = [], iree_compile._compile
    model_name = [""]

    def both(asm, target, input_type="torch"):
        unchecked = dataclasses.replace(target, flags=(*target.flags, "--verify=false"))
        t0 = time.perf_counter()
        got = real(asm, unchecked, input_type)
        t1 = time.perf_counter()
        checked = real(asm, target, input_type)
        t2 = time.perf_counter()
        rows.append({"model": model_name[0], "flags": " ".join(target.flags),
                     "unchecked_s": round(t1 - t0, 2), "checked_s": round(t2 - t1, 2),
                     "ok": got[0] is not None, "ok_checked": checked[0] is not None,
                     "same_bytes": got[0] == checked[0]})
        print(f"{model_name[0]}: {rows[-1]}", file=sys.stderr, flush=True)
        return checked

    iree_compile._compile = both
    for name in a.models.split(","):
        model_name[0] = name
        model, example, _ = suite.load_model(name, "cpu")
        aot.compile(model, example)

    info = machine_info(f"IREE {version('iree-base-compiler')}")
    big = [r for r in rows if r["checked_s"] >= 1.0]
    md = [f"{info}. Every IREE compile of a cold `aot.compile` of each model, run again "
          "without and with IREE's per-pass checks, one after the other.", "",
          f"- compiles: {len(rows)}; same bytes: {sum(r['same_bytes'] for r in rows)}; "
          f"failed unchecked: {sum(not r['ok'] for r in rows)}; failed checked: "
          f"{sum(not r['ok_checked'] for r in rows)}",
          f"- the {len(big)} compiles of 1 s or more: {sum(r['unchecked_s'] for r in big):.1f} s "
          f"unchecked, {sum(r['checked_s'] for r in big):.1f} s checked, summed", "",
          "| model | flags | unchecked s | checked s | same bytes |", "|---|---|---|---|---|"]
    md += [f"| {r['model']} | {r['flags']} | {r['unchecked_s']} | {r['checked_s']} | "
           f"{r['same_bytes']} |" for r in rows]
    publish(a.out, "\n".join(md) + "\n", info, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
