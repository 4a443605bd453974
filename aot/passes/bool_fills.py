"""Fill values of boolean results, written as the bool ATen makes of them.

ATen casts a fill value to the result's dtype: ``b.masked_fill(m, 10)`` on a bool
``b`` fills with ``True`` (10 != 0). IREE 3.13's Torch-dialect lowering truncates
the integer instead (10 -> i1 0), a silent wrong answer measured by the OpInfo
coverage run (``masked_fill`` and ``new_full`` on bool). The fill value is a
static operand, so the cast is done here, once, before partitioning: the op stays
compiled and means what eager means. Comparisons (``b == 2``) are not fills and
are left alone: there the scalar is not cast to the result's dtype.
"""

from __future__ import annotations

import torch

__all__ = ["FILL_ARGS", "bool_fills"]

# ops whose named Scalar operand is cast to the result's dtype
FILL_ARGS = {f"aten::{op}": arg for op, arg in (
    ("masked_fill", "value"), ("fill", "value"), ("full", "fill_value"),
    ("full_like", "fill_value"), ("new_full", "fill_value"), ("index_fill", "value"),
    ("scatter", "value"), ("constant_pad_nd", "value"))}


def _is_bool_result(n: torch.fx.Node) -> bool:
    v = n.meta.get("val")
    return isinstance(v, torch.Tensor) and v.dtype == torch.bool


def bool_fills(ep: torch.export.ExportedProgram) -> int:
    """Cast every numeric fill value of a bool result to bool, in place; the count."""
    changed = 0
    for n in ep.graph.nodes:
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
            continue
        arg = FILL_ARGS.get(n.target._schema.name)
        if arg is None or not _is_bool_result(n):
            continue
        names = [a.name for a in n.target._schema.arguments]
        if arg not in names:
            continue  # an overload whose value is a tensor
        i = names.index(arg)
        if i < len(n.args):
            v = n.args[i]
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                n.args = n.args[:i] + (bool(v),) + n.args[i + 1:]
                changed += 1
        elif arg in n.kwargs:
            v = n.kwargs[arg]
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                n.kwargs = {**n.kwargs, arg: bool(v)}
                changed += 1
    if changed:
        ep.graph_module.recompile()
    return changed
