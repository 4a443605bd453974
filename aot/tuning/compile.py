"""compile_model: ImportedProgram -> CompiledArtifact, the driver.

It prepares the graph (``prepare``), partitions it (``partition``), has IREE compile it
(``backend``) with its variants beside it, and, with an example, measures the
candidates end to end (``regions``). Under ``fallback="auto"`` it recovers from IREE
failing on a combination of ops that each lower alone: the ops its errors point at
become kernel calls (``recover``) and the program is partitioned and compiled again.
``stablehlo_module`` is the portable StableHLO export.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import time

import torch

from ..artifact import CompiledArtifact
from ..errors import AotError, CompileFailed, UnsupportedOp
from ..importer.program import ImportedProgram
from ..progress import step
from ..partition import aten_region
from ..backend.build import build_artifact, compile_input, host_artifact, iree_version
from ..partition.cost import (MEASURED_FASTER, CostCache, LocalCosts, compiled_floor,
                              handoff_ms, measure_aten, measure_packed)
from ..partition.coverage import Assumed, assumes_coverage
from ..partition.decisions import RUNS_IN_HOST, heavy_gflop, heavy_nodes
from ..toolchain.iree_compile import compile_error, discard_dump, first_error, try_compile
from ..partition.partitioner import PartitionedProgram, partition
from ..backend.lower import LoweredProgram, lower
from ..partition.placement import PlacementPolicy
from ..passes.prepare import prepare
from . import linear_kernels
from .recover import blame, grow
from .regions import (Race, aten_candidates, aten_far_ahead, choose_region, may_measure,
                      packed_far_ahead, pick_variant, worth_measuring)
from .specialize import specialize, worth_specializing
from ..toolchain.targets import Target
from ..toolchain.tiling_flags import DYNAMIC_UNSAFE, safe_for_dynamic, tiled_target
from ..backend.tiling import depthwise_network, worth_tiling
from ..toolchain.stablehlo import to_stablehlo

__all__ = ["compile_model", "program_target", "stablehlo_module"]
log = logging.getLogger(__name__)
_MAX_RECOVERY_ROUNDS = 4
# at most this many kernel calls chosen by per-op measurement: also try all compiled
COVERAGE_MAX_CALLS = 8
# a static program worth tiling with this many GFLOP in heavy ops or more: only its
# data-tiled variant is compiled (``_tiled_alone``); a smaller one has the per-op program
# compiled beside it and raced, where the two come within noise of each other more often
# (the bound's measurements: benchmarks/results/cpu-epyc-2core/compile-time-session14-levit).
# A depthwise network worth tiling is compiled alone at any size (``tiling``'s docstring)
TILED_ALONE_GFLOP = 0.5
# ...and with this many or more (ATen's calls a tenth of a second or longer), its heavy
# ops are timed in ATen first: the ATen regions' floors may then leave them untimed
ATEN_FLOOR_GFLOP = 10.0
# IREE demotes f64 to f32 by default, which changes a function's ABI and eager's
# precision; a program holding float64 keeps it (IREE's f64 code is exact where it
# lowers; ops it does not lower in f64 become kernel calls by probing, as any op)
KEEP_F64 = "--iree-input-demote-f64-to-f32=false"
_WIDE = (torch.float64, torch.complex128)


def _holds_f64(imported: ImportedProgram) -> bool:
    for n in imported.exported.graph.nodes:
        v = n.meta.get("val")
        for t in (v if isinstance(v, (list, tuple)) else [v]):
            if isinstance(t, torch.Tensor) and t.dtype in _WIDE:
                return True
    return False


def program_target(imported: ImportedProgram, target: Target) -> Target:
    """The target's flags for this program (float64 kept when the program holds it; a
    dynamic program's data tiling through the path that is exact on dynamic shapes)."""
    if _holds_f64(imported) and KEEP_F64 not in target.flags:
        target = dataclasses.replace(target, flags=tuple(target.flags) + (KEEP_F64,))
    unsafe = [f for f in target.flags if f in DYNAMIC_UNSAFE]
    if imported.symbols and unsafe:
        log.warning("replacing %s by --iree-global-opt-data-tiling: IREE %s computes wrong "
                    "results with it on dynamic shapes (aot.toolchain.tiling_flags.DYNAMIC_UNSAFE)",
                    " ".join(unsafe), iree_version())
        target = dataclasses.replace(target, flags=safe_for_dynamic(tuple(target.flags)))
    return target


