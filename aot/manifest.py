"""The manifest: what an artifact says about its program, as typed fields.

The backend builds one per artifact (``aot.backend.build``); a file's is read with
``Manifest.from_json``, which checks every field (below) before any is read. A manifest is frozen: a candidate that differs in its driver, executor or
region is ``replace(...)``-d into a new manifest, checked again, never edited after
its check. The runtime, the numpy runtime, the report and the CLI read its fields;
the entries below the top level (kernel calls, placements, the region) are the JSON
their own readers parse (``KernelCallSpec.from_json``, ``Placement.from_json``...).

As a read-only ``Mapping`` it is the JSON document the file holds (the keys present,
as ``to_json`` writes them), for tools that read artifacts as JSON.

**The field checks.** A file whose bytes were changed fails its checksum
(``aot.artifact``); the checks are for a manifest that checksums but was written by
hand, by another tool, or by a buggy one. Every field the runtime reads is checked for its type,
its range and its agreement with the rest of the artifact (input indices,
constant offsets inside the constants blob, pytree leaf counts), and the first
problem is an ``ArtifactError`` naming the field as a path (``inputs[1].shape``).
Deeper entries (kernel calls, the host program) are also parsed by their own
readers at load; anything those raise is reported against their field.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any, Callable, Iterator

from .errors import AotError, ArtifactError
from .limits import MAX_RANK, MAX_TENSOR_BYTES, check_document, read_json, tensor_bytes
from .op_table import GROUP_OP, name_problem, py_problem
from .fallback import static_values
from .symbolic import free_symbols
from .torch_tensor import LAYOUT_NAMES, itemsize, known_dtype_names
from .treespec import TreeSpec, load_treespec

__all__ = ["Manifest", "FORMAT_VERSION", "READS", "PARAMETER_SCOPE", "check_manifest",
           "reading"]

FORMAT_VERSION = 4  # 4: the compiled module may read its weights as parameters
READS = (1, 2, 3, 4)
PARAMETER_SCOPE = "aot"  # the scope of the module's parameters (aot.runtime.parameters)
REQUIRED = ("format_version", "target", "driver", "flags", "torch_version", "iree_version",
            "inputs", "outputs", "in_spec", "out_spec", "kernel_calls", "placements",
            "vmfb_sha256", "name")
# written only when set (a compile that measured regions, a host program...)
_WHEN_SET = ("host_program", "region", "variant", "specialized", "folded_ops")


def _checked(doc: Any, constants_len: int, path: str) -> None:
    """ArtifactError naming the first field of ``doc`` that is missing or malformed."""
    if not isinstance(doc, dict):
        raise ArtifactError(f"{path!r}: manifest is not a JSON object")
    check_document(doc, f"{path!r}: manifest")
    missing = [k for k in REQUIRED if k not in doc]
    if missing:
        raise ArtifactError(f"{path!r}: manifest lacks {', '.join(missing)}")
    if doc["format_version"] not in READS:
        raise ArtifactError(f"{path!r}: manifest format {doc['format_version']} is not "
                            f"one of {READS}")
    check_manifest(doc, constants_len, path)


@dataclasses.dataclass(frozen=True, eq=False)
class Manifest(Mapping):
    """The manifest's fields; ``from_json`` / ``to_json`` are the file's JSON."""

    name: str
    target: str
    driver: str
    flags: tuple[str, ...]
    torch_version: str
    iree_version: str
    inputs: tuple[dict, ...]
    outputs: tuple[dict, ...]
    in_spec: str
    out_spec: str
    kernel_calls: tuple[dict, ...]
    placements: tuple[dict, ...]
    vmfb_sha256: str
    format_version: int = FORMAT_VERSION
    via: str = "torch"
    cpu: dict | None = None
    input_names: tuple[str, ...] | None = None
    symbols: dict = dataclasses.field(default_factory=dict)
    mutations: tuple[dict, ...] = ()
    returns_input: tuple[int | None, ...] = ()
    policy: dict | None = None
    executor: dict | None = None
    whole_program_call: str | None = None
    compile_seconds: float | None = None
    host_constants: dict = dataclasses.field(default_factory=dict)
    parameters: dict = dataclasses.field(default_factory=dict)
    constants_sha256: str | None = None
    host_program: dict | None = None
    region: dict | None = None
    variant: dict | None = None
    specialized: dict | None = None
    folded_ops: int | None = None

    @classmethod
    def from_json(cls, doc: Any, constants_len: int, path: str = "<in memory>") -> "Manifest":
        """The manifest of JSON document ``doc``, every field checked first.

        Raises:
            ArtifactError: naming the first field that is missing or malformed.
        """
        if isinstance(doc, Manifest):
            doc = doc.to_json()
        _checked(doc, constants_len, path)
        return cls._owning(copy.deepcopy(doc))  # nothing the caller holds reaches into it

    @classmethod
    def _owning(cls, doc: dict) -> "Manifest":
        """The manifest of a checked document no one else holds (its values become the
        manifest's own)."""
        fields = {}
        for f in dataclasses.fields(cls):
            if f.name in doc and doc[f.name] is not None:
                v = doc[f.name]
                fields[f.name] = tuple(v) if f.type.startswith("tuple") else v
        return cls(**fields)

    def to_json(self) -> dict:
        """The JSON document (a fresh copy: changing it changes no manifest)."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is None and f.name in _WHEN_SET:
                continue
            out[f.name] = list(v) if isinstance(v, tuple) else v
        return copy.deepcopy(out)

    def replace(self, constants_len: int, **fields: Any) -> "Manifest":
        """A new manifest with ``fields`` set, checked as a file's is."""
        unknown = set(fields) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise TypeError(f"not manifest fields: {sorted(unknown)}")
        fields = {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}
        doc = {**self.to_json(), **copy.deepcopy(fields)}  # a fresh copy, ours alone
        _checked(doc, constants_len, "<in memory>")
        return Manifest._owning(doc)

    def plan(self) -> dict:
        """The decisions of the compile that wrote it, to pin in another: what
        ``CompiledModule.plan()`` returns and ``plan=`` / ``aot compile --plan`` take
        (``aot.plan.read_plan`` reads one saved as JSON)."""
        region = self.region or self.variant or {}
        return {"format": 1, "program": region.get("key"), "region": region.get("chosen"),
                "candidates_ms": region.get("candidates_ms") or {}}

    # the read-only JSON view
    def _doc(self) -> dict:
        doc = self.__dict__.get("_json")
        if doc is None:
            doc = self.to_json()
            object.__setattr__(self, "_json", doc)
        return doc

    def __getitem__(self, key: str) -> Any:
        return self._doc()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._doc())

    def __len__(self) -> int:
        return len(self._doc())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Manifest):
            return self.to_json() == other.to_json()
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


