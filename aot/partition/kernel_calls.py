"""kernel_calls: the program's graph rewritten into kernel calls.

Each op placed in ATen is recorded as a KernelCallSpec by walking its
FunctionSchema with its defaults (tensor, run-time scalar and static operands)
and replaced by an ``aot_kc`` placeholder call (``kernel_call_op``), which
``outline`` later turns into a call of a host function; a group (``grouping``)
becomes one such call whose members run in order over value slots. Compiled ops
are copied as they are (the IREE backend writes them in its forms: ``aot.backend.lower``).
"""

from __future__ import annotations

import dataclasses
import operator

import torch
import torch.fx

from ..errors import UnsupportedOp
from ..fallback import static_values
from ..fallback.quantized_ops import QUANT_OPERANDS
from ..fallback.spec import (GROUP_OP, KernelCallSpec, ScalarArg, StaticArg, TensorArg,
                             TensorListArg)
from ..importer.dynamic import symbolic_sizes
from ..importer.fx_import import DROP, copy_graph, stateless_graph
from ..importer.locations import node_location
from ..torch_tensor import QuantParams, TorchTensor
from .decisions import CONTROL_FLOW, is_assert
from .grouping import Grouping, n_results, scalar_kind, source, used_outside
from .kernel_call_op import kernel_call_op
from .placement import COMPILED, KERNEL_CALL, op_name

__all__ = ["HostConstants", "quantized_boundary", "rewrite_graph", "rewrite_subgraph"]


def rewrite_graph(ep, decided: dict, sizes: frozenset, grouping: Grouping):
    """The stateless graph of ``ep`` with its kernel calls as ``aot_kc`` placeholder calls.

    Args:
        ep: the program as ``decisions`` left it.
        decided: op node -> ``(where, why)``, from ``decisions``.
        sizes: size nodes kernel calls record: dropped.
        grouping: from ``grouping``; filled in as groups are emitted.
    Returns:
        The new graph, the KernelCallSpecs in site order, op node name -> kernel
        call key, and the host-held constants the calls read.
    Raises:
        UnsupportedOp: an op's operands cannot be recorded for a kernel call.
    """
    specs: list[KernelCallSpec] = []
    node_keys: dict[str, str] = {}
    consts = HostConstants()
    graph = stateless_graph(ep, lambda n, g, env: DROP if n in sizes else _rewrite(
        n, g, env, decided, specs, grouping, node_keys, consts))
    return graph, specs, node_keys, consts


def rewrite_subgraph(gm: torch.fx.GraphModule, decided: dict, specs: list, node_keys: dict,
                     consts: "HostConstants", prefix: str) -> torch.fx.GraphModule:
    """A control-flow graph of the program (a loop's condition or body, a branch) with
    its kernel calls as ``aot_kc`` placeholder calls, one each (no groups), their specs
    appended to ``specs`` (site numbers go on from the program's) and their keys to
    ``node_keys`` under ``<prefix>.<node>``, the name of the op's placement row."""
    keys: dict = {}
    none = Grouping({}, {}, frozenset())
    g = copy_graph(gm.graph, lambda node, g, env: _rewrite(node, g, env, decided, specs, none,
                                                           keys, consts))
    node_keys.update({f"{prefix}.{k}": v for k, v in keys.items()})
    new = torch.fx.GraphModule(gm, g)
    for node in gm.graph.nodes:  # control flow nested in it
        for i in CONTROL_FLOW.get(node.target, (None, ()))[1]:
            name = node.args[i].target
            setattr(new, name, rewrite_subgraph(getattr(gm, name), decided, specs, node_keys,
                                                consts, f"{prefix}.{node.name}"))
    return new


def _rewrite(node, g: torch.fx.Graph, env: dict, decided: dict, specs: list,
             grouping: Grouping, node_keys: dict, consts: HostConstants):
    if node.op == "call_function" and is_assert(node):
        return DROP  # checked by the runtime's input specs instead
    if node.target is operator.getitem and node.args[0] in grouping.values:
        v = grouping.values[node.args[0]][node.args[1]]
        return DROP if v is None else v  # DROP: only used inside its group
    if node in grouping.group_of:
        if node not in grouping.values:
            _emit_group(grouping.group_of[node], g, env, decided, specs, grouping, node_keys,
                        consts)
        v = grouping.values[node]
        if n_results(node) > 1:
            return v
        return DROP if v[0] is None else v[0]  # DROP: only used inside its group
    where, reason = decided.get(node, (COMPILED, ""))
    if where != KERNEL_CALL:
        return None  # copied as it is
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
            src = source(a) if isinstance(a, torch.fx.Node) else None
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
    outputs = [(m, r) for m in members for r in range(n_results(m))
               if used_outside(m, r, member_set | grouping.skip)]
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
        grouping.values[m] = [None] * n_results(m)
    for i, (m, r) in enumerate(outputs):
        if len(outputs) == 1:
            grouping.values[m][r] = new
        else:
            gi = g.call_function(operator.getitem, (new, i))
            gi.meta["val"] = out_vals[i]
            grouping.values[m][r] = gi


def _crossing(spec: KernelCallSpec, operands: list) -> list:
    return [v for i, v in enumerate(operands) if spec.constant_name(i) is None]


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
        elif scalar_kind(value) is not None:
            scalars.append(env[value])
            scalar_kinds.append(scalar_kind(value))
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


def _tensor_val(a):
    if isinstance(a, torch.fx.Node):
        v = a.meta.get("val")
        return v if isinstance(v, torch.Tensor) else None
    return a if isinstance(a, torch.Tensor) else None


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

    def qspec(t: TorchTensor, names, item: int | None = None) -> TorchTensor:
        if names[0] not in static or names[1] not in static:
            return t  # a run-time scale: stays integer storage
        scale, zp = static[names[0]], static[names[1]]
        if item is not None:  # a Tensor[] operand: per-element lists of parameters
            scale, zp = scale[item], zp[item]
        return TorchTensor("quint8", t.shape, t.strides,
                           QuantParams("per_tensor_affine", float(scale), int(zp)))

    inputs, new = list(inputs), []
    for o in recorded:
        if isinstance(o, TensorArg) and o.name in q.inputs:
            inputs[o.index] = qspec(inputs[o.index], q.inputs[o.name])
            o = TensorArg(o.name, o.index, inputs[o.index], o.kwarg_only, o.constant)
        elif isinstance(o, TensorListArg) and o.name in q.inputs:
            for i, index in enumerate(o.indices):
                if index is not None:
                    inputs[index] = qspec(inputs[index], q.inputs[o.name], i)
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