def compile_model(imported: ImportedProgram, target: Target,
                  policy: PlacementPolicy = PlacementPolicy(), example=None) -> CompiledArtifact:
    """Partition and compile, moving ops IREE breaks on to ATen (``fallback="auto"``).

    With ``example`` (``(args, kwargs)``) and the default options, the result is
    measured end to end against whole-ATen-region candidates (``regions``).

    A program compiled code cannot hold (``aten_region.host_reason``), or one
    IREE fails on however it is split, runs as one ATen region: the host program
    (``aot.fallback.host_program``), under ``fallback="auto"`` and ``"all"``.

    Raises:
        UnsupportedOp: from ``partition`` or ``aten_region.record``; under
            ``fallback="none"``, a program compiled code cannot hold.
        CompileFailed: ``fallback="none"`` and IREE fails.
    """
    # measuring runs the program's random ops in ATen, on torch's generators: the
    # caller's RNG state is as it was before the compile
    cuda = [torch.cuda.current_device()] if not target.driver.startswith("local") \
        and torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=cuda):
        return _compile_model(imported, target, policy, example)


def _compile_model(imported: ImportedProgram, target: Target, policy: PlacementPolicy,
                   example) -> CompiledArtifact:
    t0 = time.perf_counter()
    target = program_target(imported, target)
    if not target.runs_here and (policy.placement != "coverage" or example is not None):
        # another CPU than this one (aot.toolchain.cpu_targets): nothing is measured here
        log.info("%s is not this machine: compiling with placement='coverage', unmeasured",
                 target.name)
        policy, example = dataclasses.replace(policy, placement="coverage"), None
    if target.via == "stablehlo" and policy.fallback == "all":
        # the dummy mode: every op its own custom call, through StableHLO and IREE
        policy = dataclasses.replace(policy, group=False)
    reason = aten_region.host_reason(imported)
    if reason is not None:
        if policy.fallback == "none":
            raise UnsupportedOp(f"fallback='none', but compiled code cannot hold this program: "
                                f"{reason}")
        return host_artifact(imported, target, policy, reason, t0)
    try:
        return _compile_split(imported, target, policy, example, t0)
    except Exception as e:
        if isinstance(e, AotError) and (not isinstance(e, (CompileFailed, UnsupportedOp))
                                        or e.stage == "options"):
            raise  # the user's options (a plan, a policy) are wrong: say so
        text = str(e) if isinstance(e, AotError) else f"{type(e).__name__}: {e}"
        first = (text.strip().splitlines() or [type(e).__name__])[0]
        if policy.fallback == "none":
            if isinstance(e, AotError):
                raise
            raise CompileFailed(f"importing or partitioning {imported.name} failed: {first}"
                                ) from e
        # every program that exports runs: whatever the importer, IREE or the kernel-call
        # boundary cannot take, the whole program runs as one ATen region
        discard_dump(e)
        if isinstance(e, UnsupportedOp) and e.op == RUNS_IN_HOST:
            log.info("%s", first)  # control flow compiled code cannot hold: no warning
            return host_artifact(imported, target, policy, first[:400], t0)
        if isinstance(e, CompileFailed):
            why = f"IREE could not compile it, however split ({first})"
        elif isinstance(e, AotError):
            why = f"importing or partitioning it failed ({first})"
        else:  # not the model's fault: the warning says so, and the program still runs
            why = (f"importing or partitioning it failed inside aot ({first}; a bug in aot, "
                   "please report it)")
        log.warning("%s: running %s as one ATen region", why, imported.name)
        return host_artifact(imported, target, policy, why[:400], t0)


