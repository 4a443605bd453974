"""Rewrites of convolutions that IREE 3.13 compiles badly, to the same arithmetic.

A 1x1 convolution is a matmul over channels (after a subsample, when strided); a
kxk convolution is a matmul over its im2col columns (k*k slices stacked; two
``unfold`` views and one transposing copy where strided; a view and one transposing
copy where the stride is the kernel: a patch embedding). On IREE's CPU backend, an
unstrided float32 one whose output rows are whole vectors (or short) gathers its
columns in one copy instead (``linalg_kernels.im2col``): one dispatch where the slices make k*k, each
its own executable, so a shorter compile at the same speed.
IREE lowers the convolution forms to loop nests far slower than oneDNN, and runs
matmuls at parity (issue 15), so 1x1, strided and unstrided kxk convolutions alike
run faster as matmuls, and data tiling with microkernels (``tiling``) brings those
matmuls closer still to eager. Every output element is the same
sum of the same products, so the rewrites are exact up to the summation order IREE
picks anyway.

A depthwise convolution (one filter per channel) is the sum over its kernel taps of
the shifted input times that tap's per-channel weight (``depthwise_as_shifts``),
elementwise work IREE fuses into one loop, faster (often several times) than
IREE's convolution form of it.

Where the target takes it (IREE's CPU backend, ``linalg_kernels.named_kernels``), a
float32 depthwise convolution that is strided or has more than 3x3 taps is instead
IREE's named channels-last depthwise convolution between two permutations
(``depthwise_as_nhwc``): 3 dispatches instead of 5-10, so fewer executables, a
shorter compile and faster calls; for those kernels it beats the shifted form.
Unstrided 3x3 ones stay shifted: there the permutations cost more than they save.
``benchmarks/depthwise_forms.py`` measures the two forms end to end.

A strided tap read as a strided slice makes IREE gather element by element; so a
strided depthwise convolution splits its input into stride phases (``_phases``: a
view and one transposing copy; phase ``(a, b)`` holds every s-th row from ``a`` and
every s-th column from ``b``) and each tap reads a unit-stride window of one phase.
Where the input comes from an activation IREE computes cheaply (ReLU, ReLU6,
hardswish), the split comes first and the phases are padded after it: IREE fuses the
activation into the transposing copy. Otherwise the input is padded first: split
first, an expensive activation such as SiLU would be fused into the transposing copy
and run there element by element, slower than padding first.

Kernels of more than 25 taps (ConvNeXt's 7x7) are shifted only where the output is
at most 2.5 MiB (``SMALL_OUTPUT``): IREE fuses about six taps into one loop and
writes each partial sum out, cheap while it stays in cache; over that the
convolution form wins.

The IREE backend writes these forms only for the convolutions it compiles
(``conv_as_matmul``, ``depthwise_as_shifts``, through ``compiled_forms``); under
``fallback="all"`` nothing is compiled.
"""

from __future__ import annotations

import logging

import torch
from torch._subclasses.fake_tensor import FakeTensor

from .rewrite_nodes import emit_node as _emit, shadow, source_meta
from ..toolchain.linalg_kernels import depthwise_nhwc, im2col

__all__ = ["conv_as_matmul", "depthwise_as_nhwc", "depthwise_as_shifts", "as_matmul",
           "is_depthwise"]

aten = torch.ops.aten
# depthwise kernels shifted: up to 5x5 (any stride); up to 7x7 where the output is at
# most SMALL_OUTPUT bytes (IREE splits a sum of more taps into several loops, each
# writing its partial sum out: beyond the caches that costs more than it saves)
MAX_TAPS, MAX_TAPS_SMALL, SMALL_OUTPUT = 25, 49, 5 << 19
# float32 lanes of an AVX-512 vector: output rows of whole vectors gather well (_gathers_well)
GATHER_LANES = 16

# producers of a strided depthwise convolution's input that may fuse into its phase split
_CHEAP = {aten.relu.default, aten.hardtanh.default, aten.clamp.default, aten.hardswish.default}
log = logging.getLogger(__name__)


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


