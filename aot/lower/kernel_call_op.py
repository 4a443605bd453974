"""The placeholder op that marks a kernel call in the FX graph.

The partitioner replaces each fallen-back node by a call of
``aot_kc::call_<n>_<m>(Tensor t0, ..., int site) -> (Tensor, ...)`` (n tensor
operands, m tensor results; ``site`` indexes the KernelCallSpec). The FX
importer, knowing no such op, emits it as ``torch.operator "aot_kc.call_n_m"``,
which ``outline`` then turns into a call of an imported host function. The ops
have no kernel: they exist only between partitioning and outlining.
"""

from __future__ import annotations

import torch

__all__ = ["NAMESPACE", "kernel_call_op"]

NAMESPACE = "aot_kc"
_lib = torch.library.Library(NAMESPACE, "FRAGMENT")
_defined: dict[tuple[int, int], object] = {}


def kernel_call_op(n_in: int, n_out: int):
    """The (lazily defined) OpOverload for n tensor operands and m results."""
    key = (n_in, n_out)
    if key not in _defined:
        name = f"call_{n_in}_{n_out}"
        params = ", ".join([f"Tensor t{i}" for i in range(n_in)] + ["int site"])
        rets = "Tensor" if n_out == 1 else "(" + ", ".join(["Tensor"] * n_out) + ")"
        _lib.define(f"{name}({params}) -> {rets}")
        _defined[key] = getattr(getattr(torch.ops, NAMESPACE), name).default
    return _defined[key]
