"""aot: ahead-of-time compiler for PyTorch models with runtime fallback to ATen.

The pipeline, one stage per module::

    import_model   (aot.importer)        nn.Module -> ImportedProgram
    partition      (aot.partition.partitioner) -> PartitionedProgram (placements, kernel calls)
    compile_program(aot.backend.build)   -> CompiledArtifact (.vmfb + manifest)
    (compile_model chains partition + compile_program, retrying when IREE fails
    on a fusion of ops that lower alone: aot.tuning.recover)
    CompiledModule (aot.runtime)         load + run, kernel calls via aot.fallback

``aot.stages`` is the one staged entry point over them (``export(...).compile()``,
``.emit("stablehlo")``...): ``compile()``, the ``export_*`` functions and ``aot compile``
go through it. ``load()`` and ``report()`` need only the runtime, and
``import aot`` imports neither torch nor the compiler: a plain artifact loads in a
Python with ``iree-base-runtime`` and numpy alone (``aot.runtime.numpy_module``).
"""

from __future__ import annotations

from .errors import (AotError, ArtifactError, CompileFailed, ExportFailed, InputMismatch,
                     InternalError, KernelCallFailed, UnsupportedOp)
from . import progress
from .runtime.loading import load
from .torch_tensor import QuantParams, TorchTensor

__all__ = [
    "compile", "compile_causal_lm", "export_stablehlo", "export_vmfb", "load", "report",
    "CompiledModule",
    "NumpyModule", "TorchTensor", "QuantParams",
    "AotError", "ArtifactError", "CompileFailed", "ExportFailed", "InputMismatch",
    "InternalError", "KernelCallFailed", "UnsupportedOp",
]
__version__ = "0.1.0"


def __getattr__(name):
    if name in ("CompiledModule", "NumpyModule"):  # their modules import torch / numpy
        from . import runtime
        return getattr(runtime, name)
    raise AttributeError(f"module 'aot' has no attribute {name!r}")


def compile(model, args=(), *, example_kwargs=None, target: str = "cpu", fallback: str = "auto",
            fallback_ops=(), strict: bool = False, extra_flags=(),
            profile: str = "default", placement: str = "auto", plan=None,
            dynamic_shapes=None, via: str = "torch") -> CompiledModule:
    """Compile ``model`` for ``target`` and load it, ready to call.

    Args:
        model: an ``nn.Module`` (in ``eval()`` mode).
        args: example positional inputs (a tensor or a tuple).
        example_kwargs: example keyword inputs.
        target: ``"cpu"`` (IREE llvm-cpu, this machine's CPU), ``"cpu:<cpu or triple>"``
            (another CPU, compiled for from here without measuring: ``cpu:x86-64-v3``,
            ``cpu:aarch64-linux-gnu``; ``aot.toolchain.cpu_targets``) or ``"cuda"``.
        fallback: ``"auto"`` (ops IREE cannot lower run in ATen), ``"all"``
            (every op runs in ATen: bit-exact with eager), ``"none"`` (fail,
            listing every op IREE cannot lower).
        fallback_ops: ops forced to ATen, e.g. ``["aten.layer_norm"]``.
        strict: use ``torch.export``'s strict mode.
        extra_flags: extra ``iree-compile`` flags appended to the target profile.
        profile: ``"default"`` (flags chosen by measurement, see
            ``aot/toolchain/targets.py``) or ``"iree-default"`` (IREE as it comes).
        placement: ``"auto"``: heavy ops IREE covers (convolutions, matmuls) run
            where they measure faster on this machine, IREE or ATen (measured
            once, cached), and a program with heavy ops is then timed end to
            end against whole ATen regions (``aot.tuning.regions``), keeping
            the faster; ``"coverage"``: everything IREE covers is compiled.
        dynamic_shapes: what ``torch.export.export`` takes (``torch.export.Dim`` per
            input dimension): those dimensions stay dynamic, and the artifact serves
            every size in their ranges (docs/dynamic-shapes.md). Placement is
            measured at the example's sizes (an example of 1 is exported at 2).
        via: what IREE compiles: ``"torch"`` (the Torch dialect, IREE's own lowering)
            or ``"stablehlo"`` (torch-mlir lowers the covered ops to StableHLO first;
            ops it cannot lower run in ATen; needs ``pip install 'aot[stablehlo]'``).
        plan: the decisions of an earlier compile to reuse instead of measuring
            (``CompiledModule.plan()``, or the path of a JSON file holding it).
            Without it, a decision measured on this machine for this program is
            reused from the cache (``aot.tuning.regions``).
    Returns:
        CompiledModule: call it like the model; ``.save(path)``, ``.report()``.
    Raises:
        ExportFailed, UnsupportedOp, CompileFailed: see ``aot.errors``; calling the
        module with a size outside a dynamic dimension's range is an ``InputMismatch``.
    """
    import torch

    from .runtime.host_cpu import host_problem
    from .runtime.module import CompiledModule
    from .stages import Options, export

    options = Options.resolve(target=target, fallback=fallback, fallback_ops=fallback_ops,
                              placement=placement, plan=plan, strict=strict,
                              extra_flags=extra_flags, profile=profile, via=via,
                              dynamic_shapes=dynamic_shapes)
    art = export(model, args, example_kwargs, options).compile()
    tgt = options.target
    # Compiling never needs the target device: without it, the module opens the
    # device on its first call (a clear error there) and can be saved meanwhile.
    # Another CPU's code (target="cpu:..."): opened, and refused, only if called here.
    here = (tgt.driver.startswith("local") and host_problem(art.manifest) is None) \
        or (tgt.driver == "cuda" and torch.cuda.is_available())
    return CompiledModule(art, open_device=here)


