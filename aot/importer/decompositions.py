"""Decompositions applied before import: a registry keyed by op.

``IREE_DECOMPOSITIONS`` holds our own rewrites for ops that IREE's bundled
torch-mlir does not know but that are plain arithmetic (torch 2.13+ exports eval
batch norm as ``_native_batch_norm_legit_no_training``, unknown to IREE 3.13;
torch's own decomposition of it goes through the mutating
``_native_batch_norm_legit`` and breaks export's functional check).

The partitioner consults this table only for ops whose probe failed, so an op
IREE learns to lower is no longer decomposed (coverage decided by measurement).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch._decomp import decomposition_table

from . import int8_decompositions  # noqa: F401  (registers the aot_q lowerings)
from .registry import IREE_DECOMPOSITIONS, register_decomposition

__all__ = ["IREE_DECOMPOSITIONS", "register_decomposition", "decomposition_for"]

aten = torch.ops.aten


# torch decompositions whose ops' metadata disagree with what their kernels return
# (``prims.signbit`` is recorded as float32, its kernel returns bool): a kernel call
# of such an op would not match its recorded result, so the op stays whole
_UNRELIABLE = {aten.signbit.default, aten.copysign.Tensor, aten.copysign.Scalar}


def _random(op) -> bool:
    """A seeded random op (``geometric``, ``bernoulli``...): as a kernel call it draws from
    torch's generator as eager does; torch's decompositions draw differently (and
    ``geometric``'s calls ``rand_like`` on integer tensors, which ATen refuses)."""
    return torch.Tag.nondeterministic_seeded in getattr(op, "tags", ())


def decomposition_for(op) -> Callable | None:
    """Our decomposition if we have one, else torch's (if functional), else None."""
    if op in IREE_DECOMPOSITIONS:
        return IREE_DECOMPOSITIONS[op]
    if op in _UNRELIABLE or _random(op):
        return None
    return decomposition_table.get(op)


@register_decomposition(aten._native_batch_norm_legit_no_training.default)
def _batch_norm_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    shape = [1, -1] + [1] * (x.dim() - 2)
    scale = torch.rsqrt(running_var + eps)
    if weight is not None:
        scale = scale * weight
    out = (x - running_mean.reshape(shape)) * scale.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    empty = x.new_zeros((0,))
    return out, empty, empty.clone()
