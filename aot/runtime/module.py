"""CompiledModule: load an artifact on a device and call it like the eager model.

Torch tensors in, torch tensors out, same pytree as eager. Inputs are checked
against the manifest's TorchTensors (count, structure, shape, dtype, memory
format, device, baked non-tensor values) before anything runs.
"""

from __future__ import annotations

import atexit
import logging
import warnings
import weakref

import torch
import torch.utils._pytree as pytree
import iree.runtime as rt

from ..artifact import CompiledArtifact
from ..manifest import Manifest
from ..treespec import load_treespec
from ..errors import AotError, ArtifactError, InputMismatch, KernelCallFailed
from ..symbolic import bind_inputs
from ..fallback import heap, static_values
from ..fallback.executor import ExecOptions, HostModule, make_host_module
from ..fallback.quantized_ops import pinned_engine
from ..fallback.host_program import HostProgram
from ..fallback.spec import KernelCallSpec
from ..torch_tensor import TorchTensor, dtype_from_name
from ..treespec import structure_error
from .host_cpu import host_problem
from .parameters import parameters_module
from .device import (ALIGN, aligned_copy, as_storage, buffer_view_to_torch, get_device,
                     quiet_exit, sync_torch, torch_to_buffer_view)

__all__ = ["CompiledModule"]
log = logging.getLogger(__name__)
_live: "weakref.WeakSet[CompiledModule]" = weakref.WeakSet()
_grad_enabled, _set_grad_enabled = torch.is_grad_enabled, torch._C._set_grad_enabled


