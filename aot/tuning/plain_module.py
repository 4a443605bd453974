"""plain_module: the artifact's IREE module alone, for IREE's own runtime and tools.

A plain module (``aot.export_vmfb``, ``aot compile --emit vmfb``) is the program
compiled whole (``placement="coverage"``) and handed out as a ``.vmfb``: IREE's tools
(``iree-run-module``) and runtime call its ``main`` with the model's tensor inputs
and get its outputs. That holds only when the program needs nothing of this package
at run time: no kernel call (a host function it imports), and no in-place update of
an input (the runtime here writes it back); :func:`check_plain` refuses the rest.

Its weights can go to an IREE parameter archive beside it (``.irpa``, loaded with
``--parameters=model=FILE``): each weight literal of the Torch-dialect program
becomes a module-level ``util.global`` that IREE never inlines, read where the
literal was, and IREE's ``--iree-parameter-export`` writes every such global of
at least ``min_bytes`` to the archive under the scope ``model``, leaving the module a
loader of named parameters (IREE folds plain constant globals back into the code
before it would export them, hence ``#util.inline.never``).
"""

from __future__ import annotations

import dataclasses
import os
import re

from ..errors import CompileFailed, UnsupportedOp
from ..manifest import Manifest
from .compile import compile_model
from ..backend.lower import lower
from ..toolchain.iree_compile import first_error, try_compile
from ..partition.partitioner import partition
from ..partition.placement import PlacementPolicy
from ..passes.prepare import prepare

__all__ = ["check_plain", "plain_vmfb", "externalize_weights", "PARAMETER_SCOPE"]

PARAMETER_SCOPE = "model"
MIN_PARAMETER_BYTES = 4096  # smaller weights (biases, norms) stay in the module
_LITERAL = re.compile(r"^(\s*)(%[\w.$-]+) = torch\.vtensor\.literal\(dense_resource<([^>]+)> : "
                      r"(tensor<[^>]*>)\) : (!torch\.vtensor<[^>]*>)\s*$")


def plain_vmfb(imported, target, parameters: str | None = None,
               min_bytes: int = MIN_PARAMETER_BYTES, example=None) -> bytes:
    """The program's IREE module with every op compiled (``placement="coverage"``),
    checked plain (``check_plain``): what ``export_vmfb`` and ``--emit vmfb`` write.

    ``example`` (``(args, kwargs)``): on this machine's CPU, the module is compiled
    with the flags measured faster on it (data tiling and microkernels, where matmuls
    carry the program: ``aot.backend.tiling``), as ``aot.compile`` would. With
    ``parameters`` (a file path), weights of ``min_bytes`` or more are written there as
    an IREE parameter archive and the module loads them from it."""
    coverage = PlacementPolicy.make("auto", (), "coverage", None)
    target = dataclasses.replace(target, parameters=False)  # IREE's tools load it alone
    art = compile_model(imported, target, coverage, example)
    check_plain(art.manifest)
    if parameters is None:
        return art.vmfb
    return _with_parameters(imported, dataclasses.replace(target, flags=tuple(
        art.manifest.flags)), coverage, os.path.abspath(parameters), min_bytes)


def _with_parameters(imported, target, policy, path: str, min_bytes: int) -> bytes:
    """The plain program compiled again with ``target`` (the flags it was compiled
    with), its weights read from globals that IREE exports to ``path``."""
    if target.via != "torch":
        raise CompileFailed("a parameter archive is written for via='torch' only",
                            stage="options")
    if not os.path.isdir(os.path.dirname(path)):
        raise CompileFailed(f"parameters: folder {os.path.dirname(path)!r} does not exist",
                            stage="options")
    p = lower(partition(prepare(imported, policy)[0], target, policy))
    flags = (f"--iree-parameter-export={PARAMETER_SCOPE}={path}",
             f"--iree-parameter-export-minimum-size={int(min_bytes)}")
    vmfb, diag = try_compile(externalize_weights(p.mlir),
                             dataclasses.replace(target, flags=tuple(target.flags) + flags))
    if vmfb is None:
        raise CompileFailed(f"IREE could not compile {imported.name} with its weights as "
                            f"parameters ({first_error(diag)}); export it without an archive",
                            stage="compile")
    return vmfb


def externalize_weights(asm: str) -> str:
    """``asm`` (Torch dialect, as the importer writes it) with every
    ``torch.vtensor.literal(dense_resource<K>)`` read from a module-level global ``@K``
    (kept out of the code: ``#util.inline.never``), which holds the same resource."""
    out, globals_, seen = [], [], set()
    for line in asm.splitlines():
        m = _LITERAL.match(line)
        if m is None:
            out.append(line)
            continue
        indent, name, key, tensor, vtensor = m.groups()
        if key not in seen:
            seen.add(key)
            globals_.append(f'  util.global private @"{key}" <inlining_policy = '
                            f'#util.inline.never> = dense_resource<{key}> : {tensor}')
        raw = f"%__w{name[1:]}"
        out += [f'{indent}{raw} = util.global.load @"{key}" : {tensor}',
                f"{indent}{name} = torch_c.from_builtin_tensor {raw} : {tensor} -> {vtensor}"]
    if not globals_:
        return asm
    head = next(i for i, ln in enumerate(out) if ln.startswith("module"))
    return "\n".join(out[:head + 1] + globals_ + out[head + 1:]) + "\n"


def check_plain(manifest: Manifest) -> None:
    """Raise UnsupportedOp naming every op that keeps ``manifest``'s module from
    running on IREE's runtime alone."""
    calls = [p for p in (manifest.placements or []) if p.get("where") == "kernel_call"]
    if calls:
        lines = "\n".join(f"  {p['op']}  at {p.get('location') or '?'}: {p.get('reason', '')}"
                          for p in calls[:40])
        more = f"\n  ... and {len(calls) - 40} more" if len(calls) > 40 else ""
        raise UnsupportedOp(
            f"{len(calls)} op(s) would run in ATen through kernel calls, which only this "
            f"package's runtime provides, so the module cannot run on IREE's runtime "
            f"alone:\n{lines}{more}\n"
            "To see why each op is not compiled, compile with fallback='none' (every op "
            "IREE cannot lower, listed); to get rid of them, replace those ops in the "
            "model, or deploy the .aot artifact with aot.load instead.")
    if manifest.mutations:
        raise UnsupportedOp("the program updates its inputs in place (buffers or "
                            "arguments), which a plain IREE module cannot do to the "
                            "caller's tensors; deploy the .aot artifact with aot.load")
