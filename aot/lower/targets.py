"""Per-target compile facts, one table keyed by target name.

``flags`` are the IREE flags of the default profile; ``driver`` is the IREE
runtime driver the artifact is loaded with (recorded in the manifest so the
runtime never needs this module).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CompileFailed

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
    # "stablehlo" (lowered by torch-mlir first: aot.lower.stablehlo)
    via: str = "torch"


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
        from .stablehlo import check
        check()  # torch-mlir installed, or a clear error before anything runs
    try:
        t = TARGETS[name]
    except KeyError:
        raise CompileFailed(f"unknown target {name!r}; choose one of {sorted(TARGETS)}") from None
    try:
        pflags = PROFILES[name][profile]
    except KeyError:
        raise CompileFailed(f"unknown profile {profile!r} for {name}; choose one of "
                            f"{sorted(PROFILES[name])}") from None
    return Target(t.name, t.backend, t.driver, t.flags + pflags + tuple(extra_flags), profile,
                  via)
