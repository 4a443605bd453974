"""Coverage run over torch's OpInfo database: every op's CPU samples as one-op models.

    python benchmarks/opinfo_coverage.py                      # every op, 1 sample per dtype
    python benchmarks/opinfo_coverage.py --ops 'add|nonzero'  # a regex over op names
    python benchmarks/opinfo_coverage.py --jobs 2 --out opinfo-out

The corpus is not ours: ``torch.testing._internal.common_methods_invocations.op_db``.
For each op, for each of float32, float64, int64 and bool that the op supports on
the CPU, the first ``--samples`` sample inputs become a model whose tensor leaves
are its inputs (every non-tensor operand is baked in) and whose ``forward`` calls
the op. Each model is compiled with ``fallback="auto"`` and ``fallback="all"``,
run on fresh copies of the sample's tensors, and compared with eager on other
fresh copies, outputs *and* inputs (an op may update its inputs in place):

- integers, bools: exact;
- floats under ``"all"``: bit-exact (the same ATen kernels on the same inputs);
- floats under ``"auto"``: ``assert_close`` with float32 rtol 1e-4 / atol 1e-5,
  float64 rtol 1e-7 / atol 1e-9, NaN patterns equal (IREE reassociates reductions
  and has its own transcendental approximations);
- ops whose values are undefined or random (``empty``, ``rand``, ``bernoulli``...):
  structure, shapes and dtypes only.

``--via stablehlo`` runs the same through the StableHLO path (``aot.compile(...,
via="stablehlo")``); its ``all`` mode is the dummy mode, every op a custom call.

A sample ``torch.export`` cannot capture (in either mode) is counted as not
captured; every other sample passes or fails with a class. Each worker is a
subprocess with a per-sample time limit, so a crash or a hang is a result too.
Writes ``opinfo.jsonl`` (a line per sample and mode) and ``opinfo.md`` (the table)
to ``--out``. This is a coverage run, not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import re
import signal
import subprocess
import sys
import time

DTYPES = ("float32", "float64", "int64", "bool")
MODES = ("auto", "all")
VIA = "torch"  # --via: the path IREE compiles (aot.compile's via)
# ops whose values are undefined (empty) or drawn at random: compare structure only
UNDEFINED_VALUES = re.compile(
    r"(^|\.)(empty|new_empty|empty_like|empty_strided|empty_permuted|new_empty_strided|"
    r"rand|randn|randint|rand_like|randn_like|randint_like|bernoulli|normal|uniform|"
    r"multinomial|poisson|exponential|cauchy|geometric|log_normal|dropout|alpha_dropout|"
    r"feature_alpha_dropout|dropout2d|dropout3d|rrelu)($|_)")
TOLERANCES = {"float32": (1e-4, 1e-5), "float64": (1e-7, 1e-9)}


# -- the corpus -------------------------------------------------------------------------

def _op_db():
    from torch.testing._internal.common_methods_invocations import op_db
    return op_db


def case_id(op, dtype: str, k: int) -> str:
    name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
    return f"{name}:{dtype}:{k}"


def cases(ops: str | None = None, samples: int = 1, dtypes=DTYPES):
    """``(case id, op, dtype name, sample index)`` for every selected sample."""
    import torch
    pattern = re.compile(ops) if ops else None
    out = []
    for op in _op_db():
        name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        if pattern and not pattern.search(name):
            continue
        supported = op.supported_dtypes("cpu")
        for d in dtypes:
            if getattr(torch, d) in supported:
                out += [(case_id(op, d, k), op, d, k) for k in range(samples)]
    return out


def find_case(cid: str):
    """The ``(op, dtype, k)`` of a case id."""
    name, dtype, k = cid.rsplit(":", 2)
    for op in _op_db():
        if op.name + (f".{op.variant_test_name}" if op.variant_test_name else "") == name:
            return op, dtype, int(k)
    raise KeyError(cid)


def sample(op, dtype: str, k: int):
    """The k-th CPU sample of ``op`` in ``dtype``, or None."""
    import torch
    for i, s in enumerate(op.sample_inputs("cpu", getattr(torch, dtype), requires_grad=False)):
        if i == k:
            return s
    return None


def one_op_model(op, s):
    """``(model, example tensors, rebuild)``: ``model(*tensors)`` calls ``op`` on the
    sample with its tensor leaves as inputs (everything else baked in)."""
    import torch
    import torch.utils._pytree as pytree
    leaves, spec = pytree.tree_flatten((s.input, s.args, s.kwargs))
    where = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    fn = op.op

    class OneOp(torch.nn.Module):
        def forward(self, *tensors):
            full = list(leaves)
            for i, t in zip(where, tensors):
                full[i] = t
            inp, args, kwargs = pytree.tree_unflatten(full, spec)
            return fn(inp, *args, **kwargs)

    OneOp.__name__ = OneOp.__qualname__ = "op_" + re.sub(r"\W", "_", op.name)
    return OneOp().eval(), tuple(leaves[i] for i in where)


def _clone(ts):
    return tuple(t.clone() for t in ts)


# -- comparison -------------------------------------------------------------------------

class Mismatch(Exception):
    pass


def compare(got, want, mode: str, values: bool = True, what: str = "output") -> None:
    """Raise Mismatch unless ``got`` is what eager returned (see the module docstring)."""
    import torch
    import torch.utils._pytree as pytree
    g, gs = pytree.tree_flatten(got)
    w, ws = pytree.tree_flatten(want)
    if gs != ws:
        raise Mismatch(f"{what}: structure {gs} != eager's {ws}")
    for i, (a, b) in enumerate(zip(g, w)):
        if isinstance(b, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                raise Mismatch(f"{what} {i}: {type(a).__name__}, eager gave a tensor")
            if a.dtype != b.dtype or a.shape != b.shape:
                raise Mismatch(f"{what} {i}: {a.dtype}{list(a.shape)} != eager's "
                               f"{b.dtype}{list(b.shape)}")
            if not values:
                continue
            if a.is_quantized:
                a, b = a.dequantize(), b.dequantize()
            exact = mode == "all" or not (b.is_floating_point() or b.is_complex())
            name = str(b.dtype).replace("torch.", "")
            rtol, atol = (0.0, 0.0) if exact else TOLERANCES.get(name, (1e-3, 1e-3))
            try:
                torch.testing.assert_close(a, b, rtol=rtol, atol=atol, equal_nan=True)
            except AssertionError as e:
                raise Mismatch(f"{what} {i}: " + " ".join(str(e).split())[:300]) from None
        elif type(a) is not type(b) or (values and not _same_scalar(a, b)):
            raise Mismatch(f"{what} {i}: {a!r} != eager's {b!r}")


def _same_scalar(a, b) -> bool:
    if isinstance(b, float) and math.isnan(b):
        return isinstance(a, float) and math.isnan(a)
    return a == b


# -- running one case -------------------------------------------------------------------

def classify(e: BaseException) -> str:
    """The failure class of an exception (docs/coverage.md's list uses these)."""
    import aot
    msg = str(e)
    if isinstance(e, Mismatch):
        return "wrong result"
    if isinstance(e, TimeoutError):
        return "timeout"
    if not isinstance(e, aot.AotError):
        return f"not an AotError ({type(e).__name__})"
    for key, cls in (("data-dependent", "data-dependent shape"), ("mutates", "in-place update"),
                     ("not a tensor", "non-tensor output"), ("dtype", "dtype"),
                     ("float64", "dtype"), ("demot", "dtype")):
        if key in msg:
            return cls
    return type(e).__name__


def run_case(op, dtype: str, k: int, mode: str) -> dict:
    """Compile, run and compare one sample in one mode; a result row."""
    import torch
    import aot
    t0 = time.perf_counter()
    row = {"op": op.name + (f".{op.variant_test_name}" if op.variant_test_name else ""),
           "dtype": dtype, "sample": k, "mode": mode}
    s = sample(op, dtype, k)
    if s is None:
        return {**row, "status": "no sample"}
    model, tensors = one_op_model(op, s)
    values = not UNDEFINED_VALUES.search(op.name)
    try:
        torch.manual_seed(0)
        want_ins = _clone(tensors)
        want = model(*want_ins)
    except Exception as e:
        return {**row, "status": "eager failed", "reason": f"{type(e).__name__}: {e}"[:300]}
    try:
        cm = aot.compile(model, _clone(tensors), fallback=mode, via=VIA)
    except aot.ExportFailed as e:
        return {**row, "status": "not captured", "reason": str(e).splitlines()[0][:300],
                "seconds": round(time.perf_counter() - t0, 2)}
    except Exception as e:
        return _failed(row, e, classify(e), "compile", t0)
    try:
        torch.manual_seed(0)
        got_ins = _clone(tensors)
        got = cm(*got_ins)
        compare(got, want, mode, values)
        compare(got_ins, want_ins, mode, values, what="input (after the call)")
    except Mismatch as e:
        cls = "export differs from eager" if _export_agrees(model, tensors, got, mode) else \
            classify(e)
        return _failed(row, e, cls, "run", t0)
    except Exception as e:
        return _failed(row, e, classify(e), "run", t0)
    placed = cm.manifest.get("placements", [])
    return {**row, "status": "passed", "seconds": round(time.perf_counter() - t0, 2),
            "kernel_calls": sum(p["where"] == "kernel_call" for p in placed),
            "compiled": sum(p["where"] == "compiled" for p in placed)}


def _failed(row: dict, e: BaseException, cls: str, stage: str, t0: float) -> dict:
    text = str(e).strip()
    return {**row, "status": "failed", "class": cls, "stage": stage,
            "reason": f"{type(e).__name__}: {text.splitlines()[0][:300]}" if text
            else type(e).__name__, "seconds": round(time.perf_counter() - t0, 2)}


def _export_agrees(model, tensors, got, mode: str) -> bool:
    """The artifact's result is what torch.export's own graph computes when run
    eagerly (by the mode's rule: bit for bit under "all"): the difference from eager
    lies in the capture, not in aot."""
    import torch
    try:
        ep = torch.export.export(model, _clone(tensors), strict=False).run_decompositions({})
        torch.manual_seed(0)
        compare(got, ep.module()(*_clone(tensors)), mode)
        return True
    except Exception:
        return False


# -- workers and the table ----------------------------------------------------------------

def _worker(ids: list[str], out_path: str, modes, timeout: int) -> None:
    import warnings
    warnings.filterwarnings("ignore")
    import logging
    logging.disable(logging.WARNING)

    def alarm(*_):
        raise TimeoutError(f"over {timeout} s")
    signal.signal(signal.SIGALRM, alarm)
    with open(out_path, "a") as f:
        for cid in ids:
            op, dtype, k = find_case(cid)
            for mode in modes:
                f.write(json.dumps({"start": cid, "mode": mode}) + "\n")
                f.flush()
                signal.alarm(timeout)
                try:
                    row = run_case(op, dtype, k, mode)
                except TimeoutError as e:
                    row = {"op": cid.rsplit(":", 2)[0], "dtype": dtype, "sample": k,
                           "mode": mode, "status": "failed", "class": "timeout", "reason": str(e)}
                finally:
                    signal.alarm(0)
                f.write(json.dumps({"id": cid, **row}) + "\n")
                f.flush()


def _drive(ids: list[str], jobs: int, out: str, modes, timeout: int) -> list[dict]:
    """Run ``ids`` in ``jobs`` worker processes; a worker that dies is restarted after
    the case it died on (recorded as a crash)."""
    parts = [ids[j::jobs] for j in range(jobs)]
    paths = [os.path.join(out, f"worker{j}.jsonl") for j in range(jobs)]
    for p in paths:
        open(p, "w").close()
    todo = dict(enumerate(parts))
    procs: dict[int, subprocess.Popen] = {}
    done_n, total, t0 = 0, len(ids) * len(modes), time.time()
    while todo or procs:
        for j in list(todo):
            if j not in procs and todo[j]:
                procs[j] = subprocess.Popen(
                    [sys.executable, __file__, "--worker", paths[j], "--timeout", str(timeout),
                     "--modes", ",".join(modes), "--via", VIA, *todo[j]])
            elif not todo[j]:
                del todo[j]
        time.sleep(2)
        for j, p in list(procs.items()):
            rows = _read(paths[j])
            n = sum(1 for r in rows if "status" in r)
            if p.poll() is None:
                continue
            del procs[j]
            finished = {(r["id"], r["mode"]) for r in rows if "status" in r}
            starts = [r for r in rows if "start" in r]
            left = [c for c in parts[j] if any((c, m) not in finished for m in modes)]
            if left and starts and (starts[-1]["start"], starts[-1]["mode"]) not in finished:
                last = starts[-1]
                with open(paths[j], "a") as f:
                    op_name, dtype, k = last["start"].rsplit(":", 2)
                    for m in modes:
                        if (last["start"], m) not in finished:
                            f.write(json.dumps({"id": last["start"], "op": op_name,
                                                "dtype": dtype, "sample": int(k), "mode": m,
                                                "status": "failed", "class": "crash",
                                                "reason": f"worker exited {p.returncode}"})
                                    + "\n")
                left = [c for c in left if c != last["start"]]
            todo[j] = left
            parts[j] = left
        done_n = sum(sum(1 for r in _read(p) if "status" in r) for p in paths)
        print(f"\r{done_n}/{total} runs, {time.time() - t0:.0f} s", end="", file=sys.stderr,
              flush=True)
    print(file=sys.stderr)
    rows = []
    for p in paths:
        rows += [r for r in _read(p) if "status" in r]
    return rows


def _read(path: str) -> list[dict]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, json.JSONDecodeError):
        return []


