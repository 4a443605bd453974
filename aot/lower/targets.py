"""Per-target compile facts, one table keyed by target name.

``flags`` are the IREE flags of the default profile; ``driver`` is the IREE
runtime driver the artifact is loaded with (recorded in the manifest so the
runtime never needs this module).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CompileFailed

__all__ = ["Target", "TARGETS", "get_target"]


@dataclass(frozen=True)
class Target:
    name: str
    backend: str
    driver: str
    flags: tuple[str, ...]


TARGETS: dict[str, Target] = {
    "cpu": Target("cpu", "llvm-cpu", "local-task",
                  ("--iree-llvmcpu-target-cpu=host",)),
    # sm_80 PTX is JIT-compiled by the driver on newer GPUs (the bundled LLVM
    # rejects sm_90). The CUDA runtime path is issue #5.
    "cuda": Target("cuda", "cuda", "cuda", ("--iree-cuda-target=sm_80",)),
}


def get_target(name: str, extra_flags: tuple[str, ...] = ()) -> Target:
    """Look up a target by name; ``extra_flags`` are appended to its profile."""
    try:
        t = TARGETS[name]
    except KeyError:
        raise CompileFailed(f"unknown target {name!r}; choose one of {sorted(TARGETS)}") from None
    return Target(t.name, t.backend, t.driver, t.flags + tuple(extra_flags))
