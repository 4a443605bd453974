"""partition: ImportedProgram -> PartitionedProgram.

Second link of the chain. Measures coverage (``coverage``), decomposes ops IREE
cannot lower when a decomposition exists, places every op (``placement``),
records a KernelCallSpec per fallen-back op by walking its FunctionSchema, and
builds the outlined Torch-dialect module that ``compile_program`` compiles.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
from dataclasses import dataclass, field

import torch
import torch.fx

from ..errors import UnsupportedOp
from ..fallback import static_values
from ..fallback.quantized_ops import QUANT_OPERANDS
from ..fallback.spec import (GROUP_OP, KernelCallSpec, ScalarArg, StaticArg, TensorArg,
                             TensorListArg, lacks_cuda_kernel)
from ..importer.decompositions import decomposition_for
from ..importer.dynamic import symbolic_sizes
from ..importer.fx_import import DROP, import_graph, stateless_graph
from ..importer.locations import node_location
from ..importer.program import ImportedProgram
from ..torch_tensor import QuantParams, TorchTensor
from . import compiled_forms
from .cost import MIN_FLOPS
from .coverage import CoverageCache, Verdict, op_signature, probe_nodes
from .flops import node_flops
from .iree_faults import iree_fault
from .kernel_call_op import kernel_call_op
from .outline import carried, outline_kernel_calls
from .placement import COMPILED, KERNEL_CALL, Placement, PlacementPolicy, matches_forced, op_name
from .targets import Target

__all__ = ["PartitionedProgram", "partition", "single_call", "torch_mlir"]
log = logging.getLogger(__name__)
_MAX_DECOMPOSITION_ROUNDS = 4
# values crossing into one group (its placeholder op's operands), kept under
# torch's 64-argument schema limit; the values crossing back are bounded alike
_MAX_GROUP_INPUTS = 60
_MAX_GROUP_OUTPUTS = 60


@dataclass(frozen=True)
class PartitionedProgram:
    """Made by :func:`partition`, read by ``aot.lower.compile.compile_program``.

    ``mlir`` is the outlined Torch-dialect module as text (kernel calls are
    ``func.call``s of ``aot_kernels.*`` imports); ``placements`` has one row per
    op, in graph order; ``kernel_calls[i].key`` names the i-th host function.
    """

    imported: ImportedProgram
    target: Target
    policy: PlacementPolicy
    placements: tuple[Placement, ...]
    kernel_calls: tuple[KernelCallSpec, ...]
    mlir: str
    producers: dict[str, tuple[str, ...]] | None = None  # op node -> the op nodes it reads
    # weights only kernel calls read, by name: kept beside the module for the host,
    # never passed through IREE (which copies a constant on every call it crosses)
    host_constants: dict[str, torch.Tensor] = field(default_factory=dict)
    # the key of the one kernel call that *is* the program (model inputs in order
    # in, its results out in order), or None: see ``single_call``
    whole_program_call: str | None = None

    def __post_init__(self):
        keys = [k.key for k in self.kernel_calls]
        assert len(set(keys)) == len(keys), "kernel call keys must be unique"
        assert {p.key for p in self.placements if p.where == KERNEL_CALL} == set(keys)


def _is_assert(n: torch.fx.Node) -> bool:
    """Metadata checks export leaves in (``_assert_tensor_metadata``): no value, no users."""
    return n.meta.get("val") is None and not n.users


def _op_nodes(ep) -> list[torch.fx.Node]:
    return [n for n in ep.graph.nodes if n.op == "call_function"
            and n.target is not operator.getitem and not _is_assert(n)]


def torch_mlir(imported: ImportedProgram) -> str:
    """The Torch-dialect module of the whole program, before partitioning."""
    return str(import_graph(stateless_graph(imported.exported)))


def partition(imported: ImportedProgram, target: Target,
              policy: PlacementPolicy = PlacementPolicy(),
              cache: CoverageCache | None = None,
              demoted: dict[str, str] | None = None) -> PartitionedProgram:
    """Place every op and outline the kernel calls.

    Args:
        imported: from ``import_model``.
        target: the compile target (coverage is measured per target).
        policy: fallback policy and forced ops.
        cache: coverage verdict cache (default: on disk, per IREE version).
        demoted: node name -> reason, for ops that lower alone but broke the
            whole-program compile (see ``recover``): they become kernel calls.
    Returns:
        PartitionedProgram.
    Raises:
        UnsupportedOp: ``fallback="none"`` and some op is not covered (all are
            listed with their source lines), or an op's operands cannot be
            recorded for a kernel call.
    """
    ep = imported.exported
    verdicts: dict[str, Verdict] = {}
    kept: dict = {}  # op -> reason it stays in ATen although it has a decomposition
    if policy.fallback != "all":
        cache = cache or CoverageCache(target)
        ep, verdicts = _decompose_uncovered(ep, target, policy, cache, kept)
    costs = _costs(ep, target, policy, verdicts)
    placements, decided = _place(ep, policy, verdicts, demoted or {}, costs, kept)
    if policy.fallback == "none":
        bad = [p for p in placements if p.where == KERNEL_CALL]
        if bad:
            lines = "\n".join(f"  {p.op} at {p.location or '<unknown>'}: {p.reason}" for p in bad)
            raise UnsupportedOp(f"fallback='none' but {len(bad)} op(s) are not covered by IREE "
                                f"for {target.name}:\n{lines}")
    specs: list[KernelCallSpec] = []
    node_keys: dict[str, str] = {}
    consts = HostConstants()
    sizes = _recorded_sizes(ep, decided)
    for n in sizes:
        decided[n] = (COMPILED, _SIZE_REASON)
    placements = [dataclasses.replace(p, where=COMPILED, reason=_SIZE_REASON)
                  if p.node in {n.name for n in sizes} else p for p in placements]
    grouping = (_Grouping.find(ep, decided, sizes) if policy.group
                else _Grouping({}, {}, frozenset(sizes)))
    graph = stateless_graph(ep, lambda n, g, env: DROP if n in sizes else _rewrite(
        n, g, env, decided, specs, grouping, node_keys, consts))
    whole = single_call(graph)
    module = outline_kernel_calls(import_graph(graph), specs)
    on_cpu = set()
    if target.name == "cuda":
        on_cpu = {s.key for s in specs if lacks_cuda_kernel(s)}
        for s in specs:
            if s.key in on_cpu:
                log.warning("%s has no CUDA kernel in ATen: on the GPU it will run on the CPU, "
                            "its operands copied across devices", s.qualified_name)
    note = " [no CUDA kernel in ATen: runs on the CPU, operands copied across devices]"
    placements = tuple(
        Placement(p.node, p.op, p.where,
                  p.reason + (note if node_keys.get(p.node) in on_cpu else ""), p.location,
                  p.flops, node_keys.get(p.node))
        for p in placements)
    producers = {n.name: tuple(a.name for a in n.all_input_nodes if a.op == "call_function")
                 for n in _op_nodes(ep)}
    return PartitionedProgram(imported, target, policy, placements, tuple(specs), str(module),
                              producers, consts.tensors,
                              None if whole is None else specs[whole].key)


_SIZE_REASON = ("a size that follows a dynamic dimension: the kernel calls reading it "
                "evaluate it from the call's input sizes")


def _recorded_sizes(ep, decided: dict) -> frozenset:
    """Size nodes of a dynamic program (``sym_size``, arithmetic on sizes) that only
    kernel calls read: those record the size as an expression (``symbolic_sizes``), so
    the node itself runs nowhere and ties no group to compiled code."""
    out: set = set()
    for n in reversed(list(_op_nodes(ep))):
        if symbolic_sizes(n) is None:
            continue
        if n.users and all(u in out or decided.get(u, (COMPILED,))[0] == KERNEL_CALL
                           for u in n.users):
            out.add(n)
    return frozenset(out)


def single_call(graph: torch.fx.Graph) -> int | None:
    """The site of the kernel call that is the whole program, or None.

    True when the graph is ``return call(inputs...)``: one kernel call reading the
    tensor inputs in order and nothing else, its results the outputs in order.
    The module then holds no compiled code, and the runtime may call that host
    function without entering the IREE VM (``CompiledModule``).
    """
    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    calls = [n for n in graph.nodes if n.op == "call_function"
             and isinstance(n.target, torch._ops.OpOverload) and n.target.namespace == "aot_kc"]
    rest = [n for n in graph.nodes if n.op == "call_function" and n not in calls
            and not (n.target is operator.getitem and n.args[0] in calls)]
    if len(calls) != 1 or rest or list(calls[0].args[:-1]) != inputs:
        return None
    k = calls[0]
    out = next(n for n in graph.nodes if n.op == "output").args[0]
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    val = k.meta.get("val")
    if isinstance(val, (list, tuple)):
        want = [("item", i) for i in range(len(val))]
        got = [("item", o.args[1]) if isinstance(o, torch.fx.Node) and o.target is operator.getitem
               and o.args[0] is k else None for o in outs]
    else:
        want, got = [k], outs
    return k.args[-1] if got == want else None


def _decompose_uncovered(ep, target, policy, cache, kept: dict):
    """Probe; decompose uncovered ops that have a decomposition; repeat to a fixpoint.

    Under ``placement="auto"``, a quantized ``aot_q`` op (ATen kernel and our
    integer decomposition) is decomposed only when its decomposition, compiled
    by IREE, measures faster in total over the op's call sites; else it stays a
    kernel call and ``kept[op]`` holds the measured reason.
    """
    tried: set = set()
    for _ in range(_MAX_DECOMPOSITION_ROUNDS):
        nodes = [n for n in _op_nodes(ep) if not matches_forced(n.target, policy.fallback_ops)]
        verdicts = probe_nodes(nodes, target, cache)
        table = {}
        user_inputs = _user_inputs(ep)
        for n in nodes:
            if iree_fault(n, user_inputs) is not None:
                continue  # runs in ATen: its decomposition, compiled, is what IREE gets wrong
            if not verdicts[op_signature(n)].covered and n.target not in tried:
                fn = decomposition_for(n.target)
                if fn is not None:
                    table[n.target] = fn
        for op in [op for op in table if _measure_before_decomposing(op, policy, target)]:
            reason = _aten_faster(op, table[op], [n for n in nodes if n.target == op], target)
            if reason:
                kept[op] = reason
                del table[op]
                tried.add(op)
        if not table:
            return ep, verdicts
        tried.update(table)
        try:
            log.info("decomposing ops IREE does not lower: %s", sorted(map(op_name, table)))
            decomposed = ep.run_decompositions(table)
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
    return ep, probe_nodes(_op_nodes(ep), target, cache)


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
    from ..fallback.quantized_ops import NAMESPACE
    return (policy.fallback == "auto" and policy.placement == "auto"
            and isinstance(op, torch._ops.OpOverload) and op.namespace == NAMESPACE
            and (target.driver.startswith("local") or torch.cuda.is_available()))


def _aten_faster(op, decomposition, nodes, target: Target) -> str | None:
    """Measured reason to keep ``op`` in ATen rather than decompose it, or None."""
    from .cost import CROSSING_MS, CostCache, measure_decomposed
    cache = CostCache(target)
    costs = [measure_decomposed(n, decomposition, target, cache) for n in nodes]
    if any(c.aten_ms is None or c.iree_ms is None for c in costs):
        return None
    aten_ms = sum(c.aten_ms + CROSSING_MS for c in costs)
    iree_ms = sum(c.iree_ms for c in costs)
    if aten_ms >= iree_ms:
        return None
    return (f"ATen's kernel is faster here than IREE's code for its decomposition: "
            f"{aten_ms:.2f} ms vs {iree_ms:.2f} ms over {len(nodes)} call site(s), "
            "measured on this machine")


def _costs(ep, target: Target, policy: PlacementPolicy, verdicts) -> dict:
    """Measured ATen-vs-IREE costs of the heavy covered ops (``placement="auto"``)."""
    if policy.fallback != "auto" or policy.placement != "auto":
        return {}
    if not target.driver.startswith("local") and not torch.cuda.is_available():
        return {}  # compiling for a device this machine lacks: nothing to measure on
    heavy = [n for n in _op_nodes(ep) if isinstance(n.target, torch._ops.OpOverload)
             and verdicts.get(op_signature(n), Verdict(False)).covered
             and (node_flops(n) or 0) >= MIN_FLOPS]
    if not heavy:
        return {}
    from .cost import CostCache, measure_nodes
    return measure_nodes(heavy, target, CostCache(target))


def _user_inputs(ep) -> set:
    return {s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"}


def _place(ep, policy: PlacementPolicy, verdicts: dict[str, Verdict], demoted: dict[str, str],
           costs: dict | None = None, kept: dict | None = None):
    placements, decided = [], {}
    user_inputs = _user_inputs(ep)
    for n in _op_nodes(ep):
        name = op_name(n.target)
        if not isinstance(n.target, torch._ops.OpOverload):
            where, why = COMPILED, "symbolic scalar arithmetic (always compiled)"
        elif policy.fallback == "all":
            where, why = KERNEL_CALL, "fallback='all'"
        elif matches_forced(n.target, policy.fallback_ops):
            where, why = KERNEL_CALL, "forced by fallback_ops"
        elif n.name in demoted:
            where, why = KERNEL_CALL, ("lowers alone, but IREE failed on it fused with its "
                                       f"neighbours: {demoted[n.name]}")
        elif (fault := iree_fault(n, user_inputs)) is not None:
            where, why = KERNEL_CALL, fault
        else:
            v = verdicts[op_signature(n)]
            where, why = (COMPILED, "lowered by IREE") if v.covered else (KERNEL_CALL, v.reason)
            if not v.covered and n.target in (kept or {}):
                why = kept[n.target]
            cost = (costs or {}).get(op_signature(n))
            if v.covered and cost is not None and cost.aten_wins:
                where, why = KERNEL_CALL, cost.reason()
        decided[n] = (where, why)
        placements.append(Placement(n.name, name, where, why, node_location(n), node_flops(n)))
    return placements, decided


class HostConstants:
    """Names for the constants kernel calls read (one entry per tensor, however often read)."""

    def __init__(self):
        self._names: dict[int, str] = {}
        self.tensors: dict[str, torch.Tensor] = {}

    def name(self, t: torch.Tensor) -> str:
        if id(t) not in self._names:
            self._names[id(t)] = f"c{len(self.tensors)}"
            self.tensors[self._names[id(t)]] = t  # held: ids stay unique
        return self._names[id(t)]


def _crossing(spec: KernelCallSpec, operands: list) -> list:
    return [v for i, v in enumerate(operands) if spec.constant_name(i) is None]


def _rewrite(node, g: torch.fx.Graph, env: dict, decided: dict, specs: list,
             grouping: "_Grouping", node_keys: dict, consts: HostConstants):
    if node.op == "call_function" and _is_assert(node):
        return DROP  # checked by the runtime's input specs instead
    if node.target is operator.getitem and node.args[0] in grouping.values:
        v = grouping.values[node.args[0]][node.args[1]]
        return DROP if v is None else v  # DROP: only used inside its group
    if node in grouping.group_of:
        if node not in grouping.values:
            _emit_group(grouping.group_of[node], g, env, decided, specs, grouping, node_keys,
                        consts)
        v = grouping.values[node]
        if _n_results(node) > 1:
            return v
        return DROP if v[0] is None else v[0]  # DROP: only used inside its group
    where, reason = decided.get(node, (COMPILED, ""))
    if where != KERNEL_CALL:
        # None: copied as it is
        return compiled_forms.emit(node, g, env)
    spec, operands, scalars, _ = _kernel_call_spec(node, env, f"call_{len(specs)}", reason, consts)
    ins = "t" * len(spec.crossing) + "".join(spec.scalar_inputs)
    new = g.call_function(kernel_call_op(ins, spec.out_kinds),
                          (*_crossing(spec, operands), *scalars, len(specs)))
    new.meta = dict(node.meta)
    val = node.meta.get("val")
    if isinstance(val, list):
        new.meta["val"] = tuple(val)
    specs.append(spec)
    node_keys[node.name] = spec.key
    return new


@dataclass
class _Grouping:
    """Neighbouring kernel calls run as one crossing.

    ``group_of`` maps each member to its group (members in graph order);
    ``values`` maps a member, once its group is emitted, to a list with one
    new-graph value per result (None for results nobody outside uses).
    """

    group_of: dict
    values: dict
    skip: frozenset = frozenset()  # size nodes kernel calls record (``_recorded_sizes``)

    @staticmethod
    def find(ep, decided, skip: frozenset = frozenset()) -> "_Grouping":
        """Maximal runs of groupable kernel calls in graph order.

        A kernel call joins the open group unless it reads a value produced by
        a node that is not in the group and comes after the group's first member
        (the group runs at its first member's position, so its inputs must exist
        by then). Ops with run-time scalar operands or results stay alone.
        """
        sig = ep.graph_signature
        held = {*sig.inputs_to_parameters, *sig.inputs_to_buffers,
                *sig.inputs_to_lifted_tensor_constants}  # host-held: do not cross
        groups, cur, after, width = [], [], set(), _Width(held, skip)
        for n in _op_nodes(ep):
            if n in skip:
                continue
            if decided.get(n, (COMPILED,))[0] == KERNEL_CALL and _groupable(n):
                deps = {_source(a) for a in n.all_input_nodes if a not in skip}
                if cur and not deps & after and width.admits(n):
                    cur.append(n)
                    width.add(n)
                    continue
                if len(cur) > 1:
                    groups.append(cur)
                cur, after, width = [n], set(), _Width(held, skip)
                width.add(n)
            elif cur:
                after.add(n)
        if len(cur) > 1:
            groups.append(cur)
        return _Grouping({m: tuple(grp) for grp in groups for m in grp}, {}, skip)


class _Width:
    """The values crossing into and out of an open group, kept exactly as members join.

    In: distinct values read from outside the group, host-held constants not
    counted. Out: member results read by a node outside the group (a later
    member reading a result takes it off the count).
    """

    def __init__(self, held: set, skip: frozenset = frozenset()):
        self.held, self.members, self.skip = held, set(), skip
        self.ins: set = set()
        self.outs: set = set()  # (member, result index)

    def _step(self, n: torch.fx.Node) -> tuple[set, set]:
        members = self.members
        members.add(n)  # tentatively (sets of at most 60 are copied, the members never)
        try:
            ins = self.ins | {a for a in n.all_input_nodes if _source(a) not in members
                              and a.name not in self.held and a not in self.skip}
            outs = set(self.outs)
            for a in n.all_input_nodes:
                src = _source(a)
                if src is not n and src in members:
                    r = a.args[1] if a is not src else 0
                    if (src, r) in outs and not _used_outside(src, r, members | self.skip):
                        outs.discard((src, r))
            outs |= {(n, r) for r in range(_n_results(n))
                     if _used_outside(n, r, members | self.skip)}
        finally:
            members.discard(n)
        return ins, outs

    def admits(self, n: torch.fx.Node) -> bool:
        ins, outs = self._step(n)
        return len(ins) <= _MAX_GROUP_INPUTS and len(outs) <= _MAX_GROUP_OUTPUTS

    def add(self, n: torch.fx.Node) -> None:
        self.ins, self.outs = self._step(n)
        self.members.add(n)


def _source(a: torch.fx.Node) -> torch.fx.Node:
    return a.args[0] if a.op == "call_function" and a.target is operator.getitem else a


def _n_results(n: torch.fx.Node) -> int:
    v = n.meta.get("val")
    return len(v) if isinstance(v, (list, tuple)) else 1


def _groupable(n: torch.fx.Node) -> bool:
    if not isinstance(n.target, torch._ops.OpOverload):
        return False
    v = n.meta.get("val")
    vals = list(v) if isinstance(v, (list, tuple)) else [v]
    if not vals or not all(isinstance(x, torch.Tensor) for x in vals):
        return False
    flat = torch.fx.node.map_aggregate((n.args, n.kwargs), lambda a: a)
    nodes = []
    torch.fx.node.map_arg(flat, nodes.append)
    # a size that follows a symbol is recorded, not read (``symbolic_sizes``)
    return not any(_scalar_kind(a) and symbolic_sizes(a) is None for a in nodes)


def _used_outside(n: torch.fx.Node, r: int, members: set) -> bool:
    if _n_results(n) == 1 and not any(u.target is operator.getitem for u in n.users):
        return any(u not in members for u in n.users)
    return any(u.target is operator.getitem and u.args[1] == r
               and any(w not in members for w in u.users) for u in n.users)


def _emit_group(members, g, env, decided, specs, grouping, node_keys, consts) -> None:
    """One kernel call for ``members``: external inputs in, outside-used results out."""
    member_set = set(members)
    key = f"call_{len(specs)}"
    ext_index: dict = {}            # original arg (node, or id of a constant) -> input number
    ext_operands, ext_specs, ext_consts = [], [], []
    produced: dict = {}             # (member, result) -> position among member results
    n_member_results = 0
    raw = []                        # (member spec, local tensor index -> ("in"|"res", k))
    for i, m in enumerate(members):
        spec, operands, _, sources = _kernel_call_spec(m, env, f"{key}.{i}", decided[m][1], consts)
        where = {}
        for j, a in enumerate(sources):
            src = _source(a) if isinstance(a, torch.fx.Node) else None
            if src in member_set:
                r = a.args[1] if a is not src else 0
                where[j] = ("res", produced[(src, r)])
            else:
                ident = a if isinstance(a, torch.fx.Node) else id(a)
                if ident not in ext_index:
                    ext_index[ident] = len(ext_operands)
                    ext_operands.append(operands[j])
                    ext_specs.append(spec.inputs[j])
                    ext_consts.append(spec.constant_name(j))
                where[j] = ("in", ext_index[ident])
        raw.append((spec, where))
        for r in range(len(spec.results)):
            produced[(m, r)] = n_member_results
            n_member_results += 1
    n_in = len(ext_operands)

    def slot(w):
        return w[1] if w[0] == "in" else n_in + w[1]
    specs_out = []
    for spec, where in raw:
        ops = []
        for o in spec.operands:
            if isinstance(o, TensorArg):
                o = TensorArg(o.name, slot(where[o.index]), o.spec, o.kwarg_only, o.constant)
            elif isinstance(o, TensorListArg):
                o = TensorListArg(o.name, tuple(None if i is None else slot(where[i])
                                                for i in o.indices), o.kwarg_only)
            ops.append(o)
        specs_out.append(dataclasses.replace(spec, operands=tuple(ops), inputs=(), constants=()))
    outputs = [(m, r) for m in members for r in range(_n_results(m))
               if _used_outside(m, r, member_set | grouping.skip)]
    out_specs, out_vals, out_slots = [], [], []
    for m, r in outputs:
        spec = specs_out[members.index(m)]
        out_specs.append(spec.results[r])
        v = m.meta.get("val")
        out_vals.append(v[r] if isinstance(v, (list, tuple)) else v)
        out_slots.append(n_in + produced[(m, r)])
    reasons = sorted({decided[m][1] for m in members})
    group = KernelCallSpec(key, GROUP_OP, "", (), tuple(out_specs), node_location(members[0]),
                           "; ".join(reasons), tuple(ext_specs), members=tuple(specs_out),
                           output_slots=tuple(out_slots), constants=tuple(ext_consts))
    new = g.call_function(kernel_call_op("t" * len(group.crossing), "t" * len(outputs)),
                          (*_crossing(group, ext_operands), len(specs)))
    # only what the importer should read: the values (not members[0]'s tensor_meta)
    new.meta = {k: v for k, v in members[0].meta.items() if k in ("stack_trace", "nn_module_stack")}
    new.meta["val"] = tuple(out_vals) if len(out_vals) > 1 else out_vals[0]
    specs.append(group)
    for m in members:
        node_keys[m.name] = key
        grouping.values[m] = [None] * _n_results(m)
    for i, (m, r) in enumerate(outputs):
        if len(outputs) == 1:
            grouping.values[m][r] = new
        else:
            gi = g.call_function(operator.getitem, (new, i))
            gi.meta["val"] = out_vals[i]
            grouping.values[m][r] = gi


def _tensor_val(a):
    if isinstance(a, torch.fx.Node):
        v = a.meta.get("val")
        return v if isinstance(v, torch.Tensor) else None
    return a if isinstance(a, torch.Tensor) else None


def _scalar_kind(a) -> str | None:
    """``i``/``f``/``b`` for an FX node holding a run-time scalar, else None."""
    if not isinstance(a, torch.fx.Node):
        return None
    v = a.meta.get("val")
    if isinstance(v, (torch.SymBool, bool)):
        return "b"
    if isinstance(v, (torch.SymInt, int)):
        return "i"
    if isinstance(v, (torch.SymFloat, float)):
        return "f"
    return None


def _kernel_call_spec(node, env, key, reason, consts: HostConstants):
    """Walk the op's schema with its defaults.

    Tensors become tensor operands (constants: host-held, named in ``consts``),
    FX nodes holding scalars become run-time scalar operands, everything else
    is recorded as a StaticArg. Returns the spec, the new-graph value of every
    tensor operand (constants included), the scalar operands, and the original
    argument of every tensor operand.
    """
    target = node.target
    name, loc = op_name(target), node_location(node)
    if not isinstance(target, torch._ops.OpOverload):
        raise UnsupportedOp(f"{target} is not an ATen/library op and cannot be a kernel call",
                            op=name, location=loc)
    schema = target._schema
    operands, inputs, recorded, scalars, scalar_kinds, sources = [], [], [], [], [], []
    held = []

    def add_tensor(a):
        val = _tensor_val(a)
        # a value made inside a group has no new-graph node (the group carries it)
        value = env.get(a) if isinstance(a, torch.fx.Node) else a
        operands.append(value)
        sources.append(a)
        inputs.append(TorchTensor.from_tensor(val).dense())
        held.append(consts.name(value) if isinstance(value, torch.Tensor) else None)
        return len(operands) - 1

    def is_constant(a):  # parameters and buffers are inlined as tensors by stateless_graph
        if isinstance(a, torch.fx.Node):
            return a in env and not isinstance(env[a], torch.fx.Node)
        return True

    for i, arg in enumerate(schema.arguments):
        if i < len(node.args):
            value = node.args[i]
        elif arg.name in node.kwargs:
            value = node.kwargs[arg.name]
        elif arg.has_default_value():
            value = arg.default_value
        else:
            raise UnsupportedOp(f"missing operand {arg.name!r}", op=name, location=loc)
        kw = arg.kwarg_only
        if _tensor_val(value) is not None:
            idx = add_tensor(value)
            recorded.append(TensorArg(arg.name, idx, inputs[idx], kw, is_constant(value)))
        elif isinstance(value, (list, tuple)) and any(_tensor_val(v) is not None for v in value):
            recorded.append(TensorListArg(arg.name, tuple(
                None if v is None else add_tensor(v) for v in value), kw))
        elif (sizes := symbolic_sizes(value)) is not None:
            # sizes that follow a dynamic dimension: recorded as expressions over the
            # program's symbols, evaluated per call (the static-value contract's "size")
            recorded.append(StaticArg(arg.name, str(arg.type), static_values.encode(sizes), kw))
        elif _scalar_kind(value) is not None:
            scalars.append(env[value])
            scalar_kinds.append(_scalar_kind(value))
            recorded.append(ScalarArg(arg.name, len(scalars) - 1, scalar_kinds[-1], kw))
        elif isinstance(value, torch.fx.Node) or _has_node(value):
            raise UnsupportedOp(f"operand {arg.name!r} holds a value only known at run time "
                                f"that cannot cross into a kernel call ({_describe(value)}); "
                                "run-time scalars can, lists of them cannot", op=name, location=loc)
        else:
            try:
                recorded.append(StaticArg(arg.name, str(arg.type), static_values.encode(value), kw))
            except TypeError as e:
                raise UnsupportedOp(f"operand {arg.name!r}: {e}", op=name, location=loc) from None
    results, kinds = _result_specs(node, name, loc)
    recorded, inputs, results = quantized_boundary(schema.name, recorded, inputs, results)
    spec = KernelCallSpec(key, schema.name, target._overloadname, tuple(recorded), results,
                          loc, reason, tuple(inputs), tuple(scalar_kinds),
                          "" if kinds == "t" * len(results) else kinds,
                          constants=tuple(held) if any(held) else ())
    return spec, operands, scalars, sources


def quantized_boundary(op: str, recorded: list, inputs: list, results: tuple):
    """Give the quantized operands/results of an ``aot_q`` op their ``quint8`` specs.

    The op's activations are integer storage with static qparams in other
    operands; across the kernel call they become real quantized tensors (the
    executor rebuilds them from the spec), so ATen sees what it saw in eager.
    """
    q = QUANT_OPERANDS.get(op)
    if q is None:
        return recorded, inputs, results
    static = {o.name: static_values.decode(o.value) for o in recorded if isinstance(o, StaticArg)}

    def qspec(t: TorchTensor, names) -> TorchTensor:
        if names[0] not in static or names[1] not in static:
            return t  # a run-time scale: stays integer storage
        return TorchTensor("quint8", t.shape, t.strides,
                           QuantParams("per_tensor_affine", float(static[names[0]]),
                                       int(static[names[1]])))

    inputs, new = list(inputs), []
    for o in recorded:
        if isinstance(o, TensorArg) and o.name in q.inputs:
            inputs[o.index] = qspec(inputs[o.index], q.inputs[o.name])
            o = TensorArg(o.name, o.index, inputs[o.index], o.kwarg_only, o.constant)
        new.append(o)
    if q.result is not None:
        results = tuple(qspec(r, q.result) for r in results)
    return new, inputs, results


def _describe(value) -> str:
    if isinstance(value, torch.fx.Node):
        return f"{value.name}: {type(value.meta.get('val')).__name__}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_describe(v) for v in value) + "]"
    return repr(value)


def _has_node(value) -> bool:
    return isinstance(value, (list, tuple)) and any(isinstance(v, torch.fx.Node) for v in value)


_RESULT_KINDS = ((torch.SymBool, "b"), (bool, "b"), (torch.SymInt, "i"), (int, "i"),
                 (torch.SymFloat, "f"), (float, "f"), (torch.Tensor, "t"))


def _result_specs(node, name, loc) -> tuple[tuple[TorchTensor, ...], str]:
    """Tensor result specs and the kind letter of every result."""
    val = node.meta.get("val")
    vals = list(val) if isinstance(val, (list, tuple)) else [val]
    kinds = "".join(next((k for t, k in _RESULT_KINDS if isinstance(v, t)), "?") for v in vals)
    if not vals or "?" in kinds:
        raise UnsupportedOp("only ops returning tensors and scalars can be kernel calls "
                            f"(this one returns {type(val).__name__})", op=name, location=loc)
    return tuple(TorchTensor.from_tensor(v) for v in vals if isinstance(v, torch.Tensor)), kinds
