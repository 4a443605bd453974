"""What an artifact may name: op namespaces, ops refused, and the ``py:`` functions.

An artifact names what its kernel calls and host program run as text: an op
(``aten::add`` with overload ``Tensor``) or a Python function export applies to
run-time scalars (``py:operator.add``). This table is the one place that says which
names resolve, and everything is checked at load, before anything runs:

- An op resolves only to a real ``torch._ops.OpOverload`` registered with the
  dispatcher, looked up as ``torch.ops.<namespace>.<op>.<overload>`` after the
  dispatcher confirmed the schema: never an attribute walk onto Python objects
  (``torch.ops.import_module``, ``torch.ops.load_library``), never a TorchScript-only
  builtin (``aten::save``, ``aten::format``, string and list ops).
- :data:`COMPILER_NAMESPACES` are those this compiler emits. Any other namespace is a
  custom-op library, which must be registered in the loading process (as it must be
  anyway for the op to run); torch's runtime-internal namespaces
  (:data:`REFUSED_NAMESPACES`: profiler, streams, collectives, inductor...) never are.
- Ops that reach the file system or the process are refused (:data:`REFUSED_OPS`, and
  any op with a string argument whose name says it is a file, path or directory).
- ``py:`` names are the few of :data:`PY_NAMES`; each runs behind a guard that takes
  only numbers within int64 and refuses powers and shifts that could not fit, so a
  recorded operand cannot make it run unbounded.

The name checks (:func:`name_problem`, :func:`py_problem`) import no torch: the
torch-free runtime checks manifests too.
"""

from __future__ import annotations

import builtins
import math
import operator
import re
from functools import lru_cache
from typing import Any, Callable

__all__ = ["GROUP_OP", "COMPILER_NAMESPACES", "REFUSED_NAMESPACES", "REFUSED_OPS", "PY_NAMES",
           "name_problem", "resolve", "check_kwargs", "py_problem", "py_function", "py_name", "check_py_args"]

GROUP_OP = "aot::group"  # the op name of a kernel call that runs a group of ops
# the namespaces this compiler's kernel calls and host programs name
COMPILER_NAMESPACES = ("aten", "prims", "quantized", "quantized_decomposed", "aot_q")
# torch's runtime-internal namespaces: profiling, streams and events, collectives and
# process groups, symmetric memory, compiler internals, test ops. No model op lives there.
REFUSED_NAMESPACES = frozenset((
    "profiler", "streams", "mempool", "c10d", "c10d_functional", "_c10d_functional",
    "_c10d_functional_autograd", "symm_mem", "fsdp", "_dtensor", "inductor", "inductor_prims",
    "debugprims", "rngprims", "static_runtime", "export", "debug_mode_ops", "_native", "_test",
    "_inductor_test", "onnx", "onnx_symbolic", "higher_order", "prim", "aot_kc", "coor",
    "flex_lib"))
# ops of allowed namespaces that touch the file system, print, change process state or
# rebind memory, with why
REFUSED_OPS = {
    "aten::from_file": "reads (or maps for writing) a file",
    "aten::_print": "prints",
    "aten::_cufft_set_plan_cache_max_size": "changes process-wide state",
    "aten::_cufft_clear_plan_cache": "changes process-wide state",
    "aten::set": "rebinds a tensor to other memory",
    "aten::set_": "rebinds a tensor to other memory",
    "image::read_file": "reads a file",
    "image::write_file": "writes a file",
}
_PATH_ARGUMENT = re.compile(r"file|path|dir", re.IGNORECASE)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def name_problem(op: str, overload: str) -> str | None:
    """Why ``op``/``overload`` (``"aten::add"``, ``"Tensor"``) may not be named by an
    artifact, or None. Syntax and the fixed tables only (no torch)."""
    if not isinstance(op, str) or not isinstance(overload, str):
        return "an op name and overload must be strings"
    ns, sep, name = op.partition("::")
    if not sep or not _IDENT.match(ns) or not _IDENT.match(name) or not _IDENT.match(overload) \
            or ns.startswith("_" * 2) or overload.startswith("_" * 2):
        return (f"{op!r} (overload {overload!r}) is not an op name: expected "
                "'namespace::name' and an overload, each an identifier")
    if ns in REFUSED_NAMESPACES:
        return f"namespace {ns!r} holds torch's runtime internals, never a model's op"
    if op in REFUSED_OPS:
        return f"{op} {REFUSED_OPS[op]}: an artifact never runs it"
    return None


