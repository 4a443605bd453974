"""The one module that imports the MLIR Python bindings and the FX importer.

Compile-side code imports MLIR names from here, so the runtime side
(``aot.runtime``, ``aot.fallback``, ``aot.artifact``, ``aot.torch_tensor``)
never pulls in ``iree.compiler``.
"""

from __future__ import annotations

import sys
import types

from iree.compiler import ir  # noqa: F401  (re-exported)
from iree.compiler._mlir_libs import _mlir as _bindings
from iree.compiler.extras.fx_importer import (  # noqa: F401
    FxImporter, FxImporterHooks, GraphNodeImporter, RefTracker)

__all__ = ["ir", "FxImporter", "FxImporterHooks", "GraphNodeImporter", "RefTracker",
           "new_context"]


# The bindings look up a Python module of op classes for each op's dialect as it is
# touched, and retry an import that failed every time: the torch dialect has none in
# iree.compiler.dialects, so importing and walking a module searched sys.path again at
# every torch op, a large share of a partition's time. An empty module under our own
# prefix ends the search: torch ops stay generic operations, as without it.
_DIALECTS = "aot._mlir_dialects"
if _DIALECTS not in _bindings.globals.dialect_search_modules:
    sys.modules[f"{_DIALECTS}.torch"] = types.ModuleType(
        f"{_DIALECTS}.torch", "No op classes: torch dialect ops are generic operations.")
    _bindings.globals.append_dialect_search_prefix(_DIALECTS)


def new_context() -> "ir.Context":
    """A fresh MLIR context with the dialects IREE registers (torch included)."""
    return ir.Context()
