"""The symbols of a program exported with ``dynamic_shapes``, for the manifest.

``symbol_table`` reads the exported program's range constraints and the model
inputs' fake shapes: one entry per symbol with its range, its example value, the
user's name for it (the ``torch.export.Dim``'s, where the dynamic-shapes spec
names one) and the input dimensions that bind it at run time (``aot.symbolic``).
"""

from __future__ import annotations

import inspect
import math

import torch
import torch.fx
import torch.utils._pytree as pytree

from ..errors import ExportFailed
from ..fallback.static_values import SymSize
from ..symbolic import is_input_symbol

__all__ = ["symbol_table", "declared_dims", "dim_names", "export_example", "symbolic_sizes",
           "is_symbolic_value", "hint", "meta_at_hints", "resized"]

# a range end torch leaves open (int_oo) is written as this many elements
_UNBOUNDED = 2 ** 62


def _end(v, default: int) -> int:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return default
    return default if math.isinf(f) else int(f)


def symbol_table(ep: torch.export.ExportedProgram, flat: list, names: tuple[str, ...],
                 dim_names: dict[tuple[int, int], str]) -> dict:
    """``{symbol: {"name", "min", "max", "example", "binds": [...]}}``; ``{}`` for a
    static program. ``flat``: the example input leaves, ``names`` theirs."""
    user = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    vals = {n.name: n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder"}
    table: dict[str, dict] = {}
    # backed symbols only: an unbacked one (``u0``) is a size the data decides (nonzero)
    ranges = {str(k): v for k, v in ep.range_constraints.items() if is_input_symbol(str(k))}
    tensor_leaf = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]
    if len(user) != len(flat):
        user_of_leaf = dict(zip(tensor_leaf, [u for u in user
                                              if isinstance(vals.get(u), torch.Tensor)]))
    else:
        user_of_leaf = dict(enumerate(user))
    for leaf, ph in user_of_leaf.items():
        v = vals.get(ph)
        if not isinstance(v, torch.Tensor):
            continue
        for d, size in enumerate(v.shape):
            if not isinstance(size, torch.SymInt):
                continue
            expr = size.node.expr
            if not expr.is_symbol:
                continue  # a derived size (2*s0): checked once its symbols are bound
            sym = str(expr)
            r = ranges.get(sym)
            entry = table.setdefault(sym, {
                "name": dim_names.get((leaf, d), sym),
                "min": _end(r.lower, 0) if r is not None else 0,
                "max": _end(r.upper, _UNBOUNDED) if r is not None else _UNBOUNDED,
                "example": int(flat[leaf].shape[d]), "binds": []})
            if size.node.hint is not None and int(size.node.hint) != entry["example"]:
                entry["exported"] = int(size.node.hint)  # an example of 1, exported at 2
            entry["binds"].append({"input": leaf, "name": names[leaf], "dim": d})
    missing = set(ranges) - set(table)
    if missing:
        raise ExportFailed(f"dynamic_shapes: the symbol(s) {sorted(missing)} are not the "
                           "size of any input dimension, so no call could set them; "
                           "make each Dim the size of an input dimension")
    return table


def declared_dims(model, args: tuple, kwargs: dict, dynamic_shapes) -> dict[tuple[int, int], object]:
    """``(flat input leaf, dim) -> its Dim`` (or ``Dim.AUTO``/``Dim.DYNAMIC``) for every
    dimension ``dynamic_shapes`` declares.

    ``dynamic_shapes`` is what ``torch.export`` takes: a tuple/list following ``args``
    (then ``kwargs`` by name), or a dict keyed by ``forward``'s parameter names; per
    tensor a dict ``{dim: Dim}`` or a list with a ``Dim`` or None per dimension.
    Nested inputs are left out (their symbols are still found from the export).
    """
    if dynamic_shapes is None:
        return {}
    if isinstance(dynamic_shapes, dict):
        try:
            bound = inspect.signature(model.forward).bind(*args, **kwargs)
        except (TypeError, ValueError):
            return {}
        per_input = [dynamic_shapes.get(k) for k in bound.arguments]
        leaves = list(bound.arguments.values())
    else:
        per_input = _varargs_spread(model, len(args), list(dynamic_shapes)) + [None] * len(kwargs)
        leaves = list(args) + list(kwargs.values())
    out, flat_i = {}, 0
    for leaf, spec in zip(leaves, per_input):
        if not isinstance(leaf, torch.Tensor):
            return out  # a nested or non-tensor leaf: flat positions no longer line up
        items = spec.items() if isinstance(spec, dict) else (
            enumerate(spec) if isinstance(spec, (list, tuple)) else ())
        for d, dim in items:
            if isinstance(d, int) and dim is not None and -leaf.dim() <= d < leaf.dim() \
                    and getattr(dim, "__name__", None) != "STATIC":
                out[(flat_i, d % leaf.dim())] = dim
        flat_i += 1
    return out