@lru_cache(maxsize=None)
def resolve(op: str, overload: str):
    """``("aten::add", "Tensor")`` -> ``torch.ops.aten.add.Tensor``.

    Raises:
        LookupError: the name is refused (:func:`name_problem`), the dispatcher has no
            such op in this process (a custom-op library not imported), or its schema
            takes a path.
    """
    why = name_problem(op, overload)
    if why is not None:
        raise LookupError(f"op {op}.{overload} is refused: {why}")
    import torch
    try:  # the dispatcher's registry: no Python attribute is read before this succeeds
        schema = torch._C._dispatch_find_schema_or_throw(
            op, "" if overload == "default" else overload).schema()
    except RuntimeError:
        ns = op.split("::")[0]
        hint = ("" if ns in COMPILER_NAMESPACES else
                f"; {ns!r} is a custom-op namespace: import the library that defines it "
                "before loading")
        raise LookupError(f"op {op}.{overload} is not registered in this process{hint}") \
            from None
    paths = [a.name for a in schema.arguments  # a string naming a file (not einsum's path)
             if _PATH_ARGUMENT.search(a.name) and "str" in str(a.type).lower()]
    if paths:
        raise LookupError(f"op {op}.{overload} is refused: it takes a path ({paths[0]})")
    ns, name = op.split("::")
    try:
        target = getattr(getattr(getattr(torch.ops, ns), name), overload)
    except (AttributeError, RuntimeError):
        target = None
    if not isinstance(target, torch._ops.OpOverload) or target._schema.name != op:
        raise LookupError(f"op {op}.{overload} does not resolve to a registered overload")
    return target


def check_kwargs(target, names) -> str | None:
    """Why operands named ``names`` cannot be passed to ``target`` (an OpOverload) by
    keyword: each must name an argument of its schema."""
    allowed = {a.name for a in target._schema.arguments}
    bad = [n for n in names if n not in allowed]
    if bad:
        return (f"keyword operand {str(bad[0])[:40]!r} is not an argument of {target} "
                f"(its arguments: {sorted(allowed)})")
    return None


# -- py: functions ---------------------------------------------------------------------

_INT = 2 ** 63
_NUMBERS = (bool, int, float)
# name -> (module, attribute); torch's resolved lazily (torch-free checks need the names)
PY_NAMES: dict[str, tuple[str, str]] = {
    **{f"operator.{n}": ("operator", n) for n in (
        "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos", "abs",
        "eq", "ne", "lt", "le", "gt", "ge", "and_", "or_", "xor", "not_", "invert",
        "lshift", "rshift", "getitem", "truth")},
    **{f"math.{n}": ("math", n) for n in (
        "ceil", "floor", "sqrt", "exp", "log", "sin", "cos", "tan", "trunc", "isnan", "isinf")},
    **{f"torch.{n}": ("torch", n) for n in (
        "sym_float", "sym_int", "sym_max", "sym_min", "sym_not", "sym_ite", "sym_sqrt",
        "sym_sum")},
    **{f"builtins.{n}": ("builtins", n) for n in ("int", "float", "bool", "max", "min", "abs")},
}


def py_problem(name: str) -> str | None:
    """Why ``py:<name>`` may not be named, or None."""
    if name not in PY_NAMES:
        return f"py:{name} is not one of the Python functions an artifact may call"
    return None


def _number(v) -> bool:
    return v.__class__ in _NUMBERS and (v.__class__ is not int or -_INT <= v < _INT)


def check_py_args(name: str, args, kwargs) -> str | None:
    """Why ``py:<name>`` must not run on these operands (values, not references), or
    None. Only numbers within int64 (a list of them for ``sym_sum``, any container
    indexed by an int for ``getitem``); no power or shift whose result cannot fit."""
    if kwargs:
        return f"py:{name} takes no keyword operands"
    if name == "operator.getitem":
        ok = len(args) == 2 and isinstance(args[1], int) and -_INT <= args[1] < _INT
        return None if ok else "getitem takes a container and an integer index"
    if name == "torch.sym_sum":
        ok = len(args) == 1 and isinstance(args[0], (list, tuple)) and all(map(_number, args[0]))
        return None if ok else "sym_sum takes a list of numbers"
    if not all(map(_number, args)):
        bad = next(a for a in args if not _number(a))
        return (f"py:{name} takes numbers within int64, got {type(bad).__name__} "
                f"{str(bad)[:30]}")
    if name == "operator.pow" and len(args) == 2:
        base, exp = args
        if abs(exp) > 64 and (abs(base) > 1 or isinstance(base, float)):
            return f"power with exponent {exp} (at most 64)"
    if name in ("operator.lshift", "operator.rshift") and len(args) == 2 and abs(args[1]) > 64:
        return f"shift by {args[1]} (at most 64)"
    return None


@lru_cache(maxsize=None)
def py_function(name: str) -> Callable:
    """The guarded callable for ``py:<name>``: it raises ``ValueError`` instead of
    running on operands :func:`check_py_args` refuses, and on a result beyond int64."""
    module, attr = PY_NAMES[name]
    if module == "torch":
        import torch
        fn = getattr(torch, attr)
    else:
        fn = getattr({"operator": operator, "math": math, "builtins": builtins}[module], attr)

    def guarded(*args, **kwargs):
        why = check_py_args(name, args, kwargs)
        if why is not None:
            raise ValueError(why)
        out = fn(*args)
        if out.__class__ is int and not -_INT <= out < _INT:
            raise ValueError(f"py:{name} gave an integer beyond int64")
        return out
    guarded.__name__ = guarded.__qualname__ = f"py:{name}"
    guarded.wrapped = fn
    return guarded


def py_name(fn: Any) -> str | None:
    """The ``py:`` name of a Python function (as an exported graph holds it), or None."""
    for name in PY_NAMES:
        module, attr = PY_NAMES[name]
        if getattr(fn, "__name__", None) != attr:
            continue
        try:
            if py_function(name).wrapped is fn:
                return "py:" + name
        except AttributeError:  # this torch lacks it
            continue
    return None
