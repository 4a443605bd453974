"""The graph passes before partition: batch norm folded into convolutions, constant
subgraphs folded, bool fills made explicit."""

from __future__ import annotations

import dataclasses

from ..importer.program import ImportedProgram
from .bool_fills import bool_fills
from .fold_bn import fold_batch_norm
from .fold_constants import fold_constants

__all__ = ["prepare"]


def prepare(imported: ImportedProgram, policy) -> tuple[ImportedProgram, int]:
    """The program as it is partitioned: batch norm folded into convolutions, constant
    subgraphs folded, bool fills made explicit (not under ``fallback="all"``, which
    stays bit-exact); and how many ops were folded. ``policy``: the placement policy
    (``aot.partition.placement.PlacementPolicy``; its ``fallback`` is read, and passes
    come before the partition)."""
    if policy.fallback == "all":
        return imported, 0
    ep, folded = fold_constants(fold_batch_norm(imported.exported))
    bool_fills(ep)  # IREE truncates a bool fill value; ATen casts it
    return dataclasses.replace(imported, exported=ep), folded
