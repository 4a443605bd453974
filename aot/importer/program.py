"""import_model: nn.Module + example inputs -> ImportedProgram.

First link of the chain. Captures the model with ``torch.export`` (strict or
not), lowers it to functional ATen with the smallest decomposition set, and
records the typed signature: a TorchTensor per tensor input and output and the
static values of non-tensor inputs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..errors import ExportFailed, UnsupportedOp
from ..fallback import static_values
from ..torch_tensor import TorchTensor
from .locations import node_location
from .qdq import rewrite_qdq
from .quantized import is_eager_quantized, rewrite_eager_quantized

__all__ = ["ImportOptions", "ImportedProgram", "import_model"]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ImportOptions:
    """Options of the import stage.

    Attributes:
        strict: use ``torch.export``'s strict (TorchDynamo) tracing; non-strict by default.
    """

    strict: bool = False


@dataclass(frozen=True)
class ImportedProgram:
    """Made by :func:`import_model`, read by ``aot.lower.partition``.

    ``exported`` is a functional ATen ``ExportedProgram`` (only export's own
    mandatory decompositions applied). ``flat_inputs`` has one entry per leaf of
    the ``(args, kwargs)`` pytree: a TorchTensor for tensors, or a ``("static",
    value)`` pair for non-tensor leaves, which are baked in at export.
    """

    exported: torch.export.ExportedProgram
    flat_inputs: tuple[Any, ...]
    outputs: tuple[TorchTensor, ...]
    in_spec: pytree.TreeSpec
    out_spec: pytree.TreeSpec
    name: str = "model"
    input_names: tuple[str, ...] = field(default=())

    def __post_init__(self):
        n_tensor = sum(isinstance(i, TorchTensor) for i in self.flat_inputs)
        n_user = sum(1 for s in self.exported.graph_signature.input_specs
                     if s.kind.name == "USER_INPUT")
        assert n_tensor <= n_user, (n_tensor, n_user)

    @property
    def tensor_inputs(self) -> tuple[TorchTensor, ...]:
        return tuple(i for i in self.flat_inputs if isinstance(i, TorchTensor))


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
        UnsupportedOp: the program mutates inputs/buffers or returns non-tensors.
    """
    if not isinstance(model, torch.nn.Module):
        raise ExportFailed(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(args, torch.Tensor):
        args = (args,)
    if not isinstance(args, tuple):
        args = tuple(args) if isinstance(args, list) else (args,)
    kwargs = dict(kwargs or {})
    name = type(model).__name__
    boundary = None
    if is_eager_quantized(model):
        log.info("rewriting eager-mode quantized %s into aot_q ops", name)
        model, args, kwargs, boundary = rewrite_eager_quantized(model, args, kwargs)
    ep = rewrite_qdq(_export(model, args, kwargs, options, name))
    _check_functional(ep)
    flat, _ = pytree.tree_flatten((args, kwargs))
    flat_inputs = tuple(TorchTensor.from_tensor(x) if isinstance(x, torch.Tensor)
                        else ("static", static_values.encode(x)) for x in flat)
    outputs = _output_specs(ep)
    if boundary is not None:  # quantized inputs/outputs keep their dtype and qparams
        flat_inputs = tuple(b if isinstance(b, TorchTensor) else f
                            for f, b in zip(flat_inputs, boundary.inputs))
        outputs = boundary.outputs
    return ImportedProgram(ep, flat_inputs, outputs, ep.call_spec.in_spec, ep.call_spec.out_spec,
                           name=name, input_names=_input_names(args, kwargs))


def _input_names(args, kwargs) -> tuple[str, ...]:
    """``args[0]``, ``kwargs['mask']``: how errors name each input leaf."""
    names = []
    for path, _ in pytree.tree_flatten_with_path((args, kwargs))[0]:
        head, rest = path[0], path[1:]
        root = "args" if getattr(head, "idx", None) == 0 else "kwargs"
        names.append(root + "".join(str(k) for k in rest))
    return tuple(names)


def _export(model, args, kwargs, options, name) -> torch.export.ExportedProgram:
    try:
        ep = torch.export.export(model, args, kwargs, strict=options.strict)
    except Exception as e:  # torch raises many types here; all are the user's model
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        hint = ("try strict=False" if options.strict else
                "try strict=True, or rewrite data-dependent Python control flow with torch.cond")
        raise ExportFailed(f"torch.export could not capture {name}: "
                           f"{type(e).__name__}: {first} ({hint})") from e
    try:
        # Functional ATen with no decompositions beyond export's own: what
        # fallback="all" runs, bit-exact with eager. Coverage-driven
        # decompositions happen later, in the partitioner.
        return ep.run_decompositions({})
    except Exception as e:
        raise ExportFailed(f"could not functionalize the exported program: {e}") from e


def _check_functional(ep: torch.export.ExportedProgram) -> None:
    sig = ep.graph_signature
    mutated = list(sig.buffers_to_mutate.values()) + list(sig.user_inputs_to_mutate.values())
    if mutated:
        raise UnsupportedOp(
            f"the model mutates {', '.join(mutated)} in forward; compiled modules are pure "
            "functions (for BatchNorm/Dropout call model.eval(); avoid in-place updates of inputs)")
    for node in ep.graph.nodes:
        if node.op == "call_function" and "auto_functionalized" in str(node.target):
            raise UnsupportedOp("custom ops that mutate their arguments are not supported; "
                                "return a new tensor instead", op=str(node.args[0]),
                                location=node_location(node))


def _output_specs(ep) -> tuple[TorchTensor, ...]:
    out_node = next(n for n in ep.graph.nodes if n.op == "output")
    specs = []
    for i, v in enumerate(pytree.tree_leaves(out_node.args[0])):
        val = v.meta.get("val") if isinstance(v, torch.fx.Node) else v
        if not isinstance(val, torch.Tensor):
            raise UnsupportedOp(f"output {i} is a {type(val).__name__}, not a tensor; compiled "
                                "modules return tensors only")
        if not all(isinstance(d, int) for d in val.shape):
            raise UnsupportedOp(f"output {i} has a data-dependent shape {tuple(val.shape)}; "
                                "compiled modules need static output shapes",
                                location=node_location(v) if isinstance(v, torch.fx.Node) else None)
        specs.append(TorchTensor.from_tensor(val))
    return tuple(specs)
