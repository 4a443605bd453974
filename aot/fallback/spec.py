"""KernelCallSpec: one ATen kernel call site, as recorded at compile time.

Made by the partitioner (``aot.partition.kernel_calls``) by walking the op's
``FunctionSchema``; stored in the artifact manifest; read by the fallback
executor to rebuild the exact call. Tensor operands arrive at run time as
buffers; a scalar only known at run time (a ``SymInt``/``SymFloat``/``SymBool``
such as the result of ``.item()``) arrives as a host-function scalar
(:class:`ScalarArg`); every other operand is a :class:`StaticArg` whose value
was recorded (see ``static_values`` for the contract), never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..op_table import GROUP_OP
from ..torch_tensor import TorchTensor
from . import static_values

__all__ = ["HOST_MODULE", "GROUP_OP", "TensorArg", "TensorListArg", "ScalarArg", "StaticArg", "KernelCallSpec", "resolve_op",
           "lacks_cuda_kernel"]

# The IREE module name kernel calls are imported from (compile side) and that the
# fallback executor registers (run side).
HOST_MODULE = "aot_kernels"


@dataclass(frozen=True)
class TensorArg:
    """A tensor operand: the ``index``-th tensor passed to the host function."""

    name: str
    index: int
    spec: TorchTensor
    kwarg_only: bool = False
    constant: bool = False  # a weight baked into the program: the same buffer every call


@dataclass(frozen=True)
class TensorListArg:
    """A ``Tensor[]`` / ``Tensor?[]`` operand: host-function tensors by index (None kept)."""

    name: str
    indices: tuple[int | None, ...]
    kwarg_only: bool = False


@dataclass(frozen=True)
class ScalarArg:
    """A run-time scalar operand: the ``index``-th scalar passed to the host function.

    ``kind`` is ``i`` (int, passed as i64), ``f`` (float, passed as f32 as
    IREE demotes f64) or ``b`` (bool, passed as i64 0/1).
    """

    name: str
    index: int
    kind: str
    kwarg_only: bool = False


@dataclass(frozen=True)
class StaticArg:
    """A non-tensor operand recorded at compile time (value encoded per the contract)."""

    name: str
    schema_type: str
    value: Any
    kwarg_only: bool = False


Operand = TensorArg | TensorListArg | ScalarArg | StaticArg

# host-function calling-convention letter per scalar kind (IREE VM: I=i64, f=f32)
SCALAR_CCONV = {"i": "I", "b": "I", "f": "f"}
SCALAR_PY = {"i": int, "b": bool, "f": float}  # kind -> Python type


@dataclass(frozen=True)
class KernelCallSpec:
    """One kernel call: ``op`` (``aten::layer_norm``), ``overload``, operands, results.

    ``key`` is the host function name (``call_3``), stable within an artifact.
    ``inputs`` describe the tensor operands of the host function, in order;
    ``scalar_inputs`` the kinds of the run-time scalars that follow them.
    ``results`` describe every tensor the op returns, as ATen returns it;
    ``result_kinds`` spells every result in order (``t`` for the next of
    ``results``, or a scalar kind); empty means "all tensors".
    """

    key: str
    op: str
    overload: str
    operands: tuple[Operand, ...]
    results: tuple[TorchTensor, ...]
    location: str | None
    reason: str
    inputs: tuple[TorchTensor, ...]
    scalar_inputs: tuple[str, ...] = ()
    result_kinds: str = ""
    # A group of neighbouring ops run in one crossing (``op == GROUP_OP``): the
    # members run in order over value slots (the group's inputs, then every
    # member's results in turn; member TensorArg indices name slots), and
    # ``output_slots`` are handed back.
    members: tuple["KernelCallSpec", ...] = ()
    output_slots: tuple[int, ...] = ()
    # Per entry of ``inputs``: None when the tensor crosses from compiled code, or
    # the name of a host-held constant (a weight only kernel calls read: stored
    # beside the module and handed to ATen directly, never copied through IREE).
    constants: tuple[str | None, ...] = ()

    def constant_name(self, i: int) -> str | None:
        return self.constants[i] if i < len(self.constants) else None

    @property
    def crossing(self) -> tuple[TorchTensor, ...]:
        """The tensor operands compiled code passes (host-held constants left out)."""
        return tuple(t for i, t in enumerate(self.inputs) if self.constant_name(i) is None)

    @property
    def is_group(self) -> bool:
        return bool(self.members)

    @property
    def out_kinds(self) -> str:
        return self.result_kinds or "t" * len(self.results)

    @property
    def cconv(self) -> str:
        """IREE VM calling convention of the host function (``0rrI_r``)."""
        ins = "r" * len(self.crossing) + "".join(SCALAR_CCONV[k] for k in self.scalar_inputs)
        outs = "".join("r" if k == "t" else SCALAR_CCONV[k] for k in self.out_kinds)
        return f"0{ins or 'v'}_{outs}"

    @property
    def qualified_name(self) -> str:
        if self.is_group:
            return "group(" + ", ".join(m.qualified_name for m in self.members) + ")"
        return f"{self.op.replace('::', '.')}.{self.overload}"

    def __repr__(self) -> str:
        if self.is_group:
            ins = ", ".join(f"%{i}: {t.short()}" for i, t in enumerate(self.inputs))
            body = "\n".join("    " + repr(m) for m in self.members)
            outs = ", ".join(f"%{s}" for s in self.output_slots)
            return f"{self.key}: group({ins}) -> ({outs})\n{body}"
        parts = []
        for o in self.operands:
            if isinstance(o, TensorArg):
                text = f"%{o.index}: {o.spec.short()}"
            elif isinstance(o, TensorListArg):
                text = "[" + ", ".join("None" if i is None else f"%{i}" for i in o.indices) + "]"
            elif isinstance(o, ScalarArg):
                text = f"${o.index}: {SCALAR_PY[o.kind].__name__}"
            else:
                text = repr(static_values.decode(o.value))
            parts.append(f"{o.name}={text}" if o.kwarg_only else text)
        tensors = iter(self.results)
        res = ", ".join(next(tensors).short() if k == "t" else SCALAR_PY[k].__name__
                        for k in self.out_kinds)
        loc = f"  # {self.location}" if self.location else ""
        return f"{self.key}: {self.qualified_name}({', '.join(parts)}) -> ({res}){loc}"

    def to_json(self) -> dict[str, Any]:
        ops = []
        for o in self.operands:
            if isinstance(o, TensorArg):
                op = {"kind": "tensor", "name": o.name, "index": o.index,
                      "kwarg_only": o.kwarg_only, "constant": o.constant}
                if not self.inputs:  # a group member: its slots have no host input spec
                    op["spec"] = o.spec.to_json()
                ops.append(op)
            elif isinstance(o, TensorListArg):
                ops.append({"kind": "tensor_list", "name": o.name, "indices": list(o.indices),
                            "kwarg_only": o.kwarg_only})
            elif isinstance(o, ScalarArg):
                ops.append({"kind": "scalar", "name": o.name, "index": o.index,
                            "scalar_kind": o.kind, "kwarg_only": o.kwarg_only})
            else:
                ops.append({"kind": "static", "name": o.name, "type": o.schema_type,
                            "value": o.value, "kwarg_only": o.kwarg_only})
        return {"key": self.key, "op": self.op, "overload": self.overload, "operands": ops,
                "inputs": [t.to_json() for t in self.inputs],
                "results": [r.to_json() for r in self.results],
                "scalar_inputs": list(self.scalar_inputs), "result_kinds": self.result_kinds,
                "members": [m.to_json() for m in self.members],
                "output_slots": list(self.output_slots),
                "constants": list(self.constants),
                "location": self.location, "reason": self.reason}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "KernelCallSpec":
        inputs = tuple(TorchTensor.from_json(t) for t in d["inputs"])
        operands: list[Operand] = []
        for o in d["operands"]:
            if o["kind"] == "tensor":
                spec = (TorchTensor.from_json(o["spec"]) if "spec" in o
                        else inputs[o["index"]])
                operands.append(TensorArg(o["name"], o["index"], spec, o["kwarg_only"],
                                          o.get("constant", False)))
            elif o["kind"] == "tensor_list":
                operands.append(TensorListArg(o["name"], tuple(o["indices"]), o["kwarg_only"]))
            elif o["kind"] == "scalar":
                operands.append(ScalarArg(o["name"], o["index"], o["scalar_kind"], o["kwarg_only"]))
            else:
                operands.append(StaticArg(o["name"], o["type"], o["value"], o["kwarg_only"]))
        return KernelCallSpec(d["key"], d["op"], d["overload"], tuple(operands),
                              tuple(TorchTensor.from_json(r) for r in d["results"]),
                              d.get("location"), d.get("reason", ""), inputs,
                              tuple(d.get("scalar_inputs", ())), d.get("result_kinds", ""),
                              tuple(KernelCallSpec.from_json(m) for m in d.get("members", ())),
                              tuple(d.get("output_slots", ())),
                              tuple(d.get("constants", ())))


def resolve_op(op: str, overload: str):
    """``("aten::add", "Tensor")`` -> ``torch.ops.aten.add.Tensor``, or raise LookupError
    (a name the artifact may not use, or an op not registered here: ``aot.op_table``)."""
    from ..op_table import resolve
    return resolve(op, overload)


_NO_CUDA_NAMESPACES = ("aot_q", "quantized", "quantized_decomposed")


def lacks_cuda_kernel(spec: KernelCallSpec) -> bool:
    """True when ATen cannot run this call (or a member of the group) on CUDA tensors."""
    if spec.is_group:
        return any(lacks_cuda_kernel(m) for m in spec.members)
    if spec.op.split("::")[0] in _NO_CUDA_NAMESPACES:
        return True
    name = spec.op if spec.overload == "default" else f"{spec.op}.{spec.overload}"
    keys = ("CUDA", "CompositeImplicitAutograd", "CompositeExplicitAutograd")
    try:
        return not any(torch._C._dispatch_has_kernel_for_dispatch_key(name, k) for k in keys)
    except RuntimeError:
        return False  # unknown to the dispatcher here: let the call itself report
