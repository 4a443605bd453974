"""Turn kernel-call placeholders into calls of imported host functions.

Input: a Torch-dialect module where each kernel call is a
``torch.operator "aot_kc.call_n_m"(t0, ..., site)``. Output: the same module
where each becomes ``torch_c.to_builtin_tensor`` on the operands, a
``func.call @aot_kernels.<key>`` of a private declaration (IREE turns it into a
module import, resolved at run time by the fallback executor), and
``torch_c.from_builtin_tensor`` on the results.
"""

from __future__ import annotations

from .._mlir import ir
from ..errors import InternalError
from ..fallback.spec import HOST_MODULE, KernelCallSpec
from ..torch_tensor import TorchTensor
from .kernel_call_op import NAMESPACE

__all__ = ["HOST_MODULE", "outline_kernel_calls", "builtin_tensor_type"]


_ELEMENT = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16",
            "bool": "i1", "int8": "i8", "uint8": "ui8", "int16": "i16", "int32": "i32",
            "int64": "i64", "complex64": "complex<f32>"}


def builtin_tensor_type(spec: TorchTensor) -> str:
    """``tensor<1x3xf32>`` for a TorchTensor (the dense buffer compiled code sees)."""
    try:
        elem = _ELEMENT[spec.dtype]
    except KeyError:
        raise InternalError(f"no builtin element type for {spec.dtype}") from None
    dims = "".join(f"{d}x" for d in spec.shape)
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
                ins = [ir.Type.parse(builtin_tensor_type(t)) for t in spec.inputs]
                outs = [ir.Type.parse(builtin_tensor_type(t.dense())) for t in spec.results]
                ir.Operation.create("func.func", regions=1, attributes={
                    "sym_name": ir.StringAttr.get(f"{HOST_MODULE}.{spec.key}"),
                    "function_type": ir.TypeAttr.get(ir.FunctionType.get(ins, outs)),
                    "sym_visibility": ir.StringAttr.get("private"),
                })
        for op in _walk_kernel_calls(module):
            _replace(op, specs)
    return module


def _replace(op: "ir.Operation", specs: list[KernelCallSpec]) -> None:
    site_op = op.operands[len(op.operands) - 1].owner
    site = ir.IntegerAttr(site_op.attributes["value"]).value
    spec = specs[site]
    tensors = list(op.operands)[:-1]
    if len(tensors) != len(spec.inputs) or len(op.results) != len(spec.results):
        raise InternalError(f"kernel call {spec.key} arity does not match its spec")
    with ir.InsertionPoint(op), op.location:
        builtins = [
            ir.Operation.create("torch_c.to_builtin_tensor", operands=[v],
                                results=[ir.Type.parse(builtin_tensor_type(t))]).result
            for v, t in zip(tensors, spec.inputs)]
        call = ir.Operation.create(
            "func.call", operands=builtins,
            results=[ir.Type.parse(builtin_tensor_type(t.dense())) for t in spec.results],
            attributes={"callee": ir.FlatSymbolRefAttr.get(f"{HOST_MODULE}.{spec.key}")})
        for i, old in enumerate(op.results):
            new = ir.Operation.create("torch_c.from_builtin_tensor", operands=[call.results[i]],
                                      results=[old.type]).result
            old.replace_all_uses_with(new)
    op.erase()
