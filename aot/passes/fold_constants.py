"""Fold what does not depend on the inputs into constants, once, at compile time.

Eager PyTorch recomputes every op on every call, including those whose
operands are all parameters, buffers or literals: BERT's position ids
(``arange(seq)``) and their embedding lookup run on each call although they
never change. Here each such op is evaluated once on the constants, and the
values the rest of the program reads become new lifted constants of the
exported program (``InputKind.CONSTANT_TENSOR``, named ``_folded_<node>``);
the folded ops disappear from the program.

What is folded: ATen/prims ops that are deterministic (no RNG), mutate
nothing, and whose operands are constants (or folded values) and literals,
computed on the CPU (a program exported on CUDA tensors keeps its ops). A
view of a constant is never stored as a constant (its strides are the
reader's business); it stays in the program and its source is stored instead.
A value larger than ``MAX_BYTES`` (and than every constant it was computed
from) stays in the program too, so folding never inflates an artifact (e.g.
an ``expand`` of a bias to a batch-sized tensor). The values are the ones
eager computes (same kernels, same inputs), bit for bit on the CPU; like batch
norm folding it is skipped under ``fallback="all"``.
"""

from __future__ import annotations

import copy
import logging

import torch
from torch.export.graph_signature import InputKind, InputSpec, TensorArgument

__all__ = ["fold_constants", "MAX_BYTES"]
log = logging.getLogger(__name__)

MAX_BYTES = 1 << 20  # a folded value may always be this large


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _foldable_op(target) -> bool:
    if not isinstance(target, torch._ops.OpOverload) or target.namespace not in ("aten", "prims"):
        return False
    schema = target._schema
    return (not schema.is_mutable and torch.Tag.nondeterministic_seeded not in target.tags
            and len(schema.returns) == 1)


def _is_view(target) -> bool:
    ret = target._schema.returns[0]
    return ret.alias_info is not None


def _evaluate(ep: torch.export.ExportedProgram) -> tuple[dict, set]:
    """``(values, folded)``: each foldable node's value; the call nodes among them."""
    sig = ep.graph_signature
    lifted = {**sig.inputs_to_parameters, **sig.inputs_to_buffers,
              **sig.inputs_to_lifted_tensor_constants}
    state = {**ep.state_dict, **getattr(ep, "constants", {})}
    values: dict[torch.fx.Node, torch.Tensor] = {}
    folded: set[torch.fx.Node] = set()
    for n in ep.graph.nodes:
        if n.op == "placeholder" and n.name in lifted:
            values[n] = state[lifted[n.name]]
            continue
        if n.op != "call_function" or not _foldable_op(n.target):
            continue
        if not all(a in values for a in n.all_input_nodes):
            continue
        args, kwargs = torch.fx.map_arg((n.args, n.kwargs), lambda a: values[a])
        try:
            with torch.no_grad():
                out = n.target(*args, **kwargs)
        except Exception as e:  # e.g. a device absent here: the op stays in the program
            log.debug("not folding %s: %s", n.name, e)
            continue
        if not isinstance(out, torch.Tensor) or out.requires_grad or out.is_quantized \
                or out.device.type != "cpu":  # constants are stored from the CPU
            continue
        ins = [values[a] for a in n.all_input_nodes]
        if _bytes(out) > max([MAX_BYTES] + [_bytes(t) for t in ins]):
            continue
        values[n] = out
        folded.add(n)
    return values, folded


def _stored(values: dict, folded: set) -> list[torch.fx.Node]:
    """The folded nodes whose values non-folded nodes read, views replaced by their sources."""
    folded = set(folded)
    while True:
        stored = [n for n in folded if any(u not in folded for u in n.users)]
        views = [n for n in stored if _is_view(n.target)]
        if not views:
            return sorted(stored, key=lambda n: list(n.graph.nodes).index(n))
        folded -= set(views)  # the view stays; what it reads becomes the stored value


def fold_constants(ep: torch.export.ExportedProgram) -> tuple[torch.export.ExportedProgram, int]:
    """``(program, ops folded)``: a copy of ``ep`` with input-independent ops folded
    into constants (``ep`` itself is untouched)."""
    values, folded = _evaluate(ep)
    stored = [n for n in _stored(values, folded) if n.op == "call_function"]
    if not stored:
        return ep, 0
    names = {n.name for n in stored}
    stored_values = {n.name: values[n].contiguous() for n in stored}
    ep = copy.deepcopy(ep)
    g = ep.graph
    nodes = {n.name: n for n in g.nodes}
    placeholders = [n for n in g.nodes if n.op == "placeholder"]
    specs = ep.graph_signature.input_specs
    # constants go before the user inputs (placeholders and input specs stay in step)
    at = next((i for i, s in enumerate(specs) if s.kind == InputKind.USER_INPUT), len(specs))
    anchor = placeholders[at] if at < len(placeholders) else None
    fake_mode = next((p.meta["val"].fake_mode for p in placeholders
                      if hasattr(p.meta.get("val"), "fake_mode")), None)
    for k, name in enumerate(sorted(names, key=list(nodes).index)):
        node, value = nodes[name], stored_values[name]
        target = f"_folded_{name}"
        if anchor is not None:
            with g.inserting_before(anchor):
                ph = g.placeholder(target)
        else:  # after the last placeholder, or first in a program without any
            with (g.inserting_after(placeholders[-1]) if placeholders
                  else g.inserting_before(next(iter(g.nodes)))):
                ph = g.placeholder(target)
            placeholders.append(ph)
        ph.meta["val"] = (fake_mode.from_tensor(value, static_shapes=True)
                          if fake_mode is not None else node.meta.get("val"))
        specs.insert(at + k, InputSpec(kind=InputKind.CONSTANT_TENSOR,
                                       arg=TensorArgument(name=ph.name), target=target,
                                       persistent=None))
        ep._constants[target] = value
        node.replace_all_uses_with(ph)
    before = sum(n.op == "call_function" for n in g.nodes)
    g.eliminate_dead_code()
    g.lint()
    ep.graph_module.recompile()
    n_folded = before - sum(n.op == "call_function" for n in g.nodes)
    log.info("folded %d input-independent ops into %d constants", n_folded, len(stored))
    return ep, n_folded
