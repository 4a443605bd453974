"""import_model: nn.Module + example inputs -> ImportedProgram.

First link of the chain. Captures the model with ``torch.export`` (strict or
not), lowers it to functional ATen with the smallest decomposition set, and
records the typed signature: a TorchTensor per tensor input and output and the
static values of non-tensor inputs.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from ..hf_pytree import is_transformers_model, register_cache
from ..errors import ExportFailed, UnsupportedOp
from ..fallback import static_values
from ..torch_tensor import TorchTensor
from .dynamic import declared_dims, dim_names, export_example, symbol_table
from .locations import node_location
from .pt2e import is_pt2e, rewrite_pt2e
from .qdq import rewrite_qdq
from .quantized import is_eager_quantized, rewrite_eager_quantized

__all__ = ["ImportOptions", "ImportedProgram", "import_model"]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ImportOptions:
    """Options of the import stage.

    Attributes:
        strict: use ``torch.export``'s strict (TorchDynamo) tracing; non-strict by default.
        dynamic_shapes: what ``torch.export.export`` takes (``Dim``s per input
            dimension): those dimensions stay symbolic through the whole pipeline.
        pt2e_integer_ops: rewrite PT2E Q/DQ patterns into integer ``aot_q`` ops
            (``aot.importer.pt2e``); off for ``fallback="all"``, which runs the
            converted model's own float ops, bit for bit.
    """

    strict: bool = False
    dynamic_shapes: Any = None
    pt2e_integer_ops: bool = True


@dataclass(frozen=True)
class ImportedProgram:
    """Made by :func:`import_model`, read by ``aot.partition.partitioner``.

    ``exported`` is a functional ATen ``ExportedProgram`` (only export's own
    mandatory decompositions applied). ``flat_inputs`` has one entry per leaf of
    the ``(args, kwargs)`` pytree: a TorchTensor for tensors, or a ``("static",
    value)`` pair for non-tensor leaves, which are baked in at export.

    ``outputs`` has one entry per leaf of the graph's output, in order: first the
    new values of what the model updates in place (``mutations``, one each), then
    the user's outputs (``out_spec`` rebuilds their pytree). An entry is a
    TorchTensor, ``("static", value)`` for a value export computed at trace time
    (``x.shape[0] > 2``), or ``("scalar", kind)`` for an int/float/bool only known
    at run time (kind ``i``/``f``/``b``). ``mutations[i]`` is ``{"input": k}``
    (flat input leaf ``k``) or ``{"buffer": name}``; ``returns_input[j]`` is the
    flat input leaf the j-th user output *is* (a mutated input returned, as
    ``x.fill_(v)`` returns ``x``), or None.
    """

    exported: torch.export.ExportedProgram
    flat_inputs: tuple[Any, ...]
    outputs: tuple[Any, ...]
    in_spec: pytree.TreeSpec
    out_spec: pytree.TreeSpec
    name: str = "model"
    input_names: tuple[str, ...] = field(default=())
    mutations: tuple[dict, ...] = ()
    returns_input: tuple[int | None, ...] = ()
    # dynamic_shapes: {symbol: {"name", "min", "max", "example", "binds"}} (aot.symbolic)
    symbols: dict = field(default_factory=dict)
    # a dynamic program: the same model imported with every size at the example's
    # (no dynamic_shapes), made on demand (``aot.tuning.specialize``); None when static
    at_example: Callable[[], "ImportedProgram"] | None = field(default=None, compare=False,
                                                                repr=False)
    # a PT2E program (torch's quantized_decomposed ops): its int8 ops mean the converted
    # model's float math, which their kernel calls follow where ATen's kernels saturate
    # (``aot.fallback.quantized_ops``); an eager-mode quantized model's mean ATen's kernels
    pt2e: bool = False

    def __post_init__(self):
        n_tensor = sum(isinstance(i, TorchTensor) for i in self.flat_inputs)
        n_user = sum(1 for s in self.exported.graph_signature.input_specs
                     if s.kind.name == "USER_INPUT")
        assert n_tensor <= n_user, (n_tensor, n_user)

    @property
    def tensor_inputs(self) -> tuple[TorchTensor, ...]:
        return tuple(i for i in self.flat_inputs if isinstance(i, TorchTensor))

    @property
    def tensor_outputs(self) -> tuple[TorchTensor, ...]:
        """The output leaves compiled code returns (static leaves are the runtime's)."""
        return tuple(o for o in self.outputs if isinstance(o, TorchTensor))


def import_model(model: torch.nn.Module, args: tuple, kwargs: dict | None = None,
                 options: ImportOptions = ImportOptions()) -> ImportedProgram:
    """Capture ``model`` with torch.export and describe its signature.

    Args:
        model: the ``nn.Module`` to compile (put it in ``eval()`` mode first).
        args: example positional inputs (a tuple; a single tensor is accepted).
        kwargs: example keyword inputs.
        options: :class:`ImportOptions`.
    Returns:
        ImportedProgram.
    Raises:
        ExportFailed: torch.export could not capture the model (the message
            holds torch's reason and what to try).
        UnsupportedOp: a custom op that mutates its arguments.
    """
    if not isinstance(model, torch.nn.Module):
        raise ExportFailed(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(args, torch.Tensor):
        args = (args,)
    if not isinstance(args, tuple):
        args = tuple(args) if isinstance(args, list) else (args,)
    kwargs = dict(kwargs or {})
    name = type(model).__name__
    given = (model, args, kwargs)  # before a quantized rewrite: what at_example imports
    boundary = None
    if is_eager_quantized(model):
        log.info("rewriting eager-mode quantized %s into aot_q ops", name)
        model, args, kwargs, boundary = rewrite_eager_quantized(model, args, kwargs)
    names = _input_names(args, kwargs)
    declared = declared_dims(model, args, kwargs, options.dynamic_shapes)
    ex_args, ex_kwargs, widened = export_example(args, kwargs, declared, names)
    if widened:
        log.warning("%s dynamic with an example size of 1: exporting with 2 (torch.export "
                    "fixes a dimension whose example is 0 or 1); placement is measured at "
                    "your example", ", ".join(widened))
    ep = rewrite_qdq(_export(model, ex_args, ex_kwargs, options, name))
    pt2e = is_pt2e(ep)
    if options.pt2e_integer_ops:
        ep = rewrite_pt2e(ep)
    _check_functional(ep)
    _check_promotion(ep)
    flat, _ = pytree.tree_flatten((args, kwargs))
    flat_inputs = tuple(TorchTensor.from_tensor(x) if isinstance(x, torch.Tensor)
                        else ("static", _static_input(x, n)) for x, n in zip(flat, names))
    symbols = symbol_table(ep, flat, names, dim_names(declared))
    if symbols:  # input specs from export's symbolic shapes, not the example's sizes
        flat_inputs = _symbolic_inputs(ep, flat_inputs)
    outputs = _output_specs(ep)
    mutations, returns_input = _mutations(ep, flat)
    if boundary is not None:  # quantized inputs/outputs keep their dtype and qparams
        flat_inputs = tuple(_sized(b, f) if isinstance(b, TorchTensor) else f
                            for f, b in zip(flat_inputs, boundary.inputs))
        outputs = outputs[:len(mutations)] + tuple(
            _sized(b, o) for b, o in zip(boundary.outputs, outputs[len(mutations):]))
    at_example = None
    if symbols:
        def at_example(static=dataclasses.replace(options, dynamic_shapes=None)):
            return import_model(*given, static)
    return ImportedProgram(ep, flat_inputs, outputs, ep.call_spec.in_spec, ep.call_spec.out_spec,
                           name=name, input_names=names, mutations=mutations,
                           returns_input=returns_input, symbols=symbols, at_example=at_example,
                           pt2e=pt2e)


def _sized(boundary: TorchTensor, exported) -> TorchTensor:
    """A quantized boundary spec with the exported program's (symbolic) sizes."""
    if not isinstance(exported, TorchTensor) or not exported.is_symbolic:
        return boundary
    return TorchTensor(boundary.dtype, exported.shape, exported.strides, boundary.qparams,
                       boundary.layout)


def _symbolic_inputs(ep, flat_inputs: tuple) -> tuple:
    """Tensor input specs with export's symbolic sizes (``dynamic_shapes``)."""
    user = [n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder"
            and n.name in {s.arg.name for s in ep.graph_signature.input_specs
                           if s.kind.name == "USER_INPUT"}]
    fakes = iter(v for v in user if isinstance(v, torch.Tensor))
    out = []
    for spec in flat_inputs:
        if isinstance(spec, TorchTensor):
            fake = next(fakes, None)
            if fake is not None and spec.qparams is None:
                spec = TorchTensor.from_tensor(fake)
        out.append(spec)
    return tuple(out)


def _static_input(x, name: str):
    try:
        return static_values.encode(x)
    except TypeError as e:
        raise ExportFailed(f"{name}: a non-tensor input must be an int, float, bool, str, "
                           f"None, dtype, device or a list of these ({e})") from None


def _mutations(ep, flat) -> tuple[tuple[dict, ...], tuple]:
    """What the program updates in place, and which user outputs are mutated inputs."""
    sig = ep.graph_signature
    user = [s.arg.name for s in sig.input_specs if s.kind.name == "USER_INPUT"]
    # user input placeholders in order are the flat input leaves in order
    leaf = {n: (i if len(user) == len(flat) else None) for i, n in enumerate(user)}
    mutations, mutated_arg = [], {}
    for s in sig.output_specs:
        if s.kind.name == "BUFFER_MUTATION":
            mutations.append({"buffer": s.target})
        elif s.kind.name == "USER_INPUT_MUTATION":
            k = leaf.get(s.target)
            if k is None:
                raise UnsupportedOp(f"the model updates its input {s.target!r} in place, and "
                                    "it could not be matched to an input leaf")
            mutations.append({"input": k})
            mutated_arg[s.arg.name] = k
    returns = tuple(mutated_arg.get(getattr(s.arg, "name", None))
                    for s in sig.output_specs if s.kind.name == "USER_OUTPUT")
    return tuple(mutations), returns


def _input_names(args, kwargs) -> tuple[str, ...]:
    """``args[0]``, ``kwargs['mask']``: how errors name each input leaf."""
    names = []
    for path, _ in pytree.tree_flatten_with_path((args, kwargs))[0]:
        head, rest = path[0], path[1:]
        root = "args" if getattr(head, "idx", None) == 0 else "kwargs"
        names.append(root + "".join(str(k) for k in rest))
    return tuple(names)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def _export(model, args, kwargs, options, name) -> torch.export.ExportedProgram:
    """torch.export in the requested mode; when that fails, the other mode is tried
    (each captures programs the other cannot), with a warning naming the switch.

    A model that sets torch's global RNG state in Python during ``forward``
    (``torch.manual_seed``) gets a warning: export runs that call once, while
    tracing, and records no op for it, so the artifact's random draws follow the
    caller's RNG state, not the seed (eager's draws would). The caller's RNG
    state is restored after the capture.
    """
    rng = torch.get_rng_state()
    try:
        return _export_modes(model, args, kwargs, options, name)
    finally:
        if not torch.equal(torch.get_rng_state(), rng):
            log.warning("%s changed torch's global RNG state while being captured (a "
                        "torch.manual_seed or a Python-side random draw in forward): "
                        "torch.export records no op for it, so the compiled model's random "
                        "ops do not see that seed", name)
            torch.set_rng_state(rng)


def _export_modes(model, args, kwargs, options, name) -> torch.export.ExportedProgram:
    if is_transformers_model(model):
        register_cache()  # its DynamicCache output or input (``aot.hf_pytree``)
    try:
        ep = torch.export.export(model, args, kwargs, strict=options.strict,
                                dynamic_shapes=options.dynamic_shapes)
    except Exception as e:  # torch raises many types here; all are the user's model
        other = not options.strict
        try:
            ep = torch.export.export(model, args, kwargs, strict=other,
                                    dynamic_shapes=options.dynamic_shapes)
        except Exception as e2:
            hint = "rewrite data-dependent Python control flow with torch.cond"
            if options.dynamic_shapes is not None and "Constraints violated" in str(e2):
                hint = ("dynamic_shapes: torch.export fixed a dimension declared dynamic; an "
                        "example size of 0 is always fixed (give an example of at least 1), "
                        "and a model that compares the size to a constant or ties it to "
                        "another size fixes it too (TORCH_LOGS=+dynamic says where)")
                fixes = _suggested_fixes(str(e2))
                if fixes:
                    hint += f"; torch suggests: {fixes}"
            raise ExportFailed(
                f"torch.export could not capture {name} in strict={options.strict} mode "
                f"({_first_line(e)}) nor in strict={other} mode ({_first_line(e2)}); {hint}") from e
        log.warning("torch.export failed on %s with strict=%s (%s); captured with strict=%s",
                    name, options.strict, _first_line(e), other)
    try:
        # Functional ATen with no decompositions beyond export's own: what
        # fallback="all" runs, bit-exact with eager. Coverage-driven
        # decompositions happen later, in the partitioner.
        return ep.run_decompositions({})
    except Exception as e:
        if _already_functional(ep):
            # e.g. an op whose functionalization fails on sparse inputs: export's own
            # graph is already functional ATen, what the host runs as it is
            log.warning("functionalizing %s failed (%s); using export's graph, which is "
                        "already functional", name, _first_line(e))
            return ep
        raise ExportFailed(f"could not functionalize the exported program: {e}") from e


def _check_promotion(ep) -> None:
    """Refuse a program whose exported dtypes are not eager's: a pointwise op with
    operands of different dtypes whose recorded result dtype differs from what its
    ATen kernel returns (``threshold_backward(int64 grad, float32 input)`` is float32 in
    eager, int64 in torch's own decomposition and meta function). Everything after
    such an op would be computed in the wrong dtype, by any backend, ATen included;
    the op is run once on one-element tensors of its operands' dtypes to know.

    Raises:
        UnsupportedOp: naming the op, where it is, and both dtypes.
    """
    for n in ep.graph.nodes:
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload) \
                or torch.Tag.pointwise not in n.target.tags \
                or torch.Tag.nondeterministic_seeded in n.target.tags:  # would draw
            continue
        vals = [a.meta.get("val") for a in n.all_input_nodes]
        dtypes = {v.dtype for v in vals if isinstance(v, torch.Tensor)}
        out = n.meta.get("val")
        if len(dtypes) < 2 or not isinstance(out, torch.Tensor):
            continue

        def tiny(a):
            v = a.meta.get("val") if isinstance(a, torch.fx.Node) else a
            if isinstance(v, torch.Tensor):
                return torch.zeros([1] * v.dim(), dtype=v.dtype)
            return v
        try:
            real = n.target(*pytree.tree_map(tiny, n.args), **pytree.tree_map(tiny, n.kwargs))
        except Exception:  # the kernel refuses such operands: nothing to compare
            continue
        if isinstance(real, torch.Tensor) and real.dtype != out.dtype:
            where = n.meta.get("stack_trace", "").strip().splitlines()[-2:-1]
            raise UnsupportedOp(
                "with operands of dtypes "
                f"{', '.join(sorted(str(d).removeprefix('torch.') for d in dtypes))} returns "
                f"{str(real.dtype).removeprefix('torch.')} in eager, but torch.export recorded "
                f"{str(out.dtype).removeprefix('torch.')} (torch's decomposition and meta "
                "function disagree with its kernel), so every op after it would compute in "
                "the wrong dtype: give the operands one dtype (e.g. "
                f".to({str(real.dtype).removeprefix('torch.')})) before the call"
                + (f" ({where[0].strip()})" if where else ""), op=str(n.target), stage="import")


def _suggested_fixes(text: str) -> str:
    """The ``Dim(...)`` lines torch.export suggests after a constraint violation."""
    lines = text.splitlines()
    if "Suggested fixes:" not in [ln.strip() for ln in lines]:
        return ""
    start = [ln.strip() for ln in lines].index("Suggested fixes:") + 1
    fixes = []
    for ln in lines[start:]:
        if not ln.strip() or "=" not in ln:
            break
        fixes.append(ln.strip())
    return "; ".join(fixes)


def _already_functional(ep: torch.export.ExportedProgram) -> bool:
    """No op writes its operands, and export recorded no in-place update."""
    if any(s.kind.name in ("BUFFER_MUTATION", "USER_INPUT_MUTATION")
           for s in ep.graph_signature.output_specs):
        return False
    for n in ep.graph.nodes:
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and any(
                a.alias_info is not None and a.alias_info.is_write
                for a in n.target._schema.arguments):
            return False
    return True


def _check_functional(ep: torch.export.ExportedProgram) -> None:
    for node in ep.graph.nodes:
        if node.op == "call_function" and "auto_functionalized" in str(node.target):
            raise UnsupportedOp("custom ops that mutate their arguments are not supported; "
                                "return a new tensor instead", op=str(node.args[0]),
                                location=node_location(node))


_SCALAR_KINDS = ((torch.SymBool, "b"), (torch.SymInt, "i"), (torch.SymFloat, "f"))


def _output_specs(ep) -> tuple[Any, ...]:
    """One entry per output leaf (see ``ImportedProgram.outputs``)."""
    out_node = next(n for n in ep.graph.nodes if n.op == "output")
    specs = []
    for i, v in enumerate(pytree.tree_leaves(out_node.args[0])):
        val = v.meta.get("val") if isinstance(v, torch.fx.Node) else v
        if isinstance(val, torch.Tensor):
            specs.append(TorchTensor.from_tensor(val))
            continue
        kind = next((k for t, k in _SCALAR_KINDS if isinstance(val, t)), None)
        if kind is not None and isinstance(v, torch.fx.Node):
            specs.append(("scalar", kind))
            continue
        try:
            specs.append(("static", static_values.encode(val)))
        except TypeError:
            raise UnsupportedOp(f"output {i} is a {type(val).__name__}, which a compiled module "
                                "cannot return (tensors, ints, floats, bools, strings, None, "
                                "dtypes and lists of them can)",
                                location=node_location(v) if isinstance(v, torch.fx.Node)
                                else None) from None
    return tuple(specs)