def stablehlo_module(imported: ImportedProgram, target: Target,
                     policy: PlacementPolicy = PlacementPolicy()) -> str:
    """The program as StableHLO, every kernel call a ``stablehlo.custom_call`` of one ATen
    op with all its tensor operands (``aot.toolchain.stablehlo``), partitioned as ``compile_model``
    partitions for ``via="stablehlo"``: ops torch-mlir cannot lower, blamed by its
    errors, run in ATen (under ``fallback="auto"``).

    A portable export: every op torch-mlir lowers is lowered (``placement="coverage"``:
    nothing here is measured against IREE), as written (``lower(portable=True)``:
    a convolution is a ``stablehlo.convolution``, not the forms IREE runs well).

    Raises:
        CompileFailed: torch-mlir fails and no op is to blame (or ``fallback`` is not
            ``"auto"``); the message has torch-mlir's first error.
    """
    target = dataclasses.replace(program_target(imported, target), via="stablehlo")
    # one custom call per ATen op
    policy = dataclasses.replace(policy, group=False, placement="coverage", plan=None)
    imported, _ = prepare(imported, policy)
    demoted: dict[str, str] = {}
    for _ in range(_MAX_RECOVERY_ROUNDS + 1):
        p = lower(partition(imported, target, policy, demoted=demoted), portable=True)
        text, diag = to_stablehlo(p.mlir, {k.key: k for k in p.kernel_calls}, p.host_constants)
        if text is not None:
            return text
        fresh = {k: v for k, v in blame(diag, p.mlir, p.placements).items() if k not in demoted}
        if policy.fallback != "auto" or not fresh:
            raise CompileFailed(f"torch-mlir could not lower {imported.name} to StableHLO: "
                                f"{first_error(diag)}")
        demoted.update(fresh)
    raise CompileFailed(f"torch-mlir could not lower {imported.name} to StableHLO after "
                        f"{_MAX_RECOVERY_ROUNDS} rounds of moving the ops it names to ATen: "
                        f"{first_error(diag)}")


def _compile_split(imported: ImportedProgram, target: Target, policy: PlacementPolicy,
                   example, t0: float) -> CompiledArtifact:
    imported, folded = prepare(imported, policy)
    assumed = Assumed() if assumes_coverage(target, policy) else None
    aten, failed = None, None
    if example is not None:
        art, failed, aten = _tiled_alone(imported, target, policy, example, assumed)
        if art is not None:
            return art.with_manifest(compile_seconds=round(time.perf_counter() - t0, 3),
                                     folded_ops=folded)
    race = Race()  # the ATen regions, where timed before the IREE compile
    try:
        return _compile_rounds(imported, target, policy, example, t0, folded, assumed,
                               aten, failed, race)
    finally:
        race.close()


def _compile_rounds(imported: ImportedProgram, target: Target, policy: PlacementPolicy,
                    example, t0: float, folded: int, assumed, aten: dict | None,
                    failed: frozenset | None, race: Race) -> CompiledArtifact:
    """The per-op placement compiled, recovered where IREE fails on a combination of
    ops, and raced against its variants and the ATen regions."""
    demoted: dict[str, str] = {}
    for _ in range(_MAX_RECOVERY_ROUNDS + 1 + (assumed is not None)):
        p = partition(imported, target, policy, demoted=demoted, assume=assumed)
        if aten is None and example is not None:
            art, aten = _aten_far_ahead(imported, target, policy, example, race)
            if art is not None:
                return art.with_manifest(compile_seconds=round(time.perf_counter() - t0, 3),
                                         folded_ops=folded)
        p = lower(_without_calls_that_do_not_pay(p, imported, target, policy, demoted,
                                                 assumed))
        # the compiles run beside each other and beside this thread, which meanwhile
        # partitions the variant and builds the ATen-region candidates: each iree-compile
        # keeps about one core busy, and they are independent
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            step("compiling %s with IREE: %d ops compiled, %d kernel calls", imported.name,
                 sum(pl.where == "compiled" for pl in p.placements), len(p.kernel_calls))
            compiling = pool.submit(try_compile, compile_input(p), target)
            variant = _variant_program(imported, target, policy, demoted, p, assumed,
                                       failed=failed) if example is not None else None
            pending = pool.submit(_compile_variant, *variant) if variant else None
            measuring = example is not None and worth_measuring(imported, bool(p.kernel_calls),
                                                                target, policy)
            if measuring and aten is None:  # built once, whatever the rounds
                aten = aten_candidates(imported, target)
            vmfb, diag = compiling.result()
            variants = pending.result() if pending is not None and vmfb is not None else {}
        if vmfb is not None and assumed is not None:
            assumed.confirm(p.placements, target)
        elif vmfb is None and assumed is not None and assumed.sigs:
            # an op whose coverage was assumed may be what IREE failed on: probe them
            log.info("IREE failed on %s with %d op signatures assumed to lower (%s); probing "
                     "them", imported.name, len(assumed.sigs), first_error(diag))
            assumed = None
            continue
        if vmfb is None and target.via == "torch":
            # again from the text, for diagnostics that point at its lines (``blame``)
            vmfb, diag = try_compile(p.mlir, target)
        if vmfb is not None:
            art = build_artifact(p, vmfb, time.perf_counter() - t0)
            if example is not None and imported.symbols:
                art, variants = _specialized(art, variants, imported, target, policy)
            if measuring:
                art = choose_region(art, imported, target, policy, example, variants, aten,
                                    race=race)
            elif variants:
                name, entry = pick_variant({"iree": art, **variants}, example, target,
                                           policy.plan)
                art = {"iree": art, **variants}[name].with_manifest(variant=entry)
            return art.with_manifest(compile_seconds=round(time.perf_counter() - t0, 3),
                                     folded_ops=folded)
        fresh = {k: v for k, v in blame(diag, p.mlir, p.placements).items() if k not in demoted}
        if not fresh and demoted:
            fresh = grow(demoted, p.placements, p.producers or {}, first_error(diag))
        if policy.fallback != "auto" or not fresh:
            note = ("" if policy.fallback == "auto" else
                    f"(fallback={policy.fallback!r}: not retried with the failing ops in ATen)\n")
            raise compile_error(p.mlir, target, diag, what=imported.name, note=note)
        log.warning("IREE failed on a combination of ops that lower alone (%s); running %s "
                    "in ATen and compiling again", next(iter(fresh.values())), sorted(fresh))
        demoted.update(fresh)
    raise compile_error(p.mlir, target, diag, what=imported.name,
                        note=f"(gave up after {_MAX_RECOVERY_ROUNDS} recovery rounds)\n")