def is_depthwise(n: torch.fx.Node) -> bool:
    """Whether ``n`` is a depthwise conv2d: one filter per input channel, more than one
    channel."""
    c = _conv(n)
    return c is not None and c["groups"] > 1 and int(c["x"].shape[1]) == c["groups"] \
        and int(c["w"].shape[1]) == 1


def as_matmul(n: torch.fx.Node) -> bool:
    """Whether a compiled ``n`` is emitted as a matmul (``conv_as_matmul``)."""
    return _plan(n) is not None


def _operands(node: torch.fx.Node) -> tuple:
    """A conv2d node's input, weight, bias (or None) and the metadata its emitted nodes
    keep."""
    b = node.args[2] if len(node.args) > 2 else None
    return node.args[0], node.args[1], b, source_meta(node)


def _padded(g, cur, val, padding, keep, pad=None):
    """``(node, value)`` of the input zero-padded by ``padding`` (rows, cols) on both
    sides, or by ``pad`` (``constant_pad_nd``'s list: last dimension first) if given."""
    if pad is None:
        ph, pw = padding
        pad = [pw, pw, ph, ph]
    if any(pad):
        val = torch.constant_pad_nd(val, pad, 0.0)
        cur = _emit(g, aten.constant_pad_nd.default, (cur, pad, 0.0), val, keep)
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


