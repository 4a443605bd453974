"""Rewrites of convolutions that IREE 3.13 compiles badly, to the same arithmetic.

A 1x1 convolution is a matmul over channels (after a subsample, when strided); a
kxk convolution is a matmul over its im2col columns (k*k strided slices stacked).
IREE lowers the convolution forms to loop nests far slower than oneDNN, and runs
matmuls at parity (issue 15). Measured here, compiled alone (median ms):
conv 1x1 s2 64->128 at 56x56 31.8 -> 0.21 (eager 0.24); conv 3x3 s2 64->128 at
56x56 5.09 -> 1.19 (eager 0.68); the 7x7 s2 stem 10.2 -> 3.76 (eager 1.23).
Unstrided 3x3 convolutions (padding 1), on the 2-core AMD EPYC machine of
2026-11-24: 64 ch at 56x56 8.0 -> 3.2 (eager 1.6), 128 at 28x28 6.9 -> 2.3 (1.5),
256 at 14x14 30.9 -> 8.2 (1.6), 512 at 7x7 31.5 -> 6.0 (2.1); with data tiling and
microkernels (``tiling``) the 256-channel one takes 2.0. (An earlier session had
measured im2col no better for them and left them alone: torchvision ResNet18 under
``placement="coverage"`` then ran at 235 ms, now 44 ms, eager 33.) Every output
element is the same sum of the same products, so the rewrites are exact up to the
summation order IREE picks anyway. The partitioner emits them only for the
convolutions it compiles (``conv_as_matmul``); under ``fallback="all"`` nothing is
compiled.
"""

from __future__ import annotations

import logging

import torch

__all__ = ["conv_as_matmul", "as_matmul", "FORMS"]

# names the compiled forms emitted here and in ``attention_rewrites``; part of the cost
# cache's key (``cost``)
FORMS = "conv-as-matmul-2+attention-as-matmuls-1"
log = logging.getLogger(__name__)
aten = torch.ops.aten


def _plan(n: torch.fx.Node) -> dict | None:
    """How to emit a conv2d node as a matmul, or None to leave it as it is.

    1x1 (unpadded, ungrouped): subsample + matmul. Any other kxk (ungrouped,
    undilated): im2col by (strided) slices + matmul.
    """
    if n.op != "call_function" or n.target != aten.conv2d.default or n.kwargs:
        return None
    args = list(n.args) + [None] * (7 - len(n.args))
    x, w, _, stride, padding, dilation, groups = args[:7]
    wv = w.meta.get("val") if isinstance(w, torch.fx.Node) else None
    xv = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if wv is None or xv is None or wv.dim() != 4 or xv.dim() != 4 or (groups or 1) != 1:
        return None

    def pair(v, default):
        v = list(v if v is not None else [default])
        return v * 2 if len(v) == 1 else v
    stride, padding, dilation = pair(stride, 1), pair(padding, 0), pair(dilation, 1)
    kh, kw = (int(d) for d in wv.shape[2:])
    if dilation != [1, 1]:
        return None
    if (kh, kw) == (1, 1) and padding == [0, 0]:
        return {"k": (1, 1), "stride": stride, "padding": [0, 0]}
    return {"k": (kh, kw), "stride": stride, "padding": padding}


def as_matmul(n: torch.fx.Node) -> bool:
    """Whether a compiled ``n`` is emitted as a matmul (``conv_as_matmul``)."""
    return _plan(n) is not None


def _emit(g: torch.fx.Graph, op, args: tuple, val, keep: dict) -> torch.fx.Node:
    n = g.call_function(op, args)
    n.meta = {**keep, "val": val}
    return n


def conv_as_matmul(node: torch.fx.Node, g: torch.fx.Graph, env: dict) -> torch.fx.Node | None:
    """For a compiled conv2d that IREE runs badly as a convolution (see ``_plan``): emit
    it into ``g`` as columns (a subsample, or strided slices stacked: im2col), a matmul
    over them and the bias add, operands through ``env``; return the result node, or
    None (the caller copies the node as it is).

    Only compiled convolutions are rewritten: ATen runs them well (oneDNN).
    """
    plan = _plan(node)
    if plan is None:
        return None
    x, w = node.args[0], node.args[1]
    b = node.args[2] if len(node.args) > 2 else None
    keep = {k: v for k, v in node.meta.items() if k in ("stack_trace", "nn_module_stack")}
    (kh, kw), (sh, sw), (ph, pw) = plan["k"], plan["stride"], plan["padding"]
    cur, val = env[x], x.meta["val"]
    if ph or pw:
        val = torch.constant_pad_nd(val, [pw, pw, ph, ph], 0.0)
        cur = _emit(g, aten.constant_pad_nd.default, (cur, [pw, pw, ph, ph], 0.0), val, keep)
    out = node.meta["val"]
    n, c = int(val.shape[0]), int(val.shape[1])
    ho, wo = int(out.shape[2]), int(out.shape[3])
    cols, col_vals = [], []
    for i in range(kh):
        for j in range(kw):
            t, v = cur, val
            for dim, start, step, size in ((2, i, sh, ho), (3, j, sw, wo)):
                end = start + step * (size - 1) + 1
                if (start, end, step) == (0, int(v.shape[dim]), 1):
                    continue
                idx = [slice(None)] * 4
                idx[dim] = slice(start, end, step)
                v = v[tuple(idx)]
                t = _emit(g, aten.slice.Tensor, (t, dim, start, end, step), v, keep)
            cols.append(t)
            col_vals.append(v)
    if len(cols) == 1:
        col, cval = cols[0], col_vals[0]
    else:
        cval = torch.stack(col_vals, 2)
        col = _emit(g, aten.stack.default, (cols, 2), cval, keep)
    kk = c * kh * kw
    xr = _emit(g, aten.reshape.default, (col, [n, kk, ho * wo]), cval.reshape(n, kk, ho * wo),
               keep)
    wv = w.meta["val"]
    co = int(wv.shape[0])
    w2 = _emit(g, aten.view.default, (env[w], [co, kk]), wv.reshape(co, kk), keep)
    mm = _emit(g, aten.matmul.default, (w2, xr), torch.matmul(wv.reshape(co, kk), xr.meta["val"]),
               keep)
    y = _emit(g, aten.view.default, (mm, [n, co, ho, wo]), out, keep)
    if b is not None:
        bv = b.meta["val"]
        b4 = _emit(g, aten.view.default, (env[b], [1, co, 1, 1]), bv.view(1, co, 1, 1), keep)
        y = _emit(g, aten.add.Tensor, (y, b4), out, keep)
    y.meta = {**dict(node.meta), "val": out}
    return y
