"""PT2E quantized programs: Q/DQ patterns rewritten into integer ``aot_q`` ops.

torchao's ``convert_pt2e`` leaves a quantized model in reference form: torch's
``quantized_decomposed`` ops quantize and dequantize integer tensors, with static
parameters, around ordinary float ops::

    dequantize(x_q) -> conv2d(., dequantize(w_q), bias) -> relu -> quantize(.)

Compiled as it stands, every op runs in float on dequantized values. Here each
such pattern becomes the ``aot_q`` op (``aot.fallback.quantized_ops``) computing it
on the integers, so ``placement="coverage"`` compiles int8 arithmetic
(``int8_decompositions``) and ``fallback_ops=["aot_q"]`` runs ATen's kernels:

=========================================================  ===============================
pattern (static qparams)                                   becomes
=========================================================  ===============================
quantize / dequantize of an activation                     ``aot_q.quantize`` / ``dequantize``
conv2d, linear -> [relu | hardtanh] -> quantize            ``aot_q.conv2d``, ``aot_q.linear``
                                                           (a hardtanh: ``clamp`` on the integers)
conv2d, linear whose result stays float                    ``aot_q.conv2d_f32``, ``linear_f32``
add -> [relu] -> quantize; cat -> quantize                 ``aot_q.add``; ``aot_q.cat``
max_pool2d, adaptive_avg_pool2d -> quantize (same qparams)  ``aot_q.max_pool2d``, ``...avg_pool2d``
view, permute, flatten... -> quantize (same qparams)       the same op on the integers
=========================================================  ===============================

Activations are ``uint8`` in the ``aot_q`` ops. An ``int8`` activation with zero
point ``z`` is stored as ``uint8`` with zero point ``z + 128``: the same real
values and the same rounding (clamping ``round(x/s) + z`` to [-128, 127] is
clamping ``round(x/s) + z + 128`` to [0, 255]), so int8 schemes map exactly. A
clamp after the op commutes with quantization (``q(clamp(y, lo, hi)) =
clamp(q(y), q(lo), q(hi))`` for the increasing ``q``), which is how ``relu``
and ``hardtanh`` move onto the integers.

What is not rewritten stays as it is, and stays correct: run-time qparams
(dynamic quantization's ``choose_qparams``), a restricted range
(``reduce_range``), weights not per-tensor or per-output-channel int8, and float
ops with no ``aot_q`` counterpart (``matmul`` of two activations, ``layer_norm``).
Their Q/DQ ops import and run as the converted model runs them; the compile
report lists where each ran, and this module logs what it left.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch._guards import detect_fake_mode
from torch.export.graph_signature import InputKind, InputSpec, TensorArgument
from torch.fx.passes.shape_prop import _extract_tensor_metadata

from ..fallback import quantized_ops  # noqa: F401  (registers torch.ops.aot_q)
from .locations import node_location

__all__ = ["is_pt2e", "rewrite_pt2e"]
log = logging.getLogger(__name__)

aten = torch.ops.aten
aot_q = torch.ops.aot_q
# the full range of each activation dtype; int8 is stored shifted into uint8's
_FULL_RANGE = {torch.uint8: (0, 255), torch.int8: (-128, 127)}
_SHIFT = {torch.uint8: 0, torch.int8: 128}
# ops that only move values: between a dequantize and a quantize with the same
# parameters they give the same integers when applied to the integers themselves
_MOVES = {aten.view.default, aten._unsafe_view.default, aten.reshape.default,
          aten.permute.default, aten.transpose.int, aten.t.default, aten.flatten.using_ints,
          aten.squeeze.dim, aten.squeeze.dims, aten.unsqueeze.default, aten.clone.default,
          aten.expand.default, aten.slice.Tensor, aten.select.int}


def _qd():
    """torch's ``quantized_decomposed`` ops (defined on import of their module)."""
    try:
        import torch.ao.quantization.fx._decomposed  # noqa: F401
        return torch.ops.quantized_decomposed
    except (ImportError, AttributeError, RuntimeError):
        return None


def is_pt2e(ep: torch.export.ExportedProgram) -> bool:
    """``ep`` holds torch's ``quantized_decomposed`` ops: a PT2E (converted) program."""
    return _qd() is not None and any(_namespace(n) == "quantized_decomposed"
                                     for n in ep.graph_module.graph.nodes)


