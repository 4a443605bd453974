"""The StableHLO path (``via="stablehlo"``): outlined Torch dialect -> StableHLO.

Input: the partitioned Torch-dialect module (``partition``: compiled ops as
``torch.aten.*``, each kernel call a ``func.call @aot_kernels.<key>`` on builtin
tensors). Each kernel call becomes a ``stablehlo.custom_call`` under the contract
below, then torch-mlir (``torch-mlir-opt``, from the ``torch-mlir`` package) lowers
the rest Torch -> StableHLO. For IREE the custom calls turn back into calls of the
same host functions (``host_calls``), so the runtime, the kernel calls' groups and
the TorchTensor boundary are those of the Torch-dialect path.

Custom-call contract (docs/stablehlo.md):

- ``call_target_name``: the ATen op, ``aten::layer_norm``; ``aot::group`` for a
  group of neighbouring ops run in one crossing.
- operands: the op's tensors in schema order, then each run-time scalar as a 0-d
  tensor: ``tensor<i64>`` for ints and bools, ``tensor<f32>`` for floats
  (``scalar_operands`` in ``backend_config`` lists their positions).
- results: typed tensors in order; a scalar result is a 0-d tensor as above
  (``scalar_results``).
- ``backend_config``: a JSON string, the kernel call's record as the manifest holds
  it (``KernelCallSpec.to_json``): ``op``, ``overload``, ``operands`` (every schema
  argument in order: ``tensor`` with its operand index, ``scalar`` with its index
  among the run-time scalars, or ``static`` with its value recorded by the static-value
  contract of ``aot.fallback.static_values``: ints, floats incl. inf/nan, bools,
  None, lists, dtypes, devices, memory formats, strings), ``inputs`` and ``results``
  (TorchTensor: dtype, shape, strides, quantization parameters), ``key`` (the host
  function), ``location`` (the user's source line) and ``reason``.

Diagnostics from torch-mlir carry the Torch-dialect module's own line numbers
(``<stdin>:L:C``), so ``recover.blame`` maps an op StableHLO cannot take back to
its node, which then runs in ATen: coverage is per path.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

from .._mlir import ir, new_context
from ..errors import CompileFailed
from ..fallback.spec import HOST_MODULE, KernelCallSpec

__all__ = ["CUSTOM_CALL", "PIPELINE", "available", "check", "to_stablehlo",
           "host_calls", "custom_calls"]

CUSTOM_CALL = "stablehlo.custom_call"
PIPELINE = ("builtin.module(func.func(torch-match-quantized-custom-ops),"
            "torchdynamo-export-to-torch-backend-pipeline{ extra-library=},"
            "torch-backend-to-stablehlo-backend-pipeline)")
_SCALAR_TENSOR = {"i64": "tensor<i64>", "f32": "tensor<f32>"}

_TIMEOUT_S = 600


def _tool() -> str:
    """The ``torch-mlir-opt`` of the installed ``torch-mlir`` package."""
    try:
        import torch_mlir._mlir_libs as libs
    except ImportError:
        raise CompileFailed("via='stablehlo' needs the torch-mlir package: "
                            "pip install 'aot[stablehlo]'", stage="options") from None
    path = os.path.join(os.path.dirname(libs.__file__), "torch-mlir-opt")
    if not os.access(path, os.X_OK):
        raise CompileFailed(f"the torch-mlir package has no runnable torch-mlir-opt ({path})",
                            stage="options")
    return path


def check() -> None:
    """Raise CompileFailed (stage ``options``) when torch-mlir is missing."""
    _tool()


def available() -> bool:
    """torch-mlir is installed (``check`` raises the error that says how to get it)."""
    try:
        _tool()
        return True
    except CompileFailed:
        return False


def to_stablehlo(torch_asm: str, specs: dict[str, KernelCallSpec] | None = None,
                 constants: dict | None = None) -> tuple[str | None, str]:
    """``(StableHLO text, "")``, or ``(None, torch-mlir's diagnostics)``.

    ``specs`` (key -> KernelCallSpec) fills each custom call's ``backend_config``;
    without it only the host function's key is recorded (enough for ``host_calls``).
    ``constants`` (name -> tensor, the weights only kernel calls read): passed to
    their custom calls as ``stablehlo.constant`` operands, so every tensor operand is
    there in schema order (what ``--emit stablehlo`` writes; compiled artifacts keep
    such weights beside the module instead).
    """
    with new_context() as ctx, ir.Location.unknown():
        module = ir.Module.parse(torch_asm, ctx)
        _calls_to_custom_calls(module, specs or {}, constants)
        text = module.operation.get_asm(enable_debug_info=True)
    try:
        done = subprocess.run([_tool(), f"--pass-pipeline={PIPELINE}", "-"], input=text,
                              capture_output=True, text=True, timeout=_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, f"error: torch-mlir took more than {_TIMEOUT_S} s"
    if done.returncode != 0:
        # locations are the Torch-dialect text's own lines: say so as IREE does
        return None, re.sub(r"(?m)^-:(\d+):(\d+):", r"<stdin>:\1:\2:", done.stderr)
    return done.stdout, ""


def _calls_to_custom_calls(module: "ir.Module", specs: dict[str, KernelCallSpec],
                           constants: dict | None) -> None:
    for call in _ops(module, "func.call"):
        callee = ir.FlatSymbolRefAttr(call.attributes["callee"]).value
        if not callee.startswith(HOST_MODULE + "."):
            continue
        key = callee[len(HOST_MODULE) + 1:]
        spec = specs.get(key)
        config = spec.to_json() if spec is not None else {"key": key}
        n_scalars = sum(str(v.type) in _SCALAR_TENSOR for v in call.operands)  # trailing
        with ir.InsertionPoint(call), call.location:
            operands = [_to_tensor(v) for v in call.operands]
            if constants is not None and spec is not None and any(spec.constants):
                passed = iter(operands[:len(spec.crossing)])
                operands = [next(passed) if spec.constant_name(i) is None
                            else _constant(constants[spec.constant_name(i)])
                            for i in range(len(spec.inputs))] + operands[len(spec.crossing):]
                config["constants_passed"] = True
            # which operands and results are run-time scalars (a 0-d tensor is not)
            config["scalar_operands"] = list(range(len(operands) - n_scalars, len(operands)))
            config["scalar_results"] = [i for i, r in enumerate(call.results)
                                        if str(r.type) in _SCALAR_TENSOR]
            result_types = [ir.Type.parse(_SCALAR_TENSOR.get(str(r.type), str(r.type)))
                            for r in call.results]
            cc = ir.Operation.create(CUSTOM_CALL, results=result_types, operands=operands,
                                     attributes={
                "call_target_name": ir.StringAttr.get(spec.op if spec else key),
                "backend_config": ir.StringAttr.get(json.dumps(config, sort_keys=True)),
                "has_side_effect": ir.BoolAttr.get(False)})
            for old, new in zip(call.results, cc.results):
                old.replace_all_uses_with(_from_tensor(new, old.type))
        call.erase()
    for decl in _private_host_decls(module):
        decl.erase()


def host_calls(stablehlo_asm: str) -> str:
    """The StableHLO module with each of our custom calls a ``func.call`` of its host
    function again (declared private: IREE makes it a module import)."""
    with new_context() as ctx, ir.Location.unknown():
        module = ir.Module.parse(stablehlo_asm, ctx)
        declared: set[str] = set()
        for cc in _ops(module, CUSTOM_CALL):
            key = _key(cc)
            if key is None:
                continue
            config = json.loads(ir.StringAttr(cc.attributes["backend_config"]).value)
            if config.get("constants_passed"):
                raise CompileFailed(f"custom call {key} passes its weights as operands (an "
                                    f"emitted module): compile the model, not the emitted text")
            scalar_in = set(config.get("scalar_operands", ()))
            scalar_out = set(config.get("scalar_results", ()))
            with ir.InsertionPoint(cc), cc.location:
                args = [_from_tensor(v, ir.Type.parse(_SCALAR_OF[str(v.type)]))
                        if i in scalar_in else v for i, v in enumerate(cc.operands)]
                outs = [ir.Type.parse(_SCALAR_OF[str(r.type)]) if i in scalar_out else r.type
                        for i, r in enumerate(cc.results)]
                name = f"{HOST_MODULE}.{key}"
                call = ir.Operation.create("func.call", results=outs, operands=args,
                                           attributes={"callee": ir.FlatSymbolRefAttr.get(name)})
                for old, new in zip(cc.results, call.results):
                    old.replace_all_uses_with(_to_tensor(new) if old.type != new.type else new)
            cc.erase()
            if name not in declared:
                declared.add(name)
                with ir.InsertionPoint.at_block_begin(module.body):
                    ir.Operation.create("func.func", regions=1, attributes={
                        "sym_name": ir.StringAttr.get(name),
                        "function_type": ir.TypeAttr.get(ir.FunctionType.get(
                            [a.type for a in args], outs)),
                        "sym_visibility": ir.StringAttr.get("private")})
        return str(module)


def custom_calls(stablehlo_asm: str) -> list[dict]:
    """Our custom calls of a StableHLO module, in order: ``call_target_name``, the
    parsed ``backend_config`` and the operand and result types, as text."""
    out = []
    with new_context() as ctx:
        module = ir.Module.parse(stablehlo_asm, ctx)
        for cc in _ops(module, CUSTOM_CALL):
            if _key(cc) is None:
                continue
            out.append({"target": ir.StringAttr(cc.attributes["call_target_name"]).value,
                        "config": json.loads(ir.StringAttr(cc.attributes["backend_config"]).value),
                        "operands": [str(v.type) for v in cc.operands],
                        "results": [str(r.type) for r in cc.results]})
    return out


_SCALAR_OF = {v: k for k, v in _SCALAR_TENSOR.items()}  # tensor<i64> -> i64


def _key(cc) -> str | None:
    if "backend_config" not in cc.attributes:
        return None
    try:
        config = json.loads(ir.StringAttr(cc.attributes["backend_config"]).value)
    except (ValueError, TypeError):
        return None
    return config.get("key") if isinstance(config, dict) else None


def _to_tensor(v):
    """A scalar (i64, f32) as a 0-d tensor; a tensor as it is."""
    t = str(v.type)
    if t not in _SCALAR_TENSOR:
        return v
    return ir.Operation.create("tensor.from_elements", operands=[v],
                               results=[ir.Type.parse(_SCALAR_TENSOR[t])]).result


def _constant(t):
    """A weight as a ``stablehlo.constant`` (its dense storage, row-major)."""
    import numpy as np
    import torch
    t = t.detach().contiguous()
    if t.is_quantized:
        t = t.int_repr()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: its bits, typed bf16
        attr = ir.DenseElementsAttr.get(np.ascontiguousarray(t.view(torch.int16).numpy()),
                                        type=ir.BF16Type.get())
    else:
        attr = ir.DenseElementsAttr.get(np.ascontiguousarray(t.numpy()), signless=True)
    return ir.Operation.create("stablehlo.constant", results=[attr.type],
                               attributes={"value": attr}).result


def _from_tensor(v, want: "ir.Type"):
    """A 0-d tensor back to the scalar ``want``; anything else as it is."""
    if str(want) not in _SCALAR_TENSOR:
        return v
    return ir.Operation.create("tensor.extract", operands=[v], results=[want]).result


def _ops(module: "ir.Module", name: str) -> list:
    found = []

    def walk(op):
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    if inner.operation.name == name:
                        found.append(inner.operation)
                    walk(inner.operation)

    walk(module.operation)
    return found


def _private_host_decls(module: "ir.Module") -> list:
    return [op.operation for op in module.body.operations
            if op.operation.name == "func.func"
            and ir.StringAttr(op.operation.attributes["sym_name"]).value.startswith(HOST_MODULE + ".")
            and len(op.operation.regions[0].blocks) == 0]
