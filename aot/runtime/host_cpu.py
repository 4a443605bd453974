"""May this machine run an artifact's compiled CPU code?

A CPU artifact's manifest records the CPU it was compiled for (``cpu``: architecture,
triple, CPU name and the LLVM features its code may use; ``aot.toolchain.cpu_targets``).
IREE's runtime refuses a module of another architecture only with a device error
("INCOMPATIBLE; HAL device not found"), and does not check CPU features: code that
uses an instruction this CPU lacks kills the process with SIGILL at its first call.
:func:`host_problem` compares the record with this machine before a module is opened
(``aot.load``, a compiled module's first call): the architecture, then each feature
IREE's runtime can detect here (``iree-cpuinfo``, shipped with ``iree-base-runtime``),
and the runtime raises ``ArtifactError`` naming both CPUs instead of crashing.

Features ``iree-cpuinfo`` does not report are not checked (on x86 it reports the SSE,
AVX, AVX-512 and AMX families, which is where SIGILLs come from). Imports neither
torch nor ``iree.compiler``.
"""

from __future__ import annotations

import os
import platform
import subprocess
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..manifest import Manifest

__all__ = ["host_problem", "host_features", "host_arch", "ARCHES"]

# Architectures by the names a triple's first word or ``platform.machine()`` gives them
# (``arm64``: Apple's aarch64; ``amd64``: Windows' x86_64), as the manifest names them:
# the ones LLVM in IREE 3.13 targets and IREE's runtime runs.
ARCHES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64",
          "riscv64": "riscv64", "riscv32": "riscv32", "i686": "x86", "i386": "x86",
          "armv7": "arm", "wasm32": "wasm32"}


def host_arch() -> str:
    """This machine's architecture, named as the manifest names it (``x86_64``)."""
    m = platform.machine().lower()
    return ARCHES.get(m, m)


@lru_cache(maxsize=1)
def host_features() -> dict[str, bool] | None:
    """Each CPU feature IREE's runtime detects here (LLVM names: ``avx512fp16``) and
    whether this CPU has it; None where ``iree-cpuinfo`` cannot be run."""
    try:
        from iree import _runtime_libs
        tool = os.path.join(os.path.dirname(_runtime_libs.__file__), "iree-cpuinfo")
        out = subprocess.run([tool], capture_output=True, text=True, timeout=20, check=True)
    except (ImportError, OSError, subprocess.SubprocessError):
        return None
    features = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] in ("0", "1"):
            features[parts[0]] = parts[1] == "1"
    return features or None


def host_problem(manifest: "Manifest") -> str | None:
    """Why this machine cannot run ``manifest``'s compiled code, or None when it can
    (or the artifact records no CPU: older artifacts, other backends)."""
    cpu = manifest.cpu
    if not cpu or manifest.driver not in ("local-task", "local-sync"):
        return None
    what = f"compiled for {cpu['cpu']} ({cpu['triple']}, target {manifest.target!r})"
    if cpu["arch"] != host_arch():
        return (f"{what}: this machine is {host_arch()}, that code is {cpu['arch']}; "
                f"compile with target='cpu' on this machine, or run it on {cpu['arch']}")
    have = host_features()
    if have is None:
        return None
    missing = [f for f in cpu["features"] if have.get(f) is False]
    if missing:
        return (f"{what}: this CPU lacks {', '.join(missing)}, which that code may use "
                "(it would die of an illegal instruction); compile with target='cpu' on "
                "this machine, or for a CPU it has every feature of (e.g. cpu:x86-64-v3)")
    return None