# -- the field checks ------------------------------------------------------------------
DRIVERS = ("local-task", "local-sync", "cuda")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,127}\Z")
_SCALAR_KINDS = ("b", "i", "f")


def _torch():
    """torch, or None in a Python without it (the torch-free runtime reads manifests too)."""
    try:
        import torch
    except ImportError:
        return None
    return torch


class _Bad(Exception):
    def __init__(self, field: str, what: str):
        super().__init__(f"{field}: {what}")


def _need(ok: bool, field: str, what: str) -> None:
    if not ok:
        raise _Bad(field, what)


def _one_of(v, names) -> bool:
    """``v`` is a string among ``names`` (a list or dict given here is simply not)."""
    return isinstance(v, str) and v in names


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _typed(m: dict, key: str, types, optional: bool = False):
    v = m.get(key)
    if v is None and optional:
        return None
    _need(key in m, key, "missing")
    _need(isinstance(v, types), key, f"expected {_names(types)}, got {type(v).__name__}")
    return v


def _names(types) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(t.__name__ for t in types)


def _tensor(d: Any, field: str) -> None:
    """A TorchTensor's JSON (``aot.torch_tensor``)."""
    _need(isinstance(d, dict), field, "expected a tensor description (object)")
    _need(_one_of(d.get("dtype"), known_dtype_names()), f"{field}.dtype", f"unknown dtype {d.get('dtype')!r}")
    shape, strides = d.get("shape"), d.get("strides")
    _need(isinstance(shape, list) and all(s is None or (_is_int(s) and s >= 0) or _size_expr(s)
                                          for s in shape),
          f"{field}.shape", f"expected a list of sizes, got {shape!r}")
    _need(isinstance(strides, list) and len(strides) == len(shape)
          and all(s is None or _is_int(s) or _size_expr(s) for s in strides),
          f"{field}.strides", f"expected {len(shape)} integer strides, got {strides!r}")
    _need(len(shape) <= MAX_RANK, f"{field}.shape", f"rank {len(shape)} (at most {MAX_RANK})")
    _need(all(not _is_int(s) or s >= 0 for s in strides), f"{field}.strides",
          f"expected strides of 0 or more, got {strides!r:.80}")
    size = tensor_bytes(shape, strides, itemsize(d["dtype"]))
    _need(size is None or size <= MAX_TENSOR_BYTES, f"{field}.shape",
          f"describes {size} bytes (shape {shape!r:.60}, strides {strides!r:.60}), beyond "
          f"the {MAX_TENSOR_BYTES >> 30} GiB a tensor may span")
    _need(_one_of(d.get("layout", "strided"), LAYOUT_NAMES), f"{field}.layout",
          f"unknown layout {d.get('layout')!r}")
    q = d.get("qparams")
    if q is not None:
        _need(isinstance(q, dict), f"{field}.qparams", "expected an object or null")
        scheme = q.get("scheme")
        _need(_one_of(scheme, ("per_tensor_affine", "per_channel_affine")), f"{field}.qparams.scheme",
              f"unknown scheme {scheme!r}")
        if scheme == "per_tensor_affine":
            _need(isinstance(q.get("scale"), (int, float)) and not isinstance(q["scale"], bool),
                  f"{field}.qparams.scale", "expected a number")
            _need(_is_int(q.get("zero_point")), f"{field}.qparams.zero_point", "expected an int")
        else:
            axis = q.get("axis")
            _need(_is_int(axis) and 0 <= axis < max(len(shape), 1), f"{field}.qparams.axis",
                  f"expected a dimension of {shape}, got {axis!r}")
            n = shape[axis] if shape else 0
            for key, ok in (("scale", lambda v: isinstance(v, (int, float))), ("zero_point", _is_int)):
                v = q.get(key)
                _need(isinstance(v, list) and len(v) == n and all(ok(x) for x in v),
                      f"{field}.qparams.{key}", f"expected {n} values, one per channel")


