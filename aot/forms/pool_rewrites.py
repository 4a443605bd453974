"""Compiled global average pooling as a mean over the spatial dimensions.

IREE 3.13 lowers ``adaptive_avg_pool2d(x, [1, 1])`` (the squeeze-excitation blocks of
MobileNetV3 and EfficientNet, every torchvision classifier's last pool) through a
pooling op whose window tensor is a dummy ``i1`` operand; its CPU backend turns it
into a scalar loop that gathers one element at a time, with the padding of the
producer fused in as selects; in a squeeze-excitation network those pools can take
a large share of the dispatch time (``benchmarks/dispatch_profile.py``). As
``mean(x, [-2, -1], keepdim=True)`` they are vectorised reductions, a small fraction
of that. ``adaptive_avg_pool2d`` to 1x1 is the
mean of each channel's plane by definition (sum over H*W, divided by H*W), so the
rewrite is exact up to summation order.
"""

from __future__ import annotations

import torch

__all__ = ["global_pool_as_mean"]

aten = torch.ops.aten


def _global_pool(n: torch.fx.Node) -> bool:
    if n.op != "call_function" or n.target != aten.adaptive_avg_pool2d.default or n.kwargs:
        return False
    x = n.args[0].meta.get("val") if isinstance(n.args[0], torch.fx.Node) else None
    size = n.args[1] if len(n.args) > 1 else None
    if x is None or not x.dtype.is_floating_point or x.dim() not in (3, 4):
        return False
    size = [size] if isinstance(size, int) else list(size or [])
    return size in ([1], [1, 1])


def global_pool_as_mean(node: torch.fx.Node, g: torch.fx.Graph, env: dict
                        ) -> torch.fx.Node | None:
    """For a compiled ``adaptive_avg_pool2d`` to 1x1: emit ``mean`` over the last two
    dimensions (kept) into ``g``, operands through ``env``; return it, or None."""
    if not _global_pool(node):
        return None
    new = g.call_function(aten.mean.dim, (env[node.args[0]], [-2, -1], True))
    new.meta = dict(node.meta)
    return new
