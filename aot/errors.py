"""Exception types of the compiler and runtime.

Every user-facing error carries the stage that raised it and, where known, the
op and the user's source location, so a message reads like
``UnsupportedOp [partition] aten.foo.default at model.py:42: ...``.
``InternalError`` is reserved for bugs in this package.
"""

from __future__ import annotations

__all__ = [
    "AotError",
    "ExportFailed",
    "UnsupportedOp",
    "CompileFailed",
    "KernelCallFailed",
    "InputMismatch",
    "ArtifactError",
    "InternalError",
]


class AotError(Exception):
    """Base class of every error this package raises on purpose.

    Args:
        message: what went wrong and what was expected.
        op: the op involved (``aten.layer_norm.default``), if any.
        location: the user's source location (``model.py:42``), if known.
        stage: the pipeline stage (``import``, ``partition``, ``compile``, ``run``, ...).
    """

    stage_default = "aot"

    def __init__(self, message: str, *, op: str | None = None,
                 location: str | None = None, stage: str | None = None):
        self.message = message
        self.op = op
        self.location = location
        self.stage = stage or self.stage_default
        super().__init__(self._format())

    def _format(self) -> str:
        where = []
        if self.op:
            where.append(self.op)
        if self.location:
            where.append(f"at {self.location}")
        head = f"[{self.stage}]" + (" " + " ".join(where) if where else "")
        return f"{head}: {self.message}"


class ExportFailed(AotError):
    """``torch.export`` could not capture the model."""

    stage_default = "import"


class UnsupportedOp(AotError):
    """An op cannot be placed under the chosen policy (or cannot cross the boundary)."""

    stage_default = "partition"


class CompileFailed(AotError):
    """IREE rejected the partitioned module; the message holds diagnostics and a repro."""

    stage_default = "compile"


class KernelCallFailed(AotError):
    """An ATen kernel call raised at run time; chained from the original exception."""

    stage_default = "run"


class InputMismatch(AotError):
    """Inputs given to a compiled module do not match what it was compiled for."""

    stage_default = "run"


class ArtifactError(AotError):
    """An artifact file is missing, corrupt, truncated or incompatible."""

    stage_default = "load"


class InternalError(AotError):
    """A bug in this package, not in the user's input. Please report it."""

    stage_default = "internal"