def _size_expr(s) -> bool:
    """A symbolic size (``aot.symbolic``): an expression the runtime evaluates."""
    if not isinstance(s, str):
        return False
    try:
        free_symbols(s)
    except AotError:
        return False
    return True


def _symbols(m: dict, inputs: list) -> None:
    table = _typed(m, "symbols", dict, optional=True) or {}
    for sym, e in table.items():
        f = f"symbols.{sym}"
        _need(isinstance(e, dict) and _is_int(e.get("min")) and _is_int(e.get("max"))
              and 0 <= e["min"] <= e["max"] and isinstance(e.get("binds"), list), f,
              "expected {name, min, max, example, binds} with 0 <= min <= max")
        for j, b in enumerate(e["binds"]):
            ok = (isinstance(b, dict) and _is_int(b.get("input")) and _is_int(b.get("dim"))
                  and 0 <= b["input"] < len(inputs) and isinstance(inputs[b["input"]], dict)
                  and 0 <= b["dim"] < len(inputs[b["input"]].get("shape") or ()))
            _need(ok, f"{f}.binds[{j}]", "expected {input, name, dim} naming an input dimension")


def _static(v: Any, field: str) -> None:
    try:
        static_values.decode(v)
    except Exception as e:  # noqa: BLE001 - any decoding failure is the field's fault
        raise _Bad(field, f"not a value of the operand contract ({type(e).__name__}: {e})")


def _leaf(d: Any, field: str, kinds: tuple[str, ...]) -> str:
    """An input/output entry: a tensor, or one of ``kinds`` (static, scalar)."""
    _need(isinstance(d, dict), field, "expected an object")
    if "dtype" in d:
        _tensor(d, field)
        return "tensor"
    _need(len(d) == 1 and _one_of(next(iter(d)), kinds), field,
          f"expected a tensor description or one of {list(kinds)}, got keys {sorted(d)}")
    (kind, v), = d.items()
    if kind == "static":
        _static(v, f"{field}.static")
    elif kind == "scalar":
        _need(_one_of(v, _SCALAR_KINDS), f"{field}.scalar", f"expected one of {_SCALAR_KINDS}")
    return kind


