"""PT2E-quantized models (torchao ``prepare_pt2e``/``convert_pt2e``), calibrated on generated data.

Weights are random (seeded); batch-norm statistics are measured on generated
data, so every layer's activations keep a unit scale (random MobileNetV2
statistics shrink them until int8 holds only zeros). Each CNN returns its pooled
features and its logits: the features are a dequantized int8 tensor, on the
quantization grid, so agreement can be counted in quantization steps.

Needs torchvision and torchao (the ``test`` extra).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["QUANTIZERS", "mobilenet_v2", "pt2e_quantize", "resnet18", "small_cnn", "transformer"]

QUANTIZERS = ("x86", "arm")  # X86InductorQuantizer (uint8), ArmInductorQuantizer (int8)


def pt2e_quantize(model: nn.Module, example: torch.Tensor, quantizer: str = "x86",
                  dynamic: bool = False, calibration_batches: int = 4, seed: int = 0):
    """torchao's PT2E flow: export, ``prepare_pt2e``, calibrate, ``convert_pt2e``.

    Args:
        model: a float model in eval mode.
        example: its example input (calibration draws batches of its shape).
        quantizer: ``"x86"`` (per-channel int8 weights, uint8 activations) or ``"arm"``
            (per-tensor int8 weights, int8 activations), static unless ``dynamic``.
        dynamic: activations quantized with parameters chosen at run time (linears only).
    Returns:
        The converted ``GraphModule``.
    """
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    torch.manual_seed(seed)
    # strict export: torchao's quantizers match partitions of Dynamo-traced graphs
    exported = torch.export.export(model, (example,), strict=True).module()
    prepared = prepare_pt2e(exported, _quantizer(quantizer, dynamic))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _ in range(calibration_batches):
            prepared(torch.randn(example.shape, generator=g))
    return convert_pt2e(prepared)


def _quantizer(name: str, dynamic: bool):
    if name == "x86":
        from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xq
        return xq.X86InductorQuantizer().set_global(
            xq.get_default_x86_inductor_quantization_config(is_dynamic=dynamic))
    if name == "arm":
        from torchao.quantization.pt2e.quantizer import arm_inductor_quantizer as aq
        return aq.ArmInductorQuantizer().set_global(
            aq.get_default_arm_inductor_quantization_config(is_dynamic=dynamic))
    raise ValueError(f"quantizer must be one of {QUANTIZERS}, got {name!r}")


class FeaturesAndLogits(nn.Module):
    """``(pooled features, logits)`` of a classifier whose head is ``model.<head>``."""

    def __init__(self, model: nn.Module, head: str):
        super().__init__()
        *path, last = head.split(".")
        parent = model
        for p in path:
            parent = getattr(parent, p)
        self.head = getattr(parent, last)
        setattr(parent, last, nn.Identity())
        self.body = model

    def forward(self, x):
        f = self.body(x)
        return f, self.head(f)


def _measured_batch_norm(model: nn.Module, shape, seed: int) -> nn.Module:
    """Batch-norm running statistics measured on generated data of ``shape``."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None  # a cumulative average over the batches below
    model.train()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for _ in range(2):
            model(torch.randn(8, *shape[1:], generator=g))
    return model.eval()


def _cnn(build, head: str, size: int, batch: int, quantizer: str, seed: int):
    torch.manual_seed(seed)
    x = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))
    model = FeaturesAndLogits(_measured_batch_norm(build(), x.shape, seed), head).eval()
    return pt2e_quantize(model, x, quantizer, seed=seed), x


def resnet18(size: int = 32, batch: int = 2, quantizer: str = "x86", seed: int = 0):
    """``(converted, x)``: torchvision's ResNet18, PT2E-quantized."""
    from torchvision.models import resnet18 as build
    return _cnn(build, "fc", size, batch, quantizer, seed)


def mobilenet_v2(size: int = 32, batch: int = 2, quantizer: str = "x86", seed: int = 0):
    """``(converted, x)``: torchvision's MobileNetV2, PT2E-quantized."""
    from torchvision.models import mobilenet_v2 as build
    return _cnn(build, "classifier.1", size, batch, quantizer, seed)


class SmallCNN(nn.Module):
    """ResNet18's and MobileNetV2's patterns in a few layers: conv-bn-relu, max pool,
    a 1x1 conv, a residual add with relu, a depthwise conv with relu6, average pool."""

    def __init__(self, c: int = 16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, 2, 1), nn.BatchNorm2d(c), nn.ReLU())
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.conv = nn.Sequential(nn.Conv2d(c, c, 3, 1, 1), nn.BatchNorm2d(c), nn.ReLU6())
        self.project = nn.Sequential(nn.Conv2d(c, c, 1), nn.BatchNorm2d(c))
        self.depthwise = nn.Sequential(nn.Conv2d(c, c, 3, 1, 1, groups=c), nn.BatchNorm2d(c),
                                       nn.ReLU6())
        self.fc = nn.Linear(c, 10)

    def forward(self, x):
        x = self.pool(self.stem(x))
        x = self.depthwise(torch.relu(x + self.project(self.conv(x))))
        return torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)


def small_cnn(size: int = 16, batch: int = 2, quantizer: str = "x86", seed: int = 0):
    """``(converted, x)``: :class:`SmallCNN`, PT2E-quantized."""
    return _cnn(SmallCNN, "fc", size, batch, quantizer, seed)


class Block(nn.Module):
    """Pre-norm transformer block: multi-head self-attention, then a ReLU MLP."""

    def __init__(self, d: int = 32, heads: int = 4):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (y.view(b, t, self.heads, -1).transpose(1, 2)
                   for y in self.qkv(self.ln1(x)).split(d, -1))
        a = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, -1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(torch.relu(self.fc1(self.ln2(x))))


def transformer(layers: int = 2, d: int = 32, seq: int = 8, batch: int = 2,
                quantizer: str = "x86", dynamic: bool = False, seed: int = 0):
    """``(converted, x)``: ``layers`` transformer blocks, PT2E-quantized."""
    torch.manual_seed(seed)
    model = nn.Sequential(*[Block(d) for _ in range(layers)]).eval()
    x = torch.randn(batch, seq, d, generator=torch.Generator().manual_seed(seed))
    return pt2e_quantize(model, x, quantizer, dynamic, seed=seed), x
