"""Run side: load an artifact on a device and call it (iree-base-runtime + torch only)."""

from .module import CompiledModule, load

__all__ = ["CompiledModule", "load"]
