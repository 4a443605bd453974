"""A cold compile assumes the ATen ops it has no verdict for lower, and the program's
compile is their probe (``coverage.Assumed``): each op's code is generated once.
Results are compared with eager (float32, rtol 1e-5 / atol 1e-5)."""

import torch

import aot
from aot.toolchain import iree_compile
from aot.partition.coverage import CoverageCache
from aot.toolchain.targets import get_target


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        y = torch.nn.functional.hardswish(self.conv(x))
        return torch.softmax(self.fc(y.mean((2, 3))), -1)


class WithAnd(torch.nn.Module):
    """``&`` of two bool tensors (``aten.__and__.Tensor``) is an ATen op IREE 3.13's
    torch lowering does not know, between ops it lowers."""

    def forward(self, x):
        inside = (torch.relu(x) > 0.25) & (x < 1.0)
        return inside.to(x.dtype) * 2.0 + x


def _compiles(monkeypatch) -> list[str]:
    """The text of every IREE compile of compiled ops for the plain CPU target, in
    order (not the modules of the ATen-region candidates, which hold one kernel call,
    nor the data-tiled variant's)."""
    seen = []
    real = iree_compile._compile
    plain = get_target("cpu").flags

    def counted(asm, target, input_type="torch"):
        # the program's module comes as MLIR bytecode: op and symbol names are strings in it
        text = asm.decode("latin-1") if isinstance(asm, bytes) else asm
        if ("torch.aten." in text or isinstance(asm, bytes) and "aten." in text) \
                and target.flags == plain:
            seen.append(text)
        return real(asm, target, input_type)
    monkeypatch.setattr(iree_compile, "_compile", counted)
    return seen


def test_a_cold_compile_compiles_the_program_once_and_records_every_verdict(
        monkeypatch, tmp_path):
    monkeypatch.setenv("AOT_CACHE_DIR", str(tmp_path))
    seen = _compiles(monkeypatch)
    m, x = Small().eval(), torch.randn(1, 3, 16, 16)
    cm = aot.compile(m, (x,), placement="coverage")
    # one compile: the program's (no probe module)
    assert len(seen) == 1 and "probe0" not in seen[0]
    assert {p["where"] for p in cm.manifest["placements"]} == {"compiled"}
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-5)
    # every op signature of the program now has a cached verdict: covered
    cache = CoverageCache(get_target("cpu"))
    assert cache.data and all(v["covered"] for v in cache.data.values())
    # a warm compile: one compile, the program's
    seen.clear()
    aot.compile(m, (x,), placement="coverage")
    assert len(seen) == 1


def test_a_program_that_fails_with_assumed_ops_probes_them(monkeypatch, tmp_path):
    monkeypatch.setenv("AOT_CACHE_DIR", str(tmp_path))
    seen = _compiles(monkeypatch)
    m, x = WithAnd().eval(), torch.randn(4, 16)
    cm = aot.compile(m, (x,), placement="coverage")
    # the program's compile (no probe functions) failed, then the signatures were probed
    assert "probe0" not in seen[0] and any("probe0" in s for s in seen[1:])
    where = {p["op"]: p["where"] for p in cm.manifest["placements"]}
    assert where["aten.__and__.Tensor"] == "kernel_call"
    assert where["aten.relu.default"] == "compiled"
    verdicts = CoverageCache(get_target("cpu")).data
    assert [k for k, v in verdicts.items() if not v["covered"]] == \
        [k for k in verdicts if k.startswith("aten.__and__")]
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-5)


def test_the_measured_compile_probes_nothing(monkeypatch, tmp_path):
    """Under the default placement (costs measured, candidates timed) the heavy ops'
    cost module and the program's compile are the probe: no probe module is
    compiled, and the choice gives eager's values."""
    monkeypatch.setenv("AOT_CACHE_DIR", str(tmp_path))
    seen = _compiles(monkeypatch)
    m, x = Small().eval(), torch.randn(1, 3, 16, 16)
    cm = aot.compile(m, (x,))
    assert not any("probe0" in s for s in seen)
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-5)


class NormThenLinear(torch.nn.Module):
    """A batch norm on a 2-D input, a ReLU, then a linear: nothing to fold it into (the
    linear does not read it directly), and an ATen op the Torch dialect does not define."""

    def __init__(self):
        super().__init__()
        self.bn, self.fc = torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(x)))


def test_an_op_outside_the_torch_dialect_is_probed_not_assumed(monkeypatch, tmp_path):
    """The batch norm is probed (a probe module), the rest assumed: the program
    compiles once, with the batch norm decomposed, instead of failing and probing every
    op it assumed."""
    monkeypatch.setenv("AOT_CACHE_DIR", str(tmp_path))
    seen = _compiles(monkeypatch)
    m = NormThenLinear()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-1, 1)
        m.bn.running_var.uniform_(0.5, 2)
    m, x = m.eval(), torch.randn(4, 16)
    cm = aot.compile(m, (x,), placement="coverage")
    programs = [s for s in seen if "probe0" not in s]
    probes = [s for s in seen if "probe0" in s]
    assert len(programs) == 1 and len(probes) == 1
    assert "_native_batch_norm_legit_no_training" in probes[0]
    assert "linear" not in probes[0] and "relu" not in probes[0]
    assert {p["where"] for p in cm.manifest["placements"]} == {"compiled"}
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-5)
