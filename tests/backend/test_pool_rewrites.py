"""Compiled global average pooling is a mean over the spatial dimensions (IREE's
pooling form ran as a scalar gather loop, 10x slower), with eager's values (float32
rtol 1e-5 / atol 1e-6: IREE's summation order); other output sizes keep the op."""

import pytest
import torch

import aot
from aot.importer import import_model
from aot.partition.partitioner import partition
from aot.backend.lower import lower
from aot.partition.placement import PlacementPolicy
from aot.toolchain.targets import get_target


class SqueezeExcite(torch.nn.Module):
    """MobileNetV3's block: pool, two 1x1 convolutions, a gate on the input."""

    def __init__(self, c: int, size):
        super().__init__()
        self.size = size
        self.fc1, self.fc2 = torch.nn.Conv2d(c, 4, 1), torch.nn.Conv2d(4, c, 1)

    def forward(self, x):
        s = torch.nn.functional.adaptive_avg_pool2d(x, self.size)
        return x * torch.sigmoid(self.fc2(torch.relu(self.fc1(s))))


@pytest.mark.parametrize("size,shape", [(1, (2, 8, 13, 11)), ((1, 1), (1, 8, 56, 56)),
                                        ((1, 1), (8, 5, 7))])
def test_global_pool_as_mean_gives_eagers_values(size, shape):
    torch.manual_seed(0)
    m = SqueezeExcite(8, size).eval()
    x = torch.randn(*shape)
    cm = aot.compile(m, (x,), placement="coverage")
    # (IREE does not lower the unbatched convolutions: kernel calls around the pool)
    assert [p["where"] for p in cm.manifest["placements"]
            if p["op"] == "aten.adaptive_avg_pool2d.default"] == ["compiled"]
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-6)


def _mlir(m, x, forced=()):
    return lower(partition(import_model(m, (x,)), get_target("cpu"),
                           PlacementPolicy("auto", forced, "coverage"))).mlir


def test_the_compiled_form_is_a_mean():
    mlir = _mlir(torch.nn.AdaptiveAvgPool2d(1), torch.randn(1, 8, 9, 9))
    assert "torch.aten.mean.dim" in mlir and "adaptive_avg_pool2d" not in mlir


def test_other_output_sizes_and_kernel_calls_keep_the_op():
    mlir = _mlir(torch.nn.AdaptiveAvgPool2d((2, 3)), torch.randn(1, 8, 9, 9))
    assert "torch.aten.mean.dim" not in mlir and "adaptive_avg_pool2d" in mlir
    m = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 2))
    mlir = _mlir(m, torch.randn(1, 8, 9, 9), forced=("aten.adaptive_avg_pool2d",))
    assert "torch.aten.mean.dim" not in mlir


def test_a_pooled_classifier_matches_eager():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                            torch.nn.AdaptiveAvgPool2d((1, 1)), torch.nn.Flatten(),
                            torch.nn.Linear(8, 4)).eval()
    x = torch.randn(2, 3, 16, 16)
    cm = aot.compile(m, (x,), placement="coverage")
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-5)
