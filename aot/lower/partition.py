"""partition: ImportedProgram -> PartitionedProgram.

Second link of the chain. Measures coverage (``coverage``), decomposes ops IREE
cannot lower when a decomposition exists, places every op (``placement``),
records a KernelCallSpec per fallen-back op by walking its FunctionSchema, and
builds the outlined Torch-dialect module that ``compile_program`` compiles.
"""

from __future__ import annotations

import logging
import operator
from dataclasses import dataclass

import torch
import torch.fx

from ..errors import UnsupportedOp
from ..fallback import static_values
from ..fallback.quantized_ops import QUANT_OPERANDS
from ..fallback.spec import KernelCallSpec, ScalarArg, StaticArg, TensorArg, TensorListArg
from ..importer.decompositions import decomposition_for
from ..importer.fx_import import DROP, import_graph, stateless_graph
from ..importer.locations import node_location
from ..importer.program import ImportedProgram
from ..torch_tensor import QuantParams, TorchTensor
from .cost import MIN_FLOPS
from .coverage import CoverageCache, Verdict, op_signature, probe_nodes
from .flops import node_flops
from .kernel_call_op import kernel_call_op
from .outline import outline_kernel_calls
from .placement import COMPILED, KERNEL_CALL, Placement, PlacementPolicy, matches_forced, op_name
from .targets import Target

__all__ = ["PartitionedProgram", "partition", "torch_mlir"]
log = logging.getLogger(__name__)
_MAX_DECOMPOSITION_ROUNDS = 4


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

    def __post_init__(self):
        keys = [k.key for k in self.kernel_calls]
        assert len(set(keys)) == len(keys), "kernel call keys must be unique"
        assert sum(p.where == KERNEL_CALL for p in self.placements) == len(keys)


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
    graph = stateless_graph(ep, lambda n, g, env: _rewrite(n, g, env, decided, specs))
    module = outline_kernel_calls(import_graph(graph), specs)
    keys = iter(s.key for s in specs)
    placements = tuple(
        Placement(p.node, p.op, p.where, p.reason, p.location, p.flops,
                  next(keys) if p.where == KERNEL_CALL else None) for p in placements)
    producers = {n.name: tuple(a.name for a in n.all_input_nodes if a.op == "call_function")
                 for n in _op_nodes(ep)}
    return PartitionedProgram(imported, target, policy, placements, tuple(specs), str(module),
                              producers)


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
        for n in nodes:
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
            ep = ep.run_decompositions(table)
        except Exception as e:  # a decomposition torch cannot apply: keep the op as a kernel call
            log.info("decomposition failed (%s); keeping those ops as kernel calls", e)
            return ep, verdicts
    return ep, probe_nodes(_op_nodes(ep), target, cache)


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


def _place(ep, policy: PlacementPolicy, verdicts: dict[str, Verdict], demoted: dict[str, str],
           costs: dict | None = None, kept: dict | None = None):
    placements, decided = [], {}
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


def _rewrite(node, g: torch.fx.Graph, env: dict, decided: dict, specs: list):
    if node.op == "call_function" and _is_assert(node):
        return DROP  # checked by the runtime's input specs instead
    where, reason = decided.get(node, (COMPILED, ""))
    if where != KERNEL_CALL:
        return None
    spec, operands = _kernel_call_spec(node, env, f"call_{len(specs)}", reason)
    ins = "t" * len(spec.inputs) + "".join(spec.scalar_inputs)
    new = g.call_function(kernel_call_op(ins, spec.out_kinds), (*operands, len(specs)))
    new.meta = dict(node.meta)
    val = node.meta.get("val")
    if isinstance(val, list):
        new.meta["val"] = tuple(val)
    specs.append(spec)
    return new


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


def _kernel_call_spec(node, env, key, reason):
    """Walk the op's schema with its defaults.

    Tensors become tensor operands, FX nodes holding scalars become run-time
    scalar operands, everything else is recorded as a StaticArg. Returns the
    spec and the host function's operands (tensors first, then scalars).
    """
    target = node.target
    name, loc = op_name(target), node_location(node)
    if not isinstance(target, torch._ops.OpOverload):
        raise UnsupportedOp(f"{target} is not an ATen/library op and cannot be a kernel call",
                            op=name, location=loc)
    schema = target._schema
    operands, inputs, recorded, scalars, scalar_kinds = [], [], [], [], []

    def add_tensor(a):
        val = _tensor_val(a)
        operands.append(env[a] if isinstance(a, torch.fx.Node) else a)
        inputs.append(TorchTensor.from_tensor(val).dense())
        return len(operands) - 1

    def is_constant(a):  # parameters and buffers are inlined as tensors by stateless_graph
        return not isinstance(env[a] if isinstance(a, torch.fx.Node) else a, torch.fx.Node)

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
                          "" if kinds == "t" * len(results) else kinds)
    return spec, operands + scalars


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