def _aten_far_ahead(imported: ImportedProgram, target: Target, policy: PlacementPolicy,
                    example, race: Race) -> tuple[CompiledArtifact | None, dict | None]:
    """``(artifact, ATen-region candidates)``: the fastest ATen region where no compiled
    plan can come near it (``regions.aten_far_ahead``, from the heavy ops' measured
    costs), else ``(None, the candidates or None)``, the candidates timed in ``race``
    where they were timed. Not for dynamic programs, pinned
    plans, or programs with a data-tiled variant (whose matmuls the per-op costs do not
    measure). Where ATen's prepacked region already beats the floor, compiling the
    per-op program and its variants only to lose the race is wasted compile time.

    The ATen regions are timed only where their floors leave room: the compiled floor
    over ATen's plain kernels' (``floor.aten_ms``), or over ``FLOOR_MARGIN`` times the
    prepacked region's (``floor.packed_ms``, measured here where the plain one is not
    enough: MobileNetV2's and EfficientNet-B0's prepacked regions run 2-3x faster than
    their plain kernels' floor)."""
    if imported.symbols or policy.plan or not may_measure(target, policy) \
            or worth_tiling(imported, target, policy):
        return None, None
    nodes, cache = heavy_nodes(imported.exported), CostCache(target)
    floor = compiled_floor(nodes, target, cache)
    if floor is None:
        return None, None
    if floor.compiled_ms <= floor.aten_ms:
        # ATen's plain kernels cannot be far ahead; its prepacked ones (oneDNN's reordered
        # convolutions, MKL's packed linears) may be, by 1.5-3x on depthwise networks
        measure_packed(nodes, cache)
        floor = compiled_floor(nodes, target, cache)
        if floor is None or not packed_far_ahead(floor):
            return None, None
    # its linears' kernels timed here, before any compile runs beside them
    aten = linear_kernels.chosen(aten_candidates(imported, target), target)
    return aten_far_ahead(imported, target, policy, example, floor, aten, race), aten


def _specialized(art: CompiledArtifact, variants: dict, imported: ImportedProgram,
                 target: Target, policy: PlacementPolicy) -> tuple[CompiledArtifact, dict]:
    """A dynamic program's compiled candidate with its static form at the example's
    sizes beside it (``aot.tuning.specialize``), before candidates are measured: the
    ``iree-tiled`` variant where it has no kernel calls, else the per-op artifact
    where it has none (one extra IREE compile)."""
    tiled = variants.get("iree-tiled")
    if worth_specializing(tiled, imported):
        coverage = dataclasses.replace(policy, placement="coverage")
        target = tiled_target(target)
        return art, {**variants, "iree-tiled": specialize(tiled, imported, target, coverage)}
    if worth_specializing(art, imported):
        return specialize(art, imported, target, policy), variants
    return art, variants


def _compiled_nodes(p: PartitionedProgram) -> frozenset:
    return frozenset(pl.node for pl in p.placements if pl.where == "compiled")