def rewrite_pt2e(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """Rewrite the PT2E Q/DQ patterns of ``ep`` into ``aot_q`` ops (in place).

    Args:
        ep: a functional ATen program, as the importer exports it.
    Returns:
        ``ep``, rewritten; unchanged when it holds no ``quantized_decomposed`` op.
    """
    if not is_pt2e(ep):
        return ep
    qd, g = _qd(), ep.graph_module.graph
    n_act = _integer_activations(g, qd)
    rules = {aten.conv2d.default: _conv2d, aten.linear.default: _linear,
             aten.add.Tensor: _add, aten.cat.default: _cat,
             aten.max_pool2d.default: _max_pool2d,
             aten.adaptive_avg_pool2d.default: _adaptive_avg_pool2d}
    done: Counter = Counter()
    ctx = _Constants(ep)
    for n in list(g.nodes):
        if n.op != "call_function":
            continue
        rule = rules.get(n.target) or (_move if n.target in _MOVES else None)
        what = rule(n, qd, ctx) if rule is not None else None
        if what:
            done[what] += 1
    g.eliminate_dead_code()
    g.lint()
    ep.graph_module.recompile()
    left = Counter(str(n.target) for n in g.nodes if _namespace(n) == "quantized_decomposed")
    log.info("PT2E: %d activation quantize(s) on integers; rewritten: %s; left as Q/DQ: %s",
             n_act, dict(done) or "nothing", dict(left) or "nothing")
    for n in g.nodes:
        if n.op == "call_function" and n.target in (aten.conv2d.default, aten.linear.default):
            log.info("PT2E: %s at %s stays a float op (its operands are not statically "
                     "quantized uint8/int8 activations and int8 weights)", n.target,
                     node_location(n))
    return ep


def _namespace(n: torch.fx.Node) -> str | None:
    return getattr(n.target, "namespace", None) if n.op == "call_function" else None


# --- activations: quantize/dequantize pairs onto uint8 storage ---------------------------

def _static_qparams(n: torch.fx.Node):
    """``(scale, zero_point, quant_min, quant_max, dtype)`` of a per-tensor Q or DQ, if static."""
    if len(n.args) < 6:
        return None
    s, z, lo, hi, dtype = n.args[1:6]
    if isinstance(s, torch.fx.Node) or isinstance(z, torch.fx.Node):
        return None
    if n.kwargs.get("out_dtype") not in (None, torch.float32):
        return None
    return float(s), int(z), int(lo), int(hi), dtype


def _integer_activations(g: torch.fx.Graph, qd) -> int:
    """Each static full-range quantize whose users all dequantize it: ``aot_q`` ops."""
    count = 0
    for n in list(g.nodes):
        if n.op != "call_function" or n.target != qd.quantize_per_tensor.default:
            continue
        p = _static_qparams(n)
        if p is None or _FULL_RANGE.get(p[4]) != (p[2], p[3]) or _dtype(n.args[0]) != torch.float32:
            continue
        users = list(n.users)
        if not users or any(u.target != qd.dequantize_per_tensor.default
                            or _static_qparams(u) != p for u in users):
            continue
        scale, zp = p[0], p[1] + _SHIFT[p[4]]
        q = _emit(g, n, aot_q.quantize.default, (n.args[0], scale, zp), n)
        for u in users:
            u.replace_all_uses_with(_emit(g, u, aot_q.dequantize.default, (q, scale, zp), u))
            g.erase_node(u)
        g.erase_node(n)  # now, so that the users the rules count are the live ones
        count += 1
    return count


# --- pattern rules: each returns what it rewrote, or None ---------------------------------

def _conv2d(n, qd, ctx):
    a = _operands(n)
    x, w = _dequantized(a["input"]), _weight(a["weight"], qd, ctx)
    if x is None or w is None or not _float_or_none(a["bias"]) or isinstance(a["padding"], str) \
            or len(_shape(a["input"]) or ()) != 4:  # the aot_q ops take batched NCHW
        return None
    geometry = (_pair(a["stride"]), _pair(a["padding"]), _pair(a["dilation"]), a["groups"])
    out = _output(n)
    if out is None:
        _replace(n, aot_q.conv2d_f32.default, (x[0], *w, a["bias"], *geometry, *x[1:]))
        return "conv2d -> aot_q.conv2d_f32"
    q, relu, clamp = out
    new = _emit(n.graph, q, aot_q.conv2d.default,
                (x[0], *w, a["bias"], *geometry, *x[1:], *q.args[1:3], relu), n)
    _finish(q, new, clamp, n)
    return "conv2d -> aot_q.conv2d"


def _linear(n, qd, ctx):
    a = _operands(n)
    x, w = _dequantized(a["input"]), _weight(a["weight"], qd, ctx)
    if x is None or w is None or not _float_or_none(a["bias"]) \
            or len(_shape(a["input"]) or ()) < 2:
        return None
    out = _output(n)
    if out is None:
        _replace(n, aot_q.linear_f32.default, (x[0], *w, a["bias"], *x[1:]))
        return "linear -> aot_q.linear_f32"
    q, relu, clamp = out
    new = _emit(n.graph, q, aot_q.linear.default,
                (x[0], *w, a["bias"], *x[1:], *q.args[1:3], relu), n)
    _finish(q, new, clamp, n)
    return "linear -> aot_q.linear"


def _add(n, qd, ctx):
    a = _operands(n)
    x, y = _dequantized(a["self"]), _dequantized(a["other"])
    if x is None or y is None or a["alpha"] != 1 or _shape(a["self"]) != _shape(a["other"]):
        return None
    out = _output(n)
    if out is None:
        return None
    q, relu, clamp = out
    new = _emit(n.graph, q, aot_q.add.default, (*x, *y, *q.args[1:3], relu), n)
    _finish(q, new, clamp, n)
    return "add -> aot_q.add"


def _cat(n, qd, ctx):
    a = _operands(n)
    xs = [_dequantized(t) for t in a["tensors"]]
    out = _output(n)
    if any(x is None for x in xs) or out is None or out[1:] != (False, None):
        return None
    q = out[0]
    dim = a["dim"] % len(_shape(n))
    new = _emit(n.graph, q, aot_q.cat.default,
                ([x[0] for x in xs], [x[1] for x in xs], [x[2] for x in xs], dim,
                 *q.args[1:3]), n)
    q.replace_all_uses_with(new)
    return "cat -> aot_q.cat"


def _max_pool2d(n, qd, ctx):
    a = _operands(n)
    x, q = _dequantized(a["self"]), _same_params_output(n)
    if x is None or q is None or len(_shape(n)) != 4:
        return None
    stride = _pair(a["stride"]) if a["stride"] else []
    new = _emit(n.graph, q, aot_q.max_pool2d.default,
                (*x, _pair(a["kernel_size"]), stride, _pair(a["padding"]),
                 _pair(a["dilation"]), a["ceil_mode"]), n)
    q.replace_all_uses_with(new)
    return "max_pool2d -> aot_q.max_pool2d"


def _adaptive_avg_pool2d(n, qd, ctx):
    x, q = _dequantized(n.args[0]), _same_params_output(n)
    if x is None or q is None or len(_shape(n)) != 4:
        return None
    new = _emit(n.graph, q, aot_q.adaptive_avg_pool2d.default, (*x, _pair(n.args[1])), n)
    q.replace_all_uses_with(new)
    return "adaptive_avg_pool2d -> aot_q.adaptive_avg_pool2d"


def _move(n, qd, ctx):
    x, q = _dequantized(n.args[0]), _same_params_output(n)
    if x is None or q is None:
        return None
    new = _emit(n.graph, q, n.target, (x[0], *n.args[1:]), n, dict(n.kwargs))
    q.replace_all_uses_with(new)
    return f"{n.target._schema.name.split('::')[1]} on the integers"


# --- pattern pieces ------------------------------------------------------------------------

def _operands(n: torch.fx.Node) -> dict:
    """The node's operands by schema name, defaults filled in."""
    out = {}
    for i, arg in enumerate(n.target._schema.arguments):
        if i < len(n.args) and not arg.kwarg_only:
            out[arg.name] = n.args[i]
        elif arg.name in n.kwargs:
            out[arg.name] = n.kwargs[arg.name]
        else:
            out[arg.name] = arg.default_value if arg.has_default_value() else None
    return out


def _dequantized(a):
    """``(uint8 node, scale, zero_point)`` when ``a`` dequantizes an activation."""
    if isinstance(a, torch.fx.Node) and a.target == aot_q.dequantize.default:
        return a.args[0], a.args[1], a.args[2]
    return None


def _weight(a, qd, ctx):
    """``(w, w_scales, w_zero_points, axis)`` when ``a`` dequantizes an int8 weight
    per output channel (axis 0) or per tensor (axis -1, parameters as constants)."""
    if not isinstance(a, torch.fx.Node) or a.op != "call_function":
        return None
    w = a.args[0]
    if _dtype(w) != torch.int8 or a.kwargs.get("out_dtype") not in (None, torch.float32):
        return None
    if a.target == qd.dequantize_per_channel.default:
        scales, zps, axis, _, _, dtype = a.args[1:7]
        if axis != 0 or dtype != torch.int8:
            return None
        if zps is None:
            zps = ctx.tensor(torch.zeros(_shape(scales)[0], dtype=torch.int64))
        return w, scales, zps, 0
    if a.target == qd.dequantize_per_tensor.default:
        p = _static_qparams(a)
        if p is None or p[4] != torch.int8:
            return None
        return (w, ctx.tensor(torch.tensor([p[0]], dtype=torch.float64)),
                ctx.tensor(torch.tensor([p[1]], dtype=torch.int64)), -1)
    return None


def _output(n: torch.fx.Node):
    """``(quantize node, relu, clamp)`` when ``n``'s only use is ``[relu | hardtanh] ->
    quantize``: ``relu`` clamps at the zero point (the ``aot_q`` op's own flag), ``clamp``
    is None or the ``(min, max)`` integers a hardtanh leaves (min None: the relu's)."""
    act = next(iter(n.users)) if len(n.users) == 1 else None
    if act is None or act.target not in (aten.relu.default, aten.hardtanh.default):
        act = None
    chain = act if act is not None else n
    if len(chain.users) != 1:
        return None
    q = next(iter(chain.users))
    if q.target != aot_q.quantize.default:
        return None
    if act is None:
        return q, False, None
    if act.target == aten.relu.default:
        return q, True, None
    scale, zp = q.args[1], q.args[2]
    bounds = _operands(act)
    lo = _quantized_scalar(bounds["min_val"], scale, zp)
    hi = _quantized_scalar(bounds["max_val"], scale, zp)
    return q, lo == zp, (None if lo == zp else lo, hi)


def _same_params_output(n: torch.fx.Node):
    """The quantize that is ``n``'s only use, when it has the parameters of ``n``'s input."""
    x = _dequantized(n.args[0])
    out = _output(n)
    if x is None or out is None or out[1:] != (False, None) or tuple(out[0].args[1:3]) != x[1:]:
        return None
    return out[0]


def _quantized_scalar(v: float, scale: float, zp: int) -> int:
    """``v`` quantized as ``quantized_decomposed.quantize_per_tensor`` computes it."""
    t = torch.round(torch.tensor(float(v), dtype=torch.float32) * (1.0 / scale)) + zp
    return int(t.clamp(0, 255))


def _finish(q: torch.fx.Node, new: torch.fx.Node, clamp, anchor: torch.fx.Node) -> None:
    """``new`` (then the clamp on the integers, if any) replaces the quantize ``q``."""
    if clamp is not None:
        new = _emit(q.graph, q, aten.clamp.default, (new, *clamp), anchor)
    q.replace_all_uses_with(new)


def _replace(n: torch.fx.Node, target, args) -> None:
    n.replace_all_uses_with(_emit(n.graph, n, target, args, n))


def _pair(v) -> list[int]:
    v = [v] if isinstance(v, int) else list(v)
    return v * 2 if len(v) == 1 else v


def _val(a):
    return a.meta.get("val") if isinstance(a, torch.fx.Node) else None


def _dtype(a):
    v = _val(a)
    return v.dtype if isinstance(v, torch.Tensor) else None


def _shape(a):
    v = _val(a)
    return tuple(v.shape) if isinstance(v, torch.Tensor) else None


def _float_or_none(a) -> bool:
    return a is None or _dtype(a) == torch.float32


# --- graph edits ---------------------------------------------------------------------------

def _emit(g: torch.fx.Graph, before: torch.fx.Node, target, args, like: torch.fx.Node,
          kwargs=None) -> torch.fx.Node:
    """A node calling ``target`` before ``before``, with ``like``'s source location and
    the value its fake implementation gives."""
    with g.inserting_before(before):
        new = g.call_function(target, tuple(args), kwargs or {})
    new.meta = {k: v for k, v in like.meta.items() if k not in ("val", "tensor_meta")}
    vals = pytree.tree_map(lambda a: a.meta["val"] if isinstance(a, torch.fx.Node) else a,
                           (new.args, new.kwargs))
    with detect_fake_mode(pytree.tree_leaves(vals)) or contextlib.nullcontext():
        new.meta["val"] = target(*vals[0], **vals[1])
    new.meta["tensor_meta"] = _extract_tensor_metadata(new.meta["val"])
    return new


class _Constants:
    """New lifted constants of the program (per-tensor weight parameters as tensors)."""

    def __init__(self, ep: torch.export.ExportedProgram):
        self.ep, self.made = ep, {}

    def tensor(self, value: torch.Tensor) -> torch.fx.Node:
        key = (value.dtype, tuple(value.tolist()))
        if key in self.made:
            return self.made[key]
        g, specs = self.ep.graph_module.graph, self.ep.graph_signature.input_specs
        placeholders = [n for n in g.nodes if n.op == "placeholder"]
        # constants go before the user inputs (placeholders and input specs stay in step)
        at = next((i for i, s in enumerate(specs) if s.kind == InputKind.USER_INPUT), len(specs))
        target = f"_pt2e_qparam_{len(self.made)}"
        with (g.inserting_before(placeholders[at]) if at < len(placeholders)
              else g.inserting_after(placeholders[-1])):
            ph = g.placeholder(target)
        mode = detect_fake_mode([p.meta.get("val") for p in placeholders])
        ph.meta["val"] = mode.from_tensor(value, static_shapes=True) if mode else value
        specs.insert(at, InputSpec(kind=InputKind.CONSTANT_TENSOR,
                                   arg=TensorArgument(name=ph.name), target=target,
                                   persistent=None))
        self.ep._constants[target] = value
        self.made[key] = ph
        return ph
