"""The data-tiled variant (``aot.backend.tiling``): which programs get one, and that a
program compiled with it gives eager's values (float32 rtol 1e-5 / atol 1e-5: IREE's
summation order)."""

import torch

from torch.export import Dim

import aot
from aot.importer import ImportOptions, import_model
from aot.partition.placement import PlacementPolicy
from aot.toolchain.targets import get_target
from aot.toolchain.tiling_flags import TILING_FLAGS, safe_for_dynamic, tiled_target, untiled
from aot.backend.tiling import worth_tiling


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


class MlpLoop(torch.nn.Module):
    """The MLP's linears inside a loop: its only heavy ops are the loop body's."""

    def __init__(self):
        super().__init__()
        self.mlp = Mlp()

    def forward(self, x):
        def cond_fn(i, h):
            return i < 3

        def body_fn(i, h):
            return i + 1, self.mlp(h)
        return torch._higher_order_ops.while_loop(cond_fn, body_fn, (torch.tensor(0), x))[1]


def test_a_loop_of_matmuls_gets_one_too():
    imp = _imported(MlpLoop(), torch.randn(4, 64))
    assert worth_tiling(imp, get_target("cpu"), PlacementPolicy())


class ConvAttention(ConvNet):
    """Convolutions, then attention over the feature map's positions (MobileViT's
    shape): the convolutions carry most FLOPs."""

    def forward(self, x):
        y = self.b(torch.relu(self.a(x)))
        t = y.flatten(2).transpose(1, 2)  # [n, positions, channels]
        return torch.nn.functional.scaled_dot_product_attention(t, t, t).mean(1)


def test_a_program_with_attention_between_convolutions_gets_one_under_every_placement():
    imp = _imported(ConvAttention(), torch.randn(1, 8, 16, 16))
    cpu = get_target("cpu")
    assert worth_tiling(imp, cpu, PlacementPolicy())
    assert worth_tiling(imp, cpu, PlacementPolicy("auto", (), "coverage"))


class ConvSoftmaxAttention(ConvNet):
    """The same with the attention written out (EfficientFormer's, LeViT's)."""

    def forward(self, x):
        t = self.b(torch.relu(self.a(x))).flatten(2).transpose(1, 2)
        return (torch.softmax(t @ t.transpose(1, 2) / 4.0, -1) @ t).mean(1)


class Depthwise(torch.nn.Module):
    """A MobileNet block: pointwise expand, depthwise, pointwise project."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(32, 128, 1)
        self.dw = torch.nn.Conv2d(128, 128, 5, 2, 2, groups=128)
        self.b = torch.nn.Conv2d(128, 32, 1)

    def forward(self, x):
        return self.b(torch.relu(self.dw(torch.relu(self.a(x))))).mean((2, 3))


def test_written_out_attention_and_depthwise_networks_get_one_under_every_placement():
    from aot.backend.tiling import depthwise_network
    cpu = get_target("cpu")
    for m in (ConvSoftmaxAttention(), Depthwise()):
        imp = _imported(m, torch.randn(1, 8 if isinstance(m, ConvNet) else 32, 16, 16))
        assert worth_tiling(imp, cpu, PlacementPolicy()), type(m).__name__
    assert depthwise_network(_imported(Depthwise(), torch.randn(1, 32, 16, 16)))
    assert not depthwise_network(_imported(ConvSoftmaxAttention(), torch.randn(1, 8, 16, 16)))


def test_a_depthwise_network_compiles_its_tiled_variant_alone_with_eagers_values():
    torch.manual_seed(0)
    m, x = Depthwise().eval(), torch.randn(1, 32, 56, 56)  # 26 MFLOP in its heavy ops
    cm = aot.compile(m, (x,))
    region = cm.manifest["region"]
    assert "iree" in region["not_timed"] and "depthwise network" in region["not_timed"]["iree"]
    assert {"iree-tiled", "iree-tiled-sync"} <= set(region["candidates_ms"])
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-5)


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
    assert "--iree-global-opt-data-tiling" in tiled_target(cpu).flags  # exact on dynamic shapes


def test_dynamic_programs_are_tiled_through_the_global_optimization_path():
    imp = import_model(Mlp().eval(), (torch.randn(4, 64),), None,
                       ImportOptions(dynamic_shapes=({0: Dim("rows", min=2, max=64)},)))
    assert worth_tiling(imp, get_target("cpu"), PlacementPolicy())
    flags = safe_for_dynamic(("--iree-opt-data-tiling", "--iree-llvmcpu-enable-ukernels=all"))
    assert flags == ("--iree-llvmcpu-enable-ukernels=all", "--iree-global-opt-data-tiling")


class LinearAttention(torch.nn.Module):
    """q, k and v from one linear's view/permute, then softmax(q @ k^T) @ v: the program
    IREE 3.13's dispatch-creation data tiling gets wrong from 65 tokens on."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(64, 192)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, 2, h // 2).permute(2, 0, 3, 1, 4)
        return torch.softmax(q @ k.transpose(-1, -2), -1) @ v


def test_dynamic_attention_tiled_with_the_users_flags_gives_eagers_values(caplog):
    torch.manual_seed(0)
    m = LinearAttention().eval()
    dyn = ({0: Dim("batch", min=1, max=4), 1: Dim("seq", min=2, max=256)},)
    cm = aot.compile(m, (torch.randn(2, 16, 64),), dynamic_shapes=dyn, placement="coverage",
                     extra_flags=("--iree-opt-data-tiling", "--iree-llvmcpu-enable-ukernels=all"))
    assert "--iree-opt-data-tiling" not in cm.manifest["flags"]
    assert set(TILING_FLAGS) <= set(cm.manifest["flags"])
    assert "--iree-global-opt-data-tiling" in caplog.text
    for n, length in [(1, 16), (1, 65), (3, 100), (2, 256)]:
        x = torch.randn(n, length, 64)
        with torch.no_grad():  # float32, IREE's summation order
            torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-5)


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


def test_a_patch_embedding_of_one_image_compiles_data_tiled():
    """ConvNeXt-T's stem (a 4x4 patch embedding and a LayerNorm2d) at batch 1, its matmul
    2-D: data-tiled as a unit-batch batch matmul, IREE 3.13 exceeded its stack limit on
    it and the whole model lost its tiled variant."""
    import torchvision
    torch.manual_seed(0)
    stem = torchvision.models.convnext_tiny().features[0].eval()  # the conv, a LayerNorm2d
    x = torch.randn(1, 3, 224, 224)
    cm = aot.compile(stem, (x,), placement="coverage")
    assert set(cm.manifest["variant"]["candidates_ms"]) == {"iree", "iree-tiled"}
    with torch.no_grad():
        torch.testing.assert_close(cm(x), stem(x), rtol=1e-4, atol=1e-4)
