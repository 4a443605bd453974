"""torchvision's quantizable ResNet18, eager-mode quantized and calibrated on generated data.

Weights cannot be downloaded here: the float model is randomly initialised
(seeded), batch-norm statistics are given plausible values so activations do
not blow up, then ``fuse_model`` -> ``prepare`` -> calibrate -> ``convert``.
Needs torchvision (a test dependency).
"""

from __future__ import annotations

import torch

from .quantized_zoo import QCONFIGS, eager_quantize

__all__ = ["quantized_resnet18", "QCONFIGS"]


def quantized_resnet18(backend: str = "x86", batch: int = 1, calibration_batches: int = 4,
                       seed: int = 0):
    """``(model, (x,))``: a converted quantized ResNet18 for ``backend``'s qconfig.

    ``backend`` picks the qconfig (``x86``/``fbgemm``: per-channel weights;
    ``qnnpack``: per-tensor weights) and sets ``torch.backends.quantized.engine``
    to it, as a user deploying with that engine would.
    """
    from torchvision.models.quantization import resnet18

    if backend not in QCONFIGS:
        raise ValueError(f"backend must be one of {QCONFIGS}, got {backend!r}")
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = resnet18(weights=None, quantize=False).eval()
    for m in model.modules():  # random but well-scaled batch-norm statistics
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1, generator=g)
            m.running_var.uniform_(0.5, 1.5, generator=g)
            m.weight.data.uniform_(0.5, 1.0, generator=g)
            m.bias.data.uniform_(-0.1, 0.1, generator=g)
    eager_quantize(model, backend, 224, g, calibration_batches)
    return model, (torch.randn(batch, 3, 224, 224, generator=g),)
