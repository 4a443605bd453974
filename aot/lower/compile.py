"""compile_program: PartitionedProgram -> CompiledArtifact.

Third link of the chain: runs IREE on the outlined module for the target and
writes the manifest the runtime needs (nothing in it requires the compiler).
``compile_model`` drives partition + compile for an ImportedProgram and, under
``fallback="auto"``, recovers from IREE failing on a combination of ops that
each lower alone: the ops its errors point at become kernel calls (``recover``)
and the program is partitioned and compiled again.
"""

from __future__ import annotations

import hashlib
import time

import torch
import torch.utils._pytree as pytree

from ..artifact import FORMAT_VERSION, CompiledArtifact, pack_constants
from ..fallback.executor import ExecOptions
from ..torch_tensor import TorchTensor
import dataclasses
import logging

from ..importer.program import ImportedProgram
from .iree_compile import compile_error, first_error, try_compile
from .partition import PartitionedProgram, partition
from .placement import PlacementPolicy
from .fold_bn import fold_batch_norm
from .fold_constants import fold_constants
from .recover import blame, grow
from .regions import choose_region, worth_measuring
from .targets import Target

__all__ = ["compile_program", "compile_model"]
log = logging.getLogger(__name__)
_MAX_RECOVERY_ROUNDS = 4


def _iree_version() -> str:
    try:
        from importlib.metadata import version
        return version("iree-base-compiler")
    except Exception:
        return "unknown"


def compile_program(p: PartitionedProgram) -> CompiledArtifact:
    """Compile the partitioned module for its target.

    Args:
        p: from ``aot.lower.partition``.
    Returns:
        CompiledArtifact (vmfb + manifest).
    Raises:
        CompileFailed: IREE rejected the module; the message has the first
            diagnostic, the path of the dumped input IR and an iree-compile repro.
    """
    t0 = time.perf_counter()
    vmfb, diag = try_compile(p.mlir, p.target)
    if vmfb is None:
        raise compile_error(p.mlir, p.target, diag, what=p.imported.name)
    return _artifact(p, vmfb, time.perf_counter() - t0)


def compile_model(imported: ImportedProgram, target: Target,
                  policy: PlacementPolicy = PlacementPolicy(), example=None) -> CompiledArtifact:
    """Partition and compile, moving ops IREE breaks on to ATen (``fallback="auto"``).

    With ``example`` (``(args, kwargs)``) and the default options, the result is
    measured end to end against whole-ATen-region candidates (``regions``).

    Raises:
        UnsupportedOp: from ``partition``.
        CompileFailed: IREE still fails after the blamed ops moved to ATen, its
            errors point at no compiled op, or the policy forbids fallback.
    """
    t0 = time.perf_counter()
    folded = 0
    if policy.fallback != "all":  # the round-trip mode stays bit-exact: no rewrites
        ep, folded = fold_constants(fold_batch_norm(imported.exported))
        imported = dataclasses.replace(imported, exported=ep)
    demoted: dict[str, str] = {}
    for _ in range(_MAX_RECOVERY_ROUNDS + 1):
        p = partition(imported, target, policy, demoted=demoted)
        vmfb, diag = try_compile(p.mlir, target)
        if vmfb is not None:
            art = _artifact(p, vmfb, time.perf_counter() - t0)
            if example is not None and worth_measuring(imported, art, target, policy):
                art = choose_region(art, imported, target, policy, example)
                art.manifest["compile_seconds"] = round(time.perf_counter() - t0, 3)
            art.manifest["folded_ops"] = folded
            return art
        fresh = {k: v for k, v in blame(diag, p.mlir, p.placements).items() if k not in demoted}
        if not fresh and demoted:
            fresh = grow(demoted, p.placements, p.producers or {}, first_error(diag))
        if policy.fallback != "auto" or not fresh:
            note = ("" if policy.fallback == "auto" else
                    f"(fallback={policy.fallback!r}: not retried with the failing ops in ATen)\n")
            raise compile_error(p.mlir, target, diag, what=imported.name, note=note)
        log.warning("IREE failed on a combination of ops that lower alone (%s); running %s "
                    "in ATen and compiling again", next(iter(fresh.values())), sorted(fresh))
        demoted.update(fresh)
    raise compile_error(p.mlir, target, diag, what=imported.name,
                        note=f"(gave up after {_MAX_RECOVERY_ROUNDS} recovery rounds)\n")


def _artifact(p: PartitionedProgram, vmfb: bytes, seconds: float) -> CompiledArtifact:
    table, blob = pack_constants(p.host_constants)
    inputs = [i.to_json() if isinstance(i, TorchTensor) else {"static": i[1]}
              for i in p.imported.flat_inputs]
    manifest = {
        "format_version": FORMAT_VERSION,
        "name": p.imported.name,
        "target": p.target.name,
        "driver": p.target.driver,
        "flags": list(p.target.flags),
        "torch_version": torch.__version__,
        "iree_version": _iree_version(),
        "inputs": inputs,
        "input_names": list(p.imported.input_names),
        "outputs": [o.to_json() for o in p.imported.outputs],
        "in_spec": pytree.treespec_dumps(p.imported.in_spec),
        "out_spec": pytree.treespec_dumps(p.imported.out_spec),
        "kernel_calls": [k.to_json() for k in p.kernel_calls],
        "placements": [pl.to_json() for pl in p.placements],
        "policy": {"fallback": p.policy.fallback, "fallback_ops": list(p.policy.fallback_ops),
                   "placement": p.policy.placement},
        "executor": ExecOptions().to_json(),
        "whole_program_call": p.whole_program_call,
        "compile_seconds": round(seconds, 3),
        "vmfb_sha256": hashlib.sha256(vmfb).hexdigest(),
        "host_constants": table,
        "constants_sha256": hashlib.sha256(blob).hexdigest(),
    }
    return CompiledArtifact(vmfb, manifest, blob)