def _spec(m: dict, key: str, leaves: int) -> None:
    s = _typed(m, key, str)
    try:
        check_document(read_json(s, key), key)
    except ArtifactError as e:
        raise _Bad(key, f"not a pytree spec within bounds ({e.message})")
    try:
        tree = TreeSpec.loads(s)
    except Exception as e:  # noqa: BLE001
        raise _Bad(key, f"not a pytree spec ({type(e).__name__}: {e})")
    why = tree.import_problem()
    _need(why is None, key, f"holds {why}")
    try:
        n = tree.num_leaves
        if _torch() is not None:  # its pytree also knows every container type named
            load_treespec(s)
    except Exception as e:  # noqa: BLE001
        raise _Bad(key, f"not a pytree spec ({type(e).__name__}: {e})")
    _need(n == leaves, key, f"has {n} leaves, the manifest describes {leaves}")


# a parameter's dtype, by name (the floating-point weights fx_import.Parameters takes),
# and its key: what the module's #stream.parameter.named attributes name
_PARAMETER_DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
_PARAMETER_KEY = re.compile(r"p[0-9]{1,9}\Z")


def _constants(m: dict, constants_len: int) -> None:
    table = m.get("host_constants")
    params = m.get("parameters")
    if params:  # the compiled module's weights: read by IREE, torch or not
        _need(isinstance(params, dict), "parameters", "expected an object")
        for key, d in params.items():
            f = f"parameters.{str(key)[:40]}"
            _need(isinstance(key, str) and _PARAMETER_KEY.match(key), f,
                  "expected a key p<number>")
            _need(isinstance(d, dict) and str(d.get("dtype")) in _PARAMETER_DTYPES,
                  f"{f}.dtype", f"expected one of {sorted(_PARAMETER_DTYPES)}")
            _slice(d, f, _PARAMETER_DTYPES[d["dtype"]], constants_len)
    if table:
        _need(isinstance(table, dict), "host_constants", "expected an object")
        torch = _torch()
        if torch is not None:  # else: only kernel calls read them, and those need torch
            for name, d in table.items():
                f = f"host_constants.{name}"
                _need(isinstance(d, dict), f, "expected an object")
                dtype = getattr(torch, str(d.get("dtype")), None)
                _need(isinstance(dtype, torch.dtype), f"{f}.dtype",
                      f"unknown dtype {d.get('dtype')!r}")
                _slice(d, f, dtype.itemsize, constants_len)
    if table or params:
        _need(isinstance(m.get("constants_sha256"), str)
              and _HEX64.match(m["constants_sha256"]),
              "constants_sha256", "expected a SHA-256 hex digest")


def _slice(d: dict, f: str, itemsize: int, constants_len: int) -> None:
    """A constant's shape, and its bytes: 64-byte aligned, sized by the shape, within
    the constants."""
    shape = d.get("shape")
    _need(isinstance(shape, list) and len(shape) <= MAX_RANK
          and all(_is_int(s) and s >= 0 for s in shape),
          f"{f}.shape", f"expected a list of sizes, got {shape!r:.80}")
    off, n = d.get("offset"), d.get("nbytes")
    _need(_is_int(off) and off >= 0 and off % 64 == 0, f"{f}.offset",
          f"expected a 64-byte aligned offset, got {off!r}")
    want = math.prod(shape) * itemsize
    _need(_is_int(n) and n == want, f"{f}.nbytes",
          f"expected {want} (shape {shape}, {d['dtype']}), got {n!r}")
    _need(off + n <= constants_len, f"{f}.offset",
          f"bytes {off}..{off + n} lie outside the constants ({constants_len} bytes)")


_OPERAND_KINDS = ("tensor", "tensor_list", "scalar", "static")