def compile_causal_lm(model, *, max_length: int, batch_size: int = 1, example_length: int = 8,
                      **compile_kwargs):
    """A Hugging Face causal LM compiled for greedy generation: prefill and decode
    entry points over one cache, ``generate(input_ids, max_new_tokens=...)`` giving
    ``model.generate(..., do_sample=False)``'s tokens (``aot.causal_lm``;
    docs/generation.md)."""
    from .causal_lm import compile_causal_lm as build
    return build(model, compile, max_length=max_length, batch_size=batch_size,
                 example_length=example_length, **compile_kwargs)


def export_stablehlo(model, args=(), *, example_kwargs=None, target: str = "cpu",
                     fallback: str = "auto", fallback_ops=(), strict: bool = False,
                     dynamic_shapes=None) -> str:
    """``model`` as StableHLO MLIR text, no Torch-dialect op left: what torch-mlir lowers
    as StableHLO ops, every other op (and every op in ``fallback_ops``) a
    ``stablehlo.custom_call`` whose target names the ATen op and whose
    ``backend_config`` holds its static operands as JSON (docs/stablehlo.md).
    Needs ``pip install 'aot[stablehlo]'``. ``fallback="all"`` makes every op a custom
    call (the "dummy mode"). Same arguments as ``compile``; raises as it does."""
    from .stages import Options, export

    options = Options.resolve(target=target, fallback=fallback, fallback_ops=fallback_ops,
                              placement="coverage", strict=strict, via="stablehlo",
                              dynamic_shapes=dynamic_shapes)
    return export(model, args, example_kwargs, options).stablehlo()


def export_vmfb(model, args=(), path=None, *, example_kwargs=None, target: str = "cpu",
                extra_flags=(), strict: bool = False, dynamic_shapes=None,
                via: str = "torch", parameters: str | None = None) -> bytes:
    """``model`` as a plain IREE module (``.vmfb``) that IREE's own tools and runtime run
    without this package or torch: every op compiled (``placement="coverage"``), entry
    function ``main`` (docs/deployment.md). Written to
    ``path`` when given; the bytes are returned. On this machine's CPU, compiled with
    the flags measured faster on it, as ``compile`` is (the same module an artifact of
    ``compile(..., placement="coverage")`` holds).

    ``parameters``: a path: weights of 4 KiB or more are written there as an IREE
    parameter archive (``.irpa``, scope ``model``: run with
    ``--parameters=model=FILE``) and the module holds only the code, a small
    fraction of its size with the weights inside. ``target``: as ``compile``'s
    (``"cpu:aarch64-linux-gnu"`` makes a module for another CPU).

    Raises:
        UnsupportedOp: some ops would still run in ATen (kernel calls need this
            package's host functions): the message lists them, with their source lines
            and reasons, and how to see or avoid them. Also for a program that updates
            its inputs in place (the plain module cannot write the caller's tensors).
        ExportFailed, CompileFailed: as ``compile``.
    """
    from .stages import Options, export

    options = Options.resolve(target=target, placement="coverage", strict=strict,
                              extra_flags=extra_flags, via=via, dynamic_shapes=dynamic_shapes)
    data = export(model, args, example_kwargs, options).vmfb(parameters)
    if path is not None:
        with open(path, "wb") as f:
            f.write(data)
    return data


def report(module_or_path) -> str:
    """The placement report of a CompiledModule or an artifact file."""
    if hasattr(module_or_path, "report"):  # a CompiledModule or NumpyModule
        return module_or_path.report()
    from .artifact import load_artifact
    from .reporting import format_report
    return format_report(load_artifact(module_or_path).manifest)