class CompiledModule:
    """A loaded artifact, callable like the model it came from.

    Args:
        artifact: a CompiledArtifact (from ``aot.compile`` or ``aot.load``).
        strict_layout: refuse (``InputMismatch``) an input whose memory layout
            is not the compiled one; by default it is converted (a copy, counted
            in ``layout_conversions``, warned about once), as eager accepts any
            strides. Settable on the module. A row-major input whose data is not
            64-byte aligned (``x[1:]``, ``np.frombuffer``) is copied into an aligned
            buffer (IREE imports no other) and counted there too, strict or not:
            alignment is no layout its strides show.
    Raises:
        ArtifactError: the artifact's device cannot be opened, or a kernel
            call's op is not registered in this process.
    """

    def __init__(self, artifact: CompiledArtifact, *, open_device: bool = True,
                 strict_layout: bool = False):
        self.artifact = artifact
        # an input in another layout than the compiled one (transposed, channels-last,
        # expanded) is converted, as eager accepts any strides; strict refuses it
        self.strict_layout = strict_layout
        self.layout_conversions = 0
        self._warned_layout = False
        self.host = None
        self._direct = None
        self._at_example, self._example_env = None, None
        m = artifact.manifest
        self.driver: str = m.driver
        self.inputs = [TorchTensor.from_json(i) if "dtype" in i else ("static", i["static"])
                       for i in m.inputs]
        self.input_names = m.input_names or [f"input {i}" for i in range(len(self.inputs))]
        self._tensor_names = [n for n, i in zip(self.input_names, self.inputs)
                              if isinstance(i, TorchTensor)]
        # one entry per output leaf: a TorchTensor (returned by the module), or a
        # ("static", value) computed at export time, or ("scalar", kind)
        self.outputs = [TorchTensor.from_json(o) if "dtype" in o else next(iter(o.items()))
                        for o in m.outputs]
        self._tensor_outputs = [o for o in self.outputs if isinstance(o, TorchTensor)]
        self.outputs_static = [static_values.decode(o[1]) if isinstance(o, tuple)
                               and o[0] == "static" else None for o in self.outputs]
        self.mutations = m.mutations or []
        # a dynamic artifact's symbols (aot.symbolic): bound from the inputs on every call
        self.symbols = m.symbols or {}
        self.returns_input = m.returns_input or []
        self._out_storage = [dtype_from_name(o.storage_dtype) for o in self._tensor_outputs]
        self.in_spec = load_treespec(m.in_spec)
        self.out_spec = load_treespec(m.out_spec)
        # the common call shapes skip pytree: positional leaves in, one leaf out
        self._positional = self.in_spec == pytree.tree_structure(
            (tuple(range(len(self.inputs))), {}))
        self._one_out = self.out_spec.is_leaf()
        # every output leaf is a tensor compiled code returns, nothing updated in place
        self._plain = (len(self._tensor_outputs) == len(self.outputs) and not self.mutations
                       and not any(k is not None for k in self.returns_input))
        self.program = None  # a HostProgram, for an artifact that is one (no IREE module)
        self.kernel_calls = [KernelCallSpec.from_json(k) for k in m["kernel_calls"]]
        self.exec_options = ExecOptions.from_json(m.get("executor"))
        self.torch_device = (torch.device("cpu") if self.driver.startswith("local")
                             else torch.device("cuda", 0))
        if open_device:
            self._open()
        _live.add(self)

    def _open(self) -> None:
        if self.exec_options.retained_heap_bytes and self.driver.startswith("local"):
            heap.retain(self.exec_options.retained_heap_bytes)  # for ATen's intermediates
        if self.manifest.host_program is not None:
            # one ATen region, run by the host: no IREE module, no device
            self.program = HostProgram(self.manifest.host_program,
                                       self.artifact.host_constants(self.torch_device),
                                       self.torch_device)
            self.host = HostModule(None, None)  # type: ignore[arg-type]  (counts calls)
            return
        why = host_problem(self.manifest)
        if why is not None:  # before IREE: its code would die of SIGILL on the first call
            raise ArtifactError(f"{self.manifest.name}: cannot run here: {why}", stage="load")
        self.device = get_device(self.driver)
        self.instance = rt.VmInstance()
        self.host = make_host_module(self.kernel_calls, self.device, self.driver,
                                     self.exec_options,
                                     self.artifact.host_constants(self.torch_device))
        hal = rt.create_hal_module(self.instance, self.device)
        try:
            params = parameters_module(self.instance, self.manifest, self.artifact.constants)
            main = rt.VmModule.copy_buffer(self.instance, self.artifact.vmfb)
            self.context = rt.VmContext(self.instance, [hal, *([params] if params else []),
                                                        self.host.vm_module, main])
        except (RuntimeError, ValueError, LookupError) as e:  # IREE's status as Python's
            raise ArtifactError(f"IREE could not load the module: {e}") from e
        self.main = main.lookup_function("main")
        # a dynamic program's static form at the example's sizes (aot.tuning.specialize):
        # called when every symbol is bound to its example size
        spec = self.manifest.specialized or {}
        self._at_example = main.lookup_function(spec["function"]) if spec.get("kept") else None
        if spec.get("kept") and self._at_example is None:
            raise ArtifactError(f"the module lacks its function {spec['function']!r}, which "
                                "the manifest says it holds")
        self._example_env = spec.get("at")
        # A program that is one kernel call (an ATen region chosen by measurement)
        # holds no compiled code: on the CPU its host function is called directly,
        # without the VM's marshalling (same function, same checks, same results).
        key = self.manifest.whole_program_call
        self._direct = (self.host.functions[key] if key and self.driver.startswith("local")
                        else None)

    @property
    def manifest(self) -> Manifest:
        return self.artifact.manifest

    @property
    def kernel_call_count(self) -> int:
        """Kernel calls made by this module so far (one per crossing into ATen)."""
        return self.host.calls if self.host is not None else 0

    def plan(self) -> dict:
        """The placement decisions of this compile (the region candidate chosen), to
        pass as ``aot.compile(..., plan=...)`` so another compile makes the same ones."""
        return self.manifest.plan()

    def save(self, path: str) -> None:
        """Write the artifact to one file, loadable by :func:`load`."""
        self.artifact.save(path)

    def report(self) -> str:
        """What was compiled, what fell back to ATen, and why."""
        from ..reporting import format_report
        return format_report(self.manifest)

    def __call__(self, *args, **kwargs):
        """Run the model. Outputs carry no autograd history on any path (compiled
        code, kernel calls, the host program): an artifact is for inference, so
        ``requires_grad`` inputs are read as values and results never have a
        ``grad_fn`` nor ``requires_grad`` (train with eager PyTorch)."""
        engine = self.exec_options.quantized_engine  # the artifact's, not the global one
        if engine is not None and engine != torch.backends.quantized.engine:
            with torch.no_grad(), pinned_engine(engine):
                return self._call(args, kwargs)
        if not _grad_enabled():  # already off (the caller's no_grad): no context to enter
            return self._call(args, kwargs)
        _set_grad_enabled(False)  # torch.no_grad() without its Python context object
        try:
            return self._call(args, kwargs)
        finally:
            _set_grad_enabled(True)

    def _call(self, args, kwargs):
        if self._positional and not kwargs and len(args) == len(self.inputs):
            flat = args
        else:
            try:
                # Leaves at the example's leaf positions: a list where a tensor was
                # expected stays one leaf, so the error can name it.
                flat = self.in_spec.flatten_up_to((args, kwargs))
            except (ValueError, TypeError, KeyError):
                raise InputMismatch(self._structure_error(args, kwargs)) from None
        if self.host is None:  # compiled where the target device is absent: open it now
            self._open()
        inputs, outputs, env = self.inputs, self._tensor_outputs, None
        if self.symbols:  # this call's sizes: the symbols bound, range and agreement checked
            env = bind_inputs(self.symbols, inputs, flat, self.input_names)
            self.host.symbols.env = env  # what the kernel calls' sizes read (this thread's)
            inputs = [i.bind(env) if isinstance(i, TorchTensor) else i for i in inputs]
            outputs = [o.bind(env) for o in outputs]
        dense = self._dense_inputs(flat, inputs)
        if self.program is not None:  # one ATen region: eager's values, eager's layouts
            self.host.calls += 1
            return self._user_outputs(flat, self.program.run(self._program_inputs(flat)))
        if self._direct is not None:  # a program that is one kernel call: no VM
            outs = [self._finish(t, i, o) for i, (t, o) in
                    enumerate(zip(self._direct.run_tensors(dense), outputs))]
        else:
            arg_list = rt.VmVariantList(len(dense))
            for t, name in zip(dense, self._tensor_names):
                arg_list.push_ref(torch_to_buffer_view(self.device, t, name).ref)
            results = rt.VmVariantList(len(self._tensor_outputs))
            sync_torch(self.driver)  # inputs torch is still writing on its stream
            at_example = self._at_example is not None and env == self._example_env
            self._invoke(arg_list, results, self._at_example if at_example else self.main)
            outs = [self._output(results, i, o) for i, o in enumerate(outputs)]
        if not self._plain:
            return self._user_outputs(flat, self._leaves(outs))
        return outs[0] if self._one_out else _unflatten(outs, self.out_spec)

    def _converted(self, leaf: torch.Tensor, want: TorchTensor, name: str) -> None:
        """Count an input given in another layout than the compiled one (it is copied)."""
        got = TorchTensor.from_tensor(leaf)
        if got.memory_format == want.memory_format and want.memory_format != "strided":
            return  # the same layout (size-1 dims' strides aside)
        self._copied(f"{name}: compiled for {want.memory_format} (strides "
                     f"{list(want.strides)}), given {got.memory_format} (strides "
                     f"{list(got.strides)}): converted on every such call (counted in "
                     "layout_conversions; strict_layout=True refuses instead)")

    def _aligned(self, t: torch.Tensor, name: str) -> torch.Tensor:
        """An aligned copy of a row-major input whose data is not ``ALIGN``-byte aligned
        (counted). IREE imports no other memory; the strides are the compiled ones, so
        ``strict_layout`` copies it too rather than refuse what the user cannot see."""
        self._copied(f"{name}: its data (at {t.data_ptr():#x}) is not {ALIGN}-byte aligned, "
                     "as IREE needs: copied into an aligned buffer on every such call "
                     "(counted in layout_conversions, also under strict_layout=True)")
        return aligned_copy(t)

    def _copied(self, message: str) -> None:
        """Count an input copy; the first of this module's is warned about."""
        self.layout_conversions += 1
        if not self._warned_layout:
            self._warned_layout = True
            warnings.warn(message, stacklevel=6)  # the caller of CompiledModule.__call__

    def _program_inputs(self, flat) -> list:
        """The caller's leaves as the host program takes them (quantized: storage form)."""
        return [want.to_storage(leaf) if isinstance(want, TorchTensor) and want.qparams
                else leaf for leaf, want in zip(flat, self.inputs)]

    def _leaves(self, tensors: list) -> list:
        """Every output leaf: the tensors compiled code returned, the static values."""
        it = iter(tensors)
        return [next(it) if isinstance(o, TorchTensor) else v
                for o, v in zip(self.outputs, self.outputs_static)]

    def _user_outputs(self, flat, leaves: list):
        """Apply in-place updates to the caller's tensors (as eager does), then the
        user's outputs in their pytree (a mutated input returned is the caller's tensor)."""
        n = len(self.mutations)
        for m, value in zip(self.mutations, leaves[:n]):
            if "input" in m:
                flat[m["input"]].copy_(value)  # under __call__'s no_grad
        outs = leaves[n:]
        for j, k in enumerate(self.returns_input):
            if k is not None:
                outs[j] = flat[k]
        return outs[0] if self._one_out else _unflatten(outs, self.out_spec)

    def _dense_inputs(self, flat, inputs: list) -> list[torch.Tensor]:
        """Check every input against ``inputs`` (this call's specs); the tensors as
        compiled code holds them (dense, storage form, aligned for IREE), none for a
        host program. A copy for another layout than the compiled one, or for
        alignment, is counted in ``layout_conversions``."""
        dense = []
        for leaf, want, name in zip(flat, inputs, self.input_names):
            if isinstance(want, TorchTensor):
                want.check(leaf, name, self.strict_layout)
                if leaf.device.type != self.torch_device.type or (
                        leaf.device.type == "cuda" and (leaf.device.index or 0) != 0):
                    raise InputMismatch(f"{name}: expected a tensor on {self.torch_device} "
                                        f"(module compiled for {self.manifest.target}), got "
                                        f"one on {leaf.device}")
                if self.program is not None:
                    continue  # the host program takes the caller's tensors as they are
                # quantized: its integer representation (qparams checked above);
                # .contiguous() copies only for a non-row-major spec (recorded) or an
                # input in another layout than the compiled one (counted, warned once)
                if leaf.stride() != want.strides:
                    self._converted(leaf, want, name)
                t = want.to_storage(leaf, name).contiguous()
                # row-major but unaligned (a view at an offset, np.frombuffer): IREE
                # imports only aligned memory (the direct call runs ATen, which does not care)
                if t.data_ptr() % ALIGN and self._direct is None:
                    t = self._aligned(t, name)
                dense.append(t)
            else:
                static_values.check_given(leaf, want[1], name)
        return dense

    def _invoke(self, arg_list, results, function) -> None:
        try:
            self.context.invoke(function, arg_list, results)
        except (RuntimeError, ValueError, LookupError) as e:  # IREE's status as Python's
            err = self.host.take_error()
            if isinstance(err, AotError):
                raise err
            if err is not None:
                raise KernelCallFailed(f"{type(err).__name__}: {err}") from err
            if "Python" in str(e):  # a host function raised, its exception not kept
                raise KernelCallFailed(f"a kernel call raised inside IREE: {e}") from e
            raise AotError(f"IREE runtime error: {e}", stage="run") from e

    def _output(self, results, i: int, spec: TorchTensor) -> torch.Tensor:
        bv = results.get_as_object(i, rt.HalBufferView)
        return self._finish(buffer_view_to_torch(self.device, bv, self.driver), i, spec)

    def _finish(self, t: torch.Tensor, i: int, spec: TorchTensor) -> torch.Tensor:
        """A dense result in storage form -> the tensor eager returns."""
        t = as_storage(t, self._out_storage[i])
        if not spec.is_contiguous:
            t = _eager_layout(t, spec)
        return spec.from_storage(t)  # quantized outputs: the qparams eager returns

    def _structure_error(self, args, kwargs) -> str:
        want_args, want_kwargs = pytree.tree_unflatten(list(range(len(self.inputs))), self.in_spec)
        return structure_error(len(want_args), want_kwargs, args, kwargs, str(self.in_spec))

    def close(self) -> None:
        """Release IREE objects now (also done at interpreter exit)."""
        for attr in ("context", "main", "host", "instance", "device"):
            self.__dict__.pop(attr, None)
        self.host = None

    def __repr__(self) -> str:
        m = self.manifest
        return (f"<CompiledModule {m['name']} target={m['target']} "
                f"kernel_calls={len(self.kernel_calls)}>")


