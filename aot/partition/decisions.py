"""decisions: where each op of a program runs, and why.

The first step of ``partition``, and the only one that asks IREE or measures:
probes each op's coverage (``coverage``), decomposes the ops IREE cannot lower
when a decomposition exists (unless ATen's kernel measures faster, ``cost``),
measures the heavy covered ops under ``placement="auto"``, and places every op
(``placement``). Grouping and the rewrite into kernel calls only read the
:class:`Decisions` it returns.

Control flow (``torch.while_loop``, ``torch.cond``) is compiled: the importer makes a
loop or a branch of the compiled module, and the ops of its condition and body, or of
its branches, are probed and placed like any others, each with its own row (a kernel
call inside runs once per iteration, or only in the branch taken), nested control flow's
too. Under ``fallback="all"`` control flow runs in the host program with the whole
program (``RUNS_IN_HOST``).
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import weakref
from dataclasses import dataclass

import torch
import torch.fx
from torch.export import ExportedProgram

from ..errors import UnsupportedOp
from ..importer.decompositions import decomposition_for
from ..importer.dynamic import symbolic_sizes
from ..importer.locations import node_location
from ..torch_tensor import TorchTensor
from .cost import MIN_FLOPS
from .coverage import CoverageCache, Verdict, probe_nodes
from .signatures import op_signature
from .flops import node_flops
from .iree_faults import iree_fault
from .outline import carried
from .placement import COMPILED, KERNEL_CALL, Placement, PlacementPolicy, matches_forced, op_name
from ..toolchain.targets import Target
from .cost import CROSSING_MS, CostCache, measure_decomposed, measure_nodes, start_prefetch
from ..fallback.quantized_ops import NAMESPACE

__all__ = ["Decisions", "decide", "is_assert", "op_nodes", "inner_ops", "flat_ops", "heavy_gflop",
           "CONTROL_FLOW", "RUNS_IN_HOST"]
log = logging.getLogger(__name__)
_MAX_DECOMPOSITION_ROUNDS = 4


@dataclass(frozen=True)
class Decisions:
    """Made by :func:`decide`, read by ``grouping`` and ``kernel_calls``.

    ``program`` is the program after decompositions (the one every later step
    walks); ``placements`` has one row per op, in graph order; ``decided`` maps
    each op node to ``(where, why)``; ``sizes`` are the size nodes of a dynamic
    program that only kernel calls read: they record them, so they run nowhere.
    """

    program: ExportedProgram
    placements: tuple[Placement, ...]
    decided: dict
    sizes: frozenset


def decide(ep: ExportedProgram, target: Target, policy: PlacementPolicy,
           cache: CoverageCache | None, demoted: dict[str, str] | None,
           assume=None) -> Decisions:
    """Place every op of ``ep``.

    Args:
        ep: the exported program, before decompositions.
        target, policy, cache, demoted, assume: as :func:`aot.partition.partitioner.partition`
            takes them.
    Returns:
        Decisions.
    Raises:
        UnsupportedOp: ``fallback="none"`` and some op is not covered (all are
            listed with their source lines).
    """
    verdicts: dict[str, Verdict] = {}
    kept: dict = {}  # op -> reason it stays in ATen although it has a decomposition
    prefetch = None
    if policy.fallback != "all":
        cache = cache or CoverageCache(target)
        prefetch = _prefetch_costs(ep, target, policy, cache)
        ep, verdicts = _decompose_uncovered(ep, target, policy, cache, kept, prefetch, assume)
    costs = _costs(ep, target, policy, verdicts, prefetch)
    placements, decided = _place(ep, policy, verdicts, demoted or {}, costs, kept, target.via)
    if policy.fallback == "none":
        bad = [p for p in placements if p.where == KERNEL_CALL]
        if bad:
            lines = "\n".join(f"  {p.op} at {p.location or '<unknown>'}: {p.reason}" for p in bad)
            raise UnsupportedOp(f"fallback='none' but {len(bad)} op(s) are not covered by IREE "
                                f"for {target.name}:\n{lines}")
    sizes = _recorded_sizes(ep, decided)
    for n in sizes:
        decided[n] = (COMPILED, _SIZE_REASON)
    placements = [dataclasses.replace(p, where=COMPILED, reason=_SIZE_REASON)
                  if p.node in {n.name for n in sizes} else p for p in placements]
    return Decisions(ep, tuple(placements), decided, sizes)


def is_assert(n: torch.fx.Node) -> bool:
    """Metadata checks export leaves in (``_assert_tensor_metadata``): no value, no users."""
    return n.meta.get("val") is None and not n.users


def op_nodes(ep) -> list[torch.fx.Node]:
    return _ops(ep.graph)


def _ops(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    return [n for n in graph.nodes if n.op == "call_function"
            and n.target is not operator.getitem and not is_assert(n)]


# control flow -> (its name, the positions of its graph operands)
CONTROL_FLOW = {torch.ops.higher_order.while_loop: ("torch.while_loop", (0, 1)),
                torch.ops.higher_order.cond: ("torch.cond", (1, 2))}
# the UnsupportedOp ``op`` of control flow compiled code cannot hold (``fallback="all"``):
# ``compile_model`` runs the program in the host program, for the reason the error gives
RUNS_IN_HOST = "control flow"


def inner_ops(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The ops of the graphs of control flow ``node`` (a loop's condition and body, a
    cond's branches)."""
    owner = node.graph.owning_module
    return [n for i in CONTROL_FLOW[node.target][1]
            for n in _ops(getattr(owner, node.args[i].target).graph)]


