"""The pieces of dynamic shapes: symbol tables, symbolic sizes, their evaluation, the CLI form."""

from __future__ import annotations

import json

import pytest
import torch
from torch.export import Dim

import aot
from aot.cli import main as cli_main, parse_dynamic
from aot.errors import ArtifactError, InputMismatch
from aot.fallback import static_values
from aot.importer import ImportOptions, import_model
from aot.symbolic import bind_inputs, evaluate, free_symbols
from aot.torch_tensor import TorchTensor


class Attn(torch.nn.Module):
    def forward(self, x, y):
        return (x.transpose(1, 2) @ y).reshape(x.shape[0], -1)


def _imported():
    b, s = Dim("batch", min=2, max=64), Dim("seq", min=4, max=512)
    return import_model(Attn(), (torch.randn(3, 8, 4), torch.randn(3, 8, 5)),
                        options=ImportOptions(dynamic_shapes=({0: b, 1: s}, {0: b, 1: s})))


def test_symbol_table_names_ranges_examples_and_binding_dimensions():
    imp = _imported()
    table = {e["name"]: e for e in imp.symbols.values()}
    assert table["batch"]["min"] == 2 and table["batch"]["max"] == 64
    assert table["batch"]["example"] == 3 and table["seq"]["example"] == 8
    assert table["seq"]["binds"] == [{"input": 0, "name": "args[0]", "dim": 1},
                                     {"input": 1, "name": "args[1]", "dim": 1}]
    b, s = (next(k for k, e in imp.symbols.items() if e["name"] == n) for n in ("batch", "seq"))
    x = imp.flat_inputs[0]
    assert x.shape == (b, s, 4) and x.strides == (f"4*{s}", 4, 1) and x.is_symbolic
    assert x.is_contiguous and x.memory_format == "contiguous"
    assert imp.outputs[0].shape == (b, 20)
    # the JSON form round-trips, and binds to the static spec of one call
    assert TorchTensor.from_json(json.loads(json.dumps(x.to_json()))) == x
    bound = x.bind({b: 5, s: 7})
    assert bound.shape == (5, 7, 4) and bound.strides == (28, 4, 1) and not bound.is_symbolic


def test_static_program_has_no_symbols():
    imp = import_model(Attn(), (torch.randn(3, 8, 4), torch.randn(3, 8, 5)))
    assert imp.symbols == {} and not imp.flat_inputs[0].is_symbolic


@pytest.mark.parametrize("expr,env,want", [
    ("s0", {"s0": 7}, 7), ("768*s1", {"s1": 3}, 2304), ("s0*s1 + 2", {"s0": 2, "s1": 5}, 12),
    ("FloorDiv(s0, 2)", {"s0": 9}, 4), ("CeilDiv(s0, 2)", {"s0": 9}, 5),
    ("Max(s0, 8)", {"s0": 3}, 8), ("Mod(s0, 4)", {"s0": 10}, 2), ("-s0 + 10", {"s0": 3}, 7),
])
def test_size_expressions_evaluate(expr, env, want):
    assert evaluate(expr, env) == want
    assert free_symbols(expr) <= set(env)


def test_a_size_expression_outside_the_grammar_is_an_artifact_error():
    with pytest.raises(ArtifactError, match="not a size expression"):
        evaluate("__import__('os')", {})
    with pytest.raises(ArtifactError, match="names 's9', which no input binds"):
        evaluate("s9 + 1", {"s0": 1})


def test_symbolic_sizes_follow_the_static_value_contract():
    v = [static_values.SymSize("s0"), 512]
    enc = json.loads(json.dumps(static_values.encode(v)))
    assert enc == {"list": [{"size": "s0"}, 512]}
    dec = static_values.decode(enc)
    assert dec == v and static_values.has_sym_size(dec)
    assert static_values.resolve_sizes(dec, {"s0": 6}) == [6, 512]


def test_bind_inputs_checks_ranges_and_agreement():
    imp = _imported()
    specs, names = imp.flat_inputs, imp.input_names
    env = bind_inputs(imp.symbols, specs, [torch.empty(4, 9, 4), torch.empty(4, 9, 5)], names)
    assert sorted(env.values()) == [4, 9]
    with pytest.raises(InputMismatch, match=r"args\[0\] dimension 1 is 600, outside the range "
                                            r"it was compiled for: seq in 4\.\.512"):
        bind_inputs(imp.symbols, specs, [torch.empty(4, 600, 4), torch.empty(4, 600, 5)], names)
    with pytest.raises(InputMismatch, match=r"args\[1\] dimension 0 is 5, but args\[0\] "
                                            r"dimension 0 is 4: both are the symbol batch"):
        bind_inputs(imp.symbols, specs, [torch.empty(4, 9, 4), torch.empty(5, 9, 5)], names)


