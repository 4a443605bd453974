"""``torch.cond`` in the Torch dialect: the FX importer bundled with IREE 3.13 takes a
``while_loop`` (as ``torch.prim.Loop``) but no ``cond``. ``NodeImporter`` is its node
importer with one more higher-order op: a ``cond`` becomes a ``torch.prim.If`` on the
predicate whose two regions call the branch functions (imported before the graph, as
the loop's are) on the operands and yield their results; IREE lowers it to a branch of
the compiled module, where only the branch taken runs."""

from __future__ import annotations

import torch

from .._mlir import GraphNodeImporter, ir

__all__ = ["NodeImporter"]


class NodeImporter(GraphNodeImporter):
    def _import_hop_cond(self, loc, node: torch.fx.Node, hop) -> None:
        pred, yes, no, operands = node.args
        if not isinstance(pred, torch.fx.Node) or not isinstance(pred.meta.get("val"),
                                                                  torch.Tensor):
            raise NotImplementedError(f"{node.name}: a cond on a {type(pred).__name__} "
                                      "predicate (a tensor is imported)")
        root = node.graph.owning_module
        names = [self.fx_importer._graph_module_to_func_name[id(getattr(root, g.target))]
                 for g in (yes, no)]
        values = [self._import_argument(loc, a) for a in operands]
        vals = node.meta["val"]
        vals = list(vals) if isinstance(vals, (list, tuple)) else [vals]
        types = [self._cc.value_info_to_type(v) for v in vals]
        flag = ir.Operation.create("torch.aten.Bool.Tensor", results=[self._cc.torch_bool_type],
                                   operands=[self._import_argument(loc, pred)], loc=loc).result
        branch = ir.Operation.create("torch.prim.If", results=types, operands=[flag],
                                     regions=2, loc=loc)
        for region, name in zip(branch.regions, names):
            with loc:
                block = ir.Block.create_at_start(region, [])
            with ir.InsertionPoint(block):
                call = ir.Operation.create("func.call", results=types, operands=values,
                                           attributes={"callee": ir.FlatSymbolRefAttr.get(name)},
                                           loc=loc)
                ir.Operation.create("torch.prim.If.yield", results=[],
                                    operands=list(call.results), loc=loc)
        self._multi_result_nodes.add(node)
        for i, value in enumerate(branch.results):
            self.bind_node_value(node, value, i)