def flat_ops(ep) -> list[torch.fx.Node]:
    """Every op of the program, the ops inside its control flow (nested too) in place of
    the control flow: the ops whose coverage decides placement."""
    def flat(nodes):
        for n in nodes:
            if n.target in CONTROL_FLOW:
                yield from flat(inner_ops(n))
            else:
                yield n
    return list(flat(op_nodes(ep)))


def _decompose_uncovered(ep, target, policy, cache, kept: dict, prefetch=None, assume=None):
    """Probe; decompose uncovered ops that have a decomposition; repeat to a fixpoint.

    Under ``placement="auto"``, a quantized ``aot_q`` op (ATen kernel and our
    integer decomposition) is decomposed only when its decomposition, compiled
    by IREE, measures faster in total over the op's call sites; else it stays a
    kernel call and ``kept[op]`` holds the measured reason.
    """
    tried: set = set()
    for _ in range(_MAX_DECOMPOSITION_ROUNDS):
        nodes = [n for n in flat_ops(ep) if isinstance(n.target, torch._ops.OpOverload)
                 and not matches_forced(n.target, policy.fallback_ops)]
        verdicts = probe_nodes(nodes, target, cache, prefetch, assume)
        table = {}
        user_inputs = _user_inputs(ep)
        for n in nodes:
            if iree_fault(n, user_inputs, target.via) is not None:
                continue  # runs in ATen: its decomposition, compiled, is what IREE gets wrong
            if not verdicts[op_signature(n)].covered and n.target not in tried:
                fn = decomposition_for(n.target)
                if fn is not None:
                    table[n.target] = fn
        measured = {op: table[op] for op in table if _measure_before_decomposing(op, policy, target)}
        for op, reason in _aten_faster(measured, nodes, target).items():
            kept[op] = reason
            del table[op]
            tried.add(op)
        if not table:
            return ep, verdicts
        tried.update(table)
        try:
            log.info("decomposing ops IREE does not lower: %s", sorted(map(op_name, table)))
            decomposed = _decomposed(ep, table)
        except Exception as e:  # a decomposition torch cannot apply: keep the op as a kernel call
            log.info("decomposition failed (%s); keeping those ops as kernel calls", e)
            return ep, verdicts
        if _uncarried(decomposed) - _uncarried(ep):
            # a decomposition whose intermediate values compiled code cannot hold
            # (fft_hfft in float64 goes through complex128): keep the ops whole
            log.info("decomposing %s makes values of dtypes compiled code cannot hold (%s); "
                     "keeping them as kernel calls", sorted(map(op_name, table)),
                     sorted(_uncarried(decomposed) - _uncarried(ep)))
            return ep, verdicts
        if _output_types(decomposed) != _output_types(ep):
            # a decomposition whose ops' metadata disagree with the op (torch's
            # prims.signbit says float32 where signbit returns bool): keep the ops
            log.info("decomposing %s changes the program's output types; keeping them as "
                     "kernel calls", sorted(map(op_name, table)))
            return ep, verdicts
        ep = decomposed
    return ep, probe_nodes([n for n in flat_ops(ep) if isinstance(n.target, torch._ops.OpOverload)],
                           target, cache, prefetch, assume)