def _tiled_alone(imported: ImportedProgram, target: Target, policy: PlacementPolicy,
                 example, assumed) -> tuple[CompiledArtifact | None, frozenset | None,
                                            dict | None]:
    """``(artifact, failed, ATen-region candidates)``: the fastest of the data-tiled
    variant and the ATen regions, the per-op placement neither measured nor compiled,
    for a static program worth tiling (``worth_tiling``) with ``TILED_ALONE_GFLOP`` or
    more in heavy ops, or a depthwise network (``tiling.depthwise_network``). Its
    artifact is None for any other program, or where the variant fails to compile or to
    run: the caller then places and compiles it as any program,
    without the variant where its partition compiles the same ops (``failed``: those
    op nodes; IREE 3.13 fails ConvNeXt-T's at batch 1 on a dispatch's stack size) and
    with the candidates built here.

    On programs that large the data-tiled variant ran faster than the per-op placement
    and its executor variants on every model measured, or within noise of them
    (``benchmarks/results/<machine>/compile-time-*``: transformers from 2 GFLOP up,
    ConvNeXt at batch 8); the per-op program competed only on programs of a few
    milliseconds. Its cost measurement, its compile and its three candidates' calls
    were over a third of these programs' compile time. Where the program is large enough
    for the ATen regions' calls to be slow (``ATEN_FLOOR_GFLOP``), their heavy ops are
    timed in ATen alone (``cost.measure_aten``, not cached): a region whose floor cannot
    win is then not run (``regions._floors``).
    """
    if imported.symbols or policy.plan or policy.placement != "auto" \
            or not worth_tiling(imported, target, policy) \
            or not worth_measuring(imported, False, target, policy):
        return None, None, None
    heavy = heavy_nodes(imported.exported)
    gflop = heavy_gflop(imported.exported)
    depthwise = depthwise_network(imported)
    if gflop < TILED_ALONE_GFLOP and not depthwise:
        return None, None, None
    costs = None
    if gflop >= ATEN_FLOOR_GFLOP:  # before the compile starts: timed on an idle machine
        costs = LocalCosts(CostCache(target))
        measure_aten([n for n in heavy if n.target.namespace == "aten"], costs, target)
    variant = _variant_program(imported, target, policy, {}, None, assumed, alone=gflop)
    if variant is None:
        return None, None, None
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(_compile_variant, *variant)
        aten = aten_candidates(imported, target)
        arts = pending.result()
    if arts and assumed is not None:
        assumed.confirm(variant[1].placements, target)
    why = ("the per-op placement was not compiled: in a depthwise network worth tiling, the "
           "data-tiled variant outruns it" if depthwise and gflop < TILED_ALONE_GFLOP else
           f"the per-op placement was not compiled: in a program worth tiling with {gflop:.1f} "
           f"GFLOP in heavy ops ({TILED_ALONE_GFLOP} or more), the data-tiled variant outruns it")
    art = choose_region(None, imported, target, policy, example, arts, aten,
                        not_compiled={"iree": why}, costs=costs) if arts else None
    return art, None if art is not None else _compiled_nodes(variant[1]), aten


def _variant_program(imported: ImportedProgram, target: Target, policy: PlacementPolicy,
                     demoted: dict, per_op: PartitionedProgram, assumed=None,
                     alone: float | None = None, failed: frozenset | None = None):
    """``(name, lowered program, imported name)`` of the program partitioned as
    ``placement="coverage"`` (everything IREE covers compiled), to measure against the
    per-op placement ``per_op``, or None:

    - ``iree-tiled``: compiled with data tiling and microkernels, where ``tiling``
      says matmuls carry the program (its tiled matmuls are what is worth measuring);
    - ``iree-coverage``: compiled as the per-op artifact is, where the per-op placement
      put between 1 and ``COVERAGE_MAX_CALLS`` ops in ATen because ATen measured faster
      on each alone. A few kernel calls between compiled ops hand work from IREE's
      worker threads to ATen's and back, and those hand-offs can cost more than the
      calls save, so the all-compiled program is worth measuring beside them.
      Programs with more such calls gain little from the variant and still pay its
      compile.

    ``alone``: the program's heavy GFLOP, where the variant is compiled instead of the
    per-op placement (``_tiled_alone``), not beside it; ``per_op`` is then None.
    ``failed``: the compiled ops of a variant that failed alone: the same is not built.
    """
    tiled = worth_tiling(imported, target, policy)
    if tiled:
        name, vtarget = "iree-tiled", tiled_target(target)
    else:
        if not _coverage_wanted(per_op, target, policy):
            return None
        name, vtarget = "iree-coverage", target
    try:
        p = lower(partition(imported, vtarget, dataclasses.replace(policy, placement="coverage"),
                            demoted=demoted, assume=assumed))
    except Exception as e:  # a variant that cannot be built is not a candidate
        log.info("no %s variant of %s: %s", name, imported.name, e)
        return None
    if failed is not None and _compiled_nodes(p) == failed:
        log.info("no %s variant of %s: the same program failed alone", name, imported.name)
        return None
    if alone is not None:
        step("compiling %s with IREE as the %s variant (every op IREE covers compiled, data "
             "tiling): %.1f GFLOP in heavy ops, where the per-op placement does not compete",
             imported.name, name, alone)
    else:
        step("compiling the %s variant (every op IREE covers compiled%s), to measure against "
             "the per-op placement", name, ", data tiling" if tiled else "")
    return name, p, imported.name


