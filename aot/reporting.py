"""report: what was compiled, what fell back to ATen, and why (from a manifest)."""

from __future__ import annotations

from collections import Counter, defaultdict

from .manifest import Manifest

__all__ = ["format_report", "placement_summary"]


def placement_summary(manifest: Manifest) -> dict:
    """Totals: ops and FLOPs compiled vs fallen back, kernel calls per op."""
    rows = manifest.placements
    comp = [r for r in rows if r["where"] == "compiled"]
    fall = [r for r in rows if r["where"] != "compiled"]
    return {
        "ops_compiled": len(comp), "ops_fallback": len(fall),
        "flops_compiled": sum(r["flops"] or 0 for r in comp),
        "flops_fallback": sum(r["flops"] or 0 for r in fall),
        "kernel_calls": len(manifest.kernel_calls),
        "compiled_ops": dict(Counter(r["op"] for r in comp)),
        "fallback_ops": dict(Counter(r["op"] for r in fall)),
    }


def _gflops(n: int) -> str:
    return f"{n / 1e9:.3f} GFLOP"


def format_report(manifest: Manifest) -> str:
    """Human-readable report of one artifact's placements."""
    s = placement_summary(manifest)
    total = s["ops_compiled"] + s["ops_fallback"]
    pol = manifest.policy or {}
    lines = [
        f"model {manifest.name}  target {manifest.target}  fallback={pol.get('fallback')!r}"
        + (f"  fallback_ops={pol.get('fallback_ops')}" if pol.get("fallback_ops") else ""),
        f"ops: {total} total, {s['ops_compiled']} compiled by IREE, "
        f"{s['ops_fallback']} kernel calls into ATen",
    ]
    if manifest.via == "stablehlo":
        lines.append("path: StableHLO (torch-mlir lowers the compiled ops, IREE compiles "
                     "StableHLO; an op torch-mlir cannot lower runs in ATen, with its error)")
    else:
        lines.append("path: Torch dialect (IREE lowers the compiled ops)")
    cpu = manifest.cpu
    if cpu:
        lines.append(f"cpu: {cpu['cpu']} ({cpu['arch']}; LLVM features: {len(cpu['features'])})"
                     + ("" if cpu["host"] else ", not this machine's: placement not "
                        "measured (coverage); refused at load by a CPU that cannot run it"))
    symbols = manifest.symbols or {}
    if symbols:
        dims = "; ".join(
            f"{e.get('name') or sym} in {e['min']}..{e['max']} ("
            + ", ".join(f"{b['name']} dim {b['dim']}" for b in e["binds"]) + ")"
            for sym, e in symbols.items())
        example = ", ".join(f"{e.get('name') or sym}={e['example']}" for sym, e in symbols.items())
        at = [", ".join(f"{k}={v}" for k, v in sizes.items())
              for sizes in (manifest.region or {}).get("measured_at") or []]
        exported = ", ".join(f"{e.get('name') or sym}={e.get('exported', e['example'])}"
                             for sym, e in symbols.items())
        costs = f"the example's sizes ({example})" if exported == example else \
            f"the sizes exported with ({exported})"
        where = (f"per-op costs at {costs}, the region end to end at "
                 + " and ".join(f"({a})" for a in at)) if len(at) > 1 else \
            f"costs and regions at the example's sizes ({example})"
        lines.append(f"dynamic shapes: {dims}; one artifact serves every size in range. "
                     f"Measured: {where}")
        spec = manifest.specialized or {}
        if spec.get("kept"):
            sizes = ", ".join(f"{k}={v}" for k, v in spec["sizes"].items())
            lines.append(f"  specialised at the example ({sizes}): the module also holds the "
                         f"program compiled for those sizes ({spec['function']}), called when "
                         "a call's sizes are the example's; every other size runs main")
    weights = [(len(t), sum(d["nbytes"] for d in t.values()))
               for t in (manifest.parameters or {}, manifest.host_constants or {})]
    if weights[0][0] or weights[1][0]:
        lines.append("weights: " + ", ".join(
            f"{n} {what} ({b / 1e6:.1f} MB)" for (n, b), what in zip(
                weights, ("read by compiled code as IREE parameters",
                          "handed to kernel calls")) if n)
            + ", stored beside the module in the artifact")
    if manifest.folded_ops:
        lines.append(f"{manifest.folded_ops} op(s) read only constants: computed once at "
                     "compile time and stored as constants (not counted above)")
    region = manifest.region
    if region:
        spread = region.get("spread_ms") or {}
        times = ", ".join(f"{k} {v:.3f}" + (f" ±{spread[k]:.3f}" if k in spread else "")
                          for k, v in (region.get("candidates_ms") or {}).items())
        lines.append(f"region placement, measured end to end on this machine (median ms "
                     f"± half the interquartile range): {times or 'not measured'} -> "
                     f"{region['chosen']}")
        end = region.get("at_range_end_ms") or {}
        if end:
            at = ", ".join(f"{k}={v}" for k, v in (region.get("measured_at") or [{}])[-1].items())
            lines.append(f"  at the range's end ({at}), which settles near-ties only: "
                         + ", ".join(f"{k} {v:.3f}" for k, v in end.items()))
            best = min(end, key=end.get)
            if end.get(region["chosen"], 0) > 1.25 * end[best]:
                lines.append(f"  there {best} is {end[region['chosen']] / end[best]:.2f}x "
                             f"faster than {region['chosen']}: an example at the size called "
                             "most makes the choice for that size")
        for k, v in (region.get("not_timed") or {}).items():
            lines.append(f"  {k} not timed: {v}")
        if region.get("why"):
            lines.append(f"  why: {region['why']}")
        if region.get("cached") is False:
            lines.append("  not cached: the measurement was noisy, so the next compile "
                         "measures again")
        if region.get("source", "measured") != "measured":
            lines.append(f"  the decision was {region['source']}")
    if manifest.driver == "local-sync":
        lines.append("compiled code runs on IREE's local-sync driver: on the calling thread, "
                     "so no hand-off to worker threads around each kernel call")
    ex = manifest.executor or {}
    if ex.get("memory_format") == "channels_last":
        lines.append("ATen regions run convolutions channels-last (NHWC)")
    if ex.get("prepack"):
        mkl = ex.get("mkl_linears") or []
        convs = sum(s.startswith("conv1x1:") for s in mkl)
        linears = (f"linears (oneDNN, activations fused; {len(mkl) - convs} linear and {convs} "
                   "1x1 convolution shape(s) measured faster on MKL run there)" if mkl
                   else "linears (oneDNN, activations fused)")
        lines.append("ATen regions run on prepacked CPU kernels: convolutions (oneDNN, ReLU and "
                     f"residual adds fused) and {linears} on weights packed once, written-out "
                     "attention as one fused kernel")
    if ex.get("quantized_engine"):
        lines.append(f"quantized kernels run under the {ex['quantized_engine']} engine, "
                     "recorded at compile, whatever the global engine at call time")
    n = ex.get("retained_heap_bytes")
    if n.__class__ is int and n > 0:
        size = f"{n / (1 << 20):.0f} MiB" if n < (1 << 30) else f"{n / (1 << 30):.0f} GiB"
        lines.append(f"the C heap keeps up to {size} of freed memory between calls (on glibc, "
                     "for the whole process; AOT_LEAVE_HEAP=1 leaves it): ATen's intermediates "
                     "reuse pages instead of faulting fresh ones in every call")
    if manifest.whole_program_call:
        lines.append("the program is one kernel call: on the CPU the runtime calls it directly, "
                     "without entering the IREE VM")
    if s["flops_compiled"] or s["flops_fallback"]:
        lines.append(f"FLOPs (where known): {_gflops(s['flops_compiled'])} compiled, "
                     f"{_gflops(s['flops_fallback'])} in ATen")
    if s["ops_fallback"]:
        lines.append("")
        lines.append("kernel calls (op, count, reason, source locations):")
        groups: dict[tuple[str, str], list] = defaultdict(list)
        for r in manifest.placements:
            if r["where"] != "compiled":
                groups[(r["op"], r["reason"])].append(r["location"] or "<unknown>")
        for (op, reason), locs in sorted(groups.items()):
            uniq = sorted(set(locs))
            shown = ", ".join(uniq[:4]) + (f", … (+{len(uniq) - 4})" if len(uniq) > 4 else "")
            lines.append(f"  {op:48s} x{len(locs):<3d} {reason}")
            lines.append(f"  {'':48s}      at {shown}")
    if s["compiled_ops"]:
        lines.append("")
        lines.append("compiled ops: " + ", ".join(f"{op} x{n}" for op, n in
                                                 sorted(s["compiled_ops"].items())))
    return "\n".join(lines)


def kernel_call_ops(manifest: Manifest) -> list[dict]:
    """Every op run through a kernel call, with groups flattened into their members."""
    out = []
    for k in manifest.kernel_calls:
        out.extend(k.get("members") or [k])
    return out
