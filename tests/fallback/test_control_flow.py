"""torch.cond and torch.while_loop run (issue 35). Control flow is compiled (a loop or a
branch of the compiled module), the ops of its condition and body, or of its branches,
placed like any others: compiled, or kernel calls the loop or the branch calls; control
flow nested in it too. Under fallback="all" the host program runs it, the branch or the
loop body a sub-program, op by op in ATen, bit for bit eager's. Saved
artifacts load with either, and a malformed sub-program is refused at load."""

import json

import pytest
import torch

import aot
from aot.errors import ArtifactError


class Cond(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        def yes(x, w):
            return (x @ w).sin() * 2

        def no(x, w):
            return x.cos() + w.sum()
        return torch.cond(x.sum() > 0, yes, no, (x, self.w)) + 1


class Loop(torch.nn.Module):
    def forward(self, x, n):
        def cond_fn(i, y):
            return i < n  # n: an additional input of the loop

        def body_fn(i, y):
            # a cond inside the loop body: nested graphs
            y = torch.cond(y.sum() > 100, lambda y: y / 2, lambda y: y * 2 + 1, (y,))
            return i + 1, y
        i, y = torch._higher_order_ops.while_loop(cond_fn, body_fn, (torch.tensor(0), x))
        return y, i


class Recurrent(torch.nn.Module):
    """A loop whose body reads weights (the loop's additional inputs) and whose count is
    an input."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x, n):
        def cond_fn(i, h):
            return i < n

        def body_fn(i, h):
            return i + 1, torch.tanh(self.lin(h)) + h
        i, h = torch._higher_order_ops.while_loop(cond_fn, body_fn, (torch.tensor(0), x))
        return h * 2, i


def test_a_loop_of_ops_iree_lowers_is_compiled_whole(tmp_path):
    torch.manual_seed(0)
    m, x = Recurrent().eval(), torch.randn(2, 8)
    cm = aot.compile(m, (x, torch.tensor(3)), placement="coverage")  # compiled, unmeasured
    assert cm.manifest.host_program is None and not cm.manifest.kernel_calls
    rows = {p["node"]: p for p in cm.manifest.placements}
    body = [p for k, p in rows.items() if k.startswith("while_loop.")]
    assert {p["op"] for p in body} >= {"aten.linear.default", "aten.tanh.default"}
    # the user's line (the loop's), not the code FX generated for the body
    assert all("test_control_flow.py" in p["location"] for p in body), body
    assert all(p["where"] == "compiled" for p in rows.values())
    path = str(tmp_path / "loop.aot")
    cm.save(path)
    loaded = aot.load(path)
    with torch.no_grad():
        for n in (0, 1, 3, 7):  # no iteration too; another count than the example's
            want = m(x, torch.tensor(n))
            for module in (cm, loaded):
                h, i = module(x, torch.tensor(n))
                torch.testing.assert_close(h, want[0], rtol=1e-5, atol=1e-5)
                assert int(i) == n


def test_a_compiled_loop_races_the_host_program():
    """The host program is a loop program's ATen region: the placement never runs the
    compiled loop where running it op by op in ATen measured faster."""
    torch.manual_seed(0)
    m, x, n = Recurrent().eval(), torch.randn(2, 8), torch.tensor(3)
    cm = aot.compile(m, (x, n))
    region = cm.manifest.region
    assert {"iree", "aten"} <= set(region["candidates_ms"]), region
    with torch.no_grad():
        for g, w in zip(cm(x, n), m(x, n)):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_an_op_forced_to_aten_in_a_loop_is_a_kernel_call_of_the_loop(tmp_path):
    torch.manual_seed(0)
    m, x = Recurrent().eval(), torch.randn(2, 8)
    cm = aot.compile(m, (x, torch.tensor(3)), fallback_ops=["aten.tanh"], placement="coverage")
    assert cm.manifest.host_program is None
    rows = {p["node"]: p for p in cm.manifest.placements}
    tanh = [p for k, p in rows.items() if k.startswith("while_loop.") and "tanh" in p["op"]]
    assert [p["where"] for p in tanh] == ["kernel_call"] and tanh[0]["key"]
    assert [k["op"] for k in cm.manifest.kernel_calls] == ["aten::tanh"]
    path = str(tmp_path / "loop.aot")
    cm.save(path)
    with torch.no_grad():
        for module in (cm, aot.load(path)):
            for n in (0, 3, 5):  # the kernel call runs once per iteration
                h, i = module(x, torch.tensor(n))
                torch.testing.assert_close(h, m(x, torch.tensor(n))[0], rtol=1e-5, atol=1e-5)


def test_under_fallback_all_a_loop_runs_in_the_host_program():
    torch.manual_seed(0)
    m, x, n = Recurrent().eval(), torch.randn(2, 8), torch.tensor(3)
    cm = aot.compile(m, (x, n), fallback="all")
    assert "torch.while_loop" in cm.manifest.host_program["reason"]
    with torch.no_grad():
        for g, w in zip(cm(x, n), m(x, n)):
            torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_a_cond_of_ops_iree_lowers_is_compiled_whole(tmp_path):
    torch.manual_seed(0)
    m, x = Cond().eval(), torch.randn(3, 4)
    cm = aot.compile(m, (x,), placement="coverage")  # compiled, unmeasured
    assert cm.manifest.host_program is None and not cm.manifest.kernel_calls
    rows = {p["node"]: p for p in cm.manifest.placements}
    branches = {p["op"] for k, p in rows.items() if k.startswith("cond.")}
    assert {"aten.sin.default", "aten.cos.default"} <= branches
    assert all(p["where"] == "compiled" for p in rows.values())
    path = str(tmp_path / "cond.aot")
    cm.save(path)
    with torch.no_grad():
        for module in (cm, aot.load(path)):
            for arg in (x.abs(), -x.abs()):  # each branch
                torch.testing.assert_close(module(arg), m(arg), rtol=1e-5, atol=1e-5)


def test_an_op_forced_to_aten_in_a_branch_is_a_kernel_call_of_the_branch():
    torch.manual_seed(0)
    m, x = Cond().eval(), torch.randn(3, 4)
    cm = aot.compile(m, (x,), fallback_ops=["aten.sin"], placement="coverage")
    assert cm.manifest.host_program is None
    assert [k["op"] for k in cm.manifest.kernel_calls] == ["aten::sin"]
    for arg in (x.abs(), -x.abs()):  # each branch
        torch.testing.assert_close(cm(arg), m(arg), rtol=1e-5, atol=1e-5)


def test_under_fallback_all_cond_runs_either_branch_as_eager():
    torch.manual_seed(0)
    m, x = Cond().eval(), torch.randn(3, 4)
    cm = aot.compile(m, (x,), fallback="all")
    assert "torch.cond" in cm.manifest.host_program["reason"]
    for arg in (x.abs(), -x.abs()):  # each branch
        torch.testing.assert_close(cm(arg), m(arg), rtol=0, atol=0)


def test_a_loop_with_a_cond_in_its_body_is_compiled_and_runs_as_eager(tmp_path):
    x, n = torch.randn(5), torch.tensor(7)
    m = Loop().eval()
    cm = aot.compile(m, (x, n), placement="coverage")  # compiled, unmeasured
    assert cm.manifest.host_program is None
    rows = {p["node"]: p for p in cm.manifest.placements}
    assert rows["while_loop.cond"]["op"] == "hop:cond"  # the cond in the body, its own row
    assert any(k.startswith("while_loop.cond.") for k in rows)  # and its branches' ops
    for args in ((x, n), (x * 3, torch.tensor(2)), (x, torch.tensor(0))):
        got, want = cm(*args), m(*args)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
    path = str(tmp_path / "loop.aot")
    cm.save(path)
    loaded = aot.load(path)
    for g, w in zip(loaded(x, n), m(x, n)):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def _edit_host_program(path, dst, edit):
    from artifact_edit import manifest_of, write_with_manifest
    m = manifest_of(path)
    edit(m["host_program"])
    return write_with_manifest(path, dst, json.dumps(m).encode())


@pytest.mark.parametrize("edit, match", [
    (lambda hp: hp["graphs"].pop(next(iter(hp["graphs"]))), "missing"),
    (lambda hp: hp["nodes"][[n["target"] for n in hp["nodes"]].index("hop:cond")]["args"]
     .pop(), "takes 4 operands"),
    (lambda hp: hp["graphs"][next(iter(hp["graphs"]))]["nodes"][0].update(
        target="builtins.eval"), "target"),
    (lambda hp: hp["graphs"][next(iter(hp["graphs"]))]["inputs"][0].update(user=7),
     "operand index"),
])
def test_a_malformed_sub_program_is_refused_at_load(tmp_path, edit, match):
    torch.manual_seed(0)
    cm = aot.compile(Cond().eval(), (torch.randn(3, 4),), fallback="all")
    path = str(tmp_path / "cond.aot")
    cm.save(path)
    bad = _edit_host_program(path, str(tmp_path / "bad.aot"), edit)
    with pytest.raises(ArtifactError, match=match):
        aot.load(bad)
