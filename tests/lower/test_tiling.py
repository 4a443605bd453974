"""The data-tiled variant (``aot.lower.tiling``): which programs get one, and that a
program compiled with it gives eager's values (float32 rtol 1e-5 / atol 1e-5: IREE's
summation order)."""

import torch

import aot
from aot.importer import import_model
from aot.lower.placement import PlacementPolicy
from aot.lower.targets import get_target
from aot.lower.tiling import TILING_FLAGS, tiled_target, untiled, worth_tiling


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.b = torch.nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))).mean((2, 3))


def _imported(m, x):
    torch.manual_seed(0)
    return import_model(m.eval(), (x,))


def test_matmul_programs_get_a_tiled_variant_under_every_placement():
    imp = _imported(Mlp(), torch.randn(4, 64))
    cpu = get_target("cpu")
    assert worth_tiling(imp, cpu, PlacementPolicy())
    assert worth_tiling(imp, cpu, PlacementPolicy("auto", (), "coverage"))


def test_convolution_programs_get_one_under_coverage_only():
    imp = _imported(ConvNet(), torch.randn(1, 8, 16, 16))
    cpu = get_target("cpu")
    assert not worth_tiling(imp, cpu, PlacementPolicy())
    assert worth_tiling(imp, cpu, PlacementPolicy("auto", (), "coverage"))


def test_never_for_the_round_trip_iree_default_or_the_users_own_flags():
    imp = _imported(Mlp(), torch.randn(4, 64))
    assert not worth_tiling(imp, get_target("cpu"), PlacementPolicy("all"))
    assert not worth_tiling(imp, get_target("cpu", profile="iree-default"), PlacementPolicy())
    assert not worth_tiling(imp, get_target("cpu", extra_flags=("--iree-opt-data-tiling",)),
                            PlacementPolicy())


def test_untiled_undoes_tiled_target():
    cpu = get_target("cpu")
    assert set(TILING_FLAGS) <= set(tiled_target(cpu).flags)
    assert untiled(tiled_target(cpu)) == cpu


def test_a_coverage_compile_times_both_variants_and_gives_eagers_values():
    torch.manual_seed(0)
    m, x = ConvNet().eval(), torch.randn(1, 8, 16, 16)
    cm = aot.compile(m, (x,), placement="coverage")
    variant = cm.manifest["variant"]
    assert set(variant["candidates_ms"]) == {"iree", "iree-tiled"}
    assert variant["chosen"] in variant["candidates_ms"]
    assert all(p["where"] == "compiled" for p in cm.manifest["placements"])
    tiled = set(TILING_FLAGS) <= set(cm.manifest["flags"])
    assert tiled == (variant["chosen"] == "iree-tiled")
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-5)
