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
import threading
import warnings
from dataclasses import dataclass, field

import torch
import iree.runtime as rt

from ..errors import ArtifactError, InputMismatch, KernelCallFailed
from ..op_table import check_kwargs
from ..symbolic import Binding
from ..runtime.device import ALIGN, DLPACK_DEVICE, aligned_copy, as_storage, sync_torch

_UNSIGNED = (torch.uint8, torch.uint16, torch.uint32, torch.uint64)
from ..torch_tensor import dtype_from_name
from .bound import BoundCall
from .codegen import GroupFunction, Member
from .entry_points import entry_point
from .cuda_graph import GraphedRegion
from .heap import MAX_BYTES as MAX_HEAP_BYTES
from .layout import CONV_OPS, ChannelsLast, has_conv, layout_safe
from .omp_threads import on_this_thread_alone
from . import dnnl_api, onednn_graph
from .onednn_graph import FusedGraph
from .prepack import DEFERRED, plan_fusions
from .quantized_ops import FLOAT_MATH_IMPLS, IMPLS, PREPACKED, packing_engine_available
from .quantized_ops import NAMESPACE as QUANTIZED_NAMESPACE
from .spec import (HOST_MODULE, KernelCallSpec, StaticArg, TensorArg, lacks_cuda_kernel,
                   resolve_op)

__all__ = ["HostModule", "ExecOptions", "make_host_module", "HOST_MODULE"]
log = logging.getLogger(__name__)


@dataclass
class HostModule:
    """The VmModule plus the error slot that carries Python exceptions out of IREE."""

    vm_module: "rt.VmModule"
    interface: "rt.PyModuleInterface"
    calls: int = field(default=0)
    functions: dict = field(default_factory=dict)  # key -> its _KernelCall
    # a dynamic artifact's symbol binding for the call in progress (``.env``: symbol ->
    # int, per thread), set by the module from its inputs before each call; symbolic
    # sizes read it
    symbols: Binding = field(default_factory=Binding)
    # one slot per thread: IREE runs a host function on the thread that invoked the
    # module, so the error a kernel call raised belongs to that thread's call
    _slot: threading.local = field(default_factory=threading.local, repr=False)

    def put_error(self, err: BaseException) -> None:
        self._slot.error = err

    def take_error(self) -> BaseException | None:
        err = getattr(self._slot, "error", None)
        self._slot.error = None
        return err


