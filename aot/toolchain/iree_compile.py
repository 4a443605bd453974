"""The one place that calls ``iree.compiler``: text in, vmfb or diagnostics out."""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import time

from iree.compiler import CompilerToolError
from iree.compiler.tools.binaries import invoke_immediate
from iree.compiler.tools.core import CompilerOptions, build_compile_command_line
from iree.compiler.tools.debugging import TempFileSaver

from ..errors import CompileFailed
from .targets import Target
from .stablehlo import host_calls, to_stablehlo

__all__ = ["compile_mlir", "compile_error", "discard_dump", "try_compile", "first_error"]
log = logging.getLogger(__name__)


def try_compile(asm: str | bytes, target: Target) -> tuple[bytes | None, str]:
    """Compile the Torch-dialect ``asm`` (text, or MLIR bytecode); return ``(vmfb, "")``
    or ``(None, diagnostics)``.

    ``target.via == "stablehlo"``: torch-mlir lowers it to StableHLO first
    (``aot.toolchain.stablehlo``); its diagnostics point at ``asm``'s lines as IREE's do."""
    input_type = "torch"
    if target.via == "stablehlo":
        shlo, diag = to_stablehlo(asm)
        if shlo is None:
            return None, diag
        asm, input_type = host_calls(shlo), "stablehlo"
    return _compile(asm, target, input_type)


# IREE's per-pass IR checks stay on from the input to the executables' sources (global
# optimization, dispatch creation, flow, stream: where IREE 3.13 was seen to make invalid
# IR, on a PT2E int8 convolution) and are off in the code generation of each executable,
# where their parallel walk, nested in the per-executable parallel loop, leaves one of
# two threads idle in about a third of the compiles (docs/performance.md, "Compile time")
SPLIT_AT = "executable-sources"
# programs this large or larger compile in the two phases (a probe's or a cost module's
# one-op program does not pay for a second process)
SPLIT_MIN_BYTES = 64 << 10
_PHASE_FLAGS = ("--compile-to", "--compile-from", "--verify", "--mlir-disable-threading")


def _compile(asm: str | bytes, target: Target, input_type: str = "torch"
             ) -> tuple[bytes | None, str]:
    """Through files, not pipes: a program's weights make input and output hundreds of
    MB, which a pipe moves in page-sized writes under the GIL (seconds of a compile).
    The input file is the compiler's stdin, so its locations (in the diagnostics that
    ``recover.blame`` reads, and in the module) say ``<stdin>``, never a temp path: the
    same program compiles to the same bytes.

    A program of ``SPLIT_MIN_BYTES`` or more compiles in two phases (``_split``): to
    ``SPLIT_AT`` with IREE's checks, then on without them; the module is the same bytes
    as one checked compile's."""
    data = asm.encode() if isinstance(asm, str) else asm
    with tempfile.TemporaryDirectory(prefix="aot-iree-") as d:
        src, out = os.path.join(d, "input.mlir"), os.path.join(d, "output.vmfb")
        with open(src, "wb") as f:
            f.write(data)
        if _split(data, target):
            mid = os.path.join(d, "sources.mlir")
            diag = _run(src, mid, target, input_type,
                        (f"--compile-to={SPLIT_AT}", "--mlir-print-debuginfo"))
            if diag is None:
                diag = _run(mid, out, target, input_type,
                            (f"--compile-from={SPLIT_AT}", "--verify=false"))
        else:
            diag = _run(src, out, target, input_type, ())
        if diag is not None:
            return None, diag
        with open(out, "rb") as f:
            return f.read(), ""


def _split(data: bytes, target: Target) -> bool:
    """Compile in two phases: a large program, phases and checks not set by the user."""
    return len(data) >= SPLIT_MIN_BYTES and not any(
        f.split("=")[0] in _PHASE_FLAGS for f in target.flags)


def _run(src: str, out: str, target: Target, input_type: str, phase: tuple[str, ...]
         ) -> str | None:
    """One iree-compile run, ``src`` as its stdin, its output written to ``out``: None,
    or its diagnostics."""
    with TempFileSaver.implicit() as tfs:
        options = CompilerOptions(target_backends=[target.backend], input_type=input_type,
                                  extra_args=[*target.flags, *phase])
        options.output_file = tfs.alloc_optional("core-output.bin", export_as=out)
        try:
            invoke_immediate(build_compile_command_line("-", tfs, options), input_file=src)
        except CompilerToolError as e:
            return str(e)
    return None


def compile_mlir(asm: str, target: Target, *, what: str = "model") -> bytes:
    """Compile a whole module; on failure raise CompileFailed with a repro.

    The input IR is written to a fresh dump folder (never a fixed /tmp name) and
    the message gives the one-line ``iree-compile`` command that reproduces it.
    """
    t0 = time.perf_counter()
    vmfb, diag = try_compile(asm, target)
    if vmfb is not None:
        log.info("compiled %s for %s in %.1fs", what, target.name, time.perf_counter() - t0)
        return vmfb
    raise compile_error(asm, target, diag, what=what)


def compile_error(asm: str, target: Target, diag: str, *, what: str = "model",
                  note: str = "") -> CompileFailed:
    """The CompileFailed for ``diag``: first error, dumped input IR, repro command."""
    dump = tempfile.mkdtemp(prefix="aot-compile-failure-")
    path = os.path.join(dump, f"{what}.torch.mlir")
    with open(path, "w") as f:
        f.write(asm)
    flags = " ".join(target.flags)
    if target.via == "stablehlo":
        note += ("(via='stablehlo': torch-mlir lowers the input IR to StableHLO first, "
                 "as aot.toolchain.stablehlo.PIPELINE; the repro below skips that step)\n")
    err = CompileFailed(
        f"IREE could not compile {what} for {target.name}: {first_error(diag)}\n{note}"
        f"input IR: {path}\nrepro: iree-compile --iree-input-type=torch "
        f"--iree-hal-target-backends={target.backend} {flags} {path} -o /dev/null\n"
        f"full diagnostics:\n{_tail(diag)}")
    err.dump_dir = dump  # removed by a caller that recovers from the failure
    return err


def discard_dump(err: BaseException) -> None:
    """Remove the dump folder of a CompileFailed the caller recovered from."""
    dump = getattr(err, "dump_dir", None)
    if dump:
        shutil.rmtree(dump, ignore_errors=True)


_ERR = re.compile(r"error: (.*)")


def first_error(diag: str) -> str:
    """The first ``error:`` line of IREE's diagnostics, without its location."""
    m = _ERR.search(diag)
    return m.group(1).strip() if m else (diag.strip().splitlines() or ["unknown error"])[0]


def _tail(diag: str, lines: int = 40) -> str:
    return "\n".join(diag.strip().splitlines()[:lines])
