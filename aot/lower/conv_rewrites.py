"""Rewrites of convolutions that IREE 3.13 compiles badly, to the same arithmetic.

A 1x1 convolution is a matmul over channels (after a subsample, when strided).
IREE lowers the convolution form to a loop nest that is two orders of magnitude
slower than oneDNN: ResNet's downsampling shortcut, conv 1x1 s2 64 -> 128 at
56x56, runs 31.8 ms compiled against eager's 0.24 ms (issue 15). IREE runs the
matmul form at 0.21 ms. Every output element is the same sum over the same
input channels, so the rewrite is exact up to the summation order IREE picks
anyway. The partitioner emits the matmul form only for the convolutions it
compiles (``conv1x1_as_matmul``); under ``fallback="all"`` nothing is compiled.
"""

from __future__ import annotations

import logging

import torch

__all__ = ["conv1x1_as_matmul"]
log = logging.getLogger(__name__)
aten = torch.ops.aten


def _conv_1x1(n: torch.fx.Node) -> tuple[int, int] | None:
    """``(stride_h, stride_w)`` of an unpadded, ungrouped 1x1 conv2d node, else None."""
    if n.op != "call_function" or n.target != aten.conv2d.default or n.kwargs:
        return None
    args = list(n.args) + [None] * (7 - len(n.args))
    x, w, _, stride, padding, _, groups = args[:7]
    wv = w.meta.get("val") if isinstance(w, torch.fx.Node) else None
    xv = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if wv is None or xv is None or wv.dim() != 4 or xv.dim() != 4 \
            or tuple(wv.shape[2:]) != (1, 1) or (groups or 1) != 1:
        return None
    stride = list(stride or [1, 1])
    stride = stride * 2 if len(stride) == 1 else stride
    if any(p != 0 for p in (padding or [0, 0])):
        return None
    return stride[0], stride[1]


def _emit(g: torch.fx.Graph, op, args: tuple, val, keep: dict) -> torch.fx.Node:
    n = g.call_function(op, args)
    n.meta = {**keep, "val": val}
    return n


def conv1x1_as_matmul(node: torch.fx.Node, g: torch.fx.Graph, env: dict) -> torch.fx.Node | None:
    """For a compiled 1x1 conv2d (unpadded, ungrouped): emit it into ``g`` as a subsample
    (when strided), a matmul over channels and the bias add, operands through ``env``,
    and return the result node; else None (the caller copies the node as it is).

    Only compiled convolutions are rewritten: ATen runs them well (oneDNN).
    """
    s = _conv_1x1(node)
    if s is None:
        return None
    x, w = node.args[0], node.args[1]
    b = node.args[2] if len(node.args) > 2 else None
    keep = {k: v for k, v in node.meta.items() if k in ("stack_trace", "nn_module_stack")}
    cur, val = env[x], x.meta["val"]
    for dim, step in ((2, s[0]), (3, s[1])):
        if step != 1:
            idx = [slice(None)] * 4
            idx[dim] = slice(None, None, step)
            val = val[tuple(idx)]
            cur = _emit(g, aten.slice.Tensor, (cur, dim, 0, None, step), val, keep)
    n, c, h, wd = (int(d) for d in val.shape)
    wv = w.meta["val"]
    co = int(wv.shape[0])
    xr = _emit(g, aten.reshape.default, (cur, [n, c, h * wd]), val.reshape(n, c, h * wd), keep)
    w2 = _emit(g, aten.view.default, (env[w], [co, c]), wv.view(co, c), keep)
    mm = _emit(g, aten.matmul.default, (w2, xr), torch.matmul(wv.view(co, c),
                                                            val.reshape(n, c, h * wd)), keep)
    y = _emit(g, aten.view.default, (mm, [n, co, h, wd]), node.meta["val"], keep)
    if b is not None:
        bv = b.meta["val"]
        b4 = _emit(g, aten.view.default, (env[b], [1, co, 1, 1]), bv.view(1, co, 1, 1), keep)
        y = _emit(g, aten.add.Tensor, (y, b4), node.meta["val"], keep)
    y.meta = {**dict(node.meta), "val": node.meta["val"]}
    return y
