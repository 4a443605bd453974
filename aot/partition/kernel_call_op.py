"""The placeholder op that marks a kernel call in the FX graph.

The partitioner replaces each fallen-back node by a call of
``aot_kc::call_<ins>_<outs>(..., int site)``: ``ins`` and ``outs`` spell the
operand and result kinds, one letter each (``t`` Tensor, ``i`` SymInt, ``f``
float, ``b`` bool; ``n`` for no operands), tensors first, then run-time
scalars; ``site`` indexes the KernelCallSpec. The FX importer, knowing no such
op, emits it as ``torch.operator "aot_kc.call_<ins>_<outs>"``, which ``outline``
then turns into a call of an imported host function. The ops have no kernel:
they exist only between partitioning and outlining.
"""

from __future__ import annotations

import torch

__all__ = ["NAMESPACE", "SCALAR_KINDS", "kernel_call_op"]

NAMESPACE = "aot_kc"
# kind letter -> schema type of a run-time scalar operand or result
SCALAR_KINDS = {"i": "SymInt", "f": "float", "b": "bool"}
_TYPES = {"t": "Tensor", **SCALAR_KINDS}
_lib = torch.library.Library(NAMESPACE, "FRAGMENT")
_defined: dict[tuple[str, str], object] = {}


def kernel_call_op(ins: str, outs: str):
    """The (lazily defined) OpOverload for operand kinds ``ins`` and result kinds ``outs``."""
    key = (ins, outs)
    if not outs or any(k not in _TYPES for k in ins + outs):
        raise ValueError(f"bad kernel call kinds {key}")
    if key not in _defined:
        name = f"call_{ins or 'n'}_{outs}"
        params = ", ".join([f"{_TYPES[k]} a{i}" for i, k in enumerate(ins)] + ["int site"])
        rets = _TYPES[outs] if len(outs) == 1 else "(" + ", ".join(_TYPES[k] for k in outs) + ")"
        _lib.define(f"{name}({params}) -> {rets}")
        _defined[key] = getattr(getattr(torch.ops, NAMESPACE), name).default
    return _defined[key]
