"""Per-target compile facts, one table keyed by target name.

``flags`` are the IREE flags of the default profile; ``driver`` is the IREE
runtime driver the artifact is loaded with (recorded in the manifest so the
runtime never needs this module). ``"cpu:<name>"`` is another CPU than this
machine's, compiled for from here (``aot.toolchain.cpu_targets``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CompileFailed
from .cpu_targets import CpuTarget, cpu_flags, resolve_cpu
from .stablehlo import check

__all__ = ["Target", "TARGETS", "PROFILES", "VIAS", "get_target"]
VIAS = ("torch", "stablehlo")


@dataclass(frozen=True)
class Target:
    name: str
    backend: str
    driver: str
    flags: tuple[str, ...]
    profile: str = "default"  # "iree-default": IREE as it comes, no measured flag variants
    # what IREE compiles: "torch" (the Torch dialect, IREE's own lowering) or
    # "stablehlo" (lowered by torch-mlir first: aot.toolchain.stablehlo)
    via: str = "torch"
    # a CPU target's architecture, CPU and features (recorded in the manifest, checked
    # against the host at load); None for other backends
    cpu: CpuTarget | None = None
    # the compiled module reads its weights as IREE parameters the runtime supplies
    # from the artifact (``aot.importer.fx_import.Parameters``), not as constants
    # iree-compile parses and copies into the module; False: inline (a plain module
    # for IREE's own tools, the StableHLO route, CUDA)
    parameters: bool = False

    @property
    def runs_here(self) -> bool:
        """Compiled for this machine: its code can be measured here (placement)."""
        return self.cpu is None or self.cpu.host


TARGETS: dict[str, Target] = {
    "cpu": Target("cpu", "llvm-cpu", "local-task",
                  ("--iree-llvmcpu-target-cpu=host",)),
    # sm_80 PTX is JIT-compiled by the driver on newer GPUs (the bundled LLVM
    # rejects sm_90). The CUDA runtime path is issue #5.
    "cuda": Target("cuda", "cuda", "cuda", ("--iree-cuda-target=sm_80",)),
}


# Flags added to a target's base flags per profile. "iree-default" is IREE as it
# comes (the baseline benchmarks compare against); "default" is what users get,
# chosen by measurement with benchmarks/flag_sweep.py (numbers in the comments).
PROFILES: dict[str, dict[str, tuple[str, ...]]] = {
    "cpu": {"iree-default": (), "default": ()},
    "cuda": {"iree-default": (), "default": ()},
}


def get_target(name: str, extra_flags: tuple[str, ...] = (), profile: str = "default",
               via: str = "torch") -> Target:
    """Look up a target by name; the profile's flags, then ``extra_flags``, are appended;
    ``via`` is the input IREE compiles (``VIAS``)."""
    if via not in VIAS:
        raise CompileFailed(f"unknown via {via!r}; choose one of {list(VIAS)}", stage="options")
    if via == "stablehlo":
        check()  # torch-mlir installed, or a clear error before anything runs
    base, _, spec = name.partition(":") if isinstance(name, str) else (name, "", "")
    try:
        t = TARGETS[base]
    except (KeyError, TypeError):
        raise CompileFailed(f"unknown target {name!r}; choose one of {sorted(TARGETS)}, or "
                            "cpu:<cpu or triple> (e.g. cpu:x86-64-v3, cpu:aarch64-linux-gnu)",
                            stage="options") from None
    if spec and base != "cpu":
        raise CompileFailed(f"unknown target {name!r}: only cpu takes a name after ':' "
                            "(cpu:<cpu or triple>)", stage="options")
    try:
        pflags = PROFILES[base][profile]
    except KeyError:
        raise CompileFailed(f"unknown profile {profile!r} for {base}; choose one of "
                            f"{sorted(PROFILES[base])}", stage="options") from None
    flags = (cpu_flags(spec) if spec else t.flags) + pflags + tuple(extra_flags)
    cpu = resolve_cpu(flags) if t.backend == "llvm-cpu" else None
    return Target(name if spec else t.name, t.backend, t.driver, flags, profile, via, cpu,
                  parameters=t.backend == "llvm-cpu" and via == "torch")