def test_cli_dynamic_short_form():
    class Two(torch.nn.Module):
        def forward(self, x, mask):
            return x
    dyn = parse_dynamic(["x:0=batch:1..64", "mask:0=batch", "1:1=seq:8..512"], Two(), 2)
    assert dyn[0][0] is dyn[1][0] and dyn[0][0].__name__ == "batch"
    assert (dyn[0][0].min, dyn[0][0].max) == (1, 64)
    assert dyn[1][1].__name__ == "seq" and (dyn[1][1].min, dyn[1][1].max) == (8, 512)
    for bad, msg in [("x:0=batch", "give batch's range on its first entry"),
                     ("y:0=b:1..4", "no input 'y'"), ("x:0=b:9..4", "expected INPUT:DIM=NAME"),
                     ("x0=b:1..4", "expected INPUT:DIM=NAME")]:
        with pytest.raises(SystemExit, match=msg):
            parse_dynamic([bad], Two(), 2)


def test_cli_compiles_and_runs_a_dynamic_artifact(tmp_path, capsys):
    src = tmp_path / "mymodel.py"
    src.write_text("import torch\n"
                   "def make():\n"
                   "    torch.manual_seed(0)\n"
                   "    return torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.GELU())\n")
    out = str(tmp_path / "m.aot")
    assert cli_main(["compile", f"{src}:make", "--input-shape", "2,5", "--dynamic",
                     "0:0=rows:1..100", "-o", out]) == 0
    assert cli_main(["run", out, "--repeat", "1"]) == 0
    assert "output 0: float32[2, 3]" in capsys.readouterr().out
    namespace: dict = {}
    exec(src.read_text(), namespace)
    model, cm = namespace["make"]().eval(), aot.load(out)
    for n in (1, 77, 100):
        x = torch.randn(n, 5)
        with torch.no_grad():
            torch.testing.assert_close(cm(x), model(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(InputMismatch, match="rows in 1..100"):
        cm(torch.randn(101, 5))


def test_a_compile_that_fixed_a_dynamic_dimension_is_refused():
    from types import SimpleNamespace
    from aot.errors import CompileFailed
    from aot.backend.build import _check_dynamic_signature
    imp = _imported()
    good = ("  func.func @main(%arg0: !torch.vtensor<[?,?,4],f32>, %arg1: !torch.vtensor<[?,?,5],"
            "f32>) -> !torch.vtensor<[?,20],f32> {")
    _check_dynamic_signature(SimpleNamespace(imported=imp, mlir=good))
    fixed = good.replace("-> !torch.vtensor<[?,20]", "-> !torch.vtensor<[3,20]")
    with pytest.raises(CompileFailed, match="lost a dynamic dimension"):
        _check_dynamic_signature(SimpleNamespace(imported=imp, mlir=fixed))


def test_symbolic_specs_know_their_memory_format():
    cl = TorchTensor("float32", ("s0", 3, "s1", 5), ("15*s1", 1, 15, 3))
    assert cl.memory_format == "channels_last" and not cl.is_contiguous
    dense = TorchTensor("float32", ("s0", 3, "s1", 5), ("15*s1", "5*s1", 5, 1))
    assert dense.is_contiguous and dense.dense() == dense
    assert cl.dense().strides == ("15*s1", "5*s1", 5, 1)
    assert cl.bind({"s0": 2, "s1": 4}).memory_format == "channels_last"
    assert cl.numel is None and cl.bind({"s0": 2, "s1": 4}).numel == 120


def test_cli_dynamic_batch_on_a_batch_1_example(tmp_path, caplog):
    """A bundled model's example has batch 1: the import exports with 2, and says so."""
    src = tmp_path / "one.py"
    src.write_text("import torch\n"
                   "def make():\n"
                   "    torch.manual_seed(0)\n"
                   "    return torch.nn.Linear(6, 2).eval(), (torch.randn(1, 6),)\n")
    out = str(tmp_path / "one.aot")
    assert cli_main(["compile", f"{src}:make", "--dynamic", "input:0=batch:1..16", "-o", out]) == 0
    assert "exporting with 2" in caplog.text
    namespace: dict = {}
    exec(src.read_text(), namespace)
    model, cm = namespace["make"]()[0], aot.load(out)
    for n in (1, 16):
        x = torch.randn(n, 6)
        with torch.no_grad():
            torch.testing.assert_close(cm(x), model(x), rtol=1e-5, atol=1e-5)


class Varargs(torch.nn.Module):
    def forward(self, x, *rest):
        return x.sum() + sum(r.sum() for r in rest)


def test_dynamic_shapes_of_varargs_follow_each_extra_argument():
    """torch.export takes one tuple of specs for ``*rest``: each spec belongs to one extra
    argument, not to the dimensions of the first (which would widen a batch of 1 to 2)."""
    from aot.importer.dynamic import declared_dims
    n = Dim("n", min=1, max=16)
    args = (torch.randn(1, 3), torch.randn(1, 2, 5), torch.randn(1, 2, 5))
    got = declared_dims(Varargs(), args, {}, (None, ({2: n}, {2: n})))
    assert got == {(1, 2): n, (2, 2): n}
    imp = import_model(Varargs(), args,
                       options=ImportOptions(dynamic_shapes=(None, ({2: n}, {2: n}))))
    assert [e["name"] for e in imp.symbols.values()] == ["n"]
    assert imp.flat_inputs[1].shape[:2] == (1, 2)
