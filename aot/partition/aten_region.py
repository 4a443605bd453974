"""When a program must run as one ATen region, and its host-program record.

``host_reason`` says why compiled code cannot hold a program (or None): a value
whose shape depends on the data, a dtype IREE has no type for, an int/float/bool
output only known at run time, a buffer updated in place. ``record`` writes the
program's functional graph as the manifest's ``host_program`` entry (format in
``aot.fallback.host_program``, which runs it), with its weights as host-held
constants. ``compile_model`` also chooses this region when IREE fails on the
program however it is split, under ``fallback="auto"``/``"all"``.
"""

from __future__ import annotations

import torch

from ..errors import UnsupportedOp
from ..fallback import static_values
from ..fallback.host_program import py_function_name
from ..importer.locations import node_location
from ..importer.program import ImportedProgram
from ..torch_tensor import TorchTensor
from .outline import carried

__all__ = ["host_reason", "record"]


def _hidden_write(n: torch.fx.Node) -> bool:
    """An op export keeps whole that updates operands its schema does not mark as
    written: ``instance_norm`` with input statistics updates ``running_mean`` and
    ``running_var`` (through batch norm) and export records no mutation."""
    if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload) \
            or n.target._schema.name != "aten::instance_norm":
        return False
    args = list(n.args) + [None] * 9
    stats = args[3] is not None or args[4] is not None or n.kwargs.get("running_mean") \
        is not None or n.kwargs.get("running_var") is not None
    return bool(n.kwargs.get("use_input_stats", args[5])) and stats


def _values(v):
    if isinstance(v, (list, tuple)):
        for x in v:
            yield from _values(x)
    else:
        yield v


# ops whose result depends on their operand's storage and strides, not only its
# values: compiled code and kernel calls hold dense copies, so they run on eager's
STORAGE_OPS = {"aten::as_strided", "aten::as_strided_copy", "aten::as_strided_scatter"}


# higher-order control flow the host program runs (``aot.fallback.host_program``) where
# the whole program runs there (``fallback="all"``, or a program compiled code cannot
# hold): its graph operands are recorded as sub-programs
HOPS = {torch.ops.higher_order.cond: "hop:cond",
        torch.ops.higher_order.while_loop: "hop:while_loop"}


def host_reason(imported: ImportedProgram) -> str | None:
    """Why compiled code cannot hold this program, or None when it can."""
    if any(o[0] == "scalar" for o in imported.outputs if isinstance(o, tuple)):
        return "an output is an int/float/bool only known at run time"
    if any("buffer" in m for m in imported.mutations):
        return (f"the model updates its buffer {imported.mutations[0].get('buffer', '')!r} in "
                "place: the host keeps it")
    for n in imported.exported.graph.nodes:
        if isinstance(n.target, torch._ops.OpOverload) and n.target._schema.name in STORAGE_OPS:
            return (f"{n.name} ({_op(n)}, {node_location(n) or 'unknown location'}) reads its "
                    "operand's storage and strides, which only eager's tensors have")
        if _hidden_write(n):
            return (f"{n.name} ({_op(n)}, {node_location(n) or 'unknown location'}) updates its "
                    "running statistics in place, which export does not record: ATen runs "
                    "it on the caller's tensors")
        for v in _values(n.meta.get("val")):
            if not isinstance(v, torch.Tensor):
                continue
            spec = TorchTensor.from_tensor(v)
            if spec.is_sparse:
                return (f"{n.name} ({_op(n)}, {node_location(n) or 'unknown location'}) is a "
                        f"{spec.layout} tensor: only ATen holds sparse layouts")
            if spec.is_dynamic:
                return (f"{n.name} ({_op(n)}, {node_location(n) or 'unknown location'}) has a "
                        f"shape only known at run time {spec.short()}")
            if not carried(spec):
                return (f"{n.name} ({_op(n)}) is a {spec.dtype} tensor, a dtype compiled code "
                        "cannot hold")
    return None


def _op(n) -> str:
    return str(n.target) if n.op == "call_function" else n.op


def _target_name(n: torch.fx.Node) -> str:
    t = n.target
    if t in HOPS:
        return HOPS[t]
    if isinstance(t, torch._ops.OpOverload):
        return f"{t._schema.name}.{t._overloadname}"
    name = py_function_name(t)
    if name is None:
        raise UnsupportedOp(f"{t} cannot run in a host program (not an ATen/library op or a "
                            "scalar function export emits)", op=str(t), location=node_location(n))
    return name


