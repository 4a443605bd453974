"""Blame: which compiled ops made a whole-program IREE compile fail.

Every op signature has been probe-compiled alone before blame runs (``coverage``; a
compile that assumed its ops lower and failed probes them first), so a failure of
the whole program means IREE broke on a *combination* (a fused
dispatch of ops that each lower alone; IREE 3.13 has such bugs). IREE's
diagnostics point at lines of the Torch-dialect text we handed it
(``<stdin>:27:10``). The FX importer emits one ``torch.<ns>.<op>`` per graph
node in graph order, so the k-th ``torch.aten.add.Tensor`` line is the k-th
compiled ``aten.add.Tensor`` node: the blamed nodes go back to the partitioner
as kernel calls, which splits the failing dispatch, and compilation is retried.
When the errors point at no op (LLVM translation failures often say only
``<stdin>:1:1``) after ops were already blamed, the compiled producers of the
blamed ops are blamed next: the ATen region grows around the failure until the
remaining fusion compiles.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..toolchain.iree_compile import first_error
from ..partition.placement import COMPILED, Placement

__all__ = ["blame", "grow"]

_DIAG_LINE = re.compile(r"<stdin>:(\d+):\d+: error: (.*)")
_OP = re.compile(r"=\s+(torch\.[A-Za-z0-9_]+\.[A-Za-z0-9_.]+)\s")


def blame(diag: str, asm: str, placements: Sequence[Placement]) -> dict[str, str]:
    """Node names of compiled ops IREE's errors point at, with the error as reason.

    Returns an empty dict when no error line maps to a compiled op (the caller
    then reports the failure as is).
    """
    lines = asm.splitlines()
    blamed: dict[str, str] = {}
    reason = first_error(diag)
    for m in _DIAG_LINE.finditer(diag):
        lineno = int(m.group(1))
        if not 0 < lineno <= len(lines):
            continue
        op = _OP.search(lines[lineno - 1])
        if not op:
            continue
        mlir_name = op.group(1)
        index = sum(1 for line in lines[:lineno - 1] if _OP.search(line)
                    and _OP.search(line).group(1) == mlir_name)
        same = [p for p in placements if p.where == COMPILED
                and _mlir_name(p.op) == mlir_name]
        if index < len(same) and same[index].node not in blamed:
            blamed[same[index].node] = reason
    return blamed


def _mlir_name(op: str) -> str:
    """``aten.view.default`` -> ``torch.aten.view`` (the importer drops ``.default``)."""
    return "torch." + op.removesuffix(".default")


def grow(blamed: dict[str, str], placements: Sequence[Placement],
         producers: dict[str, tuple[str, ...]], reason: str) -> dict[str, str]:
    """Compiled ops that feed the already ``blamed`` ones (the next ring of suspects)."""
    compiled = {p.node for p in placements if p.where == COMPILED}
    ring = {}
    for node in blamed:
        for src in producers.get(node, ()):
            if src in compiled and src not in blamed:
                ring[src] = reason
    return ring