def _kernel_call(k: Any, f: str) -> None:
    """One kernel call's JSON (``aot.fallback.spec.KernelCallSpec``), members included."""
    _need(isinstance(k, dict), f, "expected an object")
    for key in ("key", "op", "overload"):
        _need(isinstance(k.get(key), str), f"{f}.{key}", f"expected a string, got {k.get(key)!r}")
    _need(_KEY.match(k["key"]) is not None, f"{f}.key",
          f"expected a host function name (call_3, call_3.0), got {k['key']!r:.80}")
    if k["op"] != GROUP_OP:
        why = name_problem(k["op"], k["overload"])
        _need(why is None, f"{f}.op", str(why))
    for key in ("inputs", "results"):
        ts = k.get(key)
        _need(isinstance(ts, list), f"{f}.{key}", "expected a list")
        for j, t in enumerate(ts):
            _tensor(t, f"{f}.{key}[{j}]")
    ops = k.get("operands")
    _need(isinstance(ops, list), f"{f}.operands", "expected a list")
    for j, o in enumerate(ops):
        g = f"{f}.operands[{j}]"
        _need(isinstance(o, dict) and _one_of(o.get("kind"), _OPERAND_KINDS)
              and isinstance(o.get("name"), str), g, f"expected an operand of kind {_OPERAND_KINDS}")
        # a schema's argument name, which may be a Python keyword (uniform's ``from``):
        # only a keyword-only operand's name becomes source, checked where it does
        # (``aot.fallback.codegen``)
        _need(o["name"].isidentifier(), f"{g}.name",
              f"expected an argument name, got {o['name']!r:.80}")
        kind = o["kind"]
        if kind in ("tensor", "scalar"):
            _need(_is_int(o.get("index")) and o["index"] >= 0, f"{g}.index", "expected an index")
        if kind == "tensor" and "spec" in o:
            _tensor(o["spec"], f"{g}.spec")
        if kind == "tensor" and "spec" not in o:
            _need(o["index"] < len(k["inputs"]), f"{g}.index",
                  f"expected an index below {len(k['inputs'])}")
        if kind == "tensor_list":
            # Tensor?[] (aten.index): None entries stand for absent tensors
            _need(isinstance(o.get("indices"), list)
                  and all(i is None or _is_int(i) for i in o["indices"]),
                  f"{g}.indices", "expected a list of indices (or nulls)")
        if kind == "scalar":
            _need(_one_of(o.get("scalar_kind"), _SCALAR_KINDS), f"{g}.scalar_kind",
                  f"expected one of {_SCALAR_KINDS}")
        if kind == "static":
            _need(isinstance(o.get("type"), str), f"{g}.type", "expected a string")
            _static(o.get("value"), f"{g}.value")
    _need(isinstance(k.get("result_kinds", ""), str), f"{f}.result_kinds", "expected a string")
    for key in ("scalar_inputs", "members", "output_slots", "constants"):
        _need(isinstance(k.get(key, []), list), f"{f}.{key}", "expected a list")
    _need(all(_is_int(j) and j >= 0 for j in k.get("output_slots", [])), f"{f}.output_slots",
          "expected slot indices")
    _need(all(_one_of(j, _SCALAR_KINDS) for j in k.get("scalar_inputs", [])),
          f"{f}.scalar_inputs", f"expected scalar kinds {_SCALAR_KINDS}")
    _need(all(c is None or isinstance(c, str) for c in k.get("constants", [])),
          f"{f}.constants", "expected constant names or nulls")
    _need(all(c in "tbif" for c in k.get("result_kinds", "")), f"{f}.result_kinds",
          "expected result kind letters (t, b, i, f)")
    for j, sub in enumerate(k.get("members", [])):
        _kernel_call(sub, f"{f}.members[{j}]")


def _kernel_calls(m: dict) -> set:
    calls = _typed(m, "kernel_calls", list)
    keys = set()
    for i, k in enumerate(calls):
        f = f"kernel_calls[{i}]"
        _kernel_call(k, f)
        if _torch() is None:  # its reader needs torch, as running it does (the loader says)
            keys.add(k.get("key"))
            continue
        from .fallback.spec import KernelCallSpec
        try:
            KernelCallSpec.from_json(k)
        except AotError as e:
            raise _Bad(f, str(e))
        except Exception as e:  # noqa: BLE001
            raise _Bad(f, f"malformed ({type(e).__name__}: {e})")
        keys.add(k.get("key"))
    return keys


def _host_program(m: dict, n_inputs: int) -> None:
    hp = m.get("host_program")
    if hp is None:
        return
    _need(isinstance(hp, dict), "host_program", "expected an object")
    for key in ("inputs", "nodes", "outputs"):
        _need(isinstance(hp.get(key), list), f"host_program.{key}", "expected a list")
    consts = m.get("host_constants") or {}
    for i, d in enumerate(hp["inputs"]):
        f = f"host_program.inputs[{i}]"
        _need(isinstance(d, dict) and isinstance(d.get("node"), str), f,
              "expected an object with a node name")
        if "user" in d:
            _need(_is_int(d["user"]) and 0 <= d["user"] < n_inputs, f"{f}.user",
                  f"expected an input index below {n_inputs}, got {d['user']!r}")
        else:
            name = d.get("constant", d.get("state"))
            _need(_one_of(name, consts), f, f"names constant {name!r}, which host_constants lacks")
            _laid_out(d.get("strides"), consts[name], f"{f}.strides")
    _host_nodes(hp["nodes"], "host_program")
    graphs = hp.get("graphs")
    if graphs is None:
        return
    _need(isinstance(graphs, dict), "host_program.graphs", "expected an object")
    for name, g in graphs.items():
        f = f"host_program.graphs.{name}"
        _need(isinstance(g, dict) and all(isinstance(g.get(k), list)
                                          for k in ("inputs", "nodes", "outputs")), f,
              "expected an object with inputs, nodes and outputs lists")
        for i, d in enumerate(g["inputs"]):
            _need(isinstance(d, dict) and isinstance(d.get("node"), str) and _is_int(d.get("user"))
                  and d["user"] == i, f"{f}.inputs[{i}]",
                  "expected {node, user: its operand index}")
        _host_nodes(g["nodes"], f)


