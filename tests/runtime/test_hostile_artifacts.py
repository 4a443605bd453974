"""Hostile artifacts: files edited by hand as an attacker would (the format-3 digest
recomputed, as anyone can). Each attack must be an ``ArtifactError`` at load, with no
side effect: no file written or read, no module imported, no library loaded, nothing
printed. docs/security.md lists what loading checks."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest
import torch

import aot
from artifact_edit import manifest_of, rewrite, setter, write_with_manifest

try:  # imported before any test watches for libraries being loaded
    import torchvision  # noqa: F401  (registers image::write_file)
except ImportError:
    torchvision = None

SENTINEL_MODULE = "aot_hostile_sentinel"


class Grouped(torch.nn.Module):
    """Two neighbouring kernel calls (one group); gelu's ``approximate`` is keyword-only."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.nn.functional.gelu(self.lin(x)) * 2 + 1


class Picks(torch.nn.Module):
    """A data-dependent shape: the whole program is one host program."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        return (x * self.w)[x > 0] * 2


@pytest.fixture(scope="module")
def x():
    return torch.randn(2, 4)


@pytest.fixture(scope="module")
def grouped(tmp_path_factory, x):
    torch.manual_seed(0)
    m = Grouped().eval()
    cm = aot.compile(m, (x,), placement="coverage", fallback_ops=["aten.linear", "aten.gelu"])
    assert [k["op"] for k in cm.manifest["kernel_calls"]] == ["aot::group"]
    path = str(tmp_path_factory.mktemp("grouped") / "g.aot")
    cm.save(path)
    return path, m


@pytest.fixture(scope="module")
def program(tmp_path_factory, x):
    torch.manual_seed(0)
    m = Picks().eval()
    cm = aot.compile(m, (x,))
    assert cm.manifest.get("host_program")
    path = str(tmp_path_factory.mktemp("program") / "p.aot")
    cm.save(path)
    return path, m


@pytest.fixture(scope="module")
def dynamic(tmp_path_factory):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    cm = aot.compile(m, (torch.randn(3, 4),), dynamic_shapes=({0: batch},),
                     placement="coverage")
    assert isinstance(cm.manifest["inputs"][0]["shape"][0], str)
    path = str(tmp_path_factory.mktemp("dynamic") / "d.aot")
    cm.save(path)
    return path, m


@pytest.fixture
def watched(tmp_path, capfd, monkeypatch):
    """Side effects an attack could have, checked after the test body ran."""
    victim = tmp_path / "victim.txt"
    secret = tmp_path / "secret.txt"
    secret.write_text("secret contents")
    mod_dir = tmp_path / "mods"
    mod_dir.mkdir()
    marker = tmp_path / "imported.txt"
    (mod_dir / f"{SENTINEL_MODULE}.py").write_text(
        f"open({str(marker)!r}, 'w').write('imported')\n")
    monkeypatch.syspath_prepend(str(mod_dir))
    libs = set(torch.ops.loaded_libraries)
    secret_atime = os.stat(secret).st_atime_ns
    capfd.readouterr()
    yield {"victim": str(victim), "secret": str(secret), "marker": str(marker),
           "tmp": tmp_path}
    out, err = capfd.readouterr()
    assert not victim.exists(), "the artifact wrote a file"
    assert not marker.exists() and SENTINEL_MODULE not in sys.modules, "a module was imported"
    assert set(torch.ops.loaded_libraries) == libs, "a library was loaded"
    assert os.stat(secret).st_atime_ns == secret_atime or not _reads_recorded(tmp_path), \
        "a file was read"
    assert out == "" and err == "", f"something was printed: {out!r} {err!r}"


def _reads_recorded(tmp_path) -> bool:
    """Whether this file system updates access times (noatime mounts do not)."""
    probe = tmp_path / "atime_probe"
    probe.write_text("x")
    before = os.stat(probe).st_atime_ns
    time.sleep(0.01)
    probe.read_text()
    return os.stat(probe).st_atime_ns != before


def _refused(path: str, match: str) -> aot.ArtifactError:
    with pytest.raises(aot.ArtifactError, match=match) as e:
        aot.load(path)
    return e.value


def _with_node(node: dict, at: int = 0):
    """An edit putting ``node`` into the host program's nodes."""
    def edit(m):
        m["host_program"]["nodes"].insert(at, node)
    return edit


