"""NumpyModule: a plain artifact run with numpy arrays, in a Python without torch.

An artifact whose program is all compiled code (no kernel call, no ATen region,
no in-place update of an input: what ``aot.export_vmfb`` also requires) needs only
IREE's runtime. ``aot.load`` returns this module where torch cannot be imported (or
with ``arrays="numpy"``): numpy arrays in, numpy arrays out, in the model's pytree
of tuples, lists and dicts. Inputs get the checks the torch runtime makes, with the
same messages (count and structure, shape, dtype, memory format, the ranges of a
dynamic artifact's sizes, static values). Outputs are row-major arrays.

Imports ``iree.runtime`` and numpy, never torch (nor ``iree.compiler``).
"""

from __future__ import annotations

import atexit
import warnings
import weakref

import numpy as np
import iree.runtime as rt

from ..errors import AotError, ArtifactError, InputMismatch
from ..fallback import static_values
from ..manifest import Manifest
from ..symbolic import bind_inputs
from ..torch_tensor import TorchTensor
from ..treespec import TreeSpec, structure_error
from .device import get_device, quiet_exit
from .host_cpu import host_problem
from .parameters import parameters_module

__all__ = ["NumpyModule", "NUMPY_DTYPES"]

# the boundary's dtypes that numpy holds (bfloat16, float8 and quantized ones need torch)
NUMPY_DTYPES = {n: np.dtype(n) for n in (
    "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
    "uint32", "uint64", "complex64", "complex128")} | {"bool": np.dtype(np.bool_)}
_ALIGN = 64  # IREE imports host memory at this alignment; other arrays are copied
_live: "weakref.WeakSet[NumpyModule]" = weakref.WeakSet()


class NumpyModule:
    """A loaded plain artifact, callable with numpy arrays like the model with tensors.

    Args:
        artifact: a CompiledArtifact (``aot.load(path, arrays="numpy")``).
        strict_layout: refuse (``InputMismatch``) an input array in another memory
            layout than the compiled one (a transposed view, channels-last); by
            default it is copied row-major (counted in ``layout_conversions``). A
            row-major array whose data is not 64-byte aligned is copied and counted
            too, strict or not (as ``CompiledModule`` does).
    Raises:
        ArtifactError: the artifact needs torch at run time (the message says what
            needs it), or its device cannot be opened.
    """

    def __init__(self, artifact, *, strict_layout: bool = False):
        m = artifact.manifest
        self.artifact, self.strict_layout, self.layout_conversions = artifact, strict_layout, 0
        _refuse_torch_only(m)
        self.driver = m.driver
        self.inputs = [TorchTensor.from_json(i) if "dtype" in i else ("static", i["static"])
                       for i in m.inputs]
        self.input_names = m.input_names or [f"input {i}" for i in range(len(self.inputs))]
        self._tensor_names = [n for n, i in zip(self.input_names, self.inputs)
                              if isinstance(i, TorchTensor)]
        self.outputs = [TorchTensor.from_json(o) if "dtype" in o else
                        static_values.decode(o["static"]) for o in m.outputs]
        self._n_results = sum(isinstance(o, TorchTensor) for o in self.outputs)
        self.symbols = m.symbols or {}
        self.in_spec = TreeSpec.loads(m.in_spec)
        self.out_spec = TreeSpec.loads(m.out_spec)
        why = host_problem(m)
        if why is not None:  # before IREE: its code would die of SIGILL on the first call
            raise ArtifactError(f"{m['name']}: cannot run here: {why}", stage="load")
        self.device = get_device(self.driver)
        self.instance = rt.VmInstance()
        try:
            params = parameters_module(self.instance, m, artifact.constants)
            module = rt.VmModule.copy_buffer(self.instance, artifact.vmfb)
            self.context = rt.VmContext(self.instance,
                                        [rt.create_hal_module(self.instance, self.device),
                                         *([params] if params else []), module])
        except (RuntimeError, ValueError, LookupError) as e:  # IREE's status as Python's
            raise ArtifactError(f"IREE could not load the module: {e}") from e
        self.main = module.lookup_function("main")
        spec = m.specialized or {}
        self._at_example = module.lookup_function(spec["function"]) if spec.get("kept") else None
        self._example_env = spec.get("at")
        _live.add(self)

    @property
    def manifest(self) -> Manifest:
        return self.artifact.manifest

    def report(self) -> str:
        """What was compiled (all of it, for a module this runtime loads)."""
        from ..reporting import format_report
        return format_report(self.manifest)

    def __call__(self, *args, **kwargs):
        """Run the model on numpy arrays; numpy arrays come back (row-major)."""
        try:
            flat = self.in_spec.flatten_up_to((args, kwargs))
        except ValueError as e:
            want_args, want_kwargs = self.in_spec.children
            raise InputMismatch(structure_error(len(want_args.children), want_kwargs.context or [],
                                                args, kwargs, str(e))) from None
        inputs, env = self.inputs, None
        if self.symbols:
            env = bind_inputs(self.symbols, inputs, flat, self.input_names)
            inputs = [i.bind(env) if isinstance(i, TorchTensor) else i for i in inputs]
        args_list = rt.VmVariantList(len(self._tensor_names))
        for leaf, want, name in zip(flat, inputs, self.input_names):
            if isinstance(want, TorchTensor):
                args_list.push_ref(self._buffer_view(leaf, want, name).ref)
            else:
                static_values.check_given(leaf, want[1], name)
        results = rt.VmVariantList(self._n_results)
        at_example = self._at_example is not None and env == self._example_env
        try:
            self.context.invoke(self._at_example if at_example else self.main, args_list, results)
        except (RuntimeError, ValueError, LookupError) as e:  # IREE's status as Python's
            raise AotError(f"IREE runtime error: {e}", stage="run") from e
        it = iter(range(self._n_results))
        leaves = [self._array(results, next(it), o) if isinstance(o, TorchTensor) else o
                  for o in self.outputs]
        return self.out_spec.unflatten(leaves)

    def _buffer_view(self, a, want: TorchTensor, name: str) -> "rt.HalBufferView":
        """Check ``a`` against ``want``; its memory handed to IREE (no copy when it is
        row-major and 64-byte aligned, else a row-major copy)."""
        want.check_array(a, name, self.strict_layout)
        if not a.flags.c_contiguous:
            self._copied(f"{name}: not row-major (strides {list(a.strides)} bytes): copied "
                         "on every such call (counted in layout_conversions; "
                         "strict_layout=True refuses instead)")
        elif a.size and a.ctypes.data % _ALIGN:  # as CompiledModule counts it
            self._copied(f"{name}: its data (at {a.ctypes.data:#x}) is not {_ALIGN}-byte "
                         "aligned, as IREE needs: copied on every such call (counted in "
                         "layout_conversions, also under strict_layout=True)")
        if a.flags.c_contiguous and a.flags.writeable and a.size and a.ctypes.data % _ALIGN == 0:
            return self.device.from_dlpack_capsule(a.__dlpack__())  # (DLPack: writable only)
        return rt.asdevicearray(self.device, np.ascontiguousarray(a))._buffer_view

    def _copied(self, message: str) -> None:
        """Count an input copy; the first of this module's is warned about."""
        self.layout_conversions += 1
        if self.layout_conversions == 1:
            warnings.warn(message, stacklevel=4)  # the caller of NumpyModule.__call__

    def _array(self, results, i: int, spec: TorchTensor) -> np.ndarray:
        bv = results.get_as_object(i, rt.HalBufferView)
        out = rt.DeviceArray(self.device, bv, implicit_host_transfer=True).to_host()
        want = NUMPY_DTYPES[spec.dtype]
        # IREE types integers signless: a uint8 result may come back as int8
        return out.view(want) if out.dtype != want and out.dtype.itemsize == want.itemsize \
            else out

    def close(self) -> None:
        """Release IREE objects now (also done at interpreter exit)."""
        for attr in ("context", "main", "_at_example", "instance", "device"):
            self.__dict__.pop(attr, None)

    def __repr__(self) -> str:
        return f"<NumpyModule {self.manifest.name} target={self.manifest.target}>"