def _phases(g, cur, val, padding, stride, size, taps, pad_first, keep):
    """``(node, value, origin)``: the input split into its stride phases, ``[n, c, sh,
    sw, rows, cols]``, zero-padded so that every tap's window lies inside its phase.
    Phase ``(a, b)`` holds every ``sh``-th row from ``a`` and every ``sw``-th column from
    ``b``, so each tap of a strided convolution reads a unit-stride window of one phase
    (``_phase_window``) instead of a strided slice.

    ``pad_first``: pad the input by ``padding`` (and up to a multiple of the stride),
    then split; else split the input, then pad the phases (rows before, as many as the
    padding reaches, and after, as many as the taps read). ``origin``: per dimension,
    the input position phase 0 starts at and the phase rows padded before it.
    """
    (ph, pw), (sh, sw) = padding, stride
    n, c, h, w = (int(d) for d in val.shape)
    before = (ph, pw) if pad_first else (0, 0)
    eh, ew = -(h + 2 * before[0]) % sh, -(w + 2 * before[1]) % sw
    cur, val = _padded(g, cur, val, None, keep,
                       [before[1], before[1] + ew, before[0], before[0] + eh])
    rows, cols = (h + 2 * before[0] + eh) // sh, (w + 2 * before[1] + ew) // sw
    val = val.reshape(n, c, rows, sh, cols, sw)
    cur = _emit(g, aten.view.default, (cur, [n, c, rows, sh, cols, sw]), val, keep)
    val = val.permute(0, 1, 3, 5, 2, 4)
    cur = _emit(g, aten.permute.default, (cur, [0, 1, 3, 5, 2, 4]), val, keep)
    if pad_first:
        return cur, val, ((0, 0), (0, 0))
    origin = tuple((p, -(-p // s)) for p, s in zip(padding, stride))
    # the last tap's window ends at phase row (k - 1 - p) // s + out - 1 (before padding)
    after = [max(0, (k - 1 - p) // s + out - m) for out, k, p, s, m
             in zip(size, taps, padding, stride, (rows, cols))]
    cur, val = _padded(g, cur, val, None, keep, [origin[1][1], after[1], origin[0][1], after[0]])
    return cur, val, origin


def _phase_window(g, cur, val, origin, offset, stride, size, keep):
    """``(node, value)``: what ``_window`` gives for kernel tap ``offset``, read from the
    stride phases (``_phases``, its ``origin``) as a unit-stride window."""
    start = []
    for i, s, (o, f) in zip(offset, stride, origin):  # the row's phase, then the column's
        val = val.select(2, (i - o) % s)
        cur = _emit(g, aten.select.int, (cur, 2, (i - o) % s), val, keep)
        start.append((i - o) // s + f)
    return _window(g, cur, val, tuple(start), (1, 1), size, keep)


def _cheap(n) -> bool:
    """Whether IREE may fuse ``n`` into the transposing copy of ``_phases``: an op that
    costs next to nothing there (a clamp such as ReLU6 does; SiLU's exponential does
    not)."""
    return isinstance(n, torch.fx.Node) and n.op == "call_function" and n.target in _CHEAP


def _depthwise_plan(n: torch.fx.Node) -> dict | None:
    """How to emit a depthwise conv2d (one filter per channel, undilated, at most
    ``MAX_TAPS`` taps, ``MAX_TAPS_SMALL`` for an output of at most ``SMALL_OUTPUT``
    bytes) as shifted multiply-adds, or None."""
    c = _conv(n)
    if c is None or c["groups"] == 1 or c["dilation"] != [1, 1]:
        return None
    if int(c["x"].shape[1]) != c["groups"] or tuple(int(d) for d in c["w"].shape[:2]) \
            != (c["groups"], 1):
        return None
    kh, kw = c["k"]
    out = n.meta.get("val")
    small = out is not None and out.numel() * out.element_size() <= SMALL_OUTPUT
    if kh * kw > (MAX_TAPS_SMALL if small else MAX_TAPS):
        return None
    return {"k": c["k"], "stride": c["stride"], "padding": c["padding"]}


def depthwise_as_nhwc(node: torch.fx.Node, g: torch.fx.Graph, env: dict
                      ) -> torch.fx.Node | None:
    """For a compiled float32 depthwise conv2d (one filter per channel, undilated) that
    is strided or has more than 3x3 taps: emit it into ``g`` channels-last, the input
    permuted and then padded, the weight permuted to ``[kh, kw, c]``, through
    ``linalg_kernels.depthwise_nhwc`` (IREE's named channels-last depthwise convolution),
    permuted back, the bias added; operands through ``env``. None for anything else
    (unstrided 3x3 ones are shifted multiply-adds: ``depthwise_as_shifts``)."""
    c = _conv(node)
    if c is None or c["groups"] == 1 or c["dilation"] != [1, 1]:
        return None
    if c["stride"] == [1, 1] and c["k"][0] * c["k"][1] <= 9:
        return None
    ch = int(c["x"].shape[1])
    if ch != c["groups"] or tuple(int(d) for d in c["w"].shape[:2]) != (ch, 1) \
            or c["x"].dtype != torch.float32 or c["w"].dtype != torch.float32:
        return None
    x, w, b, keep = _operands(node)
    (kh, kw), (sh, sw), (ph, pw) = c["k"], c["stride"], c["padding"]
    xv = shadow(x.meta["val"]).permute(0, 2, 3, 1)
    cur = _emit(g, aten.permute.default, (env[x], [0, 2, 3, 1]), xv, keep)
    cur, xv = _padded(g, cur, xv, None, keep, pad=[0, 0, pw, pw, ph, ph])
    wv = shadow(w.meta["val"]).reshape(ch, kh, kw).permute(1, 2, 0)
    wn = env[w]
    if isinstance(wn, torch.Tensor) and not isinstance(wn, FakeTensor) and not wn.is_meta:
        # a weight held in the program: permuted here, not by IREE's constant evaluation
        # (which compiles and runs a module of its own, seconds of compile time)
        wn = wn.detach().reshape(ch, kh, kw).permute(1, 2, 0).contiguous()
    else:
        wn = _emit(g, aten.view.default, (wn, [ch, kh, kw]), wv.permute(2, 0, 1), keep)
        wn = _emit(g, aten.permute.default, (wn, [1, 2, 0]), wv, keep)
    yv = depthwise_nhwc(xv, wv, sh, sw)
    y = _emit(g, depthwise_nhwc, (cur, wn, sh, sw), yv, keep)
    y = _emit(g, aten.permute.default, (y, [0, 3, 1, 2]), yv.permute(0, 3, 1, 2), keep)
    return _biased(g, y, node, b, env, keep)


def _biased(g, y, node, b, env, keep):
    """``y`` plus the per-channel bias ``b`` (if any), as ``node``'s result."""
    out = node.meta["val"]
    if b is not None:
        c = int(out.shape[1])
        bv = shadow(b.meta["val"]).view(1, c, 1, 1)
        b4 = _emit(g, aten.view.default, (env[b], [1, c, 1, 1]), bv, keep)
        y = _emit(g, aten.add.Tensor, (y, b4), out, keep)
    y.meta = {**dict(node.meta), "val": out}
    return y


def depthwise_as_shifts(node: torch.fx.Node, g: torch.fx.Graph, env: dict
                        ) -> torch.fx.Node | None:
    """For a compiled depthwise conv2d (``_depthwise_plan``): emit it into ``g`` as the
    sum over kernel taps of the shifted input times that tap's per-channel weight,
    plus the bias, operands through ``env``; return the result node, or None."""
    plan = _depthwise_plan(node)
    if plan is None:
        return None
    x, w, b, keep = _operands(node)
    (kh, kw), stride = plan["k"], plan["stride"]
    out = node.meta["val"]
    c, ho, wo = int(out.shape[1]), int(out.shape[2]), int(out.shape[3])
    if stride == [1, 1]:
        cur, val = _padded(g, env[x], shadow(x.meta["val"]), plan["padding"], keep)
        window = _window
    else:
        cur, val, origin = _phases(g, env[x], shadow(x.meta["val"]), plan["padding"], stride,
                                   (ho, wo), (kh, kw), not _cheap(x), keep)

        def window(g, cur, val, offset, stride, size, keep):
            return _phase_window(g, cur, val, origin, offset, stride, size, keep)
    wv = shadow(w.meta["val"]).reshape(c, kh * kw)
    taps = _emit(g, aten.view.default, (env[w], [c, kh * kw]), wv, keep)
    acc = acc_v = None
    for i in range(kh):
        for j in range(kw):
            t, v = window(g, cur, val, (i, j), stride, (ho, wo), keep)
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
    return _biased(g, acc, node, b, env, keep)


def _columns(g, cur, val, taps, stride, size, keep):
    """``(node, value)`` of im2col: the ``taps`` windows of the input, ``[n, c, taps,
    rows, cols]``, each a (strided) slice."""
    cols, col_vals = [], []
    for i in range(taps[0]):
        for j in range(taps[1]):
            t, v = _window(g, cur, val, (i, j), stride, size, keep)
            cols.append(t)
            col_vals.append(v)
    if len(cols) == 1:
        return cols[0], col_vals[0]
    cval = torch.stack(col_vals, 2)
    return _emit(g, aten.stack.default, (cols, 2), cval, keep), cval


def _patches(g, cur, val, taps, size, keep):
    """``(node, value)``: ``_columns`` of a convolution whose stride is its kernel (a
    patch embedding: ViT's 16x16, Swin's and ConvNeXt's 4x4 stems), where the windows
    do not overlap: a view and one transposing copy instead of a slice per tap (a 16x16
    patch's 256 slices take IREE long to compile)."""
    (kh, kw), (ho, wo) = taps, size
    n, c = int(val.shape[0]), int(val.shape[1])
    cur, val = _window(g, cur, val, (0, 0), (1, 1), (ho * kh, wo * kw), keep)  # the rest unread
    val = val.reshape(n, c, ho, kh, wo, kw)
    cur = _emit(g, aten.view.default, (cur, [n, c, ho, kh, wo, kw]), val, keep)
    val = val.permute(0, 1, 3, 5, 2, 4)
    cur = _emit(g, aten.permute.default, (cur, [0, 1, 3, 5, 2, 4]), val, keep)
    return cur, val


def _unfolded(g, cur, val, taps, stride, size, keep):
    """``(node, value)``: ``_columns`` of a strided convolution as two sliding-window views
    (``unfold``) and one transposing copy, which IREE makes one dispatch instead of one
    strided slice copy per tap: mostly faster to run, and far fewer dispatches to
    compile (a 7x7 stem's dozens become 3). Unstrided kernels keep their slices: each is
    a contiguous copy of rows, faster than one transposing copy."""
    (kh, kw), (sh, sw) = taps, stride
    for dim, k, s in ((2, kh, sh), (3, kw, sw)):
        val = val.unfold(dim, k, s)
        cur = _emit(g, aten.unfold.default, (cur, dim, k, s), val, keep)
    val = val.permute(0, 1, 4, 5, 2, 3)  # [n, c, kh, kw, rows, cols]
    cur = _emit(g, aten.permute.default, (cur, [0, 1, 4, 5, 2, 3]), val, keep)
    return cur, val


def _gathers_well(wo: int, stride: tuple) -> bool:
    """Whether IREE runs ``linalg_kernels.im2col`` about as fast as a slice per tap for an
    unstrided kernel with output rows ``wo`` wide: rows of whole 16-lane vectors, or
    short rows (``benchmarks/im2col_forms.py``: unstrided 3x3 kernels on 32x32, 28x28,
    16x16 and 7x7 maps within noise of the slices or faster; on 56x56 ones, whose rows
    end in a partial vector, 1.1-1.3x slower). Strided kernels keep ``unfold``: one
    dispatch already, and the gather is no faster there."""
    return stride == (1, 1) and (wo % GATHER_LANES == 0 or wo <= GATHER_LANES)


def _gathered(g, cur, val, taps, stride, keep):
    """``(node, value)``: ``_columns`` as one copy (``linalg_kernels.im2col``)."""
    (kh, kw), (sh, sw) = taps, stride
    val = im2col(val, kh, kw, sh, sw)
    return _emit(g, im2col, (cur, kh, kw, sh, sw), val, keep), val


def conv_as_matmul(node: torch.fx.Node, g: torch.fx.Graph, env: dict, named: bool = False
                   ) -> torch.fx.Node | None:
    """For a compiled conv2d that IREE runs badly as a convolution (see ``_plan``): emit
    it into ``g`` as columns (a subsample, or strided slices stacked: im2col), a matmul
    over them and the bias add, operands through ``env``; return the result node, or
    None (the caller copies the node as it is).

    ``named``: the target takes ``linalg_kernels`` ops: a float32 kxk kernel's columns
    are one copy (``linalg_kernels.im2col``) instead of a slice per tap.

    Only compiled convolutions are rewritten: ATen runs them well (oneDNN).
    """
    plan = _plan(node)
    if plan is None:
        return None
    x, w, b, keep = _operands(node)
    (kh, kw), (sh, sw) = plan["k"], plan["stride"]
    cur, val = _padded(g, env[x], shadow(x.meta["val"]), plan["padding"], keep)
    out = node.meta["val"]
    n, c = int(val.shape[0]), int(val.shape[1])
    ho, wo = int(out.shape[2]), int(out.shape[3])
    kk = c * kh * kw
    if (sh, sw) == (kh, kw) and kk > c and plan["padding"] == [0, 0]:
        col, cval = _patches(g, cur, val, (kh, kw), (ho, wo), keep)
    elif named and kh * kw > 1 and val.dtype == torch.float32 and _gathers_well(wo, (sh, sw)):
        col, cval = _gathered(g, cur, val, (kh, kw), (sh, sw), keep)
    elif (sh, sw) != (1, 1) and kh * kw > 1:  # (a strided 1x1 kernel: one subsample)
        col, cval = _unfolded(g, cur, val, (kh, kw), (sh, sw), (ho, wo), keep)
    else:
        col, cval = _columns(g, cur, val, (kh, kw), (sh, sw), (ho, wo), keep)
    wv = shadow(w.meta["val"])
    co = int(wv.shape[0])
    w2 = _emit(g, aten.view.default, (env[w], [co, kk]), wv.reshape(co, kk), keep)
    if n == 1 and (sh, sw) == (kh, kw):
        # a patch embedding of one image: a 2-D matmul. Data-tiled, IREE 3.13's batch
        # matmul of a unit batch over ConvNeXt-T's 4x4 stem exceeds its 32 KB stack limit
        xr = _emit(g, aten.reshape.default, (col, [kk, ho * wo]), cval.reshape(kk, ho * wo),
                   keep)
        mm = _emit(g, aten.mm.default, (w2, xr),
                   torch.mm(wv.reshape(co, kk), cval.reshape(kk, ho * wo)), keep)
    else:
        xr = _emit(g, aten.reshape.default, (col, [n, kk, ho * wo]),
                   cval.reshape(n, kk, ho * wo), keep)
        mm = _emit(g, aten.matmul.default, (w2, xr),
                   torch.matmul(wv.reshape(co, kk), cval.reshape(n, kk, ho * wo)), keep)
    y = _emit(g, aten.view.default, (mm, [n, co, ho, wo]), out, keep)
    return _biased(g, y, node, b, env, keep)