def _varargs_spread(model, n_args: int, per_input: list) -> list:
    """``per_input`` with the entry for ``forward``'s ``*args`` (torch.export takes a
    tuple there, one spec per extra argument) spread over those arguments."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return per_input
    fixed = 0
    for p in params:
        if p.kind == p.VAR_POSITIONAL:
            break
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            return per_input
        fixed += 1
    else:
        return per_input
    if len(per_input) == fixed + 1 and isinstance(per_input[fixed], (tuple, list)) \
            and len(per_input[fixed]) == n_args - fixed:
        return per_input[:fixed] + list(per_input[fixed])
    return per_input


def dim_names(declared: dict[tuple[int, int], object]) -> dict[tuple[int, int], str]:
    """``(flat input leaf, dim) -> the Dim's name`` where the user named one."""
    return {k: dim.__name__ for k, dim in declared.items()
            if isinstance(getattr(dim, "__name__", None), str)
            and dim.__name__ not in ("AUTO", "DYNAMIC")}


def export_example(args: tuple, kwargs: dict, declared: dict[tuple[int, int], object],
                   names: tuple[str, ...]) -> tuple[tuple, dict, list[str]]:
    """``(args, kwargs, notes)`` to export with: every declared dimension whose example
    size is 1 (and whose range reaches 2) repeated to 2. torch.export fixes a dimension
    whose example is 0 or 1; the user's own example still sets the sizes placement is
    measured at, and the manifest's example sizes. An input that is a view (``big[2:6]``,
    ``arange(256).reshape(16, 16)``) is exported as a copy: torch.export (2.14 at least,
    static shapes too) would give its base's sizes symbols that no call could set."""
    flat, spec = pytree.tree_flatten((args, kwargs))
    flat = [x.clone() if isinstance(x, torch.Tensor) and x._is_view() else x for x in flat]
    notes = []
    for (leaf, d), dim in sorted(declared.items(), key=lambda kv: kv[0]):
        x = flat[leaf] if leaf < len(flat) else None
        hi = getattr(dim, "max", None)
        if isinstance(x, torch.Tensor) and x.shape[d] == 1 and (
                not isinstance(hi, int) or hi >= 2):
            flat[leaf] = resized(x, d, 2)
            notes.append(f"{names[leaf]} dimension {d}")
    out_args, out_kwargs = pytree.tree_unflatten(flat, spec)
    return tuple(out_args), dict(out_kwargs), notes


def _backed_expr(v):
    """The sympy expression of a SymInt that follows input symbols (not data), or None."""
    if not isinstance(v, torch.SymInt):
        return None
    expr = v.node.expr
    if expr.is_number or not all(is_input_symbol(str(f)) for f in expr.free_symbols):
        return None
    return expr


def symbolic_sizes(value):
    """An FX operand (a node holding a SymInt, or a list of sizes with such nodes) as the
    static-value contract records it (``SymSize`` where a size follows a symbol), or None
    when it holds no symbolic size or holds something else only known at run time."""

    def one(a):
        v = a.meta.get("val") if isinstance(a, torch.fx.Node) else a
        if not isinstance(v, torch.SymInt):
            if isinstance(a, torch.fx.Node) and not (isinstance(v, int)
                                                     and not isinstance(v, bool)):
                raise LookupError  # a node holding something else only known at run time
            return v
        expr = _backed_expr(v)
        if expr is None:
            raise LookupError
        return SymSize(str(expr))
    try:
        if isinstance(value, (list, tuple)):
            out = [one(a) for a in value]
            if not any(isinstance(a, SymSize) for a in out):
                return None
            return tuple(out) if isinstance(value, tuple) else out
        out = one(value)
        return out if isinstance(out, SymSize) else None
    except LookupError:
        return None


def is_symbolic_value(v) -> bool:
    """A fake tensor (or SymInt, or a list of them) with a size that follows a symbol."""
    if isinstance(v, torch.Tensor):
        return any(isinstance(d, torch.SymInt) and not d.node.expr.is_number
                   for d in (*v.shape, *v.stride()))
    if isinstance(v, torch.SymInt):
        return not v.node.expr.is_number
    if isinstance(v, (list, tuple)):
        return any(is_symbolic_value(x) for x in v)
    return False


def hint(d) -> int:
    """A size at the example inputs (a SymInt's hint), never adding a guard."""
    if not isinstance(d, torch.SymInt):
        return int(d)
    h = d.node.hint
    if h is None:  # a size the data decides has no example value
        raise LookupError(f"size {d} has no example value")
    return int(h)


def meta_at_hints(v):
    """A (fake) tensor as a meta tensor of the example's sizes (to ask torch about an op
    at those sizes, e.g. its FLOPs, without touching the symbols); a SymInt as its
    example value; other values as they are."""
    if isinstance(v, torch.Tensor):
        return torch.empty_strided([hint(d) for d in v.shape], [hint(d) for d in v.stride()],
                                   dtype=v.dtype, device="meta")
    if isinstance(v, torch.SymInt):
        return hint(v)
    return v


def resized(x: torch.Tensor, dim: int, n: int) -> torch.Tensor:
    """``x`` with ``n`` entries along ``dim``: its own repeated, then cut (an example
    input at another size of a dynamic dimension, its values still valid inputs)."""
    reps = [1] * x.dim()
    reps[dim] = -(-n // x.shape[dim])
    # a clone, not a view: torch.export gives a view input's base sizes symbols of their own
    return x.repeat(*reps).narrow(dim, 0, n).clone()
