"""The bounds an artifact's manifest must keep: every size it states is checked here.

An artifact read from disk may have been written by hand (its checksum recomputed,
as anyone can), so nothing in it may make loading or calling do unbounded work:
no JSON nested deeper than :data:`MAX_JSON_DEPTH`, no integer outside int64, no
control character in a string (a report printed to a terminal must not carry
escape sequences), no tensor larger than :data:`MAX_TENSOR_BYTES`. A failure is an
``ArtifactError`` naming the field, raised at load. Symbolic sizes have their own
grammar and bounds (``aot.symbolic``). docs/security.md states these limits.

This module imports neither torch nor the compiler: the torch-free runtime reads
manifests too.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from .errors import ArtifactError

__all__ = ["INT64_MAX", "MAX_JSON_DEPTH", "MAX_RANK", "MAX_TENSOR_BYTES", "read_json",
           "check_document", "tensor_bytes", "field_name"]

INT64_MAX = 2 ** 63 - 1
# a manifest's objects nest a few levels (kernel call -> members -> operands -> value);
# pytree specs are strings read on their own, with the same bound
MAX_JSON_DEPTH = 64
MAX_RANK = 64
# the largest tensor (or strided extent) a manifest may describe: 1 TiB
MAX_TENSOR_BYTES = 1 << 40
# C0 controls but tab, newline and carriage return; DEL; C1 controls
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def read_json(text: bytes | str, what: str) -> Any:
    """``json.loads(text)``; any failure (syntax, an integer of too many digits, nesting
    the decoder cannot follow) is an ``ArtifactError`` naming ``what``."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError, MemoryError) as e:
        reason = str(e) if isinstance(e, ValueError) else f"nested or sized beyond what " \
            f"this runtime reads ({type(e).__name__})"
        raise ArtifactError(f"{what} is not valid JSON ({reason[:200]})", stage="load") from None


def field_name(path: tuple) -> str:
    """``("kernel_calls", 3, "op")`` -> ``kernel_calls[3].op``."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def check_document(doc: Any, what: str, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise ``ArtifactError`` if ``doc`` (parsed JSON) nests deeper than ``max_depth``,
    holds an integer outside int64, or a string (or key) with a control character
    other than tab, newline and carriage return. Iterative: a deep document cannot
    exhaust the stack here."""
    stack: list[tuple[Any, int, tuple]] = [(doc, 0, ())]
    pop, push = stack.pop, stack.append
    while stack:
        v, depth, path = pop()
        cls = v.__class__
        if cls is dict or cls is list:
            if depth >= max_depth:
                raise ArtifactError(f"{what}: {field_name(path)} nests deeper than "
                                    f"{max_depth} levels", stage="load")
            if cls is dict:
                for k in v:
                    if _CONTROL.search(k):
                        raise ArtifactError(f"{what}: {field_name(path)} has a key with a "
                                            f"control character: {k!r:.80}", stage="load")
            for k, x in (v.items() if cls is dict else enumerate(v)):
                xc = x.__class__
                if xc is dict or xc is list:
                    push((x, depth + 1, path + (k,)))
                elif xc is str:
                    if _CONTROL.search(x):
                        _bad_string(what, path + (k,), x)
                elif xc is int:
                    if not -INT64_MAX - 1 <= x <= INT64_MAX:
                        _bad_int(what, path + (k,), x)
        elif cls is str and _CONTROL.search(v):
            _bad_string(what, path, v)
        elif cls is int and not -INT64_MAX - 1 <= v <= INT64_MAX:
            _bad_int(what, path, v)


def _bad_string(what: str, path: tuple, s: str) -> None:
    raise ArtifactError(f"{what}: {field_name(path)} holds a control character "
                        f"({s[_CONTROL.search(s).start()]!r}); artifact strings never do",
                        stage="load")


def _bad_int(what: str, path: tuple, v: int) -> None:
    raise ArtifactError(f"{what}: {field_name(path)} is an integer outside int64 "
                        f"({str(v)[:24]}{'...' if len(str(v)) > 24 else ''})", stage="load")


def tensor_bytes(shape, strides, itemsize: int) -> int | None:
    """The bytes a tensor of concrete ``shape``/``strides`` spans (its strided extent,
    or its element count where strides are unknown), or None when a size is symbolic.
    The caller compares it with :data:`MAX_TENSOR_BYTES`."""
    if not all(isinstance(d, int) for d in shape):
        return None
    numel = math.prod(shape)
    if numel == 0:
        return 0
    extent = numel
    if strides is not None and len(strides) == len(shape) and all(isinstance(s, int)
                                                                   for s in strides):
        extent = max(numel, 1 + sum((n - 1) * s for n, s in zip(shape, strides)))
    return extent * itemsize