def _eager_layout(t: torch.Tensor, spec: TorchTensor) -> torch.Tensor:
    """A dense result laid out with the strides eager returns (channels-last, a
    transpose, a slice). A stride-0 dimension (an expanded result) is rebuilt as
    eager's view: one slice stored, expanded, so that writing to it fails as in eager."""
    zero = [d for d, (n, st) in enumerate(zip(spec.shape, spec.strides)) if st == 0 and n > 1]
    src = t
    for d in zero:
        src = src.narrow(d, 0, 1)
    strides = [1 if d in zero else st for d, st in enumerate(spec.strides)]
    try:
        out = torch.empty_strided(src.shape, strides, dtype=t.dtype, device=t.device).copy_(src)
    except RuntimeError:  # strides that overlap otherwise (as_strided): keep it dense
        out = src.contiguous()
    return out.expand(spec.shape) if zero else out


@atexit.register
def _release_all() -> None:
    # IREE's bindings warn about live objects at interpreter exit; release ours first.
    for m in list(_live):
        m.close()
    quiet_exit()


def _unflatten(leaves: list, spec: pytree.TreeSpec):
    """``pytree.tree_unflatten``, but a ``torch.Size`` comes back as one (as eager
    returns it), not as the plain tuple torch's pytree rebuilds."""
    out = pytree.tree_unflatten(leaves, spec)
    return _sizes(out, spec) if _holds_size(spec) else out


def _holds_size(spec) -> bool:
    return spec.type is torch.Size or any(_holds_size(c) for c in _children(spec))


def _children(spec) -> list:
    c = getattr(spec, "children", None)  # torch 2.15; children_specs before (deprecated since)
    return list(c()) if callable(c) else list(spec.children_specs)


def _sizes(value, spec):
    if spec.type is torch.Size:
        return torch.Size(value)
    if spec.type in (tuple, list):
        return spec.type(_sizes(v, c) for v, c in zip(value, _children(spec)))
    if spec.type is dict:
        return {k: _sizes(value[k], c) for k, c in zip(spec.context, _children(spec))}
    return value  # other containers: as torch's pytree rebuilds them

