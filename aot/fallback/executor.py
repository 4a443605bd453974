"""The host module that runs kernel calls with ATen.

``make_host_module`` builds an ``iree.runtime.PyModuleInterface`` named
``aot_kernels`` with one function per KernelCallSpec. Each function receives
IREE buffer views, sees them as torch tensors through DLPack (no copy), calls
the recorded ``torch.ops`` overload with the recorded static operands, and
hands the results back the same way. Results are made dense (compiled code
holds row-major buffers) and never alias an operand (IREE may reuse operand
memory once the call returns).
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field

import torch
import iree.runtime as rt

from ..errors import ArtifactError, InputMismatch, KernelCallFailed
from ..runtime.device import as_storage, buffer_view_to_torch, sync_torch, torch_to_buffer_view
from ..torch_tensor import dtype_from_name
from .bound import BoundCall
from .cuda_graph import GraphedRegion
from .layout import CONV_OPS, ChannelsLast, has_conv, layout_safe
from .quantized_ops import PREPACKED
from .spec import (HOST_MODULE, KernelCallSpec, StaticArg, TensorArg, lacks_cuda_kernel,
                   resolve_op)

__all__ = ["HostModule", "ExecOptions", "make_host_module", "HOST_MODULE"]
log = logging.getLogger(__name__)


@dataclass
class HostModule:
    """The VmModule plus the error slot that carries Python exceptions out of IREE."""

    vm_module: "rt.VmModule"
    interface: "rt.PyModuleInterface"
    pending_error: BaseException | None = None
    calls: int = field(default=0)

    def take_error(self) -> BaseException | None:
        err, self.pending_error = self.pending_error, None
        return err


@dataclass(frozen=True)
class ExecOptions:
    """How the host runs groups; the manifest's ``"executor"`` entry.

    ``memory_format="channels_last"``: convolution groups whose ops are all
    layout-safe run NHWC (``aot.fallback.layout``). ``cuda_graphs``: on CUDA a
    group is replayed from a CUDA graph after its first call
    (``aot.fallback.cuda_graph``).
    """

    memory_format: str = "contiguous"
    cuda_graphs: bool = True

    def to_json(self) -> dict:
        return {"memory_format": self.memory_format, "cuda_graphs": self.cuda_graphs}

    @staticmethod
    def from_json(d: dict | None) -> "ExecOptions":
        d = d or {}
        fmt = d.get("memory_format", "contiguous")
        if fmt not in ("contiguous", "channels_last"):
            raise ArtifactError(f"executor memory_format {fmt!r} is not contiguous or "
                                "channels_last", stage="load")
        return ExecOptions(fmt, bool(d.get("cuda_graphs", True)))


def _storage_ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr() if t.numel() else -1


def _resolve(spec: KernelCallSpec):
    """The callable running one op: its OpOverload, or a prepacking call site."""
    try:
        op = resolve_op(spec.op, spec.overload)
    except LookupError as e:
        raise ArtifactError(f"kernel call {spec.key}: {e}", op=spec.qualified_name,
                            location=spec.location) from None
    if spec.op in PREPACKED:
        needs, site = PREPACKED[spec.op]
        const = {o.name for o in spec.operands
                 if (isinstance(o, TensorArg) and o.constant) or isinstance(o, StaticArg)}
        if all(n in const for n in needs):
            return site()  # weights packed on the first call, not on every call
    return op


def _adapt(t, spec):
    """A slot value as a member expects it: quantized tensor or its integer storage."""
    if spec is None or not isinstance(t, torch.Tensor):
        return t
    if spec.qparams is not None and not t.is_quantized:
        return spec.from_storage(t)
    if spec.qparams is None and t.is_quantized:
        return t.int_repr()
    return t


class _Slots:
    """``tensors[i]`` for ``KernelCallSpec.bind``, adapting each slot to the member's spec."""

    def __init__(self, env: list, member: KernelCallSpec):
        self.env = env
        self.specs = {o.index: o.spec for o in member.operands if isinstance(o, TensorArg)}

    def __getitem__(self, i):
        return _adapt(self.env[i], self.specs.get(i))