@dataclass(frozen=True)
class ExecOptions:
    """How the host runs groups; the manifest's ``"executor"`` entry.

    ``memory_format="channels_last"``: convolution groups whose ops are all
    layout-safe run NHWC (``aot.fallback.layout``). ``cuda_graphs``: on CUDA a
    group is replayed from a CUDA graph after its first call
    (``aot.fallback.cuda_graph``). ``prepack``: on the CPU, convolutions (in
    NHWC groups) and linears run on weights packed once, with activations and
    residual adds fused into the convolutions, and written-out attention runs as one
    fused kernel (``aot.fallback.prepack``). ``quantized_engine``: the engine
    recorded at compile for a program with quantized ops: weights are packed with it
    and calls run under it (``aot.fallback.quantized_ops.compile_engine``).
    ``int8_float_math``: a PT2E program, whose int8 convolutions and linears mean the
    converted model's float math: their kernel calls compute it where ATen's int8
    kernel would saturate (``aot.fallback.quantized_ops``).
    ``one_thread_calls``: keys of kernel calls that run on the calling thread alone
    (``torch.set_num_threads(1)`` for the call, this thread only), chosen at compile
    (``aot.partition.threads``): light ATen ops between compiled dispatches, where waking
    torch's OpenMP team costs more than it saves, because its threads then spin on
    the cores IREE's workers need for the next dispatch.
    ``retained_heap_bytes``: freed memory the C heap keeps between calls, planned at
    compile from the kernel calls' intermediates (``aot.fallback.heap``); 0 leaves
    the heap as it is.
    ``mkl_linears``: under ``prepack``, the signatures (``prepack.linear_signature``,
    ``prepack.conv1x1_signature``) of linears and 1x1 convolutions that run on MKL's
    packed weight rather than oneDNN's, measured faster there at compile
    (``aot.tuning.linear_kernels``).
    """

    memory_format: str = "contiguous"
    cuda_graphs: bool = True
    prepack: bool = False
    quantized_engine: str | None = None
    int8_float_math: bool = False
    one_thread_calls: tuple[str, ...] = ()
    retained_heap_bytes: int = 0
    mkl_linears: tuple[str, ...] = ()
    onednn_graph: bool = False
    onednn_primitives: bool = False

    def to_json(self) -> dict:
        return {"memory_format": self.memory_format, "cuda_graphs": self.cuda_graphs,
                "prepack": self.prepack, "quantized_engine": self.quantized_engine,
                "int8_float_math": self.int8_float_math,
                "one_thread_calls": list(self.one_thread_calls),
                "retained_heap_bytes": self.retained_heap_bytes,
                **({"mkl_linears": list(self.mkl_linears)} if self.mkl_linears else {}),
                **({"onednn_graph": True} if self.onednn_graph else {}),
                **({"onednn_primitives": True} if self.onednn_primitives else {})}

    @staticmethod
    def from_json(d: dict | None) -> "ExecOptions":
        d = d or {}
        fmt = d.get("memory_format", "contiguous")
        if fmt not in ("contiguous", "channels_last"):
            raise ArtifactError(f"executor memory_format {fmt!r} is not contiguous or "
                                "channels_last", stage="load")
        engine = d.get("quantized_engine")
        if engine is not None and not packing_engine_available(engine):
            raise ArtifactError(f"the artifact packs quantized weights with the {engine!r} "
                                "engine, which this torch build lacks (engines: "
                                f"{torch.backends.quantized.supported_engines})", stage="load")
        one = d.get("one_thread_calls") or []
        if not isinstance(one, list) or not all(isinstance(k, str) for k in one):
            raise ArtifactError("executor one_thread_calls should be a list of kernel-call "
                                "keys", stage="load")
        heap = d.get("retained_heap_bytes", 0)
        if heap.__class__ is not int or not 0 <= heap <= MAX_HEAP_BYTES:
            raise ArtifactError(f"executor retained_heap_bytes {str(heap)[:40]!r} is not a "
                                f"byte count from 0 to {MAX_HEAP_BYTES}", stage="load")
        mkl = d.get("mkl_linears") or []
        if not isinstance(mkl, list) or not all(isinstance(k, str) and len(k) <= 200
                                                for k in mkl):
            raise ArtifactError("executor mkl_linears should be a list of linear signatures",
                                stage="load")
        graph = d.get("onednn_graph", False)
        if graph.__class__ is not bool:
            raise ArtifactError("executor onednn_graph should be true or false", stage="load")
        primitives = d.get("onednn_primitives", False)
        if primitives.__class__ is not bool:
            raise ArtifactError("executor onednn_primitives should be true or false",
                                stage="load")
        return ExecOptions(fmt, bool(d.get("cuda_graphs", True)), bool(d.get("prepack", False)),
                           engine, bool(d.get("int8_float_math", False)), tuple(one), heap,
                           tuple(mkl), graph, primitives)


_from_dlpack = torch._C._from_dlpack  # torch.from_dlpack without its Python dispatch
_to_dlpack = torch._C._to_dlpack
_BufferView = rt.HalBufferView


def _storage_ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr() if t.numel() else -1


def _resolve(spec: KernelCallSpec, options: "ExecOptions | None" = None):
    """The callable running one op: its OpOverload, or a prepacking call site."""
    try:
        op = resolve_op(spec.op, spec.overload)
    except LookupError as e:
        raise ArtifactError(f"kernel call {spec.key}: {e}", op=spec.qualified_name,
                            location=spec.location) from None
    why = check_kwargs(op, [o.name for o in spec.operands if o.kwarg_only])
    if why is not None:
        raise ArtifactError(f"kernel call {spec.key}: {why}", op=spec.qualified_name,
                            location=spec.location, stage="load")
    if spec.op in PREPACKED:
        needs, site = PREPACKED[spec.op]
        const = {o.name for o in spec.operands
                 if (isinstance(o, TensorArg) and o.constant) or isinstance(o, StaticArg)}
        if all(n in const for n in needs):
            # weights packed on the first call, not on every call
            return site(options.quantized_engine if options is not None else None,
                        float_math=options is not None and options.int8_float_math)
    name = spec.op.split("::", 1)[1]
    if spec.op.startswith(QUANTIZED_NAMESPACE + "::") and spec.overload == "default" \
            and name in IMPLS:
        if options is not None and options.int8_float_math and name in FLOAT_MATH_IMPLS:
            return FLOAT_MATH_IMPLS[name]  # a PT2E program's: its float math where ATen saturates
        return IMPLS[name]  # the same Python kernel, without the dispatcher
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
    """``tensors[i]`` for ``BoundCall.bind``, adapting each slot to the member's spec."""

    def __init__(self, env: list, specs: dict):
        self.env, self.specs = env, specs

    def __getitem__(self, i):
        return _adapt(self.env[i], self.specs.get(i))