_HOP_NAMES = ("hop:cond", "hop:while_loop")


def _host_nodes(nodes: list, where: str) -> None:
    for i, d in enumerate(nodes):
        f = f"{where}.nodes[{i}]"
        _need(isinstance(d, dict) and isinstance(d.get("name"), str)
              and isinstance(d.get("target"), str), f, "expected an object with name and target")
        t = d["target"]
        why = (None if t in _HOP_NAMES else py_problem(t[3:]) if t.startswith("py:")
               else name_problem(*t.rpartition(".")[::2]))
        _need(why is None, f"{f}.target", str(why))
        _need(isinstance(d.get("args", []), list), f"{f}.args", "expected a list")
        _need(isinstance(d.get("kwargs", {}), dict), f"{f}.kwargs", "expected an object")


def _laid_out(strides, const: Any, field: str) -> None:
    """A host-program constant's eager strides (it is laid out so at load): one per
    dimension, none negative, the extent within the bound on a tensor's size."""
    if strides is None or not isinstance(const, dict):
        return
    shape = const.get("shape") or []
    _need(isinstance(strides, list) and len(strides) == len(shape)
          and all(_is_int(x) and x >= 0 for x in strides), field,
          f"expected {len(shape)} strides of 0 or more")
    size = tensor_bytes(shape, strides, itemsize(str(const.get("dtype"))))
    _need(size is not None and size <= MAX_TENSOR_BYTES, field,
          f"span {size} bytes, beyond the {MAX_TENSOR_BYTES >> 30} GiB a tensor may span")


