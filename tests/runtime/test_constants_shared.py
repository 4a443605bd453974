"""Host-held constants are views of the artifact's own bytes, shared by every module
built from it (no per-load copy), and nothing a run does writes into them: the
artifact's constants hash the same after runs, and outputs stay eager's."""

import hashlib

import torch

import aot
from aot.artifact import load_artifact


class Mixed(torch.nn.Module):
    """Weights read by kernel calls (linear, layer norm) beside compiled ops, and a
    buffer the module updates in place."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.register_buffer("seen", torch.zeros(16))

    def forward(self, x):
        y = self.norm(self.lin(x).relu())
        self.seen.add_(y.sum(0))
        return y * 2 + self.seen


class Region(torch.nn.Module):
    """A data-dependent shape: the whole program is an ATen region (host program)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8))

    def forward(self, x):
        return (x * self.w)[x > 0] + self.w.sum()


def _runs_leave_constants_alone(model, example, tmp_path, **options):
    torch.manual_seed(0)
    eager = model()
    cm = aot.compile(eager, example, **options)
    assert cm.artifact.constants, "the test needs host-held constants"
    path = str(tmp_path / "m.aot")
    cm.save(path)
    art = load_artifact(path)
    digest = hashlib.sha256(art.constants).hexdigest()
    one, two = aot.load(path), aot.load(path)
    reference = model()
    reference.load_state_dict(eager.state_dict())
    for k in range(3):
        x = example[0] * (k + 1)
        want = reference(x)
        torch.testing.assert_close(one(x), want, rtol=1e-5, atol=1e-5)
    assert hashlib.sha256(one.artifact.constants).hexdigest() == digest
    assert hashlib.sha256(two.artifact.constants).hexdigest() == digest
    # the first module's buffer updates are its own: the second starts from the saved state
    torch.testing.assert_close(two(example[0]), model_after_one_call(model, eager, example),
                               rtol=1e-5, atol=1e-5)
    tensors = art.host_constants(torch.device("cpu"))
    again = art.host_constants(torch.device("cpu"))
    assert all(tensors[n].data_ptr() == again[n].data_ptr() for n in tensors if tensors[n].numel())


def model_after_one_call(model, eager, example):
    fresh = model()
    fresh.load_state_dict(eager.state_dict())
    return fresh(example[0])


def test_kernel_call_constants_are_not_written(tmp_path):
    _runs_leave_constants_alone(lambda: Mixed().eval(), (torch.randn(4, 16),), tmp_path,
                                fallback_ops=["aten.linear", "aten.layer_norm"])


def test_aten_region_constants_are_not_written(tmp_path):
    _runs_leave_constants_alone(lambda: Region().eval(), (torch.randn(3, 8),), tmp_path)