def _member(m: dict, j: int) -> dict:
    return m["kernel_calls"][0]["members"][j]


# -- 1. only what the compiler can emit resolves -----------------------------------------

def test_host_program_cannot_import_a_module(program, watched):
    node = {"name": "evil", "target": "import_module::__call__.__call__",
            "args": [SENTINEL_MODULE], "kwargs": {}}
    bad = rewrite(program[0], str(watched["tmp"] / "a.aot"), _with_node(node))
    _refused(bad, r"nodes\[0\]\.target")


def test_kernel_call_cannot_load_a_library(grouped, watched):
    lib = watched["tmp"] / "evil.so"
    lib.write_bytes(b"\x7fELF not really")

    def edit(m):
        mem = _member(m, 1)
        mem["op"], mem["overload"] = "load_library::__call__", "__call__"
        mem["operands"] = [{"kind": "static", "name": "path", "type": "str",
                            "value": str(lib), "kwarg_only": False}]
    bad = rewrite(grouped[0], str(watched["tmp"] / "a.aot"), edit)
    _refused(bad, r"members\[1\]\.op")


@pytest.mark.parametrize("shared", [True, False])
def test_from_file_is_refused(program, watched, shared):
    """``from_file(path, shared=True)`` + ``copy_`` writes any file; ``shared=False``
    reads one into an output."""
    target = watched["victim"] if shared else watched["secret"]

    def edit(m):
        nodes = m["host_program"]["nodes"]
        nodes.insert(0, {"name": "f", "target": "aten::from_file.default",
                         "args": [target, shared, 16], "kwargs": {}})
        nodes.insert(1, {"name": "w", "target": "aten::copy_.default",
                         "args": [{"node": "f"}, {"node": "x"}], "kwargs": {}})
        m["host_program"]["outputs"] = [{"node": "f"}]
    bad = rewrite(program[0], str(watched["tmp"] / "a.aot"), edit)
    _refused(bad, r"aten::from_file")


@pytest.mark.parametrize("target,match", [
    ("aten::_print.default", "prints: an artifact never runs it"),
    ("aten::save.default", "not registered"),          # TorchScript builtin, no ATen kernel
    ("aten::format.default", "not registered"),
    ("profiler::_record_function_enter.default", "runtime internals"),
    ("streams::synchronize_device.default", "runtime internals"),
    ("aten::add.__class__", "not an op name"),
    ("aten::add.Tensor.__globals__", "not an op name"),
    ("aten::add.Tensor\n", "not an op name"),
    ("nosuchlib::op.default", "custom-op namespace"),
    ("py:os.system", "not one of the Python functions"),
    ("py:builtins.eval", "not one of the Python functions"),
    ("py:builtins.__import__", "not one of the Python functions"),
])
def test_host_program_names_only_ops_the_compiler_emits(program, watched, target, match):
    node = {"name": "evil", "target": target, "args": ["hello"], "kwargs": {}}
    bad = rewrite(program[0], str(watched["tmp"] / "a.aot"), _with_node(node))
    _refused(bad, match)


def test_an_op_taking_a_path_is_refused(grouped, watched):
    """torchvision registers ``image::write_file(str filename, Tensor data)``."""
    if torchvision is None:
        pytest.skip("torchvision is not installed")

    def edit(m):
        mem = _member(m, 1)
        mem["op"], mem["overload"] = "image::write_file", "default"
    bad = rewrite(grouped[0], str(watched["tmp"] / "a.aot"), edit)
    _refused(bad, "writes a file|takes a path")