def _checks(m: dict, constants_len: int) -> None:
    for key in ("name", "target", "torch_version", "iree_version"):
        _typed(m, key, str)
    _need(_one_of(m.get("driver"), DRIVERS), "driver", f"expected one of {DRIVERS}, got "
          f"{m.get('driver')!r}")
    flags = _typed(m, "flags", list)
    _need(all(isinstance(f, str) for f in flags), "flags", "expected strings")
    _need(isinstance(m.get("vmfb_sha256"), str) and _HEX64.match(m["vmfb_sha256"]),
          "vmfb_sha256", "expected a SHA-256 hex digest")
    inputs = _typed(m, "inputs", list)
    kinds = [_leaf(d, f"inputs[{i}]", ("static",)) for i, d in enumerate(inputs)]
    names = _typed(m, "input_names", list, optional=True)
    if names is not None:
        _need(len(names) == len(inputs) and all(isinstance(n, str) for n in names),
              "input_names", f"expected {len(inputs)} strings")
    outputs = _typed(m, "outputs", list)
    for i, d in enumerate(outputs):
        _leaf(d, f"outputs[{i}]", ("static", "scalar"))
    mutations = _typed(m, "mutations", list, optional=True) or []
    for i, d in enumerate(mutations):
        f = f"mutations[{i}]"
        _need(isinstance(d, dict) and len(d) == 1 and _one_of(next(iter(d)), ("input", "buffer")), f,
              "expected {\"input\": index} or {\"buffer\": name}")
        if "input" in d:
            k = d["input"]
            _need(_is_int(k) and 0 <= k < len(inputs) and kinds[k] == "tensor", f"{f}.input",
                  f"expected the index of a tensor input, got {k!r}")
            _need(outputs[i].get("dtype") is not None, f"outputs[{i}]",
                  "an updated input's new value must be a tensor")
        else:
            _need(isinstance(d["buffer"], str), f"{f}.buffer", "expected a name")
    _need(len(outputs) >= len(mutations), "outputs", "fewer outputs than mutations")
    returns = _typed(m, "returns_input", list, optional=True) or []
    _need(len(returns) in (0, len(outputs) - len(mutations)), "returns_input",
          f"expected {len(outputs) - len(mutations)} entries, got {len(returns)}")
    for i, k in enumerate(returns):
        _need(k is None or (_is_int(k) and 0 <= k < len(inputs) and kinds[k] == "tensor"),
              f"returns_input[{i}]", f"expected null or a tensor input's index, got {k!r}")
    _spec(m, "in_spec", len(inputs))
    _spec(m, "out_spec", len(outputs) - len(mutations))
    keys = _kernel_calls(m)
    wpc = m.get("whole_program_call")
    _need(wpc is None or _one_of(wpc, keys), "whole_program_call",
          f"names {wpc!r}, which is not a kernel call key")
    placements = _typed(m, "placements", list)
    for i, p in enumerate(placements):
        f = f"placements[{i}]"
        _need(isinstance(p, dict) and isinstance(p.get("op"), str)
              and _one_of(p.get("where"), ("compiled", "kernel_call")), f,
              "expected {op, where: compiled|kernel_call, ...}")
        for key in ("reason", "location", "node"):
            _need(p.get(key) is None or isinstance(p[key], str), f"{f}.{key}",
                  "expected a string or null")
        flops = p.get("flops")
        _need(flops is None or (isinstance(flops, (int, float)) and not isinstance(flops, bool)),
              f"{f}.flops", "expected a number or null")
        _need(p.get("key") is None or isinstance(p["key"], str), f"{f}.key",
              "expected a string or null")
    ex = m.get("executor")
    _need(ex is None or isinstance(ex, dict), "executor", "expected an object or null")
    _constants(m, constants_len)
    _cpu(m)
    _symbols(m, inputs)
    _host_program(m, len(inputs))
    _specialized(m)
    for key, types in (("compile_seconds", (int, float)), ("folded_ops", int),
                       ("policy", dict), ("region", dict)):
        v = m.get(key)
        _need(v is None or (isinstance(v, types) and not isinstance(v, bool)), key,
              f"expected {_names(types)}, got {type(v).__name__}")


def _cpu(m: dict) -> None:
    """``cpu`` (``aot.toolchain.cpu_targets.CpuTarget``): what the host is checked against."""
    cpu = m.get("cpu")
    if cpu is None:
        return
    _need(isinstance(cpu, dict), "cpu", "expected an object or null")
    for key in ("arch", "triple", "cpu"):
        _need(isinstance(cpu.get(key), str) and cpu[key], f"cpu.{key}", "expected a name")
    feats = cpu.get("features")
    _need(isinstance(feats, list) and all(isinstance(f, str) for f in feats), "cpu.features",
          "expected a list of feature names")
    _need(isinstance(cpu.get("host"), bool), "cpu.host", "expected true or false")


def _specialized(m: dict) -> None:
    """``specialized`` (aot.tuning.specialize): the entry function and, per symbol of the
    ``symbols`` table, the example size it serves."""
    spec = m.get("specialized")
    if spec is None:
        return
    _need(isinstance(spec, dict), "specialized", "expected an object or null")
    if not spec.get("kept"):
        return
    _need(isinstance(spec.get("function"), str) and spec["function"] != "main",
          "specialized.function", "expected the name of a function other than main")
    at, symbols = spec.get("at"), m.get("symbols") or {}
    _need(isinstance(at, dict) and set(at) == set(symbols) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in at.values()),
        "specialized.at", "expected an integer size for each symbol of the symbols table")


def check_manifest(manifest: dict, constants_len: int, path: str) -> None:
    """Raise ``ArtifactError`` naming the first field of ``manifest`` that is malformed."""
    try:
        _checks(manifest, constants_len)
    except _Bad as e:
        raise ArtifactError(f"{path!r}: malformed manifest field {e}", stage="load") from None


def reading(path: str, what: str, fn: Callable[[], Any]) -> Any:
    """``fn()``; an exception that is not an ``AotError`` becomes an ``ArtifactError``
    naming ``what`` (a last line of defence behind ``check_manifest``)."""
    try:
        return fn()
    except AotError:
        raise
    except Exception as e:  # noqa: BLE001
        raise ArtifactError(f"{path!r}: malformed manifest ({what}: {type(e).__name__}: {e})",
                            stage="load") from e