def _coverage_wanted(per_op: PartitionedProgram, target: Target, policy: PlacementPolicy
                     ) -> bool:
    """The per-op placement put between 1 and ``COVERAGE_MAX_CALLS`` ops in ATen, each
    because it measured faster there by more than the crossings alone, and the region is
    measured (the ``iree-coverage`` variant's condition), on a driver whose hand-off cost
    is not known. On IREE's CPU task workers ``_without_calls_that_do_not_pay`` chooses
    between the two placements before anything is compiled."""
    measured = [pl for pl in per_op.placements if pl.where != "compiled"]
    return (may_measure(target, policy) and 0 < len(measured) <= COVERAGE_MAX_CALLS
            and all(pl.reason.startswith(MEASURED_FASTER) for pl in measured)
            and handoff_ms(target) == 0)


def _without_calls_that_do_not_pay(p: PartitionedProgram, imported: ImportedProgram,
                                   target: Target, policy: PlacementPolicy, demoted: dict,
                                   assumed) -> PartitionedProgram:
    """The per-op placement ``p``, or the program partitioned with every op IREE covers
    compiled where ``p``'s kernel calls of ops that measured faster in ATen save less in
    all than their hand-offs cost (``cost.handoff_ms`` each, on IREE's CPU task workers):
    one compile instead of the per-op one and an ``iree-coverage`` variant beside it,
    reaching the same choice in less compile time. The placements of those ops say why
    they are compiled."""
    handoff = handoff_ms(target)
    measured = [pl for pl in p.placements if pl.saving_ms is not None]
    if not handoff or not measured or policy.placement != "auto" \
            or any(pl.where != "compiled" and pl.saving_ms is None for pl in p.placements):
        return p
    saving = sum(pl.saving_ms for pl in measured)
    if saving >= handoff * len(measured):
        return p
    why = (f"the {len(measured)} such ops would save {saving:.2f} ms in all, less than their "
           f"hand-offs to torch's threads cost here ({len(measured)} x {handoff} ms)")
    log.info("%s: every op IREE covers compiled: %s", imported.name, why)
    try:
        q = partition(imported, target, dataclasses.replace(policy, placement="coverage"),
                      demoted=demoted, assume=assumed)
    except Exception as e:  # the per-op placement stands
        log.info("could not partition %s with every op compiled: %s", imported.name, e)
        return p
    was = {pl.node: pl for pl in measured}
    alone = {n: pl.reason.split(": ", 1)[-1] for n, pl in was.items()}  # "a ms vs IREE b ms"
    placements = tuple(dataclasses.replace(pl, reason=f"lowered by IREE: ATen {alone[pl.node]} "
                                           f"alone, but {why}")
                       if pl.node in was and pl.where == "compiled" else pl
                       for pl in q.placements)
    return dataclasses.replace(q, policy=policy, placements=placements)


def _compile_variant(name: str, p: LoweredProgram, what: str) -> dict[str, CompiledArtifact]:
    """``{name: artifact}`` of a variant's program, or ``{}`` where IREE fails on it
    (compiled from bytecode: nothing is blamed on its failure)."""
    t0 = time.perf_counter()
    try:
        vmfb, diag = try_compile(compile_input(p), p.target)
    except Exception as e:  # a variant that cannot be built is not a candidate
        log.info("no %s variant of %s: %s", name, what, e)
        return {}
    if vmfb is None:
        log.info("no %s variant of %s: %s", name, what, first_error(diag))
        return {}
    return {name: build_artifact(p, vmfb, time.perf_counter() - t0)}
