"""torchvision's model zoo and a BERT-base-sized encoder, for benchmarks (random weights).

Weights cannot be downloaded here: each model is randomly initialised (seeded)
with torchvision's own initialisation; batch-norm statistics get plausible values
(mean in [-0.1, 0.1], variance in [0.5, 1.5]) so activations neither vanish nor
blow up. Needs torchvision (the ``test`` and ``bench`` extras).

torchvision's ViT zero-initialises its classification head (its output would be
all zeros, and a correctness check against eager would compare zeros): a linear
layer left all zero gets normal weights (std 0.02) instead.

Denormals: with these weights and a standard-normal input none of the models
produces denormal floats in eager; ``python benchmarks/denormals.py`` checks it.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["VISION", "vision_model", "bert_base", "plausible_statistics"]

VISION = ("resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0",
          "vit_b_16", "convnext_tiny")


def vision_model(name: str, batch: int = 1, seed: int = 0):
    """``(model.eval(), (x,))`` for torchvision model ``name`` at 224x224."""
    import torchvision

    if name not in VISION:
        raise ValueError(f"no zoo model {name!r}; choose one of {VISION}")
    torch.manual_seed(seed)
    m = getattr(torchvision.models, name)(weights=None).eval()
    g = torch.Generator().manual_seed(seed)
    plausible_statistics(m, g)
    return m, (torch.randn(batch, 3, 224, 224, generator=g),)


def plausible_statistics(model: nn.Module, g: torch.Generator) -> None:
    """Batch-norm running statistics drawn from ``g`` (mean in [-0.1, 0.1], variance in
    [0.5, 1.5]) and normal weights (std 0.02) for a linear layer left all zero, in
    module order, so that a randomly initialised model's output is neither all zeros
    nor blown up."""
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.1, 0.1, generator=g)
                mod.running_var.uniform_(0.5, 1.5, generator=g)
            elif isinstance(mod, nn.Linear) and not mod.weight.any():
                mod.weight.normal_(0.0, 0.02, generator=g)


def bert_base(batch: int = 1, seq: int = 128, seed: int = 0):
    """``(model, (ids,))``: the bundled encoder at BERT-base width (hidden 768, 12
    heads, FFN 3072) with 4 layers, int64 token ids of shape ``(batch, seq)``."""
    from .bert import BertEncoder

    torch.manual_seed(seed)
    m = BertEncoder(vocab=30522, hidden=768, heads=12, layers=4, ffn=3072,
                    max_len=max(seq, 128)).eval()
    g = torch.Generator().manual_seed(seed)
    return m, (torch.randint(0, 30522, (batch, seq), generator=g),)