def _refuse_torch_only(m: Manifest) -> None:
    """ArtifactError naming what in manifest ``m`` needs torch at run time."""
    why = []
    if m.kernel_calls:
        ops = sorted({p["op"] for p in m.placements if p["where"] == "kernel_call"})
        why.append(f"kernel calls into ATen for {len(ops)} op(s): {', '.join(ops[:8])}"
                   f"{', ...' if len(ops) > 8 else ''}")
    if m.host_program is not None:
        why.append("it runs as one ATen region (placement chose it)")
    if m.mutations:
        why.append("in-place updates of its inputs")
    if any(k is not None for k in m.returns_input):
        why.append("outputs that are its inputs")
    if m.driver not in ("local-task", "local-sync"):
        why.append(f"the {m.driver} driver")
    for where, entries in (("inputs", m.inputs), ("outputs", m.outputs)):
        for i, d in enumerate(entries):
            if "dtype" in d and d["dtype"] not in NUMPY_DTYPES:
                why.append(f"{where}[{i}] is {d['dtype']}, which numpy does not hold")
            elif "scalar" in d:
                why.append(f"{where}[{i}] is a Python scalar computed at run time")
    for what, spec in (("input", m.in_spec), ("output", m.out_spec)):
        if not TreeSpec.loads(spec).plain:
            why.append(f"its {what} structure holds "
                       "containers other than tuples, lists and dicts")
    if why:
        raise ArtifactError(f"{m.name}: this artifact needs torch at run time ("
                            + "; ".join(why) + "): install torch, or compile with "
                            "placement='coverage' a model whose ops all compile "
                            "(aot.export_vmfb lists those that do not)", stage="load")


@atexit.register
def _release_all() -> None:
    for m in list(_live):
        m.close()
    quiet_exit()
