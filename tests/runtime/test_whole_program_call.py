"""A program that is one kernel call runs its host function directly, not through the VM."""

import pytest
import torch

import aot
from aot.artifact import CompiledArtifact
from aot.runtime.module import CompiledModule


class TwoOut(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x, y):
        h = torch.relu(self.fc(x)) * y
        return h.sum(-1), h.t()              # two outputs, one of them strided


def _through_vm(cm) -> CompiledModule:
    a = cm.artifact
    return CompiledModule(CompiledArtifact(a.vmfb, {**a.manifest, "whole_program_call": None},
                                           a.constants))


def test_single_call_program_runs_directly_and_matches_the_vm_path(tmp_path):
    torch.manual_seed(0)
    m = TwoOut().eval()
    x, y = torch.randn(4, 16), torch.randn(4, 16)
    cm = aot.compile(m, (x, y), fallback="all")
    assert cm.manifest["whole_program_call"] == cm.manifest["kernel_calls"][0]["key"]
    assert cm._direct is not None
    vm = _through_vm(cm)
    assert vm._direct is None
    with torch.no_grad():
        ref = m(x, y)
        for got in (cm(x, y), vm(x, y), aot.load(_saved(cm, tmp_path))(x, y)):
            for g, r in zip(got, ref):
                torch.testing.assert_close(g, r, rtol=0, atol=0)  # all-fallback: bit-exact
                assert g.stride() == r.stride()
    assert cm.kernel_call_count == 1


def _saved(cm, tmp_path) -> str:
    path = str(tmp_path / "m.aot")
    cm.save(path)
    return path


def test_direct_call_checks_inputs_like_the_vm_path():
    m = TwoOut().eval()
    x, y = torch.randn(4, 16), torch.randn(4, 16)
    cm = aot.compile(m, (x, y), fallback="all")
    with pytest.raises(aot.InputMismatch, match="shape"):
        cm(x, torch.randn(4, 17))
    with pytest.raises(aot.InputMismatch, match="dtype"):
        cm(x, y.double())
    with pytest.raises(aot.InputMismatch):
        cm(x)


def test_programs_with_compiled_code_go_through_the_vm():
    m = TwoOut().eval()
    x, y = torch.randn(4, 16), torch.randn(4, 16)
    cm = aot.compile(m, (x, y), fallback_ops=["aten.linear"])
    assert cm.manifest["whole_program_call"] is None and cm._direct is None
    with torch.no_grad():
        torch.testing.assert_close(cm(x, y)[0], m(x, y)[0], rtol=1e-5, atol=1e-5)


def test_kernel_call_errors_surface_from_a_direct_call():
    class Bad(torch.nn.Module):
        def forward(self, x):
            return torch.ops.aten.special_i0(x)
    cm = aot.compile(Bad(), (torch.randn(3),), fallback="all")
    assert cm._direct is not None
    fn = cm.host.functions[cm.manifest["whole_program_call"]]
    fn.call = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom"))
    with pytest.raises(aot.KernelCallFailed, match="boom"):
        cm(torch.randn(3))
