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
summation order IREE picks anyway.

A depthwise convolution (one filter per channel) is the sum over its kernel taps of
the shifted input times that tap's per-channel weight (``depthwise_as_shifts``),
elementwise work IREE fuses into one loop; its convolution form ran 2-11x slower
(median ms, compiled alone; eager in brackets): 3x3 32 ch at 112x112 4.42 -> 0.39
(0.43), 3x3 s2 96 ch at 112x112 3.26 -> 1.29 (0.31), 3x3 144 ch at 56x56 2.12 -> 0.43
(0.31), 3x3 576 ch at 14x14 0.58 -> 0.23 (0.16), 5x5 240 ch at 28x28 1.38 -> 0.87
(0.23); a strided 5x5 ran slower shifted and keeps its form. Under
``placement="coverage"``: MobileNetV2 19.8 -> 9.3 ms (eager 15.3), MobileNetV3-Small
7.5 -> 6.0 (7.7), EfficientNet-B0 51.8 -> 33 (22-25).

The partitioner emits these forms only for the convolutions it compiles
(``conv_as_matmul``, ``depthwise_as_shifts``, through ``compiled_forms``); under
``fallback="all"`` nothing is compiled.
"""

from __future__ import annotations

import logging

import torch

__all__ = ["conv_as_matmul", "depthwise_as_shifts", "as_matmul"]

# depthwise kernels shifted: up to 3x3 at any stride, up to 5x5 unstrided (a strided
# 5x5 measured slower shifted: 144 ch at 56x56, stride 2, 1.23 -> 2.52 ms)
MAX_TAPS, MAX_TAPS_UNSTRIDED = 9, 25
log = logging.getLogger(__name__)
aten = torch.ops.aten


def _conv(n: torch.fx.Node) -> dict | None:
    """A 2-d ``aten.conv2d`` node's input and weight values and its stride, padding
    and dilation as pairs, groups as an int; None for anything else (a string
    padding, unknown shapes)."""
    if n.op != "call_function" or n.target != aten.conv2d.default or n.kwargs:
        return None
    args = list(n.args) + [None] * (7 - len(n.args))
    x, w, _, stride, padding, dilation, groups = args[:7]
    wv = w.meta.get("val") if isinstance(w, torch.fx.Node) else None
    xv = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if wv is None or xv is None or wv.dim() != 4 or xv.dim() != 4 or isinstance(padding, str):
        return None

    def pair(v, default):
        v = list(v if v is not None else [default])
        return v * 2 if len(v) == 1 else v
    return {"x": xv, "w": wv, "k": tuple(int(d) for d in wv.shape[2:]),
            "stride": pair(stride, 1), "padding": pair(padding, 0),
            "dilation": pair(dilation, 1), "groups": groups or 1}


def _plan(n: torch.fx.Node) -> dict | None:
    """How to emit a conv2d node as a matmul, or None to leave it as it is.

    1x1 (unpadded, ungrouped): subsample + matmul. Any other kxk (ungrouped,
    undilated): im2col by (strided) slices + matmul.
    """
    c = _conv(n)
    if c is None or c["groups"] != 1 or c["dilation"] != [1, 1]:
        return None
    if c["k"] == (1, 1) and c["padding"] == [0, 0]:
        return {"k": (1, 1), "stride": c["stride"], "padding": [0, 0]}
    return {"k": c["k"], "stride": c["stride"], "padding": c["padding"]}


def as_matmul(n: torch.fx.Node) -> bool:
    """Whether a compiled ``n`` is emitted as a matmul (``conv_as_matmul``)."""
    return _plan(n) is not None


def _emit(g: torch.fx.Graph, op, args: tuple, val, keep: dict) -> torch.fx.Node:
    n = g.call_function(op, args)
    n.meta = {**keep, "val": val}
    return n


def _padded(g, cur, val, padding, keep):
    """``(node, value)`` of the input zero-padded by ``padding`` (rows, cols)."""
    ph, pw = padding
    if ph or pw:
        val = torch.constant_pad_nd(val, [pw, pw, ph, ph], 0.0)
        cur = _emit(g, aten.constant_pad_nd.default, (cur, [pw, pw, ph, ph], 0.0), val, keep)
    return cur, val


def _window(g, cur, val, offset, stride, size, keep):
    """``(node, value)``: the input rows ``i, i + sh, ...`` and columns ``j, j + sw, ...``
    (``offset = (i, j)``, ``size`` of them each) that kernel tap ``(i, j)`` reads."""
    for dim, start, step, n in ((2, offset[0], stride[0], size[0]),
                                (3, offset[1], stride[1], size[1])):
        end = start + step * (n - 1) + 1
        if (start, end, step) == (0, int(val.shape[dim]), 1):
            continue
        idx = [slice(None)] * 4
        idx[dim] = slice(start, end, step)
        val = val[tuple(idx)]
        cur = _emit(g, aten.slice.Tensor, (cur, dim, start, end, step), val, keep)
    return cur, val


def _depthwise_plan(n: torch.fx.Node) -> dict | None:
    """How to emit a depthwise conv2d (one filter per channel, undilated, at most
    ``MAX_TAPS`` taps, ``MAX_TAPS_UNSTRIDED`` unstrided) as shifted multiply-adds, or None."""
    c = _conv(n)
    if c is None or c["groups"] == 1 or c["dilation"] != [1, 1]:
        return None
    if int(c["x"].shape[1]) != c["groups"] or tuple(int(d) for d in c["w"].shape[:2]) \
            != (c["groups"], 1):
        return None
    kh, kw = c["k"]
    if kh * kw > (MAX_TAPS_UNSTRIDED if c["stride"] == [1, 1] else MAX_TAPS):
        return None
    return {"k": c["k"], "stride": c["stride"], "padding": c["padding"]}


def depthwise_as_shifts(node: torch.fx.Node, g: torch.fx.Graph, env: dict
                        ) -> torch.fx.Node | None:
    """For a compiled depthwise conv2d (``_depthwise_plan``): emit it into ``g`` as the
    sum over kernel taps of the shifted input times that tap's per-channel weight,
    plus the bias, operands through ``env``; return the result node, or None."""
    plan = _depthwise_plan(node)
    if plan is None:
        return None
    x, w = node.args[0], node.args[1]
    b = node.args[2] if len(node.args) > 2 else None
    keep = {k: v for k, v in node.meta.items() if k in ("stack_trace", "nn_module_stack")}
    (kh, kw), stride = plan["k"], plan["stride"]
    cur, val = _padded(g, env[x], x.meta["val"], plan["padding"], keep)
    out = node.meta["val"]
    c, ho, wo = int(out.shape[1]), int(out.shape[2]), int(out.shape[3])
    wv = w.meta["val"].reshape(c, kh * kw)
    taps = _emit(g, aten.view.default, (env[w], [c, kh * kw]), wv, keep)
    acc = acc_v = None
    for i in range(kh):
        for j in range(kw):
            t, v = _window(g, cur, val, (i, j), stride, (ho, wo), keep)
            tap_v = wv[:, i * kw + j]
            tap = _emit(g, aten.select.int, (taps, 1, i * kw + j), tap_v, keep)
            tap4_v = tap_v.view(1, c, 1, 1)
            tap4 = _emit(g, aten.view.default, (tap, [1, c, 1, 1]), tap4_v, keep)
            prod_v = v * tap4_v
            prod = _emit(g, aten.mul.Tensor, (t, tap4), prod_v, keep)
            if acc is None:
                acc, acc_v = prod, prod_v
            else:
                acc_v = acc_v + prod_v
                acc = _emit(g, aten.add.Tensor, (acc, prod), acc_v, keep)
    if b is not None:
        bv = b.meta["val"].view(1, c, 1, 1)
        b4 = _emit(g, aten.view.default, (env[b], [1, c, 1, 1]), bv, keep)
        acc = _emit(g, aten.add.Tensor, (acc, b4), out, keep)
    acc.meta = {**dict(node.meta), "val": out}
    return acc


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
    (kh, kw), (sh, sw) = plan["k"], plan["stride"]
    cur, val = _padded(g, env[x], x.meta["val"], plan["padding"], keep)
    out = node.meta["val"]
    n, c = int(val.shape[0]), int(val.shape[1])
    ho, wo = int(out.shape[2]), int(out.shape[3])
    cols, col_vals = [], []
    for i in range(kh):
        for j in range(kw):
            t, v = _window(g, cur, val, (i, j), (sh, sw), (ho, wo), keep)
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