@pytest.mark.parametrize("args,match", [
    ([10, 10 ** 18], "exponent"),                      # pow(10, 10**18): hangs
    ([{"list": [0]}, 10 ** 12], "numbers"),            # [0] * 10**12: exhausts memory
    (["9" * 4000, 2], "numbers"),                      # strings into int arithmetic
])
def test_py_functions_refuse_unbounded_operands(program, watched, args, match):
    target = "py:operator.pow" if args[0] == 10 else "py:operator.mul"
    node = {"name": "evil", "target": target, "args": args, "kwargs": {}}
    bad = rewrite(program[0], str(watched["tmp"] / "a.aot"), _with_node(node))
    _refused(bad, match)


def test_py_function_guard_at_run_time():
    """Operands only known at run time pass the same guard when the node runs."""
    from aot.op_table import py_function
    with pytest.raises(ValueError, match="exponent"):
        py_function("operator.pow")(10, 10 ** 18)
    with pytest.raises(ValueError, match="int64"):
        py_function("operator.mul")(2 ** 62, 2 ** 62)
    assert py_function("operator.floordiv")(7, 2) == 3


_LEAF = {"type": None, "context": None, "children_spec": []}


@pytest.mark.parametrize("node", [
    # torch's pytree reader imports a defaultdict's default_factory module...
    {"type": "collections.defaultdict", "children_spec": [_LEAF],
     "context": {"default_factory_module": SENTINEL_MODULE, "default_factory_name": "x",
                 "dict_context": ["a"]}},
    # ...and the module of an Enum key in a context
    {"type": "builtins.dict", "children_spec": [_LEAF],
     "context": json.dumps([{"__enum__": True, "fqn": f"{SENTINEL_MODULE}:E", "name": "A"}])},
], ids=["defaultdict-factory", "enum-key"])
def test_pytree_spec_cannot_import_a_module(grouped, watched, node):
    bad = rewrite(grouped[0], str(watched["tmp"] / "a.aot"),
                  setter(("out_spec",), json.dumps([1, node])))
    _refused(bad, "out_spec: holds")


def test_custom_namespace_must_be_registered(grouped, watched):
    bad = rewrite(grouped[0], str(watched["tmp"] / "a.aot"),
                  setter(("kernel_calls", 0, "members", 1, "op"), "not_imported_lib::gelu"))
    _refused(bad, "import the library that defines it")


# -- 2. no manifest string is source code --------------------------------------------------

def test_kernel_call_key_is_never_source(grouped, watched):
    key = "call_0(env):\n    open(%r, 'w')\ndef f" % watched["victim"]
    bad = rewrite(grouped[0], str(watched["tmp"] / "a.aot"),
                  setter(("kernel_calls", 0, "key"), key))
    _refused(bad, r"kernel_calls\[0\]\.key")


def test_keyword_operand_name_is_never_source(grouped, watched):
    name = f"x=open({watched['victim']!r}, 'w'),y"
    bad = rewrite(grouped[0], str(watched["tmp"] / "a.aot"),
                  setter(("kernel_calls", 0, "members", 1, "operands", 1, "name"), name))
    _refused(bad, r"operands\[1\]\.name")


def test_keyword_operand_must_be_an_argument_of_the_op(grouped, watched):
    bad = rewrite(grouped[0], str(watched["tmp"] / "a.aot"),
                  setter(("kernel_calls", 0, "members", 1, "operands", 1, "name"), "mode"))
    _refused(bad, "not an argument of")


def test_group_output_slot_is_never_source(grouped, watched):
    slot = f"4]; open({watched['victim']!r}, 'w'); ["
    bad = rewrite(grouped[0], str(watched["tmp"] / "a.aot"),
                  setter(("kernel_calls", 0, "output_slots"), [slot]))
    _refused(bad, r"output_slots")


