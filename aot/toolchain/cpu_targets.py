"""CPU targets: this machine, or another CPU compiled for from here.

``target="cpu"`` is this machine's CPU (``--iree-llvmcpu-target-cpu=host``). A named
one is ``"cpu:<name>"``:

- ``cpu:x86-64-v3``, ``cpu:znver4``, ``cpu:sapphirerapids``: a CPU of this machine's
  architecture, as LLVM names it (the error for an unknown name lists LLVM's names);
- ``cpu:aarch64-linux-gnu`` (or just ``cpu:aarch64``): a target triple, generic CPU
  of that architecture;
- ``cpu:aarch64-linux-gnu:neoverse-v1``: a triple and a CPU.

Every CPU target is resolved here, before anything compiles, into a
:class:`CpuTarget`: its architecture, triple, CPU and the LLVM features its code may
use, as IREE resolves them (a quick ``--compile-to=preprocessing`` of an empty module
with the target's flags, extra flags included). The manifest records it, and the
runtime checks the host against it before opening a module (``aot.runtime.host_cpu``):
IREE itself refuses another architecture only with a device error and does not check
features at all (code using an instruction the CPU lacks dies of SIGILL).

A target other than this machine is compiled without measuring anything here
(``placement="coverage"``): placement by measurement times code on this machine,
which is not the one it will run on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from ..errors import CompileFailed
from ..runtime.host_cpu import ARCHES, host_arch

__all__ = ["CpuTarget", "cpu_flags", "resolve_cpu"]

_TRIPLE_WORDS = {"linux", "gnu", "gnueabihf", "musl", "none", "unknown", "pc", "apple",
                 "darwin", "windows", "w64", "elf", "eabi", "freebsd"}
_FLAG = "--iree-llvmcpu-target-"
_TRIPLE = re.compile(r"target_triple\s*=\s*\"([^\"]*)\"")
_CPU = re.compile(r"\bcpu\s*=\s*\"([^\"]*)\"")
_FEATURES = re.compile(r"cpu_features\s*=\s*\"([^\"]*)\"")


@dataclass(frozen=True)
class CpuTarget:
    """What a CPU artifact's code needs: ``arch`` (``x86_64``, ``aarch64``), the LLVM
    ``triple`` and ``cpu`` it was compiled for, the LLVM ``features`` it may use, and
    whether it is this machine's own CPU (``host``)."""

    arch: str
    triple: str
    cpu: str
    features: tuple[str, ...]
    host: bool

    def to_json(self) -> dict:
        return {"arch": self.arch, "triple": self.triple, "cpu": self.cpu,
                "features": list(self.features), "host": self.host}


def cpu_flags(spec: str) -> tuple[str, ...]:
    """The IREE flags of a target named ``cpu:<spec>`` (the part after ``cpu:``).

    Raises:
        CompileFailed (stage ``options``): an empty spec, ``host`` with another
            architecture's triple, or a triple of an architecture IREE cannot target.
    """
    parts = spec.split(":")
    if not spec or any(not p for p in parts) or len(parts) > 2:
        raise CompileFailed(f"target 'cpu:{spec}': expected cpu:<cpu name>, cpu:<triple> or "
                            "cpu:<triple>:<cpu name> (e.g. cpu:x86-64-v3, "
                            "cpu:aarch64-linux-gnu:neoverse-v1)", stage="options")
    first = parts[0].split("-")[0]
    # a triple: starts with an architecture, or names a vendor or system (x86-64-v3 and
    # icelake-client are CPUs)
    looks_triple = any(w in _TRIPLE_WORDS or w.startswith(("android", "macos", "ios"))
                       for w in parts[0].split("-")[1:])
    if first in ARCHES or looks_triple or len(parts) == 2:
        if first not in ARCHES:
            raise CompileFailed(f"target 'cpu:{spec}': {parts[0]!r} is not a target triple of "
                                f"an architecture IREE targets ({', '.join(sorted(ARCHES))})",
                                stage="options")
        triple = parts[0] if "-" in parts[0] else f"{parts[0]}-linux-gnu"
        cpu = parts[1] if len(parts) == 2 else "generic"
        if cpu == "host" and ARCHES[first] != host_arch():
            raise CompileFailed(f"target 'cpu:{spec}': 'host' is this {host_arch()} machine's "
                                f"CPU, not one of {ARCHES[first]}; name a CPU of that "
                                "architecture or leave it out (generic)", stage="options")
        return (f"{_FLAG}triple={triple}", f"{_FLAG}cpu={cpu}")
    return (f"{_FLAG}cpu={parts[0]}",)


def resolve_cpu(flags: tuple[str, ...]) -> CpuTarget:
    """The CPU target that ``flags`` (a target's whole flag list) compile for, as IREE
    resolves it. Raises CompileFailed (stage ``options``) naming what IREE rejected."""
    return _resolve(tuple(f for f in flags if f.startswith(_FLAG)))


@lru_cache(maxsize=64)
def _resolve(flags: tuple[str, ...]) -> CpuTarget:
    from iree.compiler import CompilerToolError, compile_str
    try:
        out = compile_str("module {}", target_backends=["llvm-cpu"],
                          extra_args=[*flags, "--compile-to=preprocessing"])
    except CompilerToolError as e:
        raise CompileFailed(f"IREE rejects the CPU target {' '.join(flags)}: "
                            f"{_first_lines(str(e))}", stage="options") from None
    text = out.decode() if isinstance(out, bytes) else str(out)
    triple, cpu, features = (_TRIPLE.search(text), _CPU.search(text), _FEATURES.search(text))
    if not (triple and cpu and features):
        raise CompileFailed(f"IREE did not say what CPU {' '.join(flags)} targets (no "
                            "hal.executable.target in its output)", stage="options")
    enabled: dict[str, bool] = {}
    for f in features.group(1).split(","):  # later entries win, as in LLVM
        if f[:1] in "+-" and len(f) > 1:
            enabled[f[1:]] = f[0] == "+"
    arch = ARCHES.get(triple.group(1).split("-")[0], triple.group(1).split("-")[0])
    cpus = [f.split("=", 1)[1] for f in flags if f.startswith(f"{_FLAG}cpu=")]
    host = bool(cpus) and cpus[-1] == "host" and not any(
        f.startswith(f"{_FLAG}triple=") for f in flags)
    return CpuTarget(arch, triple.group(1), cpu.group(1),
                     tuple(sorted(f for f, on in enabled.items() if on)), host)


def _first_lines(diag: str) -> str:
    """IREE's complaint, without its list of every CPU name cut to a line."""
    lines = [ln.strip() for ln in diag.splitlines() if ln.strip()
             and not ln.startswith(("Invoked with", "Diagnostics:", " ", "Error invoking",
                                    "Error code"))]
    keep = [ln if len(ln) < 300 else ln[:300] + " ..." for ln in lines
            if "error" in ln.lower() or "unknown" in ln.lower() or "not a recognized" in ln
            or "accepted" in ln.lower()]
    return " | ".join(keep[:4]) or (lines[0] if lines else diag[:300])
