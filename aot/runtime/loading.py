"""load: an artifact file, opened by the runtime that can run it here.

With torch (the usual case), a :class:`~aot.runtime.module.CompiledModule`: torch
tensors in and out, kernel calls into ATen. Without torch, or with
``arrays="numpy"``, a :class:`~aot.runtime.numpy_module.NumpyModule`: numpy arrays in
and out, for an artifact that needs nothing but IREE's runtime. Either way the
file is validated (``aot.artifact``) and the host checked against the CPU it was
compiled for (``aot.runtime.host_cpu``) before IREE opens it.
"""

from __future__ import annotations

from ..artifact import load_artifact
from ..errors import ArtifactError
from ..manifest_check import reading

__all__ = ["load", "ARRAYS"]
ARRAYS = ("torch", "numpy")


def load(path: str, *, strict_layout: bool = False, arrays: str | None = None):
    """Load an artifact written by ``CompiledModule.save`` / ``aot compile``.

    Needs ``iree-base-runtime`` (never ``iree.compiler``), and torch unless the
    artifact's program is all compiled code.

    Args:
        strict_layout: an input in another memory layout than the compiled one is an
            ``InputMismatch`` instead of a counted conversion.
        arrays: ``"torch"`` (a CompiledModule: tensors in and out) or ``"numpy"`` (a
            NumpyModule: numpy arrays in and out, no torch needed). Default: torch
            where it can be imported, else numpy.
    Raises:
        ArtifactError: missing, corrupt, truncated or incompatible file; compiled for
            a CPU this machine is not (architecture or features, both named); with
            numpy, an artifact that needs torch at run time (what needs it, named).
    """
    if arrays is None:
        arrays = "torch" if _has_torch() else "numpy"
    if arrays not in ARRAYS:
        raise ArtifactError(f"arrays={arrays!r}: choose one of {list(ARRAYS)}", stage="load")
    art = load_artifact(path)
    if arrays == "numpy":
        from .numpy_module import NumpyModule
        return reading(path, "opening the module",
                       lambda: NumpyModule(art, strict_layout=strict_layout))
    if not _has_torch():
        raise ArtifactError("arrays='torch' needs torch, which this Python cannot import; "
                            "load with arrays='numpy'", stage="load")
    from .module import CompiledModule
    return reading(path, "opening the module",
                   lambda: CompiledModule(art, strict_layout=strict_layout))


def _has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True
