"""FX graph -> Torch-dialect MLIR, through the FX importer bundled with IREE.

We build a *stateless* copy of the exported graph (parameters and buffers
inlined as literals, non-tensor user inputs replaced by their baked value) and
hand it to ``FxImporter.import_stateless_graph``. The exported program itself
is never mutated (``import_frozen_program`` erases its placeholders), so the
same export can be imported again with different substitutions.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.fx
import torch.utils._pytree as pytree

import hashlib

from .._mlir import FxImporter, RefTracker, ir, new_context

__all__ = ["stateless_graph", "import_graph", "import_graphs", "NodeRewrite", "DROP"]

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
            env[node] = new if new is not None else g.node_copy(node, lambda n: env[n])
    return g


def import_graph(graph: torch.fx.Graph, *, func_name: str = "main",
                 module: "ir.Module | None" = None) -> "ir.Module":
    """Import one stateless FX graph as ``func_name`` into ``module`` (or a new one)."""
    importer = FxImporter(module=module) if module is not None else FxImporter(context=new_context())
    importer.import_stateless_graph(graph, func_name=func_name)
    return importer.module


class _SameContents(RefTracker):
    """The importer's literal cache keyed by a tensor's contents (dtype, shape, bytes)
    instead of its identity: equal weights in several imported functions become one
    ``dense_resource`` (one copy in the compiled module)."""

    def track(self, referrent):
        if not isinstance(referrent, torch.Tensor) or referrent.is_meta \
                or isinstance(referrent, torch._subclasses.FakeTensor) \
                or referrent.layout != torch.strided or referrent.is_quantized:
            return super().track(referrent)
        t = referrent.detach().cpu().contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""
        key = (str(t.dtype), tuple(t.shape), hashlib.sha256(data).hexdigest())
        existing = self._refs.get(key)
        if existing is None:
            existing = super().track(referrent)
            self._refs[key] = existing
        return existing


def import_graphs(graphs: dict[str, torch.fx.Graph]) -> "ir.Module":
    """Import several stateless FX graphs into one module, one function each (by name);
    a weight equal in several is one constant."""
    importer = FxImporter(context=new_context(), py_attr_tracker=_SameContents())
    for name, graph in graphs.items():
        importer.import_stateless_graph(graph, func_name=name)
    return importer.module