class _KernelCall:
    """One host function: buffer views in, buffer views out."""

    def __init__(self, spec: KernelCallSpec, device, driver: str, host: HostModule,
                 options: ExecOptions = ExecOptions(), constants: dict | None = None):
        self.spec, self.device, self.driver, self.host = spec, device, driver, host
        self.torch_device = torch.device("cpu") if driver.startswith("local") else torch.device("cuda")
        # per input: (storage dtype, None) when it crosses from IREE, (None, tensor) when host-held
        self.operand_plan = []
        for i, t in enumerate(spec.inputs):
            name = spec.constant_name(i)
            if name is not None and name not in (constants or {}):
                raise ArtifactError(f"kernel call {spec.key}: host constant {name!r} is missing "
                                    "from the artifact", op=spec.qualified_name)
            self.operand_plan.append((dtype_from_name(t.storage_dtype), None) if name is None
                                     else (None, constants[name]))
        # An op with no CUDA kernel in ATen (quantized kernels) runs on the CPU:
        # operands copied over and results copied back (reported at compile time).
        self.on_cpu = driver == "cuda" and lacks_cuda_kernel(spec)
        if self.on_cpu:
            self.operand_plan = [(d, None if c is None else c.cpu()) for d, c in self.operand_plan]
            warnings.warn(f"kernel call {spec.key} ({spec.qualified_name}) has no CUDA kernel in "
                          "ATen: it runs on the CPU with copies across devices", stacklevel=2)
        self.bound = None if spec.is_group else BoundCall(spec, _resolve(spec), self.torch_device)
        self.region = None
        if spec.is_group:
            self._prepare_group(options)

    def _prepare_group(self, options: ExecOptions) -> None:
        ops = [m.op for m in self.spec.members]
        self.nhwc = (ChannelsLast() if options.memory_format == "channels_last"
                     and layout_safe(ops) and has_conv(ops) else None)
        self.members = []
        for m in self.spec.members:
            op = _resolve(m)
            if self.nhwc is not None:
                op = self.nhwc.op_for(m.op, op)
            weight = next((o for o in m.operands if isinstance(o, TensorArg) and o.name == "weight"), None)
            self.members.append((BoundCall(m, op, self.torch_device), m.op in CONV_OPS,
                                 bool(weight and weight.constant),
                                 any(isinstance(o, TensorArg) and o.spec.qparams is not None
                                     for o in m.operands)
                                 or any(r.qparams is not None for r in m.results)))
        # quantized slots are adapted per member (quantized tensor or its integer storage)
        self.adapt = any(q for *_, q in self.members) or any(
            s.qparams is not None for s in self.spec.inputs)
        if options.cuda_graphs and self.driver == "cuda" and not self.on_cpu:
            held = [const is not None for _, const in self.operand_plan]  # same address every call
            self.region = GraphedRegion(self._run_members, held, self.spec.key)

    def __call__(self, *refs):
        try:
            return self._run(refs)
        except BaseException as e:  # never let a Python error unwind through IREE
            self.host.pending_error = e
            raise

    def _run(self, refs):
        self.host.calls += 1
        raw, n = [], 0
        for dtype, const in self.operand_plan:
            if const is not None:
                raw.append(const)
                continue
            t = as_storage(buffer_view_to_torch(self.device, refs[n].deref(rt.HalBufferView),
                                                self.driver), dtype)
            raw.append(t.cpu() if self.on_cpu else t)
            n += 1
        # quantized operands: real quantized tensors over the same memory
        tensors = [s.from_storage(t) for s, t in zip(self.spec.inputs, raw)]
        if self.spec.is_group:
            outs = self.region(tensors) if self.region is not None else self._run_members(tensors)
        else:
            args, kwargs = self.bound.bind(tensors, refs[n:])
            out = self._call(self.spec, self.bound.op, args, kwargs)
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
        kinds = self.spec.out_kinds
        if len(outs) != len(kinds):
            raise KernelCallFailed(f"ATen returned {len(outs)} value(s), compiled for {len(kinds)}",
                                   op=self.spec.qualified_name, location=self.spec.location)
        in_ptrs = {_storage_ptr(t) for t in raw}
        tensor_specs = iter(self.spec.results)
        vals = []
        for i, (r, kind) in enumerate(zip(outs, kinds)):
            if kind == "t":
                vals.append(self._tensor_result(i, r, next(tensor_specs), in_ptrs))
            else:
                vals.append(float(r) if kind == "f" else int(r))
        sync_torch(self.driver)  # results complete before IREE's stream reads them
        return vals[0] if len(vals) == 1 else tuple(vals)

    def _call(self, spec, op, args, kwargs):
        try:
            return op(*args, **kwargs)
        except Exception as e:
            raise KernelCallFailed(f"ATen raised {type(e).__name__}: {e}\n  in {spec!r}",
                                   op=spec.qualified_name, location=spec.location) from e

    def _run_members(self, tensors: list) -> list:
        """Run the members in order; intermediates stay ATen tensors (quantized stay quantized)."""
        env = list(tensors)
        for bound, is_conv, weight_constant, _ in self.members:
            args, kwargs = bound.bind(_Slots(env, bound.spec) if self.adapt else env)
            if is_conv and self.nhwc is not None:
                args = self.nhwc.conv_args(args, weight_constant)
            out = self._call(bound.spec, bound.op, args, kwargs)
            if isinstance(out, (tuple, list)):
                env.extend(out)
            else:
                env.append(out)
        return [env[i] for i in self.spec.output_slots]

    def _tensor_result(self, i: int, r, want, in_ptrs):
        if isinstance(r, torch.Tensor) and want.qparams is not None and r.is_quantized:
            # a quantized result is taken apart; its qparams must be the compiled ones
            try:
                r = want.to_storage(r, f"result {i}")
            except InputMismatch as e:
                raise KernelCallFailed(e.message, op=self.spec.qualified_name,
                                       location=self.spec.location) from None
        if not isinstance(r, torch.Tensor) or tuple(r.shape) != want.shape \
                or r.dtype not in (want.torch_dtype, dtype_from_name(want.storage_dtype)):
            got = f"{r.dtype}{list(r.shape)}" if isinstance(r, torch.Tensor) else type(r).__name__
            raise KernelCallFailed(
                f"result {i} is {got}, compiled for {want.dtype}{list(want.shape)}",
                op=self.spec.qualified_name, location=self.spec.location)
        if not r.is_contiguous() or _storage_ptr(r) in in_ptrs:
            r = r.contiguous() if not r.is_contiguous() else r.clone()
        if self.on_cpu:
            r = r.to(self.torch_device)
        return torch_to_buffer_view(self.device, r, f"{self.spec.key} result {i}").ref


def make_host_module(specs: list[KernelCallSpec], device, driver: str,
                     options: ExecOptions = ExecOptions(),
                     constants: dict[str, torch.Tensor] | None = None) -> HostModule:
    """Build the ``aot_kernels`` module for ``specs`` (ops resolved once, here).

    ``constants``: the artifact's host-held constants, on the device, by name.
    """
    iface = rt.PyModuleInterface(HOST_MODULE, lambda _iface: object())
    host = HostModule(None, iface)  # type: ignore[arg-type]
    for spec in specs:
        fn = _KernelCall(spec, device, driver, host, options, constants)
        iface.export(spec.key, spec.cconv, lambda _self, *refs, _fn=fn: _fn(*refs))
    host.vm_module = iface.create()
    return host
