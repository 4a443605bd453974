"""Symbolic dimensions: the sizes a dynamic artifact takes at run time.

A program exported with ``dynamic_shapes`` has *symbols* (torch's ``s0``, ``s1``...),
each with a range and a name (the user's ``Dim``). A ``TorchTensor`` dimension or
stride that follows a symbol is an *expression* over symbols, kept as text
(``"s0"``, ``"768*s1"``, ``"FloorDiv(s0, 2)"``). At run time the symbols are bound
from the model's inputs (:func:`bind_inputs`: range and agreement checked, errors
name the input, the dimension, the symbol and its range) and every expression is
evaluated against that binding (:func:`evaluate`). This module imports no compiler
and no torch: the runtime and the manifest checks use it.

The manifest's ``symbols`` entry, one per symbol::

    {"s0": {"name": "batch", "min": 1, "max": 64, "example": 2,
            "binds": [{"input": 0, "name": "args[0]", "dim": 0}]}}

``binds`` lists every model-input dimension that *is* the symbol (the ones that
set it at run time); ``example`` is its value in the example inputs (where
placement was measured).
"""

from __future__ import annotations

import ast
import functools
import math
import re
import threading

from .errors import ArtifactError, InputMismatch

__all__ = ["Binding", "evaluate", "free_symbols", "bind_inputs", "is_input_symbol", "to_sympy",
           "MAX_EXPR_CHARS"]

_INPUT_SYMBOL = re.compile(r"s\d+")


def is_input_symbol(name: str) -> bool:
    """A size the inputs set: torch names those ``s0``, ``s1``...; a value the data
    decides is ``u0`` (an int) or ``zuf0`` (a float), and never enters a manifest."""
    return _INPUT_SYMBOL.fullmatch(name) is not None


class Binding(threading.local):
    """The symbols' values for the call in progress, one binding per thread: a module
    called from two threads at two sizes evaluates each call's sizes with its own (IREE
    runs a host function on the thread that invoked the module)."""

    def __init__(self):
        self.env: dict[str, int] = {}


def _floordiv(a, b):
    return a // b


def _ceildiv(a, b):
    return -(-a // b)


# the functions torch's sizes print with (torch.utils._sympy.functions), by name
_FUNCTIONS = {
    "FloorDiv": _floordiv, "CeilDiv": _ceildiv, "Mod": lambda a, b: a % b,
    "PythonMod": lambda a, b: a % b, "Max": max, "Min": min, "floor": math.floor,
    "ceiling": math.ceil, "CleanDiv": _floordiv, "IntTrueDiv": lambda a, b: a / b,
    "TruncToInt": int, "FloorToInt": math.floor, "CeilToInt": math.ceil,
}
_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
           ast.Mult: lambda a, b: a * b, ast.FloorDiv: _floordiv,
           ast.Mod: lambda a, b: a % b, ast.Pow: lambda a, b: a ** b,
           ast.Div: lambda a, b: a / b}


# the grammar of a size expression: integer (or float) literals, symbols, + - * / // %,
# a power with a small exponent, and the functions above; nothing else parses
MAX_EXPR_CHARS = 512
_MAX_POW = 64
_NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Call, ast.Name, ast.Constant, ast.Load,
          ast.USub, ast.UAdd, *_BINOPS)
_LIMIT = 2 ** 63


@functools.lru_cache(maxsize=4096)
def _parse(expr: str) -> ast.AST:
    """``expr`` parsed and checked against the grammar (ArtifactError otherwise)."""
    if not isinstance(expr, str) or len(expr) > MAX_EXPR_CHARS:
        raise ArtifactError(f"symbolic size {str(expr)[:40]!r}... is longer than "
                            f"{MAX_EXPR_CHARS} characters", stage="load")
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise ArtifactError(f"symbolic size {expr!r} is not an expression: {e}") from None
    for node in ast.walk(tree):
        ok = isinstance(node, _NODES)
        if isinstance(node, ast.Constant):
            ok = type(node.value) in (int, float) and abs(node.value) < _LIMIT
        elif isinstance(node, ast.Call):
            ok = (isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS
                  and not node.keywords and 1 <= len(node.args) <= 8)
        elif isinstance(node, ast.Name):
            ok = node.id.isidentifier() and not node.id.startswith("_")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            # a power's exponent is a small literal (torch prints ``s0**2``)
            e = node.right
            ok = (isinstance(e, ast.Constant) and type(e.value) is int
                  and 0 <= e.value <= _MAX_POW)
        if not ok:
            raise ArtifactError(f"symbolic size {expr[:80]!r}: a {type(node).__name__} is not "
                                "a size expression this runtime evaluates (integers, symbols, "
                                "+ - * / // %, a power with a literal exponent up to "
                                f"{_MAX_POW}, {', '.join(sorted(_FUNCTIONS))})", stage="load")
    return tree.body


def _bounded(v, expr: str):
    if v.__class__ is int:
        if -_LIMIT <= v < _LIMIT:
            return v
    elif isinstance(v, float) and math.isfinite(v) and abs(v) < _LIMIT:
        return v
    elif isinstance(v, int) and -_LIMIT <= v < _LIMIT:  # bool
        return v
    raise ArtifactError(f"symbolic size {expr!r} evaluates beyond int64 ({str(v)[:30]})")


