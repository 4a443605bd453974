"""TreeSpec: an artifact's input and output structure, read without torch.

The manifest keeps the model's input structure (``(args, kwargs)``) and output
structure as torch's pytree serialization (``torch.utils._pytree.treespec_dumps``,
protocol 1): JSON ``[1, node]``, each node ``{"type": "builtins.tuple", "context":
<JSON text>, "children_spec": [nodes]}``, a leaf being a node without a type. The
torch runtime reads them with torch's pytree (``load_treespec``); the
manifest check and the torch-free runtime (``aot.runtime.numpy_module``) with this
module, which counts the leaves of any spec and flattens and rebuilds the containers
plain Python has: tuples, lists, dicts (in the spec's key order) and None.
Other containers (a namedtuple, ``torch.return_types``, a dataclass) need torch's
pytree: :attr:`TreeSpec.plain` says whether a spec holds any.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any

__all__ = ["TreeSpec", "structure_error", "dump_treespec", "load_treespec"]

# the defaultdict factories torch's pytree may import (any other names a module)
_FACTORIES = ("list", "dict", "set", "int", "float", "str", "tuple")
_PLAIN = {"builtins.tuple": tuple, "builtins.list": list, "builtins.dict": dict,
          "builtins.NoneType": type(None)}


@dataclass(frozen=True)
class TreeSpec:
    """One node: ``type`` (a serialized type name, None for a leaf), its context
    (dict keys for a dict), its children."""

    type: str | None
    context: Any
    children: tuple["TreeSpec", ...]

    @staticmethod
    def loads(text: str) -> "TreeSpec":
        """Read a spec as ``treespec_dumps`` writes it. Raises ValueError."""
        try:
            protocol, node = json.loads(text)
        except (TypeError, ValueError) as e:
            raise ValueError(f"expected JSON [protocol, node]: {e}") from None
        if protocol != 1:
            raise ValueError(f"pytree protocol {protocol!r}, expected 1")
        return TreeSpec._node(node)

    @staticmethod
    def _node(d: Any) -> "TreeSpec":
        if not isinstance(d, dict) or not isinstance(d.get("children_spec"), list):
            raise ValueError(f"expected a node with children_spec, got {d!r:.80}")
        kind, children = d.get("type"), tuple(TreeSpec._node(c) for c in d["children_spec"])
        if kind is None:
            if children:
                raise ValueError("a leaf with children")
            return TreeSpec(None, None, ())
        if not isinstance(kind, str):
            raise ValueError(f"node type {kind!r} is not a name")
        context = d.get("context")  # JSON text, or (a defaultdict's) an object as it is
        context = json.loads(context) if isinstance(context, str) else context
        if kind == "builtins.dict" and (not isinstance(context, list)
                                        or len(context) != len(children)):
            raise ValueError(f"dict keys {context!r} do not match its {len(children)} children")
        return TreeSpec(kind, context, children)

    def type_names(self) -> set[str]:
        """Every container type the spec names (iteratively: a deep spec cannot exhaust
        the stack)."""
        out, stack = set(), [self]
        while stack:
            node = stack.pop()
            if node.type is not None:
                out.add(node.type)
            stack.extend(node.children)
        return out

    @cached_property
    def num_leaves(self) -> int:
        return 1 if self.type is None else sum(c.num_leaves for c in self.children)

    @cached_property
    def plain(self) -> bool:
        """Only containers plain Python rebuilds (tuple, list, dict, None)."""
        return self.type is None or (self.type in _PLAIN and all(c.plain for c in self.children))

    def flatten_up_to(self, value: Any) -> list:
        """``value``'s leaves at this spec's leaf positions (a container where a leaf
        is expected stays one leaf). Raises ValueError where the structures differ."""
        out: list = []
        self._flatten(value, out)
        return out

    def import_problem(self) -> str | None:
        """Why torch's pytree must not read this spec, or None. Its reader imports
        modules a spec names: a ``collections.defaultdict``'s ``default_factory``
        (``importlib.import_module`` of any module), an ``Enum`` key in a context
        (``{"__enum__": ..., "fqn": "module:Class"}``). Only builtin factories and no
        enum keys are read (iteratively: a deep spec cannot exhaust the stack)."""
        stack: list[Any] = [self]
        while stack:
            node = stack.pop()
            if isinstance(node, TreeSpec):
                if node.type == "collections.defaultdict":
                    c = node.context if isinstance(node.context, dict) else {}
                    factory = (c.get("default_factory_module"), c.get("default_factory_name"))
                    if factory[0] != "builtins" or factory[1] not in _FACTORIES:
                        return (f"a defaultdict whose default_factory is {factory[0]}."
                                f"{factory[1]} (only builtins {', '.join(_FACTORIES)} are read)")
                stack.extend(node.children)
                stack.append(node.context)
            elif isinstance(node, dict):
                if "__enum__" in node:
                    return f"an Enum key ({str(node.get('fqn'))[:60]}), which names a module"
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
        return None

    def _flatten(self, value: Any, out: list) -> None:
        if self.type is None:
            out.append(value)
            return
        kind = _PLAIN.get(self.type)
        if kind is None:
            raise ValueError(f"{self.type} needs torch's pytree")
        if not isinstance(value, kind):
            raise ValueError(f"expected {kind.__name__}, got {type(value).__name__}")
        if kind is dict:
            if set(value) != set(self.context):
                raise ValueError(f"expected keys {self.context}, got {list(value)}")
            items = [value[k] for k in self.context]
        elif kind is type(None):
            items = []
        else:
            if len(value) != len(self.children):
                raise ValueError(f"expected {len(self.children)} items, got {len(value)}")
            items = list(value)
        for c, v in zip(self.children, items):
            c._flatten(v, out)

    def unflatten(self, leaves: list) -> Any:
        """The structure rebuilt around ``leaves`` (as many as :attr:`num_leaves`)."""
        it = iter(leaves)
        return self._build(it)

    def _build(self, it) -> Any:
        if self.type is None:
            return next(it)
        kind = _PLAIN.get(self.type)
        if kind is None:
            raise ValueError(f"{self.type} needs torch's pytree")
        values = [c._build(it) for c in self.children]
        if kind is dict:
            return dict(zip(self.context, values))
        return None if kind is type(None) else kind(values)


def structure_error(n_args: int, kwarg_names, args, kwargs, expected: str) -> str:
    """What is wrong with a call's ``(args, kwargs)`` against a model compiled for
    ``n_args`` positional inputs and keyword inputs ``kwarg_names`` (both runtimes)."""
    if len(args) != n_args or set(kwargs) != set(kwarg_names):
        return (f"expected {n_args} positional input(s) and keyword input(s) "
                f"{sorted(kwarg_names) or 'none'}, got {len(args)} positional and "
                f"{sorted(kwargs) or 'none'}")
    return f"input structure differs from the example inputs: expected {expected}"


# torch's pytree, for the torch runtime and the compiler (imported only here)

def dump_treespec(spec: "pytree.TreeSpec") -> str:
    """A pytree spec as the manifest holds it (``torch.return_types`` included)."""
    import torch.utils._pytree as pytree
    _name_return_types()
    return pytree.treespec_dumps(spec)


def load_treespec(text: str) -> "pytree.TreeSpec":
    """A manifest's spec read with torch's pytree; the ``transformers`` types it names
    (a model output, its ``DynamicCache``) are registered first (``aot.hf_pytree``)."""
    import torch.utils._pytree as pytree
    from .hf_pytree import register_for_load
    _name_return_types()
    if "transformers." in text:
        register_for_load(TreeSpec.loads(text).type_names())
    return pytree.treespec_loads(text)


def _name_return_types() -> None:
    """Give ``torch.return_types`` (``sort``, ``topk``, ``max``...) serialization names
    where this torch registered them without (torch before 2.15): a program returning
    ``torch.sort(x)`` must save and load like any other."""
    import torch.utils._pytree as pytree
    named = getattr(pytree, "SUPPORTED_SERIALIZED_TYPES", {})
    # all_return_types leaves out the private ones (``_lu_with_info``): every class of
    # the module that pytree knows
    for cls, entry in list(named.items()):
        if getattr(cls, "__module__", None) != "torch.return_types" or \
                entry.serialized_type_name != pytree.NO_SERIALIZED_TYPE_NAME_FOUND:
            continue
        name = f"torch.return_types.{cls.__name__}"
        named[cls] = entry._replace(serialized_type_name=name)
        pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE[name] = cls