# program -> {ops decomposed: the decomposed program}. A compile partitions one program
# several times (the per-op placement, the tiled variant, recovery rounds) with the same
# verdicts, and torch's decomposition retraces the whole program: a second or more
# each on a deep network. No partition changes the program it is given.
_DECOMPOSED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _decomposed(ep, table: dict):
    """``ep.run_decompositions(table)``, once per program and set of ops."""
    done = _DECOMPOSED.setdefault(ep, {})
    key = frozenset(table)
    if key not in done:
        done[key] = ep.run_decompositions(table)
    return done[key]


def _uncarried(ep) -> set[str]:
    """Dtypes of the program's tensor values that compiled code cannot hold."""
    out = set()
    for n in ep.graph.nodes:
        for v in torch.utils._pytree.tree_leaves(n.meta.get("val")):
            if isinstance(v, torch.Tensor) and v.layout == torch.strided:
                spec = TorchTensor.from_tensor(v)
                if not spec.is_dynamic and not carried(spec):
                    out.add(spec.dtype)
    return out


def _output_types(ep) -> list:
    out = next(n for n in ep.graph.nodes if n.op == "output")
    return [(v.dtype, tuple(v.shape)) if isinstance(v, torch.Tensor) else type(v).__name__
            for v in (a.meta.get("val") if isinstance(a, torch.fx.Node) else a
                      for a in torch.utils._pytree.tree_leaves(out.args[0]))]


def _measure_before_decomposing(op, policy: PlacementPolicy, target: Target) -> bool:
    """Ops with both an ATen kernel and a decomposition we wrote: the quantized ``aot_q`` ops."""
    return (policy.fallback == "auto" and policy.placement == "auto"
            and isinstance(op, torch._ops.OpOverload) and op.namespace == NAMESPACE
            and (target.driver.startswith("local") or torch.cuda.is_available()))


def _aten_faster(decompositions: dict, nodes, target: Target) -> dict:
    """``{op: measured reason to keep it in ATen rather than decompose it}`` for the ops
    of ``decompositions`` (``{op: decomposition}``) whose ATen kernels are faster over
    their call sites among ``nodes``."""
    sites = [n for n in nodes if n.target in decompositions]
    if not sites:
        return {}
    costs = measure_decomposed(sites, decompositions, target, CostCache(target))
    out = {}
    for op in decompositions:
        mine = [costs[n] for n in sites if n.target == op]
        if not mine or any(c.aten_ms is None or c.iree_ms is None for c in mine):
            continue
        aten_ms = sum(c.aten_ms + CROSSING_MS for c in mine)
        iree_ms = sum(c.iree_ms for c in mine)
        if aten_ms < iree_ms:
            out[op] = (f"ATen's kernel is faster here than IREE's code for its decomposition: "
                       f"{aten_ms:.2f} ms vs {iree_ms:.2f} ms over {len(mine)} call site(s), "
                       "measured on this machine")
    return out