def _pow(a, b, expr: str):
    if not (isinstance(b, int) and 0 <= b <= _MAX_POW) and not (isinstance(a, int)
                                                                and a in (0, 1)):
        raise ArtifactError(f"symbolic size {expr!r}: power with exponent {b!r} (at most "
                            f"{_MAX_POW})")
    return a ** b


def _eval(node: ast.AST, env: dict, expr: str):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise ArtifactError(f"symbolic size {expr!r} names {node.id!r}, which no input binds")
        return _bounded(env[node.id], expr)
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, env, expr), _eval(node.right, env, expr)
        if isinstance(node.op, ast.Pow):
            return _bounded(_pow(a, b, expr), expr)
        return _bounded(_BINOPS[type(node.op)](a, b), expr)
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env, expr)
        return -v if isinstance(node.op, ast.USub) else v
    assert isinstance(node, ast.Call)  # the grammar (_parse) admits nothing else
    return _bounded(_FUNCTIONS[node.func.id](*(_eval(a, env, expr) for a in node.args)), expr)


def evaluate(d: int | str, env: dict[str, int]) -> int:
    """The value of a size (an int, or an expression over bound symbols).

    Raises:
        ArtifactError: an expression outside the grammar, a value beyond int64 at any
            step, or a division by zero.
    """
    if not isinstance(d, str):
        return d
    try:
        v = _eval(_parse(d), env, d)
        return int(v)
    except (ZeroDivisionError, OverflowError, ValueError, TypeError) as e:
        raise ArtifactError(f"symbolic size {d!r} cannot be evaluated: {e}") from None


def to_sympy(d: int | str):
    """A size as a sympy expression, built from the checked grammar (never ``sympify``,
    which evaluates text as Python)."""
    import sympy
    if not isinstance(d, str):
        return sympy.Integer(d)
    return _sympy(_parse(d), sympy)


def _sympy(node: ast.AST, sympy):
    if isinstance(node, ast.Constant):
        return sympy.Integer(node.value) if type(node.value) is int else sympy.Float(node.value)
    if isinstance(node, ast.Name):
        return sympy.Symbol(node.id, integer=True, positive=True)
    if isinstance(node, ast.UnaryOp):
        v = _sympy(node.operand, sympy)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp):
        a, b = _sympy(node.left, sympy), _sympy(node.right, sympy)
        op = type(node.op)
        return {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
                ast.FloorDiv: lambda: sympy.floor(a / b), ast.Mod: lambda: sympy.Mod(a, b),
                ast.Pow: lambda: a ** b, ast.Div: lambda: a / b}[op]()
    args = [_sympy(a, sympy) for a in node.args]
    f = node.func.id
    two = {"FloorDiv": lambda a, b: sympy.floor(a / b), "CleanDiv": lambda a, b: sympy.floor(a / b),
           "CeilDiv": lambda a, b: sympy.ceiling(a / b), "Mod": sympy.Mod, "PythonMod": sympy.Mod,
           "Max": sympy.Max, "Min": sympy.Min, "IntTrueDiv": lambda a, b: a / b}
    one = {"floor": sympy.floor, "ceiling": sympy.ceiling, "TruncToInt": sympy.floor,
           "FloorToInt": sympy.floor, "CeilToInt": sympy.ceiling}
    return two[f](*args) if f in two else one[f](*args)


def free_symbols(d: int | str) -> set[str]:
    if not isinstance(d, str):
        return set()
    return {n.id for n in ast.walk(_parse(d)) if isinstance(n, ast.Name)
            and n.id not in _FUNCTIONS}


def _range_text(sym: str, entry: dict) -> str:
    name = entry.get("name") or sym
    return f"{name} in {entry['min']}..{entry['max']}"


def bind_inputs(symbols: dict, specs, leaves, names) -> dict[str, int]:
    """Each symbol's value in this call, read from the input dimensions that bind it.

    ``specs``/``leaves``/``names``: the manifest's input specs (TorchTensor or a
    static entry), the caller's leaves and their names, in flat order.

    Raises:
        InputMismatch: a dimension outside its symbol's range, two dimensions of one
            symbol that disagree, or an input whose rank differs from the compiled one.
    """
    env: dict[str, int] = {}
    first: dict[str, str] = {}
    for sym, entry in symbols.items():
        for b in entry["binds"]:
            leaf, name = leaves[b["input"]], b["name"]
            shape = getattr(leaf, "shape", None)
            spec = specs[b["input"]]
            if shape is None or len(shape) != len(spec.shape):
                continue  # the input's own check names what is wrong with it
            got = int(shape[b["dim"]])
            where = f"{name} dimension {b['dim']}"
            if not entry["min"] <= got <= entry["max"]:
                raise InputMismatch(f"{where} is {got}, outside the range it was compiled "
                                    f"for: {_range_text(sym, entry)} (symbol {sym})")
            if sym in env and env[sym] != got:
                raise InputMismatch(f"{where} is {got}, but {first[sym]} is {env[sym]}: both "
                                    f"are the symbol {entry.get('name') or sym} "
                                    f"({_range_text(sym, entry)}) and must agree")
            env.setdefault(sym, got)
            first.setdefault(sym, where)
    return env