def record(imported: ImportedProgram, reason: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """``(manifest entry, host-held constants)`` of the whole program as one ATen region.

    Raises:
        UnsupportedOp: a node the host cannot run (e.g. a higher-order op such as
            ``torch.cond``) or an operand that cannot be recorded.
    """
    ep = imported.exported
    sig = ep.graph_signature
    state = {**ep.state_dict, **getattr(ep, "constants", {})}
    lifted = {**sig.inputs_to_parameters, **sig.inputs_to_buffers,
              **sig.inputs_to_lifted_tensor_constants}
    mutated = set(sig.buffers_to_mutate.values())
    user = [s.arg.name for s in sig.input_specs if s.kind.name == "USER_INPUT"]
    constants: dict[str, torch.Tensor] = {}
    names: dict[int, str] = {}

    def constant(t: torch.Tensor) -> str:
        if id(t) not in names:
            names[id(t)] = f"h{len(constants)}"
            constants[names[id(t)]] = t.detach()
        return names[id(t)]

    def operand(a, n):
        if isinstance(a, torch.fx.Node):
            return {"node": a.name}
        if isinstance(a, torch.Tensor):
            return {"constant": constant(a)}
        if isinstance(a, (list, tuple)) and any(isinstance(x, (torch.fx.Node, torch.Tensor))
                                               for x in _values(a)):
            return {"tuple" if isinstance(a, tuple) else "list": [operand(x, n) for x in a]}
        try:
            return static_values.encode(a)
        except TypeError as e:
            raise UnsupportedOp(f"operand cannot be recorded: {e}", op=_op(n),
                                location=node_location(n)) from None

    graphs: dict[str, dict] = {}

    def subgraph(owner: torch.nn.Module, a: torch.fx.Node) -> dict:
        """``{"graph": name}`` of a branch or loop body, recorded into ``graphs``."""
        key = f"g{len(graphs)}"
        graphs[key] = {}  # reserved: nested graphs number after it
        gm = getattr(owner, a.target)
        ins = [{"node": p.name, "user": i}
               for i, p in enumerate(q for q in gm.graph.nodes if q.op == "placeholder")]
        graphs[key] = {"inputs": ins, **body(gm, gm.graph)}
        return {"graph": key}

    def body(owner: torch.nn.Module, graph: torch.fx.Graph) -> dict:
        nodes, outputs = [], []

        def arg(a, n):
            if isinstance(a, torch.fx.Node) and a.op == "get_attr":
                v = getattr(owner, a.target)
                if isinstance(v, torch.fx.GraphModule):
                    return subgraph(owner, a)
                if isinstance(v, torch.Tensor):
                    return {"constant": constant(v)}
            if isinstance(a, (list, tuple)) and any(isinstance(x, torch.fx.Node) for x in a):
                return {"tuple" if isinstance(a, tuple) else "list": [arg(x, n) for x in a]}
            return operand(a, n)
        for n in graph.nodes:
            if n.op == "call_function":
                nodes.append({"name": n.name, "target": _target_name(n),
                              "args": [arg(a, n) for a in n.args],
                              "kwargs": {k: arg(v, n) for k, v in n.kwargs.items()},
                              "location": node_location(n)})
            elif n.op == "output":
                outputs = [arg(a, n) for a in _values(n.args[0])]
        return {"nodes": nodes, "outputs": outputs}

    inputs = []
    for n in ep.graph.nodes:
        if n.op == "placeholder":
            if n.name in lifted:
                t = state[lifted[n.name]]
                entry = {"node": n.name, "strides": list(t.stride())}  # eager's layout
                if lifted[n.name] in mutated:
                    entry.update(state=constant(t), buffer=lifted[n.name])
                else:
                    entry["constant"] = constant(t)
                inputs.append(entry)
            elif n.name in user:
                inputs.append({"node": n.name, "user": user.index(n.name)})
    top = body(ep.graph_module, ep.graph)
    nodes, outputs = top["nodes"], top["outputs"]
    if len(user) != len(imported.flat_inputs):
        raise UnsupportedOp(f"the program has {len(user)} user inputs for "
                            f"{len(imported.flat_inputs)} input leaves")
    entry = {"reason": reason, "inputs": inputs, "nodes": nodes, "outputs": outputs,
             "mutations": list(imported.mutations)}
    if graphs:
        entry["graphs"] = graphs
    return entry, constants

