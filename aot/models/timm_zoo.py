"""A few ``timm`` image models, for benchmarks (random weights).

Nothing is downloaded: ``timm.create_model(name, pretrained=False)`` after
``torch.manual_seed(seed)``, then the zoo's plausible batch-norm statistics
(``models.zoo.plausible_statistics``), so every process that builds a model gets
the same weights. The input is one standard-normal image at the model's own
resolution (``pretrained_cfg["input_size"]``: 256x256 for MobileViT, 224x224 for
the others). The set covers what torchvision's zoo lacks: a hybrid CNN-transformer
(MobileViT-S), a small modern ConvNet (ConvNeXt-Atto), a MetaFormer
(EfficientFormer-L1), a data-efficient ViT (DeiT-Tiny) and a convolution-stemmed
attention network with batch-normed linears (LeViT-128); each exports with
``torch.export``. Needs ``timm`` (the ``bench`` extra).
"""

from __future__ import annotations

import torch

__all__ = ["TIMM", "timm_model"]

# short name -> timm's name
TIMM = {"mobilevit_s": "mobilevit_s", "convnext_atto": "convnext_atto",
        "efficientformer_l1": "efficientformer_l1", "deit_tiny": "deit_tiny_patch16_224",
        "levit_128": "levit_128"}


def timm_model(name: str, batch: int = 1, seed: int = 0):
    """``(model.eval(), (x,))`` for model ``name`` of ``TIMM`` (a short name or timm's)."""
    import timm

    from .zoo import plausible_statistics

    name = TIMM.get(name, name)
    if name not in TIMM.values():
        raise ValueError(f"no timm model {name!r}; choose one of {tuple(TIMM)}")
    torch.manual_seed(seed)
    m = timm.create_model(name, pretrained=False).eval()
    g = torch.Generator().manual_seed(seed)
    plausible_statistics(m, g)
    size = tuple(m.pretrained_cfg.get("input_size", (3, 224, 224)))
    return m, (torch.randn(batch, *size, generator=g),)
