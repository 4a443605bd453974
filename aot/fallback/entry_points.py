"""The cheapest Python entry point into an ATen op, for the executor's hot loop.

Calling an ``OpOverload`` goes through its Python ``__call__`` and then a
generic schema-driven conversion of every argument to an ``IValue``
(``op._op``, a few microseconds for a cheap op such as ``permute``). The
functions torch generates for its public API (``torch._C._VariableFunctions``,
``torch._C._nn``, tensor methods) parse their arguments with specialised code
and reach the same kernel through the same dispatcher in much less.
For a region of small ops (BERT's views, adds, layer norms) that is a visible
share of the run time.

Only the overloads listed in :data:`ENTRIES` are mapped. Each one's public
binding takes the schema's positional arguments in the schema's order and its
keyword-only arguments by the schema's names (as ``BoundCall`` passes them),
and resolves to that same overload: ``tests/fallback/test_entry_points.py``
runs every entry against its ``OpOverload`` and compares results exactly.
Everything else is called through ``op._op``.
"""

from __future__ import annotations

import torch

__all__ = ["ENTRIES", "entry_point"]

_VF, _NN, _T = torch._C._VariableFunctions, torch._C._nn, torch._C.TensorBase

# (schema name, overload) -> (namespace object, attribute)
ENTRIES: dict[tuple[str, str], tuple[object, str]] = {
    **{(f"aten::{n}", ov): (_VF, n) for n, ov in (
        ("add", "Tensor"), ("sub", "Tensor"), ("mul", "Tensor"), ("div", "Tensor"),
        ("layer_norm", "default"), ("native_layer_norm", "default"), ("relu", "default"),
        ("relu_", "default"), ("embedding", "default"), ("permute", "default"),
        ("transpose", "int"), ("unbind", "int"), ("clone", "default"), ("reshape", "default"),
        ("t", "default"), ("matmul", "default"), ("bmm", "default"), ("mm", "default"),
        ("addmm", "default"), ("cat", "default"), ("flatten", "using_ints"),
        ("select", "int"), ("softmax", "int"), ("_softmax", "default"), ("mean", "dim"),
        ("squeeze", "dim"), ("unsqueeze", "default"), ("neg", "default"), ("rsqrt", "default"),
        ("sqrt", "default"), ("tanh", "default"), ("sigmoid", "default"), ("exp", "default"),
        ("max_pool2d", "default"), ("sum", "dim_IntList"), ("dropout", "default"),
        ("erf", "default"))},
    **{(f"aten::{n}", ov): (_NN, n) for n, ov in (
        ("linear", "default"), ("gelu", "default"), ("silu", "default"),
        ("hardtanh", "default"), ("adaptive_avg_pool2d", "default"))},
    **{(f"aten::{n}", ov): (_T, n) for n, ov in (
        ("view", "default"), ("expand", "default"))},
}


def entry_point(op):
    """The callable to run ``op`` with: its public binding when listed, else ``op._op``.

    ``op``: an ``OpOverload`` (anything else is returned unchanged).
    """
    if not isinstance(op, torch._ops.OpOverload):
        return op
    where = ENTRIES.get((op._schema.name, op._overloadname))
    fn = getattr(where[0], where[1], None) if where is not None else None
    return fn if fn is not None else getattr(op, "_op", op)