def table(rows: list[dict], modes=MODES) -> str:
    """The coverage table (markdown) of result rows."""
    lines = ["| mode | samples | captured | passed | passed / captured | failed | ops compiled "
             "(passed samples) |", "|---|---|---|---|---|---|---|"]
    classes: dict[str, collections.Counter] = {}
    for mode in modes:
        rs = [r for r in rows if r["mode"] == mode and r["status"] not in ("no sample",
                                                                            "eager failed")]
        captured = [r for r in rs if r["status"] != "not captured"]
        passed = [r for r in captured if r["status"] == "passed"]
        failed = [r for r in captured if r["status"] == "failed"]
        classes[mode] = collections.Counter(r["class"] for r in failed)
        pct = 100.0 * len(passed) / max(1, len(captured))
        ops = sum(r.get("compiled", 0) + r.get("kernel_calls", 0) for r in passed)
        comp = sum(r.get("compiled", 0) for r in passed)
        lines.append(f"| {mode} | {len(rs)} | {len(captured)} | {len(passed)} | {pct:.1f}% | "
                     f"{len(failed)} | {comp} of {ops} |")
    lines += ["", "| failure class | " + " | ".join(modes) + " |",
              "|---|" + "---|" * len(modes)]
    for c in sorted(set().union(*classes.values())):
        lines.append(f"| {c} | " + " | ".join(str(classes[m][c]) for m in modes) + " |")
    lines += ["", "Failures:", ""]
    for r in sorted((r for r in rows if r["status"] == "failed"),
                    key=lambda r: (r["class"], r["op"], r["dtype"], r["mode"])):
        lines.append(f"- `{r['op']}` {r['dtype']} #{r['sample']} ({r['mode']}, {r['class']}): "
                     f"{r.get('reason', '')[:200]}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", help="regex over op names (default: every op)")
    ap.add_argument("--samples", type=int, default=1, help="samples per op and dtype")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--timeout", type=int, default=120, help="seconds per sample and mode")
    ap.add_argument("--out", default="opinfo-out")
    ap.add_argument("--via", default="torch", choices=["torch", "stablehlo"],
                    help="the path IREE compiles (stablehlo: torch-mlir first; with "
                         "--modes all, the dummy mode: every op a custom call)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("ids", nargs="*", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    global VIA
    VIA = a.via
    modes = tuple(a.modes.split(","))
    if a.worker:
        _worker(a.ids, a.worker, modes, a.timeout)
        return 0
    os.makedirs(a.out, exist_ok=True)
    ids = [c[0] for c in cases(a.ops, a.samples, tuple(a.dtypes.split(",")))]
    print(f"{len(ids)} samples x {len(modes)} modes, {a.jobs} worker(s)", file=sys.stderr)
    t0 = time.time()
    rows = _drive(ids, a.jobs, a.out, modes, a.timeout)
    with open(os.path.join(a.out, "opinfo.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    import platform
    import torch
    head = (f"# OpInfo coverage\n\n`python benchmarks/opinfo_coverage.py "
            f"{' '.join(argv if argv is not None else sys.argv[1:])}`: torch {torch.__version__}, "
            f"{platform.machine()}, {time.time() - t0:.0f} s\n\n")
    text = head + table(rows, modes)
    with open(os.path.join(a.out, "opinfo.md"), "w") as f:
        f.write(text)
    print(text.split("\nFailures:")[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
