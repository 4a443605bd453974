"""The data-tiling flags of IREE's CPU backend, and the targets they make.

``TILING_FLAGS`` (``--iree-global-opt-data-tiling --iree-llvmcpu-enable-ukernels=all``)
make IREE 3.13's CPU matmuls several times faster; whether a program is compiled with
them is measured (``aot.backend.tiling``).

IREE 3.13 has two data-tiling paths. ``--iree-opt-data-tiling`` picks the one that
starts in dispatch creation, which computes wrong results on dynamic shapes:
``softmax(q @ k^T) @ v`` with q, k and v from one linear's view/permute, batch and
sequence dynamic, is exact up to 64 tokens and off by up to 27 from 65 on (with or
without microkernels). The path that starts in global optimization
(``--iree-global-opt-data-tiling``) is exact on the same programs, runs static programs
as fast or faster (``benchmarks/tiling_paths.py``), and compiles programs with many
small constants faster: it encodes the weights alone, where the other path also encodes
each bias and per-channel constant a matmul's epilogue reads, one initializer each.
Every program is tiled through it. A user's flags that name the other path are replaced
on a dynamic program (``safe_for_dynamic``).
"""

from __future__ import annotations

import dataclasses

from .targets import Target

__all__ = ["TILING_FLAGS", "DYNAMIC_UNSAFE", "tiled_target",
           "safe_for_dynamic", "untiled"]

TILING_FLAGS = ("--iree-global-opt-data-tiling", "--iree-llvmcpu-enable-ukernels=all")
# the data-tiling flags that select the path IREE 3.13 miscompiles dynamic shapes with
DYNAMIC_UNSAFE = ("--iree-opt-data-tiling", "--iree-dispatch-creation-data-tiling")


def tiled_target(target: Target) -> Target:
    """``target`` with data tiling and microkernels (through the path that is exact on
    dynamic shapes)."""
    return dataclasses.replace(target, flags=tuple(target.flags) + TILING_FLAGS)


def safe_for_dynamic(flags: tuple) -> tuple:
    """``flags`` with the data-tiling flags of ``DYNAMIC_UNSAFE`` replaced by the path
    that is exact on dynamic shapes."""
    kept = tuple(f for f in flags if f not in DYNAMIC_UNSAFE)
    if len(kept) < len(flags) and TILING_FLAGS[0] not in kept:
        kept += (TILING_FLAGS[0],)
    return kept


def untiled(target: Target) -> Target:
    """``target`` without the flags ``tiled_target`` added."""
    added = set(TILING_FLAGS)
    return dataclasses.replace(target, flags=tuple(f for f in target.flags if f not in added))
