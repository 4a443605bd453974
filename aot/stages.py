"""The staged entry point ``aot.compile``, the ``export_*`` functions and ``aot compile``
share: the options are resolved once (``Options.resolve``), the model is exported once
(``export``), and each stage the pipeline can stop at is a method of the result
(``Exported``), named as ``--emit`` names it (``EMIT``).

    exported = export(model, (x,), options=Options.resolve(target="cpu"))
    exported.emit("torch")          # the Torch-dialect MLIR, before partitioning
    exported.emit("partitioned")    # what IREE gets: kernel calls outlined
    exported.emit("stablehlo")      # the portable StableHLO export
    exported.emit("vmfb")           # a plain IREE module, every op compiled
    exported.compile()              # the artifact: measured placement, IREE, manifest
"""

from __future__ import annotations

from dataclasses import dataclass

from .artifact import CompiledArtifact
from .errors import UnsupportedOp
from .importer.program import ImportedProgram, ImportOptions, import_model
from .tuning.compile import compile_model, stablehlo_module
from .backend.lower import lower
from .partition.partitioner import partition, torch_mlir
from .partition.placement import PlacementPolicy
from .tuning.plain_module import plain_vmfb
from .passes.prepare import prepare
from .toolchain.targets import Target, get_target
from .plan import read_plan
from .stage_names import EMIT

__all__ = ["EMIT", "Options", "Exported", "export"]

@dataclass(frozen=True)
class Options:
    """A compile's options, resolved and checked once."""

    target: Target
    policy: PlacementPolicy
    import_options: ImportOptions

    @classmethod
    def resolve(cls, *, target: str = "cpu", fallback: str = "auto", fallback_ops=(),
                placement: str = "auto", plan=None, strict: bool = False, extra_flags=(),
                profile: str = "default", via: str = "torch", dynamic_shapes=None) -> "Options":
        """The arguments ``aot.compile`` takes (see there) as one object.

        Raises:
            UnsupportedOp: an option that is not one (a placement, a fallback mode, a
                plan that is not one), naming it.
            CompileFailed: an unknown target or path (``stage="options"``).
        """
        if isinstance(plan, str):
            plan = read_plan(plan)
        policy = PlacementPolicy.make(fallback, fallback_ops, placement, plan)
        return cls(get_target(target, tuple(extra_flags), profile, via), policy,
                   ImportOptions(strict=strict, dynamic_shapes=dynamic_shapes,
                                 pt2e_integer_ops=policy.fallback != "all"))


@dataclass(frozen=True)
class Exported:
    """The exported program and its example inputs ``(args, kwargs)``, with the options
    it was exported under: every later stage starts here."""

    imported: ImportedProgram
    options: Options
    example: tuple

    def emit(self, stage: str, **kwargs):
        """The program at ``stage`` (one of ``EMIT``): MLIR text, or the plain module's
        bytes for ``"vmfb"`` (``parameters=`` as ``vmfb`` takes it).

        Raises:
            UnsupportedOp: ``stage`` is not one of ``EMIT`` (``stage="options"``)."""
        if stage not in EMIT:
            raise UnsupportedOp(f"there is no stage {stage!r} to emit; choose one of "
                                f"{', '.join(EMIT)}", stage="options")
        return getattr(self, stage)(**kwargs)

    def torch(self) -> str:
        """The Torch-dialect module of the whole program, before partitioning."""
        return torch_mlir(self.imported)

    def partitioned(self) -> str:
        """The module IREE compiles, kernel calls outlined (per-op placement)."""
        policy = self.options.policy
        return lower(partition(prepare(self.imported, policy)[0], self.options.target,
                               policy)).mlir

    def stablehlo(self) -> str:
        """The portable StableHLO export (``aot.tuning.compile.stablehlo_module``)."""
        return stablehlo_module(self.imported, self.options.target, self.options.policy)

    def vmfb(self, parameters: str | None = None) -> bytes:
        """A plain IREE module, every op compiled (``aot.tuning.plain_module``)."""
        return plain_vmfb(self.imported, self.options.target, parameters, example=self.example)

    def compile(self) -> CompiledArtifact:
        """The artifact: placement measured on the example, IREE, the manifest."""
        return compile_model(self.imported, self.options.target, self.options.policy,
                             self.example)


def export(model, args=(), kwargs=None, options: Options | None = None) -> Exported:
    """``model`` captured with ``torch.export`` under ``options`` (default: resolved
    from the defaults).

    Raises:
        ExportFailed, UnsupportedOp: see ``aot.errors``.
    """
    options = options or Options.resolve()
    args = args if isinstance(args, tuple) else (args,)
    imported = import_model(model, args, kwargs, options.import_options)
    return Exported(imported, options, (args, dict(kwargs or {})))
