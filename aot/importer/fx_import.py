"""FX graph -> Torch-dialect MLIR, through the FX importer bundled with IREE.

We build a *stateless* copy of the exported graph (parameters and buffers
inlined as literals, non-tensor user inputs replaced by their baked value) and
hand it to ``FxImporter.import_stateless_graph``. The exported program itself
is never mutated (``import_frozen_program`` erases its placeholders), so the
same export can be imported again with different substitutions.

With a :class:`Parameters` collector, every floating-point weight of at least
``PARAMETER_MIN_BYTES`` becomes a module-level ``util.global`` whose value is the named
IREE parameter ``#stream.parameter.named<"aot"::"pN">``, read where the literal was:
iree-compile then never parses, copies or serializes the weights (for a transformer,
hundreds of MB that made most of a compile's time and memory traffic), and the
runtime supplies them from the artifact's constants (``aot.runtime.parameters``).
IREE hoists what the code computes from a weight alone (a relayout, data tiling's
packing) into an initializer that runs once, when the module is loaded.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.fx
import torch.utils._pytree as pytree

import hashlib

from .._mlir import FxImporter, FxImporterHooks, RefTracker, ir, new_context
from ..manifest import PARAMETER_SCOPE
from .cond_import import NodeImporter

__all__ = ["stateless_graph", "copy_graph", "import_graph", "import_graphs", "NodeRewrite", "DROP",
           "Parameters", "PARAMETER_SCOPE", "PARAMETER_MIN_BYTES"]

PARAMETER_MIN_BYTES = 4096  # smaller weights (biases, norms' scales) stay in the code
_PARAMETER_TYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16",
                    torch.float64: "f64"}

DROP = object()  # a rewrite's answer for "leave this node out" (e.g. metadata asserts)

# (node, new_graph, env) -> replacement value for the node, or None to copy it.
NodeRewrite = Callable[[torch.fx.Node, torch.fx.Graph, dict], object]


def stateless_graph(ep: torch.export.ExportedProgram,
                    rewrite: NodeRewrite | None = None) -> torch.fx.Graph:
    """Copy ``ep.graph`` with state inlined; ``rewrite`` may replace call nodes."""
    sig = ep.graph_signature
    lifted = {**sig.inputs_to_parameters, **sig.inputs_to_buffers,
              **sig.inputs_to_lifted_tensor_constants}
    state = {**ep.state_dict, **getattr(ep, "constants", {})}
    g = torch.fx.Graph()
    env: dict[torch.fx.Node, object] = {}
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            if node.name in lifted:
                env[node] = state[lifted[node.name]]
            elif isinstance(node.meta.get("val"), torch.Tensor):
                env[node] = g.node_copy(node, lambda n: env[n])
            else:
                env[node] = node.meta.get("val")  # non-tensor input, baked by export
        elif node.op == "output":
            # the tensor leaves, in order (static leaves are the runtime's: ImportedProgram)
            leaves = [a for a in pytree.tree_leaves(node.args[0]) if isinstance(a, torch.fx.Node)
                      and isinstance(a.meta.get("val"), torch.Tensor)]
            g.output(tuple(env[a] for a in leaves))
        else:
            new = rewrite(node, g, env) if rewrite else None
            if new is DROP:
                env[node] = None
                continue
            env[node] = new if new is not None else _copy(node, g, env)
    return g


def copy_graph(graph: torch.fx.Graph, rewrite: NodeRewrite) -> torch.fx.Graph:
    """A copy of ``graph`` whose call nodes ``rewrite`` may replace (or ``DROP``), the
    others copied as they are; ``env`` maps each node of ``graph`` to its new value."""
    g, env = torch.fx.Graph(), {}
    for node in graph.nodes:
        new = rewrite(node, g, env) if node.op == "call_function" else None
        if new is DROP:
            env[node] = None
            continue
        env[node] = new if new is not None else g.node_copy(node, lambda n: env[n])
    return g


def _copy(node: torch.fx.Node, g: torch.fx.Graph, env: dict) -> torch.fx.Node:
    """``node`` copied into ``g``; a state tensor inside a list operand (``cat`` of a
    cached constant and a computed tensor: a language model's empty KV cache) becomes
    its own ``clone`` node first: the importer takes a tensor literal only as a whole
    operand, and a list's elements must all be values."""
    new = g.node_copy(node, lambda n: env[n])
    if not any(isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in a)
               for a in new.args):
        return new

    def value(x, was):
        if not isinstance(x, torch.Tensor):
            return x
        with g.inserting_before(new):
            c = g.call_function(torch.ops.aten.clone.default, (x,))
        c.meta["val"] = was.meta.get("val") if isinstance(was, torch.fx.Node) else x
        return c
    new.args = tuple(type(a)(value(x, w) for x, w in zip(a, was))
                     if isinstance(a, (list, tuple)) else a
                     for a, was in zip(new.args, node.args))
    return new


