"""Compiled linear layers on 3-D and 4-D inputs are 2-D linears between reshapes (IREE
broadcasts the weight over the leading dimensions otherwise), with eager's values
(float32 rtol 1e-5 / atol 1e-5: IREE's summation order)."""

import pytest
import torch

import aot
from aot.importer import import_model
from aot.partition.partitioner import partition
from aot.backend.lower import lower
from aot.partition.placement import PlacementPolicy
from aot.toolchain.targets import get_target


@pytest.mark.parametrize("shape,bias", [((2, 3, 3, 16), True), ((2, 5, 16), False), ((4, 16), True)])
def test_linear_runs_as_one_2d_matmul_with_eagers_values(shape, bias):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 24, bias=bias), torch.nn.GELU()).eval()
    x = torch.randn(*shape)
    p = lower(partition(import_model(m, (x,)), get_target("cpu"),
                        PlacementPolicy("auto", (), "coverage")))
    linears = [ln for ln in p.mlir.splitlines() if "torch.aten.linear" in ln]
    assert len(linears) == 1 and f"!torch.vtensor<[{x.numel() // 16},16],f32>" in linears[0]
    assert ("torch.aten.reshape" in p.mlir) == (len(shape) > 2)
    cm = aot.compile(m, (x,), placement="coverage")
    assert {pl["where"] for pl in cm.manifest["placements"]} == {"compiled"}
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-5)


def test_a_linear_forced_to_aten_keeps_its_form():
    m = torch.nn.Linear(16, 24).eval()
    p = lower(partition(import_model(m, (torch.randn(2, 3, 16),)), get_target("cpu"),
                        PlacementPolicy("auto", ("aten.linear",), "coverage")))
    assert "torch.aten.reshape" not in p.mlir