def _slot_specs(member: KernelCallSpec) -> dict:
    if member.op in _QUANTIZED_LAYOUT_OPS:
        return {}  # takes a quantized tensor as it is (see _QUANTIZED_LAYOUT_OPS)
    return {o.index: o.spec for o in member.operands if isinstance(o, TensorArg)}


# Layout ops that ATen runs on quantized tensors as on their integer storage (views and
# copies keep the quantization parameters). In a group they take a quantized
# intermediate as it is: no ``int_repr`` copy before them, no rebuilt quantized tensor
# after (ShuffleNetV2's channel shuffles: 17 copies per call).
_QUANTIZED_LAYOUT_OPS = frozenset(f"aten::{n}" for n in (
    "view", "_unsafe_view", "reshape", "transpose", "permute", "clone", "flatten", "squeeze",
    "unsqueeze", "select", "slice", "split", "split_with_sizes", "chunk", "alias", "t",
    "expand"))


class _KernelCall:
    """One host function: buffer views in, buffer views out."""

    def __init__(self, spec: KernelCallSpec, device, driver: str, host: HostModule,
                 options: ExecOptions = ExecOptions(), constants: dict | None = None):
        self.spec, self.device, self.driver, self.host = spec, device, driver, host
        self.torch_device = torch.device("cpu" if driver.startswith("local") else "cuda")
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
        self.bound = (None if spec.is_group
                      else BoundCall(spec, _resolve(spec, options), self.torch_device,
                                     host.symbols))
        self.call = None if spec.is_group else entry_point(self.bound.op)
        self.quantized_inputs = any(s.qparams is not None for s in spec.inputs)
        self.crossing_dtypes = [d for d, const in self.operand_plan if const is None]
        self.n_crossing = len(self.crossing_dtypes)
        self.dlpack_device, self.on_cuda = DLPACK_DEVICE[driver], driver == "cuda"
        # every operand crosses as it is: the crossing list is the operand list
        self.plain_operands = (len(self.crossing_dtypes) == len(self.operand_plan)
                               and not self.quantized_inputs and not self.on_cpu)
        self.kinds = spec.out_kinds
        # one op, every operand crossing as it is (no reinterpreted dtype), one tensor result
        self.simple = (not spec.is_group and self.plain_operands and not spec.scalar_inputs
                       and self.kinds == "t" and spec.results[0].qparams is None
                       and all(t.torch_dtype == d for t, d in zip(spec.inputs,
                                                                 self.crossing_dtypes))
                       # an unsigned operand crosses as IREE's signless integer (uint8
                       # as int8): the general path reinterprets it (``as_storage``)
                       and not any(d in _UNSIGNED for d in self.crossing_dtypes)
                       and driver.startswith("local"))
        # per tensor result: (spec, shape, dtype ATen returns, storage dtype); a symbolic
        # shape is None here, evaluated per call (``_dense_result``)
        self.result_checks = [(r, None if r.is_symbolic else torch.Size(r.shape), r.torch_dtype,
                               dtype_from_name(r.storage_dtype)) for r in spec.results]
        # storages a result must not share: host-held constants' fixed ones, plus
        # the crossing operands' (taken per call)
        self.const_ptrs = {_storage_ptr(c) for _, c in self.operand_plan if c is not None}
        self.region = None
        if spec.is_group:
            self._prepare_group(options)

    def _prepare_group(self, options: ExecOptions) -> None:
        ops = [m.op for m in self.spec.members]
        self.nhwc = (ChannelsLast() if options.memory_format == "channels_last"
                     and layout_safe(ops) and has_conv(ops) else None)
        self.members, self.program = [], None
        for m in self.spec.members:
            op = _resolve(m, options)
            if self.nhwc is not None:
                op = self.nhwc.op_for(m.op, op)
            weight = next((o for o in m.operands
                           if isinstance(o, TensorArg) and o.name == "weight"), None)
            self.members.append((BoundCall(m, op, self.torch_device, self.host.symbols),
                                 m.op in CONV_OPS,
                                 bool(weight and weight.constant),
                                 any(isinstance(o, TensorArg) and o.spec.qparams is not None
                                     for o in m.operands)
                                 or any(r.qparams is not None for r in m.results),
                                 _slot_specs(m)))
        self.fused = (plan_fusions([m[0] for m in self.members], len(self.spec.inputs),
                                   self.spec.output_slots, convs=self.nhwc is not None,
                                   mkl_linears=frozenset(options.mkl_linears))
                      if options.prepack and self.torch_device.type == "cpu" else {})
        # quantized slots are adapted per member (quantized tensor or its integer storage)
        self.adapt = any(m[3] for m in self.members) or any(
            s.qparams is not None for s in self.spec.inputs)
        symbolic = any(s.is_symbolic for s in self.spec.inputs)
        self.graph = None
        if (options.onednn_graph or options.onednn_primitives) \
                and self.torch_device.type == "cpu" and not symbolic \
                and not self.adapt and not self.on_cpu and set(self.kinds) <= {"t"} \
                and (dnnl_api.available() if options.onednn_primitives
                     else onednn_graph.available()):
            # traced on its first call: constants in, the crossing operands as its inputs
            self.graph = FusedGraph(self._run_members, [c for _, c in self.operand_plan],
                                    self.spec.key, primitives=options.onednn_primitives)
        if options.cuda_graphs and self.driver == "cuda" and not self.on_cpu and not symbolic:
            # (a graph captured for one shape would be replayed for another: a dynamic
            # artifact's groups run without CUDA graphs)
            held = [const is not None for _, const in self.operand_plan]  # same address every call
            self.region = GraphedRegion(self._run_members, held, self.spec.key)

    def host_entry(self, _state, *refs):
        """What IREE calls: buffer-view refs in (tensors, then scalars), refs or scalars out."""
        try:
            dl, capsule = self.dlpack_device, self.device.create_dlpack_capsule
            crossing = [as_storage(_from_dlpack(capsule(r.deref(_BufferView), dl, 0)), dtype)
                        for r, dtype in zip(refs[:self.n_crossing], self.crossing_dtypes)]
            vals = [self._tensor_result(r) if isinstance(r, torch.Tensor) else r
                    for r in self.run_tensors(crossing, refs[self.n_crossing:])]
            if self.on_cuda:
                sync_torch(self.driver)  # results complete before IREE's stream reads them
        except BaseException as e:  # never let a Python error unwind through IREE
            self.host.put_error(e)
            raise
        return vals[0] if len(vals) == 1 else tuple(vals)

    def simple_entry(self, _state, *refs):
        """``host_entry`` for the common call: one op, tensors in as they are, one tensor out.

        Same checks and results as ``host_entry``, in one frame (``self.simple``).
        """
        try:
            dl, capsule = self.dlpack_device, self.device.create_dlpack_capsule
            tensors = [_from_dlpack(capsule(r.deref(_BufferView), dl, 0)) for r in refs]
            self.host.calls += 1
            args, kwargs = self.bound.bind(tensors)
            r = self._call(self.spec, self.call, args, kwargs)
            check = self.result_checks[0]
            if r.__class__ is torch.Tensor and r.dtype == check[2] and r.shape == check[1] \
                    and r.is_contiguous():
                if self._shares_memory(r, tensors):
                    r = r.clone()
            else:  # anything else: the general checks (errors, copies)
                r = self._dense_result(0, r[0] if isinstance(r, (tuple, list)) and len(r) == 1
                                       else r, check, tensors)
            return self._tensor_result(r)
        except BaseException as e:  # never let a Python error unwind through IREE
            self.host.put_error(e)
            raise

    def run_tensors(self, crossing: list, scalars=()) -> list:
        """The ATen side of a call: crossing operands (storage form) in, results out.

        Tensor results come back dense, in storage form (a quantized result as
        its integer representation, qparams checked), never sharing memory with
        an operand; scalar results as Python numbers. ``CompiledModule`` calls
        this directly for a program that is one kernel call.
        """
        self.host.calls += 1
        if self.spec.is_group and self.graph is not None:  # the trace reads the crossing
            tensors = None
        elif self.plain_operands:
            tensors = crossing
        else:
            raw, it = [], iter(crossing)
            for _, const in self.operand_plan:
                if const is not None:
                    raw.append(const)
                    continue
                t = next(it)
                raw.append(t.cpu() if self.on_cpu else t)
            # quantized operands: real quantized tensors over the same memory
            tensors = ([s.from_storage(t) for s, t in zip(self.spec.inputs, raw)]
                       if self.quantized_inputs else raw)
        if self.spec.is_group:
            outs = (self._run_graph(crossing) if self.graph is not None
                    else self.region(tensors) if self.region is not None
                    else self._run_members(tensors))
        else:
            args, kwargs = self.bound.bind(tensors, scalars)
            out = self._call(self.spec, self.call, args, kwargs)
            outs = out if isinstance(out, (tuple, list)) else (out,)
        kinds = self.kinds
        if len(outs) != len(kinds):
            raise KernelCallFailed(f"ATen returned {len(outs)} value(s), compiled for {len(kinds)}",
                                   op=self.spec.qualified_name, location=self.spec.location)
        if kinds == "t":  # one tensor result: the common case
            return [self._dense_result(0, outs[0], self.result_checks[0], crossing)]
        checks = iter(self.result_checks)
        vals = []
        for i, (r, kind) in enumerate(zip(outs, kinds)):
            if kind == "t":
                vals.append(self._dense_result(i, r, next(checks), crossing))
            else:
                vals.append(float(r) if kind == "f" else int(r))
        return vals

    def _run_graph(self, crossing: list) -> list:
        try:
            return self.graph(crossing)
        except KernelCallFailed:
            raise
        except Exception as e:
            raise KernelCallFailed(f"the oneDNN graph of {self.spec.key} raised "
                                   f"{type(e).__name__}: {e}", op=self.spec.qualified_name,
                                   location=self.spec.location) from e

    def _call(self, spec, op, args, kwargs):
        try:
            return op(*args, **kwargs)
        except Exception as e:
            raise KernelCallFailed(f"ATen raised {type(e).__name__}: {e}\n  in {spec!r}",
                                   op=spec.qualified_name, location=spec.location) from e

    def _group_function(self) -> GroupFunction:
        """The members as one generated function (``aot.fallback.codegen``), made once."""
        members = []
        for i, (bound, is_conv, weight_constant, _, slot_specs) in enumerate(self.members):
            if i in self.fused:  # a prepacked kernel, or a member it absorbed
                f = self.fused[i]
                members.append(Member(bound, absorbed=True) if f is DEFERRED
                               else Member(bound, step=f))
            elif is_conv and self.nhwc is not None:
                members.append(Member(bound, step=self._nhwc_conv(bound, weight_constant,
                                                                  slot_specs),
                                      reads=bound.slots()))
            else:  # an OpOverload through its cheapest entry point (no Python frame per op)
                members.append(Member(bound, call=entry_point(bound.op),
                                      adapt=_adapt if self.adapt else None,
                                      slot_specs=slot_specs))
        return GroupFunction(members, self.spec.output_slots)

    def _nhwc_conv(self, bound: BoundCall, weight_constant: bool, slot_specs: dict):
        def step(env):
            args, kwargs = bound.bind(_Slots(env, slot_specs) if self.adapt else env)
            return bound.op(*self.nhwc.conv_args(args, weight_constant), **kwargs)
        return step

    def _run_members(self, tensors: list) -> list:
        """Run the members in order; intermediates stay ATen tensors (quantized stay quantized)."""
        if self.program is None:
            self.program = self._group_function()
        try:
            return self.program(list(tensors))
        except KernelCallFailed:
            raise
        except Exception as e:
            i = self.program.failing_member(e.__traceback__)
            spec = (self.spec if i is None else
                    self.fused[i].spec if i in self.fused else self.members[i][0].spec)
            raise KernelCallFailed(f"ATen raised {type(e).__name__}: {e}\n  in {spec!r}",
                                   op=spec.qualified_name, location=spec.location) from e

    def _dense_result(self, i: int, r, check, crossing) -> torch.Tensor:
        want, shape, dtype, storage = check
        if shape is None:  # a symbolic shape: this call's sizes
            want = want.bind(self.host.symbols.env)
            shape = torch.Size(want.shape) if not want.is_symbolic else None
        if isinstance(r, torch.Tensor) and want.qparams is None and r.is_quantized:
            r = r.int_repr()  # a layout op's view of a quantized intermediate: its storage
        elif isinstance(r, torch.Tensor) and want.qparams is not None and r.is_quantized:
            # a quantized result is taken apart; its qparams must be the compiled ones
            try:
                r = want.to_storage(r, f"result {i}")
            except InputMismatch as e:
                raise KernelCallFailed(e.message, op=self.spec.qualified_name,
                                       location=self.spec.location) from None
        if not isinstance(r, torch.Tensor) or (shape is not None and r.shape != shape) \
                or (r.dtype != dtype and r.dtype != storage):
            got = f"{r.dtype}{list(r.shape)}" if isinstance(r, torch.Tensor) else type(r).__name__
            raise KernelCallFailed(
                f"result {i} is {got}, compiled for {want.dtype}{list(want.shape)}",
                op=self.spec.qualified_name, location=self.spec.location)
        if not r.is_contiguous():
            r = r.contiguous()
        elif self._shares_memory(r, crossing):
            r = r.clone()
        return r.to(self.torch_device) if self.on_cpu else r

    def _shares_memory(self, r: torch.Tensor, crossing) -> bool:
        """``r`` is a host-held constant's or a crossing operand's memory, which IREE may
        reuse once the call returns: such a result must be copied."""
        ptr = _storage_ptr(r)
        return ptr in self.const_ptrs or any(ptr == _storage_ptr(t) for t in crossing)

    def _tensor_result(self, r: torch.Tensor):
        # dense already (``_dense_result``): shared with IREE as it is, unless its data is
        # not ALIGN-byte aligned (a view at an offset into an intermediate: a group ending
        # in ``t[1:]``): IREE refuses it on the CPU and its CUDA kernels fault on it
        # (CUDA_ERROR_MISALIGNED_ADDRESS, which poisons the context): copied
        if r.data_ptr() % ALIGN:
            r = aligned_copy(r)
        try:
            return self.device.from_dlpack_capsule(
                _to_dlpack(r.detach() if r.requires_grad else r)).ref
        except Exception as e:
            raise KernelCallFailed(f"result ({r.dtype}, {r.device}) cannot be handed to IREE: "
                                   f"{e}", op=self.spec.qualified_name,
                                   location=self.spec.location) from e


def make_host_module(specs: list[KernelCallSpec], device, driver: str,
                     options: ExecOptions = ExecOptions(),
                     constants: dict[str, torch.Tensor] | None = None) -> HostModule:
    """Build the ``aot_kernels`` module for ``specs`` (ops resolved once, here).

    ``constants``: the artifact's host-held constants, on the device, by name.
    """
    iface = rt.PyModuleInterface(HOST_MODULE, lambda _iface: object())
    host = HostModule(None, iface)  # type: ignore[arg-type]
    unknown = set(options.one_thread_calls) - {s.key for s in specs}
    if unknown:
        raise ArtifactError(f"executor one_thread_calls names {sorted(unknown)}, which are not "
                            "kernel calls of this artifact", stage="load")
    for spec in specs:
        fn = _KernelCall(spec, device, driver, host, options, constants)
        host.functions[spec.key] = fn
        entry = fn.simple_entry if fn.simple else fn.host_entry
        if spec.key in options.one_thread_calls:
            entry = on_this_thread_alone(entry)
        iface.export(spec.key, spec.cconv, entry)
    host.vm_module = iface.create()
    return host

