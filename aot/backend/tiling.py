"""A second compile of the program with data tiling and microkernels, to measure.

IREE 3.13's CPU matmuls without data tiling run several times slower than with it
(``--iree-opt-data-tiling --iree-llvmcpu-enable-ukernels=all``), which brings them
near ATen's. The same flags make depthwise-heavy convolution networks slower
(``benchmarks/flag_sweep.py`` compares flag sets per model). Flags are global to one IREE
compile, so the choice is per program, by measurement: where matmul-family ops
(linear, mm, bmm, matmul, addmm, baddbmm; under ``placement="coverage"`` also the
convolutions ``conv_rewrites`` emits as matmuls) carry at least ``MATMUL_SHARE`` of
the program's heavy FLOPs, the program is also partitioned as ``placement="coverage"``
does (everything IREE covers compiled: per-op cost probes take weights as inputs,
so under data tiling they pay a weight repacking per call that a compiled model
hoists into its initialiser) and compiled for a target with those flags
(``iree-tiled``), and timed end to end against the plain one:
among the region candidates under the default options, or against the plain
per-op artifact alone under ``placement="coverage"`` (the manifest's ``variant``
entry gives both times). A failing tiled compile is dropped (the plain one
stands). Never under ``fallback="all"`` (bit-exact round trip), the
``iree-default`` profile (IREE as it comes), or when the user already passed
data-tiling or microkernel flags.

Convolutions count only under ``placement="coverage"``: there every convolution is
compiled and the tiled matmuls pay; under the default placement the convolution
networks' ATen regions win anyway, and the variant would only add a large share to
the compile time.

IREE 3.13 has two data-tiling paths. ``--iree-opt-data-tiling`` picks the one that
starts in dispatch creation, which computes wrong results on dynamic shapes:
``softmax(q @ k^T) @ v`` with q, k and v from one linear's view/permute, batch and
sequence dynamic, is exact up to 64 tokens and off by up to 27 from 65 on (with or
without microkernels). The path that starts in global optimization
(``--iree-global-opt-data-tiling``) is exact on the same programs, so a dynamic
program is tiled through it (``DYNAMIC_TILING_FLAGS``), and keeps data tiling's
speed-up.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from ..importer.program import ImportedProgram
from .conv_rewrites import as_matmul
from ..partition.flops import node_flops
from ..partition.placement import PlacementPolicy
from .targets import Target

__all__ = ["TILING_FLAGS", "DYNAMIC_TILING_FLAGS", "DYNAMIC_UNSAFE", "MATMUL_SHARE", "worth_tiling",
           "tiled_target", "safe_for_dynamic", "untiled"]
log = logging.getLogger(__name__)

TILING_FLAGS = ("--iree-opt-data-tiling", "--iree-llvmcpu-enable-ukernels=all")
DYNAMIC_TILING_FLAGS = ("--iree-global-opt-data-tiling", "--iree-llvmcpu-enable-ukernels=all")
# the data-tiling flags that select the path IREE 3.13 miscompiles dynamic shapes with
DYNAMIC_UNSAFE = ("--iree-opt-data-tiling", "--iree-dispatch-creation-data-tiling")
MATMUL_SHARE = 0.5
_MATMULS = {"linear", "mm", "bmm", "matmul", "addmm", "baddbmm"}


def _matmul_share(imported: ImportedProgram, convs: bool) -> float:
    """The share of heavy FLOPs in matmul-family ops (and convolutions compiled as
    matmuls, with ``convs``)."""
    total = mm = 0.0
    for n in imported.exported.graph.nodes:
        if n.op != "call_function":
            continue
        f = node_flops(n) or 0
        total += f
        if isinstance(n.target, torch._ops.OpOverload) and \
                n.target._schema.name.split("::")[-1] in _MATMULS or convs and as_matmul(n):
            mm += f
    return mm / total if total else 0.0


def worth_tiling(imported: ImportedProgram, target: Target, policy: PlacementPolicy) -> bool:
    """A CPU program whose heavy FLOPs are mostly matmuls, flags not chosen by the user."""
    if target.backend != "llvm-cpu" or policy.fallback == "all" or target.profile != "default":
        return False
    if any(f.startswith(DYNAMIC_UNSAFE + DYNAMIC_TILING_FLAGS[:1]
                        + ("--iree-llvmcpu-enable-ukernels",)) for f in target.flags):
        return False
    return _matmul_share(imported, convs=policy.placement == "coverage") >= MATMUL_SHARE


def tiled_target(target: Target, dynamic: bool = False) -> Target:
    """``target`` with data tiling and microkernels; ``dynamic``: through the path that
    is exact on dynamic shapes."""
    return dataclasses.replace(target, flags=tuple(target.flags) + (
        DYNAMIC_TILING_FLAGS if dynamic else TILING_FLAGS))


def safe_for_dynamic(flags: tuple) -> tuple:
    """``flags`` with the data-tiling flags of ``DYNAMIC_UNSAFE`` replaced by the path
    that is exact on dynamic shapes."""
    kept = tuple(f for f in flags if f not in DYNAMIC_UNSAFE)
    if len(kept) < len(flags) and DYNAMIC_TILING_FLAGS[0] not in kept:
        kept += (DYNAMIC_TILING_FLAGS[0],)
    return kept


def untiled(target: Target) -> Target:
    """``target`` without the flags ``tiled_target`` added."""
    added = set(TILING_FLAGS) | set(DYNAMIC_TILING_FLAGS)
    return dataclasses.replace(target, flags=tuple(f for f in target.flags if f not in added))
