"""Run side: load an artifact on a device and call it (iree-base-runtime; torch for
CompiledModule, numpy alone for NumpyModule). Imported lazily: ``import aot.runtime``
needs neither torch nor numpy."""

from .loading import load

__all__ = ["CompiledModule", "NumpyModule", "load"]


def __getattr__(name):
    if name == "CompiledModule":
        from .module import CompiledModule
        return CompiledModule
    if name == "NumpyModule":
        from .numpy_module import NumpyModule
        return NumpyModule
    raise AttributeError(f"module 'aot.runtime' has no attribute {name!r}")