def _measures_costs(target: Target, policy: PlacementPolicy) -> bool:
    """Heavy ops are placed by measurement (``placement="auto"``, a device here)."""
    return (policy.fallback == "auto" and policy.placement == "auto"
            and (target.driver.startswith("local") or torch.cuda.is_available()))


def _heavy(n: torch.fx.Node) -> bool:
    return isinstance(n.target, torch._ops.OpOverload) and (node_flops(n) or 0) >= MIN_FLOPS


def heavy_nodes(ep) -> list[torch.fx.Node]:
    """The ops of ``ep`` whose placement is decided by measuring them (``MIN_FLOPS``)."""
    return [n for n in op_nodes(ep) if _heavy(n)]


def heavy_gflop(ep) -> float:
    """The GFLOP of ``ep``'s heavy ops (``heavy_nodes``)."""
    return sum(node_flops(n) or 0 for n in heavy_nodes(ep)) / 1e9


def _prefetch_costs(ep, target: Target, policy: PlacementPolicy, cache: CoverageCache):
    """Start compiling the IREE side of the heavy ATen ops' cost measurements while
    coverage is probed (``cost.Prefetch``), which then stands for their probe; ops a
    cached verdict says IREE does not lower, and ops of other namespaces (quantized ops
    may be decomposed), are left out."""
    if not _measures_costs(target, policy):
        return None
    heavy = [n for n in op_nodes(ep) if _heavy(n) and n.target.namespace == "aten"
             and not matches_forced(n.target, policy.fallback_ops)
             and (cache.get(op_signature(n)) or Verdict(True)).covered]
    if not heavy:
        return None
    return start_prefetch(heavy, target, CostCache(target))


def _costs(ep, target: Target, policy: PlacementPolicy, verdicts, prefetch=None) -> dict:
    """Measured ATen-vs-IREE costs of the heavy covered ops (``placement="auto"``)."""
    if not _measures_costs(target, policy):
        return {}  # (compiling for a device this machine lacks: nothing to measure on)
    heavy = [n for n in op_nodes(ep) if _heavy(n)
             and verdicts.get(op_signature(n), Verdict(False)).covered]
    if not heavy and prefetch is None:
        return {}
    return measure_nodes(heavy, target, CostCache(target), prefetch)


