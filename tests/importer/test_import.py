"""Import stage: export modes, Torch-dialect output, locations, the batch-norm decomposition."""

import pytest
import torch

import aot
from aot.cli import main as cli_main
from aot.importer import ImportOptions, import_model
from aot.partition.partitioner import partition, torch_mlir
from aot.backend.lower import lower
from aot.partition.placement import PlacementPolicy
from aot.toolchain.targets import get_target


class ConvBn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def _model():
    m = ConvBn().eval()
    with torch.no_grad():  # non-trivial running stats so the batch norm matters
        m.bn.running_mean.uniform_(-1, 1)
        m.bn.running_var.uniform_(0.5, 2)
    return m


@pytest.mark.parametrize("strict", [False, True])
def test_export_modes(strict):
    m, x = _model(), torch.randn(1, 3, 8, 8)
    cm = aot.compile(m, (x,), strict=strict)
    torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-5)


def test_torch_dialect_and_locations():
    imported = import_model(_model(), (torch.randn(1, 3, 8, 8),), options=ImportOptions())
    text = torch_mlir(imported)
    assert "torch.aten.conv2d" in text and "!torch.vtensor<[1,3,8,8],f32>" in text
    # Eval batch norm arrives as an op IREE does not know; the partitioner
    # measures that and decomposes it into arithmetic IREE lowers.
    assert "_native_batch_norm_legit_no_training" in text
    part = lower(partition(imported, get_target("cpu"), PlacementPolicy()))
    assert "_native_batch_norm_legit_no_training" not in part.mlir
    assert all(p.where == "compiled" for p in part.placements)
    assert any(p.location and "test_import.py" in p.location for p in part.placements)


def test_all_fallback_keeps_batch_norm_kernel():
    m, x = _model(), torch.randn(1, 3, 8, 8)
    cm = aot.compile(m, (x,), fallback="all")
    ops = {p["op"] for p in cm.manifest["placements"]}
    assert "aten._native_batch_norm_legit_no_training.default" in ops
    torch.testing.assert_close(cm(x), m(x), rtol=0, atol=0)


def test_cli_compile_run_report_emit(tmp_path, capsys):
    src = tmp_path / "mymodel.py"
    src.write_text("import torch\n"
                   "def make():\n"
                   "    return torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.GELU())\n")
    out = str(tmp_path / "m.aot")
    assert cli_main(["compile", f"{src}:make", "--input-shape", "2,5", "-o", out]) == 0
    assert cli_main(["run", out, "--repeat", "3"]) == 0
    text = capsys.readouterr().out
    assert "output 0: float32[2, 3]" in text and "latency: median" in text
    assert cli_main(["report", out]) == 0
    assert "compiled by IREE" in capsys.readouterr().out
    assert cli_main(["compile", f"{src}:make", "--input-shape", "2,5", "--emit", "torch"]) == 0
    assert "torch.aten.linear" in capsys.readouterr().out
    assert cli_main(["compile", f"{src}:make", "--input-shape", "2,5", "--emit", "partitioned",
                     "--fallback-op", "aten.gelu"]) == 0
    assert "call @aot_kernels.call_0(" in capsys.readouterr().out


def test_cli_reports_errors(tmp_path, capsys):
    assert cli_main(["report", str(tmp_path / "missing.aot")]) == 1
    assert "ArtifactError" in capsys.readouterr().err


def test_an_example_input_that_is_a_view_compiles_with_static_shapes():
    """torch.export gives a view input's base its own size symbols (torch 2.14); the
    import exports a copy, so static programs with view examples compile."""
    class Affine(torch.nn.Module):
        def forward(self, x):
            return x * 2 + 1

    for x in (torch.arange(256.0).reshape(16, 16), torch.randn(32, 16)[::2]):
        assert x._is_view()
        cm = aot.compile(Affine(), (x,))
        torch.testing.assert_close(cm(x), Affine()(x), rtol=0, atol=0)


def test_a_constant_inside_a_list_operand_is_compiled():
    """``cat([buffer, x])``: the importer takes a state tensor only as a whole operand, so
    one inside a list (a language model's empty KV cache before its first update) is
    copied in as its own value, and the op compiles instead of moving to ATen."""
    class Cat(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("head", torch.arange(24, dtype=torch.float32).view(2, 3, 4))
            self.register_buffer("empty", torch.zeros(2, 0, 4))

        def forward(self, x):
            return torch.cat([self.head, x], 1) * 2, torch.cat([self.empty, x], 1) + 1
    m, x = Cat().eval(), torch.randn(2, 5, 4)
    cm = aot.compile(m, (x,), placement="coverage")
    assert not cm.manifest["kernel_calls"]
    for got, want in zip(cm(x), m(x)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
