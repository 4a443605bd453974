"""Region placement: IREE with kernel calls, or whole ATen regions? Measured end to end.

Per-op placement (``partition``) puts each heavy op where it measures faster
alone. It cannot see what the crossings between neighbouring ops cost, nor
what ATen gains by keeping a whole region: tensors stay in its own layouts, and
on CUDA a region's launches replay from one CUDA graph. So for a program with
heavy ops (convolutions, matmuls over ``MIN_FLOPS``) or with kernel calls,
``compile_model`` also builds the candidates below and keeps the one that runs
the example inputs fastest on this machine, end to end, calls interleaved,
median of several (more for fast programs). A program with neither (all
compiled, no heavy op) has nothing to choose. A program whose per-op placement
has kernel calls but no heavy ops gets every candidate too: IREE's fixed cost
per invocation and per crossing can exceed what its code saves.

- ``iree``: the per-op placement ``partition`` decided (IREE + kernel calls);
- ``iree-sync`` (CPU, when that placement has both compiled code and kernel
  calls): the same artifact on IREE's ``local-sync`` driver, whose dispatches
  run on the calling thread, so no hand-off to worker threads around each
  crossing (compiled code then runs on one thread);
- ``aten``: every op a kernel call, neighbours grouped into as few crossings as
  the boundary allows (batch norm is already folded into the convolutions);
- ``aten-prepacked`` (CPU, where torch has oneDNN): the same with convolutions
  and linears on weights packed once and ReLU / residual adds fused into the
  convolutions (``aot.fallback.prepack``), convolutions NHWC where every
  grouped op is layout-safe (``aot.fallback.layout``);
- ``aten-channels-last`` (elsewhere, e.g. CUDA): the ``aten`` region with
  convolutions run NHWC, for programs whose grouped ops are all layout-safe;
- ``aten-int8-onednn`` (CPU, quantized convolutions or linears, when the
  current quantized engine is not oneDNN already): the ``aten`` region with
  quantized weights packed for oneDNN (``aot.fallback.quantized_ops``). Its
  requantization may round a value one step away from eager's engine.

The manifest's ``"region"`` entry and the report give every candidate's time.
Nothing is measured (the per-op placement stands) when the target device is
not on this machine, or under any option other than the defaults
(``fallback="auto"``, ``placement="auto"``).
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time

import torch
import torch.utils._pytree as pytree

from ..artifact import CompiledArtifact
from ..fallback import prepack
from ..fallback.quantized_ops import NAMESPACE as QUANTIZED_NAMESPACE
from ..fallback.quantized_ops import packing_engine_available
from ..fallback.executor import ExecOptions
from ..fallback.layout import has_conv, layout_safe
from ..importer.program import ImportedProgram
from .cost import MIN_FLOPS
from .flops import node_flops
from .placement import KERNEL_CALL, Placement, PlacementPolicy
from .targets import Target

__all__ = ["worth_measuring", "choose_region", "RUNS", "BUDGET_S"]
log = logging.getLogger(__name__)

_QUANTIZED_MM = {f"{QUANTIZED_NAMESPACE}::conv2d", f"{QUANTIZED_NAMESPACE}::linear"}
RUNS = 9          # timed calls per candidate (fewer when BUDGET_S runs out, never under 3)
BUDGET_S = 6.0    # time for the timed calls of all candidates together
_MAX_RUNS = 301     # timed calls per candidate for fast programs...
_FAST_BUDGET_S = 0.3  # ...as many as fit in this, all candidates together
_WARMUP = 3       # the second call of a CUDA region captures its graph


def _may_measure(target: Target, policy: PlacementPolicy) -> bool:
    """Default options and the target device on this machine."""
    if policy.fallback != "auto" or policy.placement != "auto" or policy.fallback_ops:
        return False
    return target.driver.startswith("local") or torch.cuda.is_available()


def worth_measuring(imported: ImportedProgram, per_op: CompiledArtifact, target: Target,
                    policy: PlacementPolicy) -> bool:
    """``_may_measure``, and kernel calls or at least one heavy op (or quantized conv/linear)."""
    if not _may_measure(target, policy):
        return False
    if per_op.manifest["kernel_calls"]:
        return True
    return any(n.op == "call_function" and ((node_flops(n) or 0) >= MIN_FLOPS or _quantized_mm(n))
               for n in imported.exported.graph.nodes)


def _quantized_mm(n) -> bool:
    """A quantized convolution or linear (``aot_q``), which has no FLOP formula."""
    t = n.target
    return isinstance(t, torch._ops.OpOverload) and t._schema.name in _QUANTIZED_MM


def choose_region(per_op: CompiledArtifact, imported: ImportedProgram, target: Target,
                  policy: PlacementPolicy, example) -> CompiledArtifact:
    """The fastest of the per-op artifact and the ATen-region candidates.

    Args:
        per_op: the artifact of the per-op placement.
        imported: the program it was compiled from (batch norm folded).
        example: ``(args, kwargs)``, the example inputs to time the candidates on.
    """
    t0 = time.perf_counter()
    cands = {"iree": per_op}
    if target.driver == "local-task" and any(
            pl["where"] == "compiled" for pl in per_op.manifest["placements"]) \
            and per_op.manifest["kernel_calls"]:
        # IREE's dispatches on the calling thread: no hand-off to worker threads
        # around each kernel call, at the price of single-threaded compiled code
        cands["iree-sync"] = CompiledArtifact(
            per_op.vmfb, {**per_op.manifest, "driver": "local-sync"}, per_op.constants)
    cands.update(_aten_candidates(imported, target))
    times = _time_candidates(cands, example, target)
    if not times.get("iree"):
        return per_op
    best = min(times, key=times.get)
    region = {"candidates_ms": {k: round(v, 4) for k, v in times.items()}, "chosen": best,
              "measure_seconds": round(time.perf_counter() - t0, 2)}
    log.info("region placement: %s", region)
    if best in ("iree", "iree-sync"):
        return _with_region(cands[best], region, per_op.manifest["placements"], policy)
    why = (f"one ATen region ({best}): the whole program ran faster in ATen on this machine, "
           f"{times[best]:.3f} ms vs {times['iree']:.3f} ms with IREE and kernel calls "
           "(measured end to end)")
    placements = [dataclasses.replace(Placement.from_json(pl), where=KERNEL_CALL,
                                      reason=why).to_json()
                  for pl in cands[best].manifest["placements"]]
    return _with_region(cands[best], region, placements, policy)


def _aten_candidates(imported: ImportedProgram, target: Target) -> dict:
    """The whole-ATen-region candidates for this program and target (none on failure)."""
    from .compile import compile_program
    from .partition import partition

    cands = {}
    try:
        p = partition(imported, target, PlacementPolicy("all"))
        aten = compile_program(p)
        cands["aten"] = aten
        ops = [m["op"] for k in aten.manifest["kernel_calls"] for m in (k.get("members") or [k])]
        nhwc = has_conv(ops) and layout_safe(ops)
        if target.driver.startswith("local") and prepack.available() \
                and (has_conv(ops) or {"aten::linear", "aten::matmul"} & set(ops)):
            cands["aten-prepacked"] = _with_executor(
                aten, ExecOptions("channels_last" if nhwc else "contiguous", prepack=True))
        elif nhwc:
            cands["aten-channels-last"] = _with_executor(aten, ExecOptions("channels_last"))
        if target.driver.startswith("local") and _QUANTIZED_MM & set(ops) \
                and torch.backends.quantized.engine != "onednn" \
                and packing_engine_available("onednn"):
            cands["aten-int8-onednn"] = _with_executor(aten, ExecOptions(quantized_engine="onednn"))
    except Exception as e:  # an ATen region is an optimisation: without it, per-op stands
        log.info("no ATen-region candidate: %s", e)
    return cands


def _with_executor(a: CompiledArtifact, options: ExecOptions) -> CompiledArtifact:
    return CompiledArtifact(a.vmfb, {**a.manifest, "executor": options.to_json()}, a.constants)


def _with_region(a: CompiledArtifact, region: dict, placements: list,
                 policy: PlacementPolicy) -> CompiledArtifact:
    policy_json = {"fallback": policy.fallback, "fallback_ops": list(policy.fallback_ops),
                   "placement": policy.placement}
    return CompiledArtifact(a.vmfb, {**a.manifest, "region": region, "placements": placements,
                                     "policy": policy_json}, a.constants)


def _on_device(example, target: Target):
    args, kwargs = example
    if target.driver.startswith("local"):
        return args, kwargs
    return pytree.tree_map(lambda v: v.cuda() if isinstance(v, torch.Tensor) else v,
                           (args, kwargs))


def _time_candidates(cands: dict[str, CompiledArtifact], example, target: Target) -> dict:
    """Median ms per candidate that ran; calls interleaved so drifts hit all alike."""
    from ..runtime.module import CompiledModule

    args, kwargs = _on_device(example, target)
    sync = torch.cuda.synchronize if not target.driver.startswith("local") else (lambda: None)
    mods = {}
    with torch.no_grad():
        for name, art in cands.items():
            try:
                m = CompiledModule(art)
                for _ in range(_WARMUP):
                    m(*args, **kwargs)
                mods[name] = m
            except Exception as e:  # a candidate that cannot run is not a candidate
                log.info("region candidate %s did not run: %s", name, e)
        samples: dict[str, list] = {k: [] for k in mods}
        runs = RUNS
        if mods:  # fast programs: more calls (medians of a few calls of 0.1 ms are noise)
            t = time.perf_counter()
            for m in mods.values():
                m(*args, **kwargs)
            sync()
            per_round = time.perf_counter() - t
            runs = max(RUNS, min(_MAX_RUNS, int(_FAST_BUDGET_S / max(per_round, 1e-6))))
        deadline = time.perf_counter() + BUDGET_S
        for i in range(runs):
            if i >= 3 and time.perf_counter() > deadline:
                break
            for name, m in mods.items():
                sync()
                t = time.perf_counter()
                m(*args, **kwargs)
                sync()
                samples[name].append((time.perf_counter() - t) * 1e3)
    for m in mods.values():
        m.close()
    return {k: statistics.median(v) for k, v in samples.items() if v}
