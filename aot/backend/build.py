"""The IREE backend's last step: a partitioned program compiled by IREE, or the host
program, and the manifest the runtime needs (nothing in it requires the compiler) —
one ``CompiledArtifact``."""

from __future__ import annotations

import hashlib
import re
import time
from importlib.metadata import version

import torch

from ..artifact import FORMAT_VERSION, CompiledArtifact, pack_constants
from ..errors import CompileFailed
from ..fallback import heap
from ..fallback.executor import ExecOptions
from ..fallback.quantized_ops import compile_engine
from ..importer.locations import node_location
from ..importer.program import ImportedProgram
from ..torch_tensor import TorchTensor
from ..treespec import dump_treespec
from ..partition import aten_region
from ..toolchain.iree_compile import compile_error, try_compile
from .lower import LoweredProgram
from ..partition.placement import KERNEL_CALL, Placement, PlacementPolicy, op_name
from ..toolchain.targets import Target
from ..partition.threads import one_thread_calls

__all__ = ["compile_program", "build_artifact", "host_artifact", "compile_input", "iree_version"]


def compile_program(p: LoweredProgram) -> CompiledArtifact:
    """Compile the lowered module for its target.

    Args:
        p: from ``aot.backend.lower``.
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
    return build_artifact(p, vmfb, time.perf_counter() - t0)


def compile_input(p: LoweredProgram) -> str | bytes:
    """What iree-compile reads: MLIR bytecode, where the weights are bytes (as text they
    are hex: a large model's text takes seconds to print and as long to parse); the text where
    torch-mlir reads it first (``via="stablehlo"``)."""
    return p.bytecode() if p.target.via == "torch" else p.mlir


def host_artifact(imported: ImportedProgram, target: Target, policy: PlacementPolicy,
                   reason: str, t0: float) -> CompiledArtifact:
    """The whole program as one ATen region run by the host (no IREE module)."""
    entry, constants = aten_region.record(imported, reason)
    placements = [Placement(n.name, op_name(n.target), KERNEL_CALL,
                            f"runs in the host program: {reason}", node_location(n), None,
                            "host_program")
                  for n in imported.exported.graph.nodes if n.op == "call_function"
                  and isinstance(n.target, torch._ops.OpOverload)]
    table, _, blob = pack_constants(constants)
    manifest = _manifest(imported, target, policy, placements, [], None, b"", table, blob,
                         time.perf_counter() - t0)
    manifest["host_program"] = entry
    manifest["executor"]["retained_heap_bytes"] = heap.planned_bytes([], target.driver,
                                                                    host_program=True)
    return CompiledArtifact.built(b"", manifest, blob)


def build_artifact(p: LoweredProgram, vmfb: bytes, seconds: float) -> CompiledArtifact:
    if p.imported.symbols:
        _check_dynamic_signature(p)
    table, parameters, blob = pack_constants(p.host_constants, p.parameters)
    manifest = _manifest(p.imported, p.target, p.policy, p.placements, p.kernel_calls,
                         p.whole_program_call, vmfb, table, blob, seconds)
    if parameters:
        manifest["parameters"] = parameters
    return CompiledArtifact.built(vmfb, manifest, blob)


_VTENSOR = re.compile(r"!torch\.vtensor<\[([^\]]*)\]")


def _check_dynamic_signature(p: LoweredProgram) -> None:
    """The compiled ``main`` has a dynamic dimension (``?``) exactly where the program's
    inputs and outputs follow a symbol: a compile step that fixed one to the example's
    size would give a module that is wrong at every other size.

    Raises:
        CompileFailed: a dimension was fixed (then ``fallback="auto"`` runs the program
            as one ATen region, which keeps every symbol).
    """
    head = next((ln for ln in p.mlir.splitlines() if "func.func @main(" in ln), "")
    got = [[d.strip() for d in m.split(",")] if m else [] for m in _VTENSOR.findall(head)]
    want = [["?" if isinstance(d, str) else str(d) for d in t.shape]
            for t in (*p.imported.tensor_inputs, *p.imported.tensor_outputs)]
    if got != want:
        raise CompileFailed(f"{p.imported.name}: the compiled program's signature {got} lost a "
                            f"dynamic dimension of {want} (a compile step fixed it to the "
                            "example's size); not compiled that way")


def _output_json(o) -> dict:
    if isinstance(o, TorchTensor):
        return o.to_json()
    return {o[0]: o[1]}  # {"static": value} or {"scalar": kind}


def _manifest(imported: ImportedProgram, target: Target, policy: PlacementPolicy, placements,
              kernel_calls, whole_program_call, vmfb: bytes, table: dict, blob: bytes,
              seconds: float) -> dict:
    inputs = [i.to_json() if isinstance(i, TorchTensor) else {"static": i[1]}
              for i in imported.flat_inputs]
    return {
        "format_version": FORMAT_VERSION,
        "name": imported.name,
        "target": target.name,
        "via": target.via,
        "driver": target.driver,
        "flags": list(target.flags),
        "cpu": target.cpu.to_json() if target.cpu is not None else None,
        "torch_version": torch.__version__,
        "iree_version": iree_version(),
        "inputs": inputs,
        "input_names": list(imported.input_names),
        "symbols": imported.symbols,
        "outputs": [_output_json(o) for o in imported.outputs],
        "mutations": list(imported.mutations),
        "returns_input": list(imported.returns_input),
        "in_spec": dump_treespec(imported.in_spec),
        "out_spec": dump_treespec(imported.out_spec),
        "kernel_calls": [k.to_json() for k in kernel_calls],
        "placements": [pl.to_json() for pl in placements],
        "policy": {"fallback": policy.fallback, "fallback_ops": list(policy.fallback_ops),
                   "placement": policy.placement},
        "executor": ExecOptions(
            quantized_engine=compile_engine(imported.exported.graph),
            int8_float_math=imported.pt2e,
            one_thread_calls=one_thread_calls(placements, kernel_calls, target),
            retained_heap_bytes=heap.planned_bytes(kernel_calls, target.driver)).to_json(),
        "whole_program_call": whole_program_call,
        "compile_seconds": round(seconds, 3),
        "vmfb_sha256": hashlib.sha256(vmfb).hexdigest(),
        "host_constants": table,
        "constants_sha256": hashlib.sha256(blob).hexdigest(),
    }


def iree_version() -> str:
    try:
        return version("iree-base-compiler")
    except Exception:
        return "unknown"
