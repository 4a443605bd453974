"""Turn kernel-call placeholders into calls of imported host functions.

Input: a Torch-dialect module where each kernel call is a
``torch.operator "aot_kc.call_<ins>_<outs>"(t0, ..., s0, ..., site)``. Output:
the same module where each becomes ``torch_c.to_builtin_tensor`` (tensors) or
``torch_c.to_i64``/``to_f64``/``to_i1`` (run-time scalars) on the operands, a
``func.call @aot_kernels.<key>`` of a private declaration (IREE turns it into a
module import, resolved at run time by the fallback executor), and the inverse
conversions on the results. Scalars cross as i64 (ints, bools) or f32 (floats:
IREE demotes f64 to f32 everywhere, so compiled code holds f32 anyway).
"""

from __future__ import annotations

from .._mlir import ir
from ..errors import InternalError
from ..fallback.spec import HOST_MODULE, KernelCallSpec
from ..torch_tensor import TorchTensor
from .kernel_call_op import NAMESPACE

__all__ = ["HOST_MODULE", "outline_kernel_calls", "builtin_tensor_type", "carried"]


_ELEMENT = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16",
            "bool": "i1", "int8": "i8", "uint8": "i8", "int16": "i16", "int32": "i32",
            "int64": "i64", "complex64": "complex<f32>"}


def carried(spec: TorchTensor) -> bool:
    """Compiled code can hold this tensor: no data-dependent size (a symbolic one is a
    dynamic dimension) and a builtin element type."""
    return not spec.is_dynamic and spec.storage_dtype in _ELEMENT


def builtin_tensor_type(spec: TorchTensor) -> str:
    """``tensor<1x3xf32>`` for a TorchTensor (the dense buffer compiled code sees).

    Builtin integer types are signless, as torch-mlir's backend types are: a
    ``uint8`` tensor crosses as ``i8`` (the executor reinterprets the bytes).
    """
    try:
        elem = _ELEMENT[spec.storage_dtype]  # quantized: its integer representation
    except KeyError:
        raise InternalError(f"no builtin element type for {spec.dtype}") from None
    dims = "".join(f"{'?' if isinstance(d, str) else d}x" for d in spec.shape)  # ?: a symbol
    return f"tensor<{dims}{elem}>"


def _walk_kernel_calls(module: "ir.Module"):
    found = []
    for func in module.body.operations:
        for block in func.regions[0].blocks if len(func.regions) else []:
            for op in block.operations:
                if op.operation.name == "torch.operator":
                    name = ir.StringAttr(op.operation.attributes["name"]).value
                    # The importer prefixes the op's namespace with "torch.".
                    if name.removeprefix("torch.").startswith(NAMESPACE + ".call_"):
                        found.append(op.operation)
    return found


def outline_kernel_calls(module: "ir.Module", specs: list[KernelCallSpec]) -> "ir.Module":
    """Rewrite ``module`` in place (it is handed on afterwards, never touched again)."""
    with module.context, ir.Location.unknown():
        with ir.InsertionPoint.at_block_begin(module.body):
            for spec in specs:
                ins, outs = _host_types(spec)
                ir.Operation.create("func.func", regions=1, attributes={
                    "sym_name": ir.StringAttr.get(f"{HOST_MODULE}.{spec.key}"),
                    "function_type": ir.TypeAttr.get(ir.FunctionType.get(ins, outs)),
                    "sym_visibility": ir.StringAttr.get("private"),
                })
        for op in _walk_kernel_calls(module):
            _replace(op, specs)
    return module


_SCALAR_ABI = {"i": "i64", "b": "i64", "f": "f32"}


def _host_types(spec: KernelCallSpec) -> tuple[list, list]:
    """Builtin argument and result types of the host function for ``spec``."""
    ins = [builtin_tensor_type(t) for t in spec.crossing]
    ins += [_SCALAR_ABI[k] for k in spec.scalar_inputs]
    tensors = iter(spec.results)
    outs = [builtin_tensor_type(next(tensors).dense()) if k == "t" else _SCALAR_ABI[k]
            for k in spec.out_kinds]
    return [ir.Type.parse(t) for t in ins], [ir.Type.parse(t) for t in outs]


def _op(name: str, operand, result: str):
    return ir.Operation.create(name, operands=[operand], results=[ir.Type.parse(result)]).result


def _scalar_to_abi(kind: str, v):
    if kind == "i":
        return _op("torch_c.to_i64", v, "i64")
    if kind == "b":
        return _op("arith.extui", _op("torch_c.to_i1", v, "i1"), "i64")
    return _op("arith.truncf", _op("torch_c.to_f64", v, "f64"), "f32")


def _scalar_from_abi(kind: str, v):
    if kind == "i":
        return _op("torch_c.from_i64", v, "!torch.int")
    if kind == "b":
        return _op("torch_c.from_i1", _op("arith.trunci", v, "i1"), "!torch.bool")
    return _op("torch_c.from_f64", _op("arith.extf", v, "f64"), "!torch.float")


def _replace(op: "ir.Operation", specs: list[KernelCallSpec]) -> None:
    site_op = op.operands[len(op.operands) - 1].owner
    site = ir.IntegerAttr(site_op.attributes["value"]).value
    spec = specs[site]
    n_t, n_s = len(spec.crossing), len(spec.scalar_inputs)
    operands = list(op.operands)[:-1]
    if len(operands) != n_t + n_s or len(op.results) != len(spec.out_kinds):
        raise InternalError(f"kernel call {spec.key} arity does not match its spec")
    ins, outs = _host_types(spec)
    with ir.InsertionPoint(op), op.location:
        args = [_op("torch_c.to_builtin_tensor", v, str(t))
                for v, t in zip(operands[:n_t], ins[:n_t])]
        args += [_scalar_to_abi(k, v) for k, v in zip(spec.scalar_inputs, operands[n_t:])]
        call = ir.Operation.create(
            "func.call", operands=args, results=outs,
            attributes={"callee": ir.FlatSymbolRefAttr.get(f"{HOST_MODULE}.{spec.key}")})
        for kind, old, res in zip(spec.out_kinds, op.results, call.results):
            new = (ir.Operation.create("torch_c.from_builtin_tensor", operands=[res],
                                       results=[old.type]).result
                   if kind == "t" else _scalar_from_abi(kind, res))
            old.replace_all_uses_with(new)
    op.erase()