def test_symbolic_size_is_never_python(dynamic, watched):
    """A stride reached ``sympy.sympify`` (which evaluates text as Python) when the
    module checked the layout; the size grammar admits no call, attribute or name
    starting with an underscore."""
    code = f"__import__('builtins').open({watched['victim']!r}, 'w').close() or 4"
    bad = rewrite(dynamic[0], str(watched["tmp"] / "a.aot"),
                  setter(("inputs", 0, "strides", 0), code))
    _refused(bad, r"inputs\[0\]\.strides")


# -- 3. every size is bounded at load -----------------------------------------------------

@pytest.mark.parametrize("expr", ["9**9**9**9", "s0**99", "2**s0", "s0" + "+s0" * 100_000,
                                  "s0.__class__", "(lambda: 4)()", "[s0][0]", "s0 if 1 else 2"])
def test_symbolic_size_grammar(dynamic, watched, expr):
    bad = rewrite(dynamic[0], str(watched["tmp"] / "a.aot"),
                  setter(("inputs", 0, "shape", 0), expr))
    _refused(bad, r"inputs\[0\]\.shape")


def test_symbolic_size_evaluation_is_bounded():
    from aot.symbolic import evaluate
    with pytest.raises(aot.ArtifactError, match="beyond int64"):
        evaluate("s0*s0*s0*s0*s0", {"s0": 2 ** 40})
    with pytest.raises(aot.ArtifactError, match="cannot be evaluated"):
        evaluate("FloorDiv(s0, s0 - 3)", {"s0": 3})
    assert evaluate("FloorDiv(s0, 2) + s0**2", {"s0": 5}) == 27


def test_manifest_nested_deeply(grouped, watched):
    m = manifest_of(grouped[0])
    deep = b"[" * 100_000 + b"]" * 100_000
    body = json.dumps(m).encode()[:-1] + b', "extra": ' + deep + b"}"
    bad = write_with_manifest(grouped[0], str(watched["tmp"] / "a.aot"), body)
    _refused(bad, "nest|not valid JSON")


def test_manifest_nested_past_the_depth_limit(grouped, watched):
    """Deep enough for Python's decoder, too deep for this runtime's recursive readers."""
    v: object = 1
    for _ in range(100):
        v = {"list": [v]}
    bad = rewrite(grouped[0], str(watched["tmp"] / "a.aot"),
                  setter(("kernel_calls", 0, "members", 1, "operands", 1, "value"), v))
    _refused(bad, "nests deeper than")


def test_pytree_spec_nested_deeply(grouped, watched):
    spec = '[1, ' + '{"type": "builtins.tuple", "context": "null", "children_spec": [' * 3000 \
        + '{"type": null, "context": null, "children_spec": []}' + ']}' * 3000 + ']'
    bad = rewrite(grouped[0], str(watched["tmp"] / "a.aot"), setter(("out_spec",), spec))
    _refused(bad, "out_spec")


def test_long_size_string(dynamic, watched):
    bad = rewrite(dynamic[0], str(watched["tmp"] / "a.aot"),
                  setter(("inputs", 0, "shape", 0), "s" * 200_000))
    _refused(bad, r"inputs\[0\]\.shape")


@pytest.mark.parametrize("field,value,match", [
    (("outputs", 0, "shape"), [2 ** 40, 2 ** 40], r"outputs\[0\]\.shape"),
    (("outputs", 0, "shape"), [2 ** 70, 1], "outside int64"),
    (("outputs", 0, "strides"), [-4, 1], r"outputs\[0\]\.strides"),
    (("outputs", 0, "strides"), [2 ** 50, 1], r"outputs\[0\]\.shape"),
    (("outputs", 0), {"dtype": "float32", "shape": [1] * 65, "strides": [1] * 65},
     r"outputs\[0\]\.shape"),
    (("kernel_calls", 0, "members", 0, "results", 0, "shape"), [2 ** 31, 2 ** 31],
     r"results\[0\]\.shape"),
    (("kernel_calls", 0, "members", 1, "operands", 1, "value"), 2 ** 64, "outside int64"),
])
def test_sizes_bounded(grouped, watched, field, value, match):
    bad = rewrite(grouped[0], str(watched["tmp"] / "a.aot"), setter(field, value))
    _refused(bad, match)


