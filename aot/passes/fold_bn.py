"""Fold eval-mode batch norm into the convolution or linear beside it (a graph-level win).

``conv2d(x, w, b) -> batch_norm(., gamma, beta, mean, var, eps)`` with every
parameter constant becomes ``conv2d(x, w * s, (b - mean) * s + beta)`` with
``s = gamma / sqrt(var + eps)``, computed once at compile time: the batch-norm
pass over the activations disappears (eager runs it on every call). A linear
folds the same way where the batch norm normalises its output features: a 2-D
batch norm on the linear's output, or on a view of it that keeps its last
dimension (LeViT's ``bn(linear(x).flatten(0, 1))``). A 2-D batch norm whose output
only a linear reads folds into that linear instead: ``linear(x * s + t, w, b)`` is
``linear(x, w * s, b + w @ t)`` (LeViT's ``NormLinear`` heads). Applied to a copy of the
program and only where results may differ in the last bits, i.e. not under
``fallback="all"`` (the bit-exact round-trip mode).
"""

from __future__ import annotations

import copy
import logging
import operator

import torch

__all__ = ["fold_batch_norm"]
log = logging.getLogger(__name__)
aten = torch.ops.aten
_BN = aten._native_batch_norm_legit_no_training.default


def _const_name(ep, node):
    """State-dict name of a parameter/buffer placeholder, or None."""
    if not isinstance(node, torch.fx.Node) or node.op != "placeholder":
        return None
    sig = ep.graph_signature
    return sig.inputs_to_parameters.get(node.name) or sig.inputs_to_buffers.get(node.name)


_VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)


def _shape(node) -> tuple | None:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


def _producer(bn: torch.fx.Node) -> torch.fx.Node | None:
    """The conv2d or linear a batch norm folds into, or None: the conv2d read by
    nothing else, or the linear whose output features the batch norm normalises (its
    input 2-D, the linear's output or a chain of views of it keeping the last
    dimension, each read by nothing else)."""
    if bn.op != "call_function" or bn.target != _BN or not isinstance(bn.args[0], torch.fx.Node):
        return None
    x = bn.args[0]
    if x.target == aten.conv2d.default:
        return x if len(x.users) == 1 else None
    shape = _shape(x)
    if shape is None or len(shape) != 2:
        return None
    while x.op == "call_function" and x.target in _VIEWS and len(x.users) == 1:
        x = x.args[0]
    out = _shape(x)
    if x.op == "call_function" and x.target == aten.linear.default and len(x.users) == 1 \
            and out is not None and out[-1] == shape[1]:
        return x
    return None


def _consumer(bn: torch.fx.Node) -> torch.fx.Node | None:
    """The linear a 2-D batch norm folds into, or None: the one op reading the batch
    norm's output (its input, not its weight or bias), with a bias."""
    if bn.op != "call_function" or bn.target != _BN or _shape(bn.args[0]) is None \
            or len(_shape(bn.args[0])) != 2:
        return None
    outs = [u for u in bn.users if u.target is operator.getitem and u.args[1] == 0]
    if len(outs) != 1 or len(outs[0].users) != 1:
        return None
    lin = next(iter(outs[0].users))
    if lin.target != aten.linear.default or len(lin.args) < 3 or lin.args[2] is None \
            or lin.args[0] is not outs[0] or outs[0] in lin.args[1:]:
        return None
    return lin


def _foldable_pair(bn: torch.fx.Node) -> bool:
    return _producer(bn) is not None or _consumer(bn) is not None


def _bn_scale_shift(state, gamma, beta, mean, var, eps):
    """``s, t`` with ``batch_norm(x) == x * s + t`` (per channel)."""
    s = state[gamma] / torch.sqrt(state[var] + eps)
    return s, state[beta] - state[mean] * s


def fold_batch_norm(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """A copy of ``ep`` with conv -> batch norm pairs folded (``ep`` is untouched)."""
    if not any(_foldable_pair(n) for n in ep.graph.nodes):
        return ep
    ep = copy.deepcopy(ep)
    state = ep.state_dict
    g = ep.graph
    folded = 0
    for bn in [n for n in g.nodes if _foldable_pair(n)]:
        conv = _producer(bn)
        if conv is None:
            folded += _fold_into_consumer(ep, bn, _consumer(bn))
            continue
        x, w, b = (list(conv.args) + [None] * 3)[:3]
        gamma, beta, mean, var = bn.args[1:5]
        eps = bn.args[6]
        names = [_const_name(ep, a) for a in (w, gamma, beta, mean, var)]
        b_name = _const_name(ep, b) if b is not None else None
        if None in names or (b is not None and b_name is None):
            continue
        # the weight and beta tensors are rewritten: they must serve only this pair
        if len(w.users) != 1 or len(beta.users) != 1:
            continue
        uses = list(bn.users)
        if not all(u.target is operator.getitem for u in uses) \
                or any(u.args[1] != 0 and u.users for u in uses):
            continue  # the batch statistics outputs are used: keep the op
        wt, bt, mt = state[names[0]], state[names[2]], state[names[3]]
        with torch.no_grad():
            s, _ = _bn_scale_shift(state, *names[1:], eps)
            new_w = (wt * s.reshape(-1, *([1] * (wt.dim() - 1)))).to(wt.dtype)
            bias0 = state[b_name] if b_name else torch.zeros_like(mt)
            new_b = ((bias0 - mt) * s + bt).to(wt.dtype)
        state[names[0]] = torch.nn.Parameter(new_w, requires_grad=False)
        state[names[2]] = torch.nn.Parameter(new_b, requires_grad=False)
        args = list(conv.args)
        while len(args) < 3:
            args.append(None)
        args[2] = beta  # beta's placeholder now holds the folded bias
        conv.args = tuple(args)
        for u in uses:
            if u.args[1] == 0:
                u.replace_all_uses_with(bn.args[0])
            g.erase_node(u)
        g.erase_node(bn)
        folded += 1
    if folded:
        g.eliminate_dead_code()
        g.lint()
        ep.graph_module.recompile()
        log.info("folded %d batch norms into convolutions and linears", folded)
    return ep


def _fold_into_consumer(ep, bn: torch.fx.Node, lin: torch.fx.Node) -> int:
    """``linear(batch_norm(x), w, b)`` -> ``linear(x, w * s, b + w @ t)``; 1 if folded."""
    w, b = lin.args[1], lin.args[2]
    gamma, beta, mean, var = bn.args[1:5]
    names = [_const_name(ep, a) for a in (w, b, gamma, beta, mean, var)]
    uses = list(bn.users)
    if None in names or len(w.users) != 1 or len(b.users) != 1 \
            or not all(u.target is operator.getitem for u in uses) \
            or any(u.args[1] != 0 and u.users for u in uses):
        return 0  # shared weights, or the batch statistics outputs are used
    state = ep.state_dict
    wt, bt = state[names[0]], state[names[1]]
    with torch.no_grad():
        s, t = _bn_scale_shift(state, *names[2:], bn.args[6])
        new_w = (wt * s.reshape(1, -1)).to(wt.dtype)
        new_b = (bt + wt.to(t.dtype) @ t).to(bt.dtype)
    state[names[0]] = torch.nn.Parameter(new_w, requires_grad=False)
    state[names[1]] = torch.nn.Parameter(new_b, requires_grad=False)
    lin.args = (bn.args[0], *lin.args[1:])
    for u in uses:
        ep.graph.erase_node(u)
    ep.graph.erase_node(bn)
    return 1
