"""Op signatures: an op and its operands' dtypes, shapes and static values, as one
string (``aten.add.Tensor(float32[1, 3], 1)``): what coverage verdicts, cost
measurements and FLOP counts are keyed by."""

from __future__ import annotations

import torch
import torch.fx

__all__ = ["op_signature"]


def _describe(a) -> str:
    if isinstance(a, torch.fx.Node):
        a = a.meta.get("val")
    if isinstance(a, torch.Tensor):
        return f"{str(a.dtype).replace('torch.', '')}{list(a.shape)}"
    if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return type(a).__name__  # a run-time scalar: its value does not change the verdict
    if isinstance(a, (list, tuple)):
        return "[" + ",".join(_describe(x) for x in a) + "]"
    return repr(a)


def op_signature(node: torch.fx.Node) -> str:
    """``aten.add.Tensor(float32[1, 3], 1)``: what a verdict is keyed by."""
    parts = [_describe(a) for a in node.args]
    parts += [f"{k}={_describe(v)}" for k, v in node.kwargs.items()]
    return f"{node.target}({', '.join(parts)})"