class Parameters:
    """The weights an import made IREE parameters (module docstring): ``tensors`` maps
    each parameter's key to its tensor, in the order the import met them; one tensor
    met again (in the same or another function) is one parameter; with
    ``by_contents``, so are tensors of equal dtype, shape and bytes (the functions of
    one module imported from separately prepared programs)."""

    def __init__(self, by_contents: bool = False):
        self.tensors: dict[str, torch.Tensor] = {}
        self._keys: dict[object, str] = {}
        self._by_contents = by_contents

    def key(self, t: torch.Tensor) -> str:
        ident = _contents(t) if self._by_contents else id(t)
        k = self._keys.get(ident)
        if k is None:
            k = self._keys[ident] = f"p{len(self.tensors)}"
            self.tensors[k] = t  # holds the tensor: its id stays its own
        return k

    @staticmethod
    def takes(t) -> bool:
        return isinstance(t, torch.Tensor) and t.dtype in _PARAMETER_TYPES \
            and t.layout == torch.strided and not t.is_meta and not t.is_quantized \
            and not isinstance(t, torch._subclasses.FakeTensor) \
            and all(type(d) is int for d in t.shape) \
            and t.numel() * t.element_size() >= PARAMETER_MIN_BYTES


class _ParameterHooks(FxImporterHooks):
    def __init__(self, parameters: Parameters):
        self.parameters = parameters
        self.globals: set[str] = set()

    def resolve_literal(self, gni, literal, info):
        if not Parameters.takes(literal):
            return None  # the importer's own literal
        key = self.parameters.key(literal)
        dims = list(literal.shape)
        elt = _PARAMETER_TYPES[literal.dtype]
        tensor = ir.RankedTensorType.get(dims, ir.Type.parse(elt))
        vtensor = ir.Type.parse(f"!torch.vtensor<[{','.join(map(str, dims))}],{elt}>")
        if key not in self.globals:
            self.globals.add(key)
            with ir.InsertionPoint.at_block_begin(gni.fx_importer.module.body), \
                    ir.Location.unknown():
                ir.Operation.create("util.global", attributes={
                    "sym_name": ir.StringAttr.get(key),
                    "sym_visibility": ir.StringAttr.get("private"),
                    "type": ir.TypeAttr.get(tensor),
                    "initial_value": ir.Attribute.parse(
                        f'#stream.parameter.named<"{PARAMETER_SCOPE}"::"{key}"> : {tensor}')})
        load = ir.Operation.create("util.global.load", results=[tensor],
                                   attributes={"global": ir.FlatSymbolRefAttr.get(key)})
        return ir.Operation.create("torch_c.from_builtin_tensor", results=[vtensor],
                                   operands=[load.result]).result


def _importer(module=None, parameters: Parameters | None = None, **kwargs) -> FxImporter:
    kwargs["graph_node_importer_cls"] = NodeImporter  # torch.cond too
    if parameters is not None:
        kwargs["hooks"] = _ParameterHooks(parameters)
    if module is not None:
        return FxImporter(module=module, **kwargs)
    return FxImporter(context=new_context(), **kwargs)


def import_graph(graph: torch.fx.Graph, *, func_name: str = "main",
                 module: "ir.Module | None" = None,
                 parameters: Parameters | None = None,
                 subgraphs: dict[str, torch.fx.GraphModule] | None = None) -> "ir.Module":
    """Import one stateless FX graph as ``func_name`` into ``module`` (or a new one);
    with ``parameters``, its weights become IREE parameters collected there;
    ``subgraphs``: the graphs its ``get_attr`` nodes name (control flow's: a loop's
    condition and body, a cond's branches), which the importer makes private functions
    of the module first."""
    importer = _importer(module, parameters)
    if subgraphs:
        holder = torch.nn.Module()
        for name, sub in subgraphs.items():
            holder.add_module(name, sub)
        graph.owning_module = holder  # where the importer looks the get_attr targets up
        importer._import_all_child_modules(holder, func_name)
    importer.import_stateless_graph(graph, func_name=func_name)
    return importer.module


def _contents(t: torch.Tensor) -> tuple:
    t = t.detach().cpu().contiguous()
    data = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""
    return (str(t.dtype), tuple(t.shape), hashlib.sha256(data).hexdigest())


class _SameContents(RefTracker):
    """The importer's literal cache keyed by a tensor's contents (dtype, shape, bytes)
    instead of its identity: equal weights in several imported functions become one
    ``dense_resource`` (one copy in the compiled module)."""

    def track(self, referrent):
        if not isinstance(referrent, torch.Tensor) or referrent.is_meta \
                or isinstance(referrent, torch._subclasses.FakeTensor) \
                or referrent.layout != torch.strided or referrent.is_quantized:
            return super().track(referrent)
        key = _contents(referrent)
        existing = self._refs.get(key)
        if existing is None:
            existing = super().track(referrent)
            self._refs[key] = existing
        return existing


def import_graphs(graphs: dict[str, torch.fx.Graph],
                  parameters: Parameters | None = None) -> "ir.Module":
    """Import several stateless FX graphs into one module, one function each (by name);
    a weight equal in several is one constant (or, with ``parameters``, one tensor read
    by several is one parameter)."""
    importer = _importer(None, parameters, py_attr_tracker=_SameContents())
    for name, graph in graphs.items():
        importer.import_stateless_graph(graph, func_name=name)
    return importer.module
