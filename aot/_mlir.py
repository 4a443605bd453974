"""The one module that imports the MLIR Python bindings and the FX importer.

Compile-side code imports MLIR names from here, so the runtime side
(``aot.runtime``, ``aot.fallback``, ``aot.artifact``, ``aot.torch_tensor``)
never pulls in ``iree.compiler``.
"""

from __future__ import annotations

from iree.compiler import ir  # noqa: F401  (re-exported)
from iree.compiler.extras.fx_importer import FxImporter, FxImporterHooks, RefTracker  # noqa: F401

__all__ = ["ir", "FxImporter", "FxImporterHooks", "RefTracker", "new_context"]


def new_context() -> "ir.Context":
    """A fresh MLIR context with the dialects IREE registers (torch included)."""
    return ir.Context()
