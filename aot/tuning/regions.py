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
- ``iree-sync`` (CPU, when that placement has compiled code and kernel calls, or
  compiled code alone in a small program, ``_small``): the same artifact on IREE's
  ``local-sync`` driver, whose dispatches run on the calling thread, so no hand-off
  to worker threads around each crossing or dispatch (compiled code then runs on one
  thread);
- ``iree-one-thread`` (CPU, the same condition, when some kernel call keeps torch's
  threads): the same artifact with every kernel call on the calling thread alone
  (``threads``). After a heavy call, torch's OpenMP team spins on the cores IREE's
  workers need next, so on few cores a handful of heavy kernel calls can cost more
  in contention than their threads save (``benchmarks/thread_budget.py``);
- ``iree-tiled`` (CPU, programs whose heavy FLOPs are mostly matmuls): the program
  partitioned as ``placement="coverage"`` and compiled with data tiling and
  microkernels (``aot.backend.tiling``); its own placements go into the manifest;
- ``iree-tiled-sync``: the ``iree-tiled`` artifact on ``local-sync`` (CPU, where the
  target's driver is ``local-task``): its dispatches on the calling thread, which on
  few cores wins where a program is many small dispatches;
- ``iree-coverage`` (programs whose per-op placement put a few ops in ATen only
  because each measured faster there, priced at the crossings alone: not on IREE's
  CPU task workers, ``compile._coverage_wanted``): the program
  partitioned as ``placement="coverage"``, compiled as the per-op one is; its own
  placements go into the manifest;
- ``aten``: every op a kernel call, neighbours grouped into as few crossings as
  the boundary allows (batch norm is already folded into the convolutions);
- ``aten-prepacked`` (CPU, where torch has oneDNN): the same with convolutions
  and linears on weights packed once and ReLU / residual adds fused into the
  convolutions (``aot.fallback.prepack``), convolutions NHWC where every
  grouped op is layout-safe (``aot.fallback.layout``);
- ``aten-onednn-graph`` (CPU, where torch reaches oneDNN Graph; programs without
  quantized ops, with ``GRAPH_MIN_KERNELS`` convolutions and matrix products or
  more): the ``aten`` region traced once into one graph that oneDNN fuses
  and compiles (``aot.fallback.onednn_graph``): a convolution or linear then costs
  the host a fraction of what each ATen call does;
- ``aten-onednn-primitives`` (x86-64 Linux with the ``onednn-cpu-gomp`` library; the
  same programs): the same trace run as oneDNN primitives of our own, each one C
  call per run, with no TorchScript executor between them
  (``aot.fallback.dnnl_program``);
- ``aten-channels-last`` (elsewhere, e.g. CUDA): the ``aten`` region with
  convolutions run NHWC, for programs whose grouped ops are all layout-safe;

No candidate changes the quantized engine: a quantized program's kernel calls
run the engine recorded at compile (``aot.fallback.quantized_ops.compile_engine``),
so every candidate gives eager int8's answers bit for bit. (No candidate packs
weights for oneDNN: its kernels can round a few values one quantization step away
from eager's, and a deep network amplifies that on its outputs. A user who wants
oneDNN's kernels sets that engine before compiling.)

The manifest's ``"region"`` entry and the report give every candidate's time.
Nothing is measured (the per-op placement stands) when the target device is
not on this machine, or under any option other than the defaults
(``fallback="auto"``, ``placement="auto"``).

**Measuring.** Candidates run in blocks: per round, each candidate (in an order
that rotates every round) is called untimed for at least ``_WARM_S`` (one call at
least), then several timed calls. Single calls interleaved would make a candidate
pay for the threads its predecessor left spinning, and on few cores that swamps
the difference between candidates. An idle gap between blocks is no cure: after
one, the next calls of a fast program run slower than its steady state, decaying
over several calls. Warm-up by time, without a sleep, puts every timed call at
steady state, close to the candidate's time run alone. A candidate whose call takes
``_SLOW_S`` or more has no untimed call before its blocks, and the last of its
warm-up calls sizes the rounds instead of one more probe call: a thread settling
for a millisecond is lost in such a call, while untimed calls of a slow program
would be a large share of the compile time. Its blocks are ``_BLOCK_SLOW`` calls
(one), since the first rounds (which every candidate runs) dominate a slow program's
timing and the race is judged after each. Such a candidate's warm-up is its first call alone where nothing is packed
on it (``_WARMUP_SLOW``), and once it is the only one left in the race it is timed to
``_SOLE_SAMPLES`` samples, not for every round: the others' rechecks decide. Where
the other candidates are fast, a slow one whose first call took ``OUT_OF_RACE`` times
a fast one's warm-up call is out of the race from the start (``_warm_race``). A slow
candidate out of the race is rechecked only where something else used the machine
while it was timed (``timing.elsewhere``: CPU time spent outside this process, a
VM's steal included); timed on an idle machine, nothing slowed it. For the same reason
a slow candidate whose first ``QUIET_SAMPLES`` calls all ran on an idle machine, the
fastest ``QUIET_LEAD`` over the best median, is out of the race.

**Floors.** A slow candidate need not run at all where the program's heavy ops, each
measured alone on this machine (``aot.partition.cost``), take ``FLOOR_MARGIN`` times a
call already measured or longer in the form that candidate runs them (ATen's kernels,
the prepacked ones, or the faster of IREE's code and a kernel call): noise only slows
calls, so it cannot win. Candidates are warmed up from the one with no floor (a
data-tiled variant) to the highest floor, so the likely fastest sets the bar first.

**Deciding.** Each candidate's median and spread (half its interquartile range)
are recorded. The fastest median wins, except that a candidate earlier in a fixed
order (the per-op placement first, then the simpler regions) is kept when the
fastest leads it by no more than ``MARGIN``, so near-ties settle the same way
every compile. Noise never protects a candidate: every candidate that might still
be the fastest (a lead over it within two standard errors of the difference of the
medians, estimated from the spreads and sample counts, or a spread over ``NOISY``
of its median with a median within its spread of the fastest) is measured again,
rotating, for up to ``EXTRA_S`` (a slow program: ``_EXTRA_SLOW_ROUNDS`` rounds at
most, each a fraction of a second per candidate); if the order is still unclear after that, the
faster median wins and the region entry names the pair as ``"undecided"``. So the
choice's median is never more than ``MARGIN`` above the fastest measured. (A rule
such as "win by more than both spreads" would let one noisy measurement of the
first candidate keep it against a far faster one.) The entry's ``why`` says in
words why the winner won.

**Reproducing.** A decision is cached on disk (``$AOT_CACHE_DIR``, like the
coverage verdicts) under a key of the program, its example input specs, the
candidates, the target's flags, torch's version, this CPU, torch's thread
count, the prepacked executor's version (``prepack.VERSION``) and the compiled
forms' (``compiled_forms.FORMS``): a second compile of the same model on the same
machine reuses it without measuring (the report says so), so it gives the same
artifact. A decision taken from a noisy measurement (``noisy``: still undecided,
or the winner or a candidate within reach of it spread over ``NOISY`` of its
median) is not cached: the next compile measures again (the entry's ``cached``
says which). ``CompiledModule.plan()`` returns the decisions of a compile;
``aot.compile(..., plan=...)`` (CLI ``--plan plan.json``) pins them in another,
on any machine. ``AOT_REMEASURE=1`` ignores the cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import statistics
import time

import torch
import torch.utils._pytree as pytree

from ..artifact import CompiledArtifact
from ..fallback import dnnl_api, onednn_graph, prepack
from ..backend.build import compile_program, host_artifact
from ..backend.lower import lower
from ..forms.compiled_forms import FORMS
from ..fallback.quantized_ops import NAMESPACE as QUANTIZED_NAMESPACE
from ..fallback.executor import ExecOptions
from ..fallback.layout import CONV_OPS, has_conv, layout_safe
from ..importer.dynamic import resized
from ..importer.program import ImportedProgram
from .. import timing
from . import linear_kernels
from ..progress import step
from ..runtime.module import CompiledModule
from ..partition.cost import (MIN_FLOPS, CostCache, Floor, LocalCosts, compiled_floor,
                              machine_key, measure_packed)
from ..partition.decisions import CONTROL_FLOW, RUNS_IN_HOST, heavy_gflop, heavy_nodes
from ..partition.flops import node_flops
from ..errors import UnsupportedOp
from ..partition.placement import KERNEL_CALL, Placement, PlacementPolicy
from ..toolchain.targets import Target
from ..partition.disk_cache import JsonCache
from ..partition.partitioner import partition

__all__ = ["may_measure", "worth_measuring", "choose_region", "aten_candidates", "choice",
           "program_key", "Race", "RUNS", "BUDGET_S", "MARGIN"]
log = logging.getLogger(__name__)

_QUANTIZED_MM = {f"{QUANTIZED_NAMESPACE}::conv2d", f"{QUANTIZED_NAMESPACE}::linear"}
RUNS = 9          # timed calls per candidate (fewer when BUDGET_S runs out, never under 3)
BUDGET_S = 6.0    # time for the timed calls of all candidates together
_MAX_RUNS = 301     # timed calls per candidate for fast programs...
_FAST_BUDGET_S = 0.5  # ...as many as fit in this, all candidates together
_WARMUP = 3       # the second call of a CUDA region captures its graph
_WARMUP_CPU = 2   # the first call packs weights; the second runs as every later one
# ...but one where that first call takes _SLOW_S or more and the candidate packs nothing
# on it (no prepacking executor): the first call already runs as every later one, and a
# slow one dropped from the race for it is checked again (``_recheck``)
_WARMUP_SLOW = 1
_SOLE_SAMPLES = 3  # a slow program's sole candidate left in the race: timed to this many
_SLOW_S = 0.1     # a candidate whose call takes this long times its blocks without an
                  # untimed call first, its last warm-up call its first sample
_BLOCK = 3        # timed calls per candidate per round, after untimed ones (``_WARM_S``)
_BLOCK_SLOW = 1   # ...for a candidate whose call takes ``_SLOW_S`` or more
_WARM_S = 0.005   # untimed calls per block, at least this long: steady state again
EXTRA_S = 3.0     # at most this much more for the contenders whose order is not yet clear
NOISY = 0.10      # a spread (half IQR) over this fraction of a median is a noisy measurement
OUT_OF_RACE = 1.5  # after every round (slow programs: from their first sample on), a
                   # candidate whose fastest call is this many times the best median is
                   # timed no more (``_in_race``), but for one block that checks it was not
                   # just disturbed (``_recheck``)
MARGIN = 0.03     # leads within this fraction are near-ties, settled by ``_ORDER``
QUIET_LEAD = 0.10  # a slow candidate whose QUIET_SAMPLES undisturbed calls were all this
QUIET_SAMPLES = 2  # much slower than the best median is out of the race (``_in_race``)
_EXTRA_SLOW_ROUNDS = 3  # rounds of measuring again at most, where every contender is slow


def may_measure(target: Target, policy: PlacementPolicy) -> bool:
    """Default options and the target device on this machine."""
    if policy.fallback != "auto" or policy.placement != "auto" or policy.fallback_ops:
        return False
    return target.driver.startswith("local") or torch.cuda.is_available()


def worth_measuring(imported: ImportedProgram, kernel_calls: bool, target: Target,
                    policy: PlacementPolicy) -> bool:
    """``may_measure``, and the per-op placement has ``kernel_calls``, the program at
    least one heavy op (or quantized conv/linear), or a loop (whose body runs as often as
    the inputs say, each time at the cost of its dispatches) or a branch."""
    if not may_measure(target, policy):
        return False
    if kernel_calls or any(n.target in CONTROL_FLOW for n in imported.exported.graph.nodes):
        return True
    return any(n.op == "call_function" and ((node_flops(n) or 0) >= MIN_FLOPS or _quantized_mm(n))
               for n in imported.exported.graph.nodes)


def _quantized_mm(n) -> bool:
    """A quantized convolution or linear (``aot_q``), which has no FLOP formula."""
    t = n.target
    return isinstance(t, torch._ops.OpOverload) and t._schema.name in _QUANTIZED_MM


def choose_region(per_op: CompiledArtifact | None, imported: ImportedProgram, target: Target,
                  policy: PlacementPolicy, example,
                  variants: dict[str, CompiledArtifact] | None = None,
                  aten: dict[str, CompiledArtifact] | None = None,
                  not_compiled: dict[str, str] | None = None,
                  costs: LocalCosts | None = None,
                  race: Race | None = None) -> CompiledArtifact | None:
    """The fastest of the per-op artifact and the ATen-region candidates.

    Args:
        per_op: the artifact of the per-op placement; None where it was not compiled
            (``not_compiled`` says why, and ``variants`` holds at least one). Then the
            result is None where no variant ran (the caller compiles the per-op one).
        variants: more per-op artifacts to measure (``iree-tiled``: compiled with
            data tiling and microkernels, ``aot.backend.tiling``; ``iree-coverage``).
        imported: the program it was compiled from (batch norm folded).
        policy: its ``plan`` (``CompiledModule.plan()``), when given, pins the choice.
        example: ``(args, kwargs)``, the example inputs to time the candidates on.
        aten: the whole-ATen-region candidates (``aten_candidates``), when already built.
        not_compiled: ``{candidate: why}`` for those not compiled, for the report.
        costs: the heavy ops' costs this compile measured (``LocalCosts``) for the
            candidates' floors, where the machine's cache does not hold them.
        race: candidates of ``aten`` already loaded and timed (``aten_far_ahead``): the
            race goes on from their samples; closed here.
    Raises:
        UnsupportedOp: the plan names a candidate this program does not have here.
    """
    t0 = time.perf_counter()
    cands = {} if per_op is None else {"iree": per_op}
    if per_op is not None and target.driver == "local-task" and any(
            pl["where"] == "compiled" for pl in per_op.manifest.placements) \
            and (per_op.manifest.kernel_calls or _small(imported)):
        # IREE's dispatches on the calling thread: no hand-off to worker threads
        # around each kernel call or dispatch, at the price of single-threaded
        # compiled code
        cands["iree-sync"] = per_op.with_manifest(driver="local-sync")
        keys = [k["key"] for k in per_op.manifest.kernel_calls]
        executor = per_op.manifest.executor or {}
        if keys and set(keys) - set(executor.get("one_thread_calls") or ()):
            # every kernel call on the calling thread alone, heavy ones too: torch's
            # OpenMP team then never spins on the cores IREE's workers run on
            cands["iree-one-thread"] = per_op.with_manifest(
                executor={**executor, "one_thread_calls": keys})
    cands.update(variants or {})
    tiled = cands.get("iree-tiled")
    if tiled is not None and target.driver == "local-task" and _small(imported):
        # the tiled code on the calling thread: no wake-up of IREE's workers around each
        # dispatch, which on few cores can cost more than the second core saves on a
        # program of many small dispatches (MobileNetV3-Small: 1.37 ms against 1.69)
        cands["iree-tiled-sync"] = tiled.with_manifest(driver="local-sync")
    cands.update(linear_kernels.chosen(aten_candidates(imported, target) if aten is None
                                       else aten, target))
    key = program_key(imported, target, cands)
    region = _pinned(policy.plan, cands) or _cached(key, cands, target)
    if region is not None and race is not None:
        race.close()
    if region is None:
        before = [k for k in cands if race is not None and k in race.mods]
        step("timing %d candidates end to end on the example (%s), a few seconds%s",
             len(cands), ", ".join(cands),
             f" ({', '.join(before)} timed before the compile)" if before else "")
        not_timed: dict[str, str] = {}
        stats = _time_candidates(cands, example, target, not_timed,
                                 _floors(imported, target, cands, costs), race=race)
        if per_op is not None and "iree" not in stats and "iree" not in not_timed:
            return per_op
        if per_op is None and not any(k in stats for k in variants or {}):
            return None  # no compiled candidate ran: the caller compiles the per-op one
        not_timed.update(not_compiled or {})
        measured = [_sizes_of(imported, None)]
        region = _decide(stats)
        if not_timed:
            region["not_timed"] = not_timed
        far = _range_end(imported, example, stats)
        if far is not None:  # a dynamic program: the range's end too, where cheap
            end_stats = _time_candidates(cands, far[1], target)
            if set(end_stats) == set(stats):
                _settle_at_range_end(region, stats, end_stats)
                measured.append(far[0])
        if imported.symbols:
            region["measured_at"] = measured
        region["measure_seconds"] = round(time.perf_counter() - t0, 2)
        region["cached"] = not region.pop("noisy")
        if region["cached"]:
            _store(key, region, target)
    region["key"] = key
    log.info("region placement: %s", region)
    best = region["chosen"]
    if best in ("iree", "iree-sync", "iree-one-thread", "iree-tiled-sync") \
            or best in (variants or {}):
        # a variant was partitioned on its own (as placement="coverage"):
        # its placements, not the per-op ones, say where its ops run
        return _with_region(cands[best], region, cands[best].manifest.placements, policy)
    times = region.get("candidates_ms") or {}
    ran = [k for k in times if k.startswith("iree")]
    ref = "iree" if "iree" in ran else min(ran, key=times.get) if ran else None
    if best in times and ref is not None:
        why = (f"one ATen region ({best}): the whole program ran faster in ATen on this "
               f"machine, {times[best]:.3f} ms vs {times[ref]:.3f} ms with IREE"
               f"{' and kernel calls' if ref == 'iree' else f' ({ref})'} (measured end to end)")
    else:
        why = f"one ATen region ({best}): {region.get('source', 'measured')}"
    placements = [dataclasses.replace(Placement.from_json(pl), where=KERNEL_CALL,
                                      reason=why).to_json()
                  for pl in cands[best].manifest.placements]
    return _with_region(cands[best], region, placements, policy)


FLOOR_MARGIN = 1.25  # the fastest ATen region under 1/this of the compiled floor: not compiled
# (and a slow candidate whose floor is this many times a measured call: not timed)

# which of a program's heavy-op floors (``cost.Floor``) bounds each candidate below
_FLOOR_OF = {"iree": "any_executor_ms", "iree-sync": "any_executor_ms",
             "iree-one-thread": "any_executor_ms", "iree-coverage": "any_executor_ms",
             "aten": "aten_ms", "aten-prepacked": "packed_ms"}


def _floors(imported: ImportedProgram, target: Target, cands: dict,
            costs: LocalCosts | None = None) -> dict[str, float]:
    """``{candidate: ms}``: the least each candidate can spend on the program's heavy ops,
    from their costs measured alone (``cost.compiled_floor``), for those whose floor is
    a slow call (``_SLOW_S``) or more; ``costs``: this compile's own (``LocalCosts``), else
    the machine's cache. A data-tiled variant has none (the per-op costs do
    not measure tiled matmuls), nor has a dynamic program (its costs are at the sizes'
    hints) or a GPU target."""
    if imported.symbols or not target.driver.startswith("local"):
        return {}
    nodes, cache = heavy_nodes(imported.exported), costs or CostCache(target)
    floor = compiled_floor(nodes, target, cache)
    if floor is None:
        return {}
    if "aten-prepacked" in cands and floor.aten_ms >= _SLOW_S * 1e3:
        measure_packed(nodes, cache)  # once per signature: where the floor is slow
        floor = compiled_floor(nodes, target, cache)
    out = {k: getattr(floor, _FLOOR_OF[k]) for k in cands if k in _FLOOR_OF}
    return {k: v for k, v in out.items() if v >= _SLOW_S * 1e3}


def packed_far_ahead(floor: Floor) -> bool:
    """Whether the prepacked ATen region's floor is under ``1 / FLOOR_MARGIN`` of the
    compiled one: then it may be far ahead (``aten_far_ahead``) and is worth timing."""
    return floor.compiled_ms > FLOOR_MARGIN * floor.packed_ms


def aten_far_ahead(imported: ImportedProgram, target: Target, policy: PlacementPolicy,
                   example, floor: Floor, aten: dict[str, CompiledArtifact],
                   race: Race | None = None) -> CompiledArtifact | None:
    """The fastest whole-ATen-region candidate, where it runs the whole program (its lower
    quartile) in under ``1 / FLOOR_MARGIN`` of what any compiled plan spends on its heavy
    ops alone (``cost.compiled_floor``): then no IREE program is compiled, since none can
    win. Else None (and the per-op program is compiled and measured as before).

    The caller tries it only where the floor is over ATen's own kernels alone
    (``floor.aten_ms``), so a program IREE may win does not pay for this timing. A
    decision is cached as ``choose_region``'s are, under its own key; a reused one still
    has to beat the floor. ``race``: where the regions are timed and not far enough
    ahead, their loaded modules and samples go there, for ``choose_region`` to go on
    from (``Race``).
    """
    if not aten:
        return None
    key = program_key(imported, target, aten) + "-floor"
    region = _cached(key, aten, target)
    if region is None:
        step("timing %d ATen-region candidates (%s) against the compiled floor of %.2f ms",
             len(aten), ", ".join(aten), floor.compiled_ms)
        t0 = time.perf_counter()
        stats = _time_candidates(aten, example, target, race=race, keep=race is not None)
        if not stats:
            return None
        region = _decide(stats)
        region["measure_seconds"] = round(time.perf_counter() - t0, 2)
        region["cached"] = not region.pop("noisy")
    best = region["chosen"]
    ms = region["candidates_ms"][best]
    # its lower quartile: noise only slows calls, and a slowed ATen region must not send
    # a program IREE cannot win for a compile
    low = ms - region.get("spread_ms", {}).get(best, 0.0)
    if low * FLOOR_MARGIN >= floor.compiled_ms:
        log.info("%s: the ATen region (%s, %.3f ms) is not far enough ahead of the compiled "
                 "floor (%.3f ms): compiling", imported.name, best, ms, floor.compiled_ms)
        return None
    if race is not None:
        race.close()
    region["compiled_floor_ms"] = round(floor.compiled_ms, 4)
    if region.get("cached") and region.get("source") == "measured":
        _store(key, region, target)
    region["key"] = key
    why = (f"one ATen region ({best}): {ms:.3f} ms end to end, while every plan that compiles "
           f"this program spends at least {floor.compiled_ms:.3f} ms on its {floor.ops} heavy ops "
           "alone (each measured alone in IREE and in ATen, with a kernel call's hand-off), "
           f"more than {FLOOR_MARGIN}x the region's time: no IREE program was compiled")
    region["why"] = why + "; " + region.get("why", "")
    log.info("region placement: %s", region)
    placements = [dataclasses.replace(Placement.from_json(pl), where=KERNEL_CALL,
                                      reason=why).to_json()
                  for pl in aten[best].manifest.placements]
    return _with_region(aten[best], region, placements, policy)


# the fixed order near-ties are settled in: the per-op placement first, then the simpler regions
_ORDER = ["iree", "iree-sync", "iree-one-thread", "iree-tiled", "iree-tiled-sync", "iree-coverage",
          "aten", "aten-prepacked", "aten-onednn-graph", "aten-onednn-primitives",
          "aten-channels-last"]
_RULE = 6  # the decision rule's version, part of the cache key
_CONFIDENCE = 2.0  # a lead counts when it exceeds this many standard errors of the difference


def _rank(name: str) -> tuple:
    return (_ORDER.index(name) if name in _ORDER else len(_ORDER), name)


def _median_error(spread: float, n: int) -> float:
    """The standard error of a median of ``n`` samples with this spread (half IQR).

    Half the interquartile range of a normal distribution is 0.674 sigma, and the
    standard error of a median is 1.253 sigma / sqrt(n).
    """
    return 1.253 * (spread / 0.674) / max(n, 1) ** 0.5


def _verdict(stats: dict[str, tuple[float, float, int]]) -> tuple[str, tuple[str, str] | None]:
    """``(choice, undecided pair)``.

    The fastest median wins, except that a candidate earlier in ``_ORDER`` within
    ``MARGIN`` of it is kept (near-ties settle the same way every compile). A lead
    beyond ``MARGIN`` but within ``_CONFIDENCE`` standard errors of the difference
    of the two medians is not yet clear: the faster median is chosen and the pair is
    returned as undecided (to be measured more).
    """
    med = {k: v[0] for k, v in stats.items()}
    best = min(med, key=lambda k: (med[k], _rank(k)))
    for k in sorted(med, key=_rank):
        if k == best:
            return best, None
        lead = med[k] - med[best]
        if lead <= MARGIN * med[best]:
            return k, None
        if lead <= _CONFIDENCE * _noise(stats[k], stats[best]):
            return best, (k, best)
    return best, None  # not reached: best is in med


def _noise(a: tuple[float, float, int], b: tuple[float, float, int]) -> float:
    """The standard error of the difference of two medians."""
    return (_median_error(a[1], a[2]) ** 2 + _median_error(b[1], b[2]) ** 2) ** 0.5


def _noisy(v: tuple[float, float, int]) -> bool:
    return v[1] > NOISY * v[0]


def _contenders(stats: dict[str, tuple[float, float, int]], chosen: str) -> list[str]:
    """The candidates besides ``chosen`` that might still be the fastest: a median
    within the noise of the choice's (``_CONFIDENCE`` standard errors), or a noisy
    spread (``NOISY``) that reaches below the choice's median, or, where the choice
    itself is noisy, a median below the top of its spread."""
    c = stats[chosen]
    out = []
    for k, v in stats.items():
        if k == chosen:
            continue
        gap = v[0] - c[0]
        if MARGIN * c[0] < abs(gap) <= _CONFIDENCE * _noise(v, c) \
                or (_noisy(v) and v[0] - v[1] < c[0]) or (_noisy(c) and v[0] < c[0] + c[1]):
            out.append(k)
    return sorted(out, key=_rank)


def _remeasure(stats: dict[str, tuple[float, float, int]]) -> list[str]:
    """The candidates to measure again (the choice and its contenders), or none."""
    chosen = _verdict(stats)[0]
    rest = _contenders(stats, chosen)
    return [chosen, *rest] if rest else []


def _decide(stats: dict[str, tuple[float, float, int]]) -> dict:
    """The region entry: every candidate's median and spread, the choice (``_verdict``),
    why it won, and whether the measurement was clear enough to cache (``noisy``)."""
    chosen, undecided = _verdict(stats)
    region = {"candidates_ms": {k: round(v[0], 4) for k, v in stats.items()},
              "spread_ms": {k: round(v[1], 4) for k, v in stats.items()},
              "runs": {k: v[2] for k, v in stats.items()}, "chosen": chosen,
              "source": "measured"}
    contenders = _contenders(stats, chosen)
    fastest = min(stats, key=lambda k: (stats[k][0], _rank(k)))
    others = sorted((k for k in stats if k != chosen), key=lambda k: stats[k][0])
    if not others:
        why = "the only candidate that ran"
    elif undecided:
        other = undecided[0] if undecided[1] == chosen else undecided[1]
        why = (f"the faster median: {other}'s {stats[other][0]:.3f} ms and {chosen}'s "
               f"{stats[chosen][0]:.3f} ms stayed within the noise after measuring again")
    elif chosen != fastest:
        why = (f"within {MARGIN:.0%} of the fastest ({fastest} {stats[fastest][0]:.3f} ms): "
               "a near-tie, settled by the fixed order")
    else:
        nxt = others[0]
        why = (f"the fastest median, {stats[nxt][0] / stats[chosen][0] - 1:.0%} ahead of "
               f"the next ({nxt}), beyond the noise")
    if contenders:
        why += (f"; noisy (spread over {NOISY:.0%} of the median, or within the noise: "
                f"{', '.join(contenders)})")
    region["why"] = why
    region["noisy"] = bool(contenders)
    if undecided:
        region["undecided"] = list(undecided)
    return region


def pick_variant(cands: dict[str, CompiledArtifact], example, target: Target,
                 plan: dict | None = None) -> tuple[str, dict]:
    """``(name, region-style entry)``: the fastest of compiled variants of one program,
    timed and decided as region candidates are (``iree`` stands on near-ties), or the
    one ``plan`` pins (``CompiledModule.plan()`` of an earlier compile).

    Raises:
        UnsupportedOp: the plan names a variant this program does not have here.
    """
    pinned = _pinned(plan, cands)
    if pinned is not None:
        return pinned["chosen"], pinned
    stats = _time_candidates(cands, example, target)
    if "iree" not in stats:
        return "iree", {}
    entry = _decide(stats)
    entry.pop("noisy")  # variants are measured again every compile, never cached
    return entry["chosen"], entry


def choice(region: dict) -> str:
    """The candidate the decision rule picks from a region entry's recorded medians,
    spreads and run counts (what the report shows): a check that a recorded decision
    follows the rule."""
    return _decide({k: (v, region["spread_ms"][k], region["runs"][k])
                    for k, v in region["candidates_ms"].items()})["chosen"]


def program_key(imported: ImportedProgram, target: Target, cands: dict) -> str:
    """What a region decision depends on: the program, its inputs, the candidates,
    the target's flags, torch, this CPU, torch's thread count and what the prepacked
    executor fuses and the compiled forms (a decision between older candidates is
    measured again)."""
    parts = [imported.exported.graph_module.code,
             json.dumps([i.to_json() if hasattr(i, "to_json") else list(i)
                         for i in imported.flat_inputs], sort_keys=True, default=str),
             json.dumps(sorted(k + ("@example" if c.manifest.specialized else "")
                               for k, c in cands.items())), " ".join(target.flags), target.driver,
             machine_key(), f"rule {_RULE}", f"prepack {prepack.VERSION}", FORMS]
    if imported.symbols:  # a dynamic program is measured at its range's end too
        parts.append(json.dumps(imported.symbols, sort_keys=True))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def _cache(target: Target):
    return JsonCache("regions", target, key=machine_key())


def _cached(key: str, cands: dict, target: Target) -> dict | None:
    if os.environ.get("AOT_REMEASURE"):
        return None
    rec = _cache(target).data.get(key)
    if not rec or rec.get("chosen") not in cands:
        return None
    return {**rec, "source": "reused: measured by an earlier compile of this program on "
                             "this machine (AOT_REMEASURE=1 measures again)"}


def _store(key: str, region: dict, target: Target) -> None:
    _cache(target).update({key: {k: v for k, v in region.items() if k != "source"}})


def _pinned(plan: dict | None, cands: dict) -> dict | None:
    if not plan:
        return None
    chosen = plan.get("region") or "iree"
    if chosen not in cands:
        raise UnsupportedOp(f"the plan pins region candidate {chosen!r}, which this program "
                            f"does not have for this target (candidates: {sorted(cands)})",
                            stage="options")
    return {"chosen": chosen, "candidates_ms": (plan.get("candidates_ms") or {}),
            "source": "pinned by the plan given to compile"}


def aten_candidates(imported: ImportedProgram, target: Target) -> dict:
    """The whole-ATen-region candidates for this program and target (none on failure);
    a program with control flow, which kernel calls cannot hold, has the host program as
    its ATen region."""
    cands = {}
    try:
        try:
            p = lower(partition(imported, target, PlacementPolicy("all")))
        except UnsupportedOp as e:
            if e.op != RUNS_IN_HOST:
                raise
            cands["aten"] = host_artifact(imported, target, PlacementPolicy("all"),
                                          str(e).splitlines()[0][:400], time.perf_counter())
            return cands
        aten = compile_program(p)
        cands["aten"] = aten
        ops = [m["op"] for k in aten.manifest.kernel_calls for m in (k.get("members") or [k])]
        nhwc = has_conv(ops) and layout_safe(ops)
        if target.driver.startswith("local") and prepack.available() \
                and (has_conv(ops) or {"aten::linear", "aten::matmul"} & set(ops)):
            cands["aten-prepacked"] = _with_executor(
                aten, ExecOptions("channels_last" if nhwc else "contiguous", prepack=True))
            kernels = sum(op in CONV_OPS or op in onednn_graph.MATRIX_PRODUCTS for op in ops)
            traced = kernels >= GRAPH_MIN_KERNELS and not (
                aten.manifest.executor or {}).get("quantized_engine")
            # channels-last where every op allows: oneDNN's partitions (or primitives)
            # then hand NHWC tensors to the ops between them, with no reorder either way
            layout = "channels_last" if nhwc else "contiguous"
            if traced and onednn_graph.available():
                cands["aten-onednn-graph"] = _with_executor(
                    aten, ExecOptions(layout, onednn_graph=True))
            if traced and dnnl_api.available():
                cands["aten-onednn-primitives"] = _with_executor(
                    aten, ExecOptions(layout, onednn_primitives=True))
        elif nhwc:
            cands["aten-channels-last"] = _with_executor(aten, ExecOptions("channels_last"))
    except Exception as e:  # an ATen region is an optimisation: without it, per-op stands
        log.info("no ATen-region candidate: %s", e)
    return cands


# the oneDNN-graph candidate's gain is the host's cost per kernel call, saved on each
# convolution and matrix product; below this many, its fixed cost at compile (a trace,
# oneDNN's compile, its rounds in the race) buys too little to be worth measuring
GRAPH_MIN_KERNELS = 8


def _with_executor(a: CompiledArtifact, options: ExecOptions) -> CompiledArtifact:
    # the quantized engine and the heap plan are the program's (recorded at compile),
    # never a candidate's
    recorded = a.manifest.executor or {}
    executor = {**options.to_json(), "quantized_engine": recorded.get("quantized_engine"),
                "retained_heap_bytes": recorded.get("retained_heap_bytes", 0)}
    return a.with_manifest(executor=executor)


def _with_region(a: CompiledArtifact, region: dict, placements: list,
                 policy: PlacementPolicy) -> CompiledArtifact:
    policy_json = {"fallback": policy.fallback, "fallback_ops": list(policy.fallback_ops),
                   "placement": policy.placement}
    return a.with_manifest(region=region, placements=placements, policy=policy_json)


def _on_device(example, target: Target):
    args, kwargs = example
    if target.driver.startswith("local"):
        return args, kwargs
    return pytree.tree_map(lambda v: v.cuda() if isinstance(v, torch.Tensor) else v,
                           (args, kwargs))


@dataclasses.dataclass
class Race:
    """Candidates loaded and timed in this process, kept for a later race to go on
    from: ``aten_far_ahead`` times the ATen regions before the IREE compile, and where
    they are not far enough ahead, ``choose_region`` adds the compiled candidates to
    their race instead of loading, warming up and timing them again. Their samples
    stand as measured; where the order
    with a newcomer is not clear, ``_remeasure`` times them again beside it, as any
    contender. ``close`` releases the modules (idempotent)."""

    mods: dict = dataclasses.field(default_factory=dict)
    samples: dict = dataclasses.field(default_factory=dict)
    call_s: dict = dataclasses.field(default_factory=dict)
    warm: dict = dataclasses.field(default_factory=dict)
    quiet: dict = dataclasses.field(default_factory=dict)

    def close(self) -> None:
        for m in self.mods.values():
            m.close()
        self.mods.clear()


def _time_candidates(cands: dict[str, CompiledArtifact], example, target: Target,
                     not_timed: dict | None = None, floors: dict | None = None,
                     race: Race | None = None, keep: bool = False) -> dict:
    """``{candidate: (median ms, spread ms, runs)}`` for every candidate that ran;
    ``not_timed`` gets ``{candidate: why}`` for those left out (``_sibling_out``,
    ``_floor_out``).

    Blocks of ``_BLOCK`` timed calls per candidate per round, after untimed calls
    for ``_WARM_S``; the order rotates every round so drifts hit all alike.

    ``floors``: ``{candidate: ms}`` its heavy ops take at least (``_floors``). Those
    without one are warmed up first, then the others from the lowest floor up, and one
    whose floor is ``FLOOR_MARGIN`` times a call already measured or more is not run.

    ``race``: candidates this process already loaded and timed (``Race``), of ``cands``:
    their samples are kept and only the others are warmed up and timed in the rounds,
    all of them in the checks after. ``keep``: the modules stay loaded and the samples
    go into ``race`` for a later call; otherwise every module is closed at the end.
    """
    floors = floors or {}
    args, kwargs = _on_device(example, target)
    cuda = not target.driver.startswith("local")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    race = race if race is not None else Race()
    prior = {k: race.samples[k] for k in race.mods if k in cands and race.samples.get(k)}
    mods = {k: race.mods[k] for k in prior}
    call_s = {k: race.call_s[k] for k in prior}
    warm = {k: race.warm[k] for k in prior}
    # a slow candidate timed only while the machine was idle
    quiet: dict[str, bool] = {k: race.quiet[k] for k in prior if k in race.quiet}
    deferred: list[str] = []  # executor variants of a slow per-op artifact, decided later

    def leave_out(name: str, why: str) -> None:
        log.info("region candidate %s not timed: %s", name, why)
        if not_timed is not None:
            not_timed[name] = why

    def warm_up(name: str) -> bool:
        art = cands[name]
        try:
            m = CompiledModule(art)
            for i in range(_WARMUP if cuda else _WARMUP_CPU):
                watch = timing.elsewhere()
                t = time.perf_counter()
                m(*args, **kwargs)
                sync()
                call_s[name] = time.perf_counter() - t  # the last warm-up call's time
                quiet[name] = _quiet(watch(), call_s[name])
                warm.setdefault(name, []).append(call_s[name])
                if not cuda and i + 1 >= _WARMUP_SLOW and call_s[name] >= _SLOW_S \
                        and not _packs(art):
                    break
            mods[name] = m
            return True
        except Exception as e:  # a candidate that cannot run is not a candidate
            log.info("region candidate %s did not run: %s", name, e)
            return False

    with torch.no_grad():
        # the per-op artifact's executor variants last: where it is slow and far out of
        # the race, they are not run at all (``_sibling_out``); where it is slow and
        # might be in it, they wait for the race's first round, which measures the
        # others better than one warm-up call each
        for name in sorted(cands, key=lambda k: (k in _SIBLINGS, floors.get(k, -1.0))):
            if name in prior:
                continue
            why = _floor_out(name, floors, call_s, mods)
            if why:
                leave_out(name, why)
                continue
            parent = _SIBLINGS.get(name)
            if parent in warm and not cuda:
                others = [s for k, s in call_s.items() if k != parent and k not in _SIBLINGS]
                why = _sibling_out(name, cands, warm[parent], min(others, default=None))
                if why:
                    leave_out(name, why)
                    continue
                if min(warm[parent]) >= _SLOW_S and others:
                    deferred.append(name)
                    continue
            warm_up(name)
        samples: dict[str, list] = {k: list(prior.get(k, ())) for k in mods}
        rounds = max(1, RUNS // _BLOCK)
        if mods:  # fast programs: more rounds (medians of a few calls of 0.1 ms are noise)
            timed = [k for k in mods if k not in prior] or list(mods)
            per_round = sum(call_s[k] for k in timed) * (_BLOCK + 1) + _WARM_S * len(timed)
            rounds = max(rounds, min(_MAX_RUNS // _BLOCK, int(_FAST_BUDGET_S / per_round)))
        # slow programs: no untimed call before a block (a call's own length dwarfs the
        # previous candidate's threads settling; it would only double the compile time),
        # the last warm-up call (which runs as every later one) is their first sample,
        # and the race is judged from it and after every round (``_in_race``)
        settled = {k for k in mods if call_s[k] >= _SLOW_S}
        for k in settled - set(prior):
            samples[k].append(call_s[k] * 1e3)
        slow = bool(mods) and settled == set(mods)
        names = _in_race(samples, list(mods)) if slow else _warm_race(mods, settled, samples,
                                                                      call_s)
        deadline = time.perf_counter() + BUDGET_S
        for r in range(rounds):
            if r >= 2 and time.perf_counter() > deadline:
                break
            _round(mods, timing.rotated([k for k in names if k not in prior], r), args, kwargs,
                   sync, samples, settled, quiet=quiet)
            for name in deferred:  # the per-op artifact's executor variants, now decided
                parent = _SIBLINGS[name]
                best = min(statistics.median(samples[k]) for k in names) / 1e3
                ran = warm[parent] + [v / 1e3 for v in samples[parent]]
                why = _sibling_out(name, cands, ran, best) or \
                    _floor_out(name, floors, call_s, mods)
                if why:
                    leave_out(name, why)
                elif warm_up(name):
                    samples[name] = [call_s[name] * 1e3] if call_s[name] >= _SLOW_S else []
                    if call_s[name] >= _SLOW_S:
                        settled.add(name)
                    names.append(name)
                    slow = settled == set(mods)
            deferred = []
            names = _in_race(samples, names, {k for k in settled if quiet.get(k)})
            if slow and len(names) == 1 and len(samples[names[0]]) >= _SOLE_SAMPLES:
                break  # nothing left to compare: the others are rechecked below
        _recheck(mods, names, args, kwargs, sync, samples, settled, quiet)
        # the choice and every candidate that might still beat it: measured more, in
        # rotating order, until the order is clear, one has _MAX_RUNS samples, or
        # EXTRA_S is spent (noise re-measures; it never protects the first candidate)
        deadline = time.perf_counter() + EXTRA_S
        todo, r = _remeasure(_stats(samples)), 0
        while todo and time.perf_counter() < deadline and \
                max(len(samples[k]) for k in todo) < _MAX_RUNS and \
                not (r >= _EXTRA_SLOW_ROUNDS and settled.issuperset(todo)):
            _round(mods, timing.rotated(todo, r), args, kwargs, sync,
                   samples, settled, quiet=quiet)
            r += 1
            todo = _remeasure(_stats(samples))
    if keep:
        race.mods.update(mods)
        race.samples.update(samples)
        race.call_s.update(call_s)
        race.warm.update(warm)
        race.quiet.update(quiet)
    else:
        race.close()
        for k, m in mods.items():
            if k not in prior:
                m.close()
    return _stats(samples)


SYNC_MAX_GFLOP = 0.5  # heavy ops of a program whose tiled code is also timed on one thread


def _small(imported: ImportedProgram) -> bool:
    """Under ``SYNC_MAX_GFLOP`` in heavy ops (a few milliseconds on two cores), where the
    dispatches' hand-offs to IREE's workers can outweigh the second core; on larger
    programs the single-threaded calls would only lengthen the race."""
    return heavy_gflop(imported.exported) < SYNC_MAX_GFLOP


# executor variants of an IREE candidate (the per-op artifact, the tiled one): its code and
# kernel calls, other threads
_SIBLINGS = {"iree-sync": "iree", "iree-one-thread": "iree", "iree-tiled-sync": "iree-tiled"}
# the most a sibling can save per kernel call: the hand-off to torch's threads and back
# and their spinning against IREE's workers (``cost.HANDOFF_MS`` is the typical cost)
_SIBLING_GAIN_MS = 2.0


def _sibling_out(name: str, cands: dict, parent_s: list[float], best_s: float | None
                 ) -> str | None:
    """Why executor variant ``name`` need not run, or None: its parent (the per-op
    artifact), whose calls took ``parent_s`` seconds, is slow (``_SLOW_S``), and even its
    fastest call, less the most its kernel calls' hand-offs can cost
    (``_SIBLING_GAIN_MS`` each), is ``OUT_OF_RACE`` times ``best_s`` (the fastest other
    candidate's call, or median once the race has run a round) or slower. The sibling
    runs the same code and the same kernel calls on other threads, so it cannot come
    within the race either; timing it would cost seconds of calls. Fast programs run
    every sibling: there the hand-offs can be most of a call."""
    parent = _SIBLINGS[name]
    if best_s is None:
        return None
    calls = len(cands[parent].manifest.kernel_calls)
    floor = min(parent_s) - calls * _SIBLING_GAIN_MS / 1e3
    if min(parent_s) < _SLOW_S or floor < OUT_OF_RACE * best_s:
        return None
    return (f"{parent} took {min(parent_s) * 1e3:.1f} ms a call, and even without the "
            f"{calls} kernel calls' hand-offs ({_SIBLING_GAIN_MS} ms each at most) "
            f"{floor * 1e3:.1f} ms, {floor / best_s:.1f}x the fastest candidate's "
            f"{best_s * 1e3:.1f} ms: {name} runs the same code")


def _floor_out(name: str, floors: dict, call_s: dict, ran) -> str | None:
    """Why candidate ``name`` need not run, or None: its heavy ops alone take
    ``FLOOR_MARGIN`` times the fastest call measured so far (of the candidates ``ran``)
    or longer (``floors``), so it cannot win however it runs the rest. Noise only slows
    calls: the measured call is at least the true time of its candidate."""
    floor = floors.get(name)
    best = min((call_s[k] for k in ran), default=None)
    if floor is None or best is None or floor < FLOOR_MARGIN * best * 1e3:
        return None
    fastest = min(ran, key=lambda k: call_s[k])
    return (f"its heavy ops alone take at least {floor:.1f} ms (each measured alone on this "
            f"machine), {floor / (best * 1e3):.2f}x the {best * 1e3:.1f} ms call of "
            f"{fastest}")


def _packs(art) -> bool:
    """The candidate's executor packs weights on its first call (``aten-prepacked``), or
    traces and compiles its groups then (``aten-onednn-graph``)."""
    manifest = getattr(art, "manifest", None)
    executor = (manifest.executor or {}) if manifest is not None else {}
    return bool(executor.get("prepack") or executor.get("onednn_graph")
                or executor.get("onednn_primitives"))


def _in_race(samples: dict[str, list], names: list[str],
             quiet: set[str] = frozenset()) -> list[str]:
    """``names`` without the candidates whose fastest call so far is ``OUT_OF_RACE``
    times the best median or slower: noise only makes calls slower, so such a
    candidate cannot win however often it is timed again. Their samples are kept.

    ``quiet``: slow candidates every call of which ran with the machine otherwise idle
    (``timing.elsewhere``). Such calls are the program's own time, undisturbed: one
    with ``QUIET_SAMPLES`` of them, the fastest ``QUIET_LEAD`` over the best median, is
    out too (ConvNeXt-T at batch 8 timed five candidates of 0.33-0.44 s a call for
    rounds)."""
    best = min(statistics.median(samples[k]) for k in names)

    def out(k: str) -> bool:
        fastest = min(samples[k])
        return fastest >= OUT_OF_RACE * best or (
            k in quiet and len(samples[k]) >= QUIET_SAMPLES
            and fastest >= (1 + QUIET_LEAD) * best)
    return [k for k in names if not out(k)]


def _warm_race(mods, settled, samples: dict[str, list], call_s: dict) -> list[str]:
    """The candidates in the race after warm-up, where some are slow (``settled``, their
    warm-up call their first sample) and some fast: a slow one whose call took
    ``OUT_OF_RACE`` times a fast one's last warm-up call or more is out at once. A
    warm-up call is seldom faster than the steady state, so this drops what the rounds
    would drop, only before they time it; those dropped are rechecked (``_recheck``)
    like any other."""
    fast = [call_s[k] * 1e3 for k in mods if k not in settled]
    if not settled or not fast:
        return list(mods)
    return [k for k in mods if k not in settled or min(samples[k]) < OUT_OF_RACE * min(fast)]


def _recheck(mods, names, args, kwargs, sync, samples, settled=frozenset(),
             quiet: dict | None = None) -> None:
    """One more block for each candidate ``_in_race`` dropped (those not in ``names``),
    one call for a slow one (``settled``): one that now runs within ``OUT_OF_RACE`` of
    the best median was slowed by something else while it was timed (a burst of other
    work on the machine), so its earlier samples are dropped and it is measured from
    that block on, as the others are. A slow one whose every call ran while nothing
    else used the machine (``quiet``: ``timing.elsewhere``) was not slowed by anything
    else, and is not called again: a call of a slow program is seconds of a compile."""
    if len(names) == len(mods):
        return
    best = min(statistics.median(samples[k]) for k in names)
    for k in [k for k in mods if k not in names]:
        if k in settled and quiet is not None and quiet.get(k):
            log.info("region candidate %s not rechecked: its %d call(s), %.3f ms at best, ran "
                     "with the machine otherwise idle", k, len(samples[k]), min(samples[k]))
            continue
        before, samples[k] = samples[k], []
        _round(mods, [k], args, kwargs, sync, samples, settled,
               block=1 if k in settled else None, quiet=quiet)
        if min(samples[k]) < OUT_OF_RACE * best:
            log.info("region candidate %s ran %.3f ms again after %.3f ms medians: measured "
                     "anew", k, min(samples[k]), statistics.median(before))
        else:
            samples[k] = before + samples[k]


def _round(mods, order, args, kwargs, sync, samples, settled=frozenset(), block=None,
           quiet: dict | None = None) -> None:
    """One block per candidate in ``order``: untimed calls for ``_WARM_S`` (the
    previous candidate's threads settle, this one's caches and threads warm up; one
    call at least, none for the ``settled`` slow ones), then ``block`` timed (by
    default ``_BLOCK``, ``_BLOCK_SLOW`` for the slow ones). ``quiet``: whether each
    slow one's blocks so far ran with the machine otherwise idle, updated."""
    for name in order:
        m = mods[name]
        watch, t = timing.elsewhere(), time.perf_counter()
        samples[name] += timing.block(lambda: m(*args, **kwargs),
                                      block or (_BLOCK_SLOW if name in settled else _BLOCK),
                                      warm_s=0.0 if name in settled else _WARM_S, sync=sync)
        if quiet is not None:
            quiet[name] = quiet.get(name, True) and _quiet(watch(), time.perf_counter() - t)


# a timed stretch ran on an otherwise idle machine when the CPU time spent outside this
# process meanwhile stayed under this much, plus _QUIET_FRACTION of the stretch on every
# CPU (``/proc/stat`` counts in ticks of 10 ms; a busy neighbour shows as tenths of s)
_QUIET_S = 0.03
_QUIET_FRACTION = 0.02


def _quiet(elsewhere_s: float | None, wall_s: float) -> bool:
    return elsewhere_s is not None and \
        elsewhere_s <= _QUIET_S + _QUIET_FRACTION * wall_s * (os.cpu_count() or 1)


# a dynamic program is timed at its range's end too when one call there is expected
# to take at most this long (the example's time scaled by the sizes' ratio)
END_CALL_S = 0.1


def _sizes_of(imported: ImportedProgram, values: dict | None) -> dict:
    """``{Dim name: size}``: the example's sizes, or ``values`` (symbol -> size)."""
    return {e.get("name") or sym: (e["example"] if values is None else values[sym])
            for sym, e in imported.symbols.items()}


def _range_end(imported: ImportedProgram, example, stats: dict):
    """``(sizes, example at the range's end)`` for a dynamic program where a call there
    is cheap (``END_CALL_S``), else None. The end is each symbol's largest size; the
    example's inputs are repeated along the dimensions that bind it, then cut."""
    if not imported.symbols:
        return None
    ends = {sym: e["max"] for sym, e in imported.symbols.items()}
    scale = math.prod(ends[s] / max(e["example"], 1) for s, e in imported.symbols.items())
    slowest = max(v[0] for v in stats.values()) / 1e3
    if scale <= 1 or slowest * scale > END_CALL_S:
        return None
    args, kwargs = example
    flat, spec = pytree.tree_flatten((args, kwargs))
    for sym, e in imported.symbols.items():
        for b in e["binds"]:
            flat[b["input"]] = resized(flat[b["input"]], b["dim"], ends[sym])
    return _sizes_of(imported, ends), pytree.tree_unflatten(flat, spec)


def _settle_at_range_end(region: dict, stats: dict, end_stats: dict) -> None:
    """The example's sizes decide (they are the sizes the user compiles for, as a
    TensorRT profile's ``opt`` shape); the range's end settles near-ties there: among
    the candidates within ``MARGIN`` of the fastest at the example, one faster at the
    range's end by more than ``MARGIN`` than the choice replaces it. The end's
    medians go in the region entry (``at_range_end_ms``) and the report.

    Over a dynamic range, no single candidate need be best at both ends (data-tiled
    IREE can lead at small batches and an ATen region at large ones), and averaging
    the two ends would give up speed at the example for the far end; an example at
    the size called most gets that size right (``benchmarks/dynamic_sweep.py``).
    """
    region["at_range_end_ms"] = {k: round(v[0], 4) for k, v in end_stats.items()}
    chosen = region["chosen"]
    fastest = min(v[0] for v in stats.values())
    near = [k for k in stats if stats[k][0] <= (1 + MARGIN) * fastest]
    alt = min(near, key=lambda k: (end_stats[k][0], _rank(k)))
    if end_stats[alt][0] * (1 + MARGIN) < end_stats[chosen][0]:
        region["chosen"] = alt
        region.pop("undecided", None)
        region["why"] = (f"within {MARGIN:.0%} of the fastest at the example, and faster than "
                         f"{chosen} at the range's end ({end_stats[alt][0]:.3f} ms against "
                         f"{end_stats[chosen][0]:.3f})")


def _stats(samples: dict[str, list]) -> dict[str, tuple[float, float, int]]:
    return {k: (statistics.median(v), timing.spread(v), len(v)) for k, v in samples.items() if v}
