"""torch.cond and torch.while_loop run (issue 35): the host program runs the branch or
the loop body as sub-programs, op by op in ATen, bit for bit eager's; saved artifacts
load with them, and a malformed sub-program is refused at load."""

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


def test_cond_runs_either_branch_as_eager():
    torch.manual_seed(0)
    m, x = Cond().eval(), torch.randn(3, 4)
    cm = aot.compile(m, (x,))
    assert "hop:cond" in cm.manifest.host_program["reason"]
    for arg in (x.abs(), -x.abs()):  # each branch
        torch.testing.assert_close(cm(arg), m(arg), rtol=0, atol=0)


def test_while_loop_with_a_nested_cond_runs_as_eager(tmp_path):
    x, n = torch.randn(5), torch.tensor(7)
    m = Loop().eval()
    cm = aot.compile(m, (x, n))
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
    cm = aot.compile(Cond().eval(), (torch.randn(3, 4),))
    path = str(tmp_path / "cond.aot")
    cm.save(path)
    bad = _edit_host_program(path, str(tmp_path / "bad.aot"), edit)
    with pytest.raises(ArtifactError, match=match):
        aot.load(bad)
