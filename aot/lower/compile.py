"""compile_program: PartitionedProgram -> CompiledArtifact.

Third link of the chain: runs IREE on the outlined module for the target and
writes the manifest the runtime needs (nothing in it requires the compiler).
"""

from __future__ import annotations

import hashlib
import time

import torch
import torch.utils._pytree as pytree

from ..artifact import FORMAT_VERSION, CompiledArtifact
from ..torch_tensor import TorchTensor
from .iree_compile import compile_mlir
from .partition import PartitionedProgram

__all__ = ["compile_program"]


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
    vmfb = compile_mlir(p.mlir, p.target, what=p.imported.name)
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
        "policy": {"fallback": p.policy.fallback, "fallback_ops": list(p.policy.fallback_ops)},
        "compile_seconds": round(time.perf_counter() - t0, 3),
        "vmfb_sha256": hashlib.sha256(vmfb).hexdigest(),
    }
    return CompiledArtifact(vmfb, manifest)
