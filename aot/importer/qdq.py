"""Quantize/dequantize graphs: quantized dtypes out of the exported graph.

``torch.export`` captures ``torch.quantize_per_tensor(x, s, z, torch.quint8)``
and ``q.dequantize()`` as ``aten.quantize_per_tensor`` / ``aten.dequantize.self``
on ``quint8`` tensors, which IREE's FX importer cannot import (``KeyError:
torch.quint8``). With static ``s`` and ``z`` they are exactly
``aot_q.quantize`` / ``aot_q.dequantize`` on the integer representation, so we
rewrite the graph in place before import. Any other use of a quantized value is
refused with the op and source line (never imported wrongly).

The ``quantized_decomposed`` ops of PT2E flows already work on integer tensors
and import as they are; ``int8_decompositions`` lowers them.
"""

from __future__ import annotations

import torch
import torch.fx
from torch.fx.passes.shape_prop import _extract_tensor_metadata

from ..errors import UnsupportedOp
from ..fallback import quantized_ops  # noqa: F401  (registers torch.ops.aot_q)
from .locations import node_location

__all__ = ["rewrite_qdq"]

aten = torch.ops.aten


def _is_quantized_val(n) -> bool:
    v = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
    return isinstance(v, torch.Tensor) and v.is_quantized


def rewrite_qdq(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """Replace per-tensor quint8 quantize/dequantize by ``aot_q`` ops (in place)."""
    g = ep.graph_module.graph
    qparams: dict[torch.fx.Node, tuple[float, int]] = {}
    changed = False
    for n in list(g.nodes):
        if n.op != "call_function":
            continue
        if n.target == aten.quantize_per_tensor.default:
            x, s, z, dtype = n.args[:4]
            if dtype != torch.quint8 or isinstance(s, torch.fx.Node) or isinstance(z, torch.fx.Node):
                raise UnsupportedOp(f"quantize_per_tensor to {dtype} with "
                                    f"{'run-time' if isinstance(s, torch.fx.Node) else 'static'} "
                                    "qparams is not supported (quint8 with constant scale and "
                                    "zero point is)", op="aten.quantize_per_tensor",
                                    location=node_location(n))
            with g.inserting_before(n):
                new = g.call_function(torch.ops.aot_q.quantize.default, (x, float(s), int(z)))
            new.meta = dict(n.meta)
            new.meta["val"] = _like(n.meta["val"], torch.uint8)
            if "tensor_meta" in new.meta:  # the importer reads dtypes from here
                new.meta["tensor_meta"] = _extract_tensor_metadata(new.meta["val"])
            n.replace_all_uses_with(new)
            g.erase_node(n)
            qparams[new] = (float(s), int(z))
            changed = True
        elif n.target == aten.dequantize.self and n.args[0] in qparams:
            src = n.args[0]
            with g.inserting_before(n):
                new = g.call_function(torch.ops.aot_q.dequantize.default, (src, *qparams[src]))
            new.meta = dict(n.meta)
            n.replace_all_uses_with(new)
            g.erase_node(n)
        elif n.target == aten.int_repr.default and n.args[0] in qparams:
            n.replace_all_uses_with(n.args[0])
            g.erase_node(n)
    for n in g.nodes:
        if n.op in ("call_function", "output") and (
                _is_quantized_val(n) or any(_is_quantized_val(a) for a in n.all_input_nodes)):
            what = "returns" if n.op == "output" else f"{n.target} uses"
            raise UnsupportedOp(f"the exported graph {what} a quantized tensor outside a "
                                "quantize_per_tensor -> dequantize pair; only those (and the "
                                "eager-quantized modules) are supported",
                                location=node_location(n))
    if changed:
        g.eliminate_dead_code()
        g.lint()
        ep.graph_module.recompile()
    return ep


def _like(val: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    mode = getattr(val, "fake_mode", None)
    if mode is None:
        return torch.empty(val.shape, dtype=dtype)
    with mode:
        return torch.empty(val.shape, dtype=dtype)