def test_symbol_range(dynamic, watched):
    def edit(m):
        (entry,) = m["symbols"].values()
        entry["min"] = -5
    bad = rewrite(dynamic[0], str(watched["tmp"] / "a.aot"), edit)
    _refused(bad, "symbols")


def test_host_constant_relayout_bounded(program, watched):
    """A constant is laid out with its recorded strides at load: huge strides would
    allocate terabytes there."""
    bad = rewrite(program[0], str(watched["tmp"] / "a.aot"),
                  setter(("host_program", "inputs", 0, "strides"), [2 ** 45]))
    _refused(bad, r"host_program\.inputs\[0\]\.strides")


def test_control_characters_refused(grouped, watched):
    """A report prints locations and reasons: no terminal escape sequence gets there."""
    bad = rewrite(grouped[0], str(watched["tmp"] / "a.aot"),
                  setter(("placements", 0, "location"), "model.py:1\x1b]0;owned\x07"))
    _refused(bad, "control character")


# -- the unedited artifacts still load and match eager -------------------------------------

def test_unedited_artifacts_run(grouped, program, dynamic, x):
    for path, m in (grouped, program):
        with torch.no_grad():
            want = m(x)
        torch.testing.assert_close(aot.load(path)(x), want, rtol=1e-5, atol=1e-5)
    path, m = dynamic
    x5 = torch.randn(5, 4)
    with torch.no_grad():
        torch.testing.assert_close(aot.load(path)(x5), m(x5), rtol=1e-5, atol=1e-5)


# -- the compiled module's parameters ----------------------------------------------------

@pytest.fixture(scope="module")
def weighted(tmp_path_factory):
    """A compiled module that reads its weights as parameters (two of them)."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(),
                            torch.nn.Linear(32, 64)).eval()
    x = torch.randn(3, 64)
    cm = aot.compile(m, (x,), placement="coverage")
    assert sorted(cm.manifest.parameters) == ["p0", "p1"]
    torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-5)
    path = str(tmp_path_factory.mktemp("weighted") / "w.aot")
    cm.save(path)
    return path, m, x


def _without(key):
    def edit(m):
        del m["parameters"][key]
    return edit


def _resized(m):  # p1 one row shorter: a consistent table entry IREE's global disagrees with
    d = m["parameters"]["p1"]
    d["shape"][0] -= 1
    d["nbytes"] = d["shape"][0] * d["shape"][1] * 4


@pytest.mark.parametrize("edit, match", [
    (setter(["parameters", "p0", "offset"], 1 << 40), r"parameters\.p0\.offset"),
    (setter(["parameters", "p0", "offset"], 3), r"parameters\.p0\.offset.*aligned"),
    (setter(["parameters", "p0", "nbytes"], 4), r"parameters\.p0\.nbytes"),
    (setter(["parameters", "p0", "dtype"], "int64"), r"parameters\.p0\.dtype"),
    (setter(["parameters", "p0", "shape"], "x" * 10), r"parameters\.p0\.shape"),
    (setter(["parameters", "../etc"], {"dtype": "float32", "shape": [1], "offset": 0,
                                       "nbytes": 4}), r"parameters\.\.\./etc|parameters\.\.\./"),
    (setter(["parameters"], ["p0"]), r"parameters"),
    (_without("p1"), r"could not load"),
    (_resized, r"could not load"),
])
def test_parameter_table_edited(weighted, tmp_path, edit, match):
    path, _, _ = weighted
    bad = rewrite(path, str(tmp_path / "bad.aot"), edit)
    with pytest.raises(aot.ArtifactError, match=match):
        aot.load(bad)


def test_parameters_load_and_run(weighted):
    path, m, x = weighted
    torch.testing.assert_close(aot.load(path)(x), m(x), rtol=1e-5, atol=1e-5)