def _user_inputs(ep) -> set:
    return {s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"}


def _place(ep, policy: PlacementPolicy, verdicts: dict[str, Verdict], demoted: dict[str, str],
           costs: dict | None = None, kept: dict | None = None, via: str = "torch"):
    placements, decided = [], {}
    user_inputs = _user_inputs(ep)
    for n in op_nodes(ep):
        name, saving = op_name(n.target), None
        if n.target in CONTROL_FLOW:
            rows = _place_control_flow(n, policy, verdicts, demoted, user_inputs, via,
                                       decided)
            decided[n] = (COMPILED, f"control flow of {len(rows)} ops, compiled")
            placements.append(Placement(n.name, f"hop:{n.target.name()}", COMPILED,
                                        decided[n][1], node_location(n), None))
            placements.extend(rows)
            continue
        if policy.fallback == "all" and isinstance(n.target, torch._ops.OpOverload):
            where, why = KERNEL_CALL, "fallback='all'"
        else:
            where, why, saving = _where(n, n.name, policy, verdicts, demoted, user_inputs,
                                        via, kept, costs)
        decided[n] = (where, why)
        placements.append(Placement(n.name, name, where, why, node_location(n), node_flops(n),
                                    saving_ms=saving))
    return placements, decided


def _where(n: torch.fx.Node, row: str, policy: PlacementPolicy, verdicts: dict,
           demoted: dict, user_inputs: set, via: str, kept: dict | None = None,
           costs: dict | None = None) -> tuple[str, str, float | None]:
    """``(where, why, measured saving)`` of op ``n``, whose placement row is ``row``
    (the name recovery demotes it by), by the rules every op follows."""
    if not isinstance(n.target, torch._ops.OpOverload):
        return COMPILED, "symbolic scalar arithmetic (always compiled)", None
    if matches_forced(n.target, policy.fallback_ops):
        return KERNEL_CALL, "forced by fallback_ops", None
    if row in demoted:
        return KERNEL_CALL, ("lowers alone, but IREE failed on it fused with its "
                             f"neighbours: {demoted[row]}"), None
    if (fault := iree_fault(n, user_inputs, via)) is not None:
        return KERNEL_CALL, fault, None
    v = verdicts[op_signature(n)]
    if not v.covered:
        return KERNEL_CALL, (kept or {}).get(n.target, v.reason), None
    cost = (costs or {}).get(op_signature(n))
    if cost is not None and cost.aten_wins:
        return KERNEL_CALL, cost.reason(), round(cost.saving_ms, 4)
    return COMPILED, "lowered by IREE", None


def _place_control_flow(loop: torch.fx.Node, policy: PlacementPolicy, verdicts: dict,
                        demoted: dict, user_inputs: set, via: str, decided: dict,
                        prefix: str | None = None) -> list[Placement]:
    """The rows of the ops inside control flow ``loop`` (named ``<prefix>.<op node>``,
    ``prefix`` the loop's own row, its node name at the top), nested control flow's
    too, each op's ``(where, why)`` added to ``decided``.

    Raises:
        UnsupportedOp: (``op=RUNS_IN_HOST``) ``fallback="all"`` (kernel calls cannot hold
            control flow), a higher-order op other than a loop or a cond inside, or the
            node itself moved to ATen by recovery."""
    prefix = prefix or loop.name

    def host(why: str) -> UnsupportedOp:
        return UnsupportedOp(f"{loop.name} ({CONTROL_FLOW[loop.target][0]}) runs in the host "
                             f"program: {why}", op=RUNS_IN_HOST, location=node_location(loop))
    if policy.fallback == "all":
        raise host("fallback='all'")
    if prefix in demoted:
        raise host(f"IREE failed on it ({demoted[prefix]})")
    rows = []
    for b in inner_ops(loop):
        what = f"its op {b.name} ({op_name(b.target)}, {node_location(b) or 'unknown location'})"
        row = f"{prefix}.{b.name}"
        if b.target in CONTROL_FLOW:
            inner = _place_control_flow(b, policy, verdicts, demoted, user_inputs, via,
                                        decided, row)
            decided[b] = (COMPILED, f"control flow of {len(inner)} ops, compiled")
            rows.append(Placement(row, f"hop:{b.target.name()}", COMPILED, decided[b][1],
                                  node_location(b), None))
            rows.extend(inner)
            continue
        if isinstance(b.target, torch._ops.HigherOrderOperator):
            raise host(f"{what} is a higher-order op compiled code does not take")
        where, why, _ = _where(b, row, policy, verdicts, demoted, user_inputs, via)
        if why == "lowered by IREE":
            why = f"lowered by IREE, in {loop.name}"
        decided[b] = (where, why)
        rows.append(Placement(row, op_name(b.target), where, why, node_location(b),
                              node_flops(b)))
    return rows


_SIZE_REASON = ("a size that follows a dynamic dimension: the kernel calls reading it "
                "evaluate it from the call's input sizes")


def _recorded_sizes(ep, decided: dict) -> frozenset:
    """Size nodes of a dynamic program (``sym_size``, arithmetic on sizes) that only
    kernel calls read: those record the size as an expression (``symbolic_sizes``), so
    the node itself runs nowhere and ties no group to compiled code."""
    out: set = set()
    for n in reversed(list(op_nodes(ep))):
        if symbolic_sizes(n) is None:
            continue
        if n.users and all(u in out or decided.get(u, (COMPILED,))[0] == KERNEL_CALL
                           for u in n.users):
            out.add(n)
    return frozenset(out)
