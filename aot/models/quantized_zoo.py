"""torchvision's quantizable zoo, eager-mode quantized and calibrated on generated data.

Weights cannot be downloaded here, so every model is randomly initialised
(seeded). Random weights with default batch-norm statistics let activations die
out or blow up, and a quantized model of such a network answers the same for
every input. So the batch-norm statistics are first measured on generated data
(the float model run in training mode, cumulative averages): every channel then
leaves its batch norm with mean 0 and variance 1, as in a trained network. Then
``fuse_model`` -> qconfig -> ``prepare`` -> calibrate -> ``convert``, as
torchvision's quantization recipe does. Needs torchvision (a test dependency).
"""

from __future__ import annotations

import torch

__all__ = ["QUANTIZED_ZOO", "QCONFIGS", "MIN_SIZE", "quantized_model", "eager_quantize"]

QUANTIZED_ZOO = ("googlenet", "inception_v3", "mobilenet_v2", "mobilenet_v3_large",
                 "resnet18", "resnet50", "resnext101_32x8d", "resnext101_64x4d",
                 "shufflenet_v2_x0_5", "shufflenet_v2_x1_0", "shufflenet_v2_x1_5",
                 "shufflenet_v2_x2_0")
QCONFIGS = ("x86", "fbgemm", "qnnpack")
MIN_SIZE = {"inception_v3": 75}  # the smallest input side the architecture takes


def _float_model(name: str) -> torch.nn.Module:
    from torchvision.models import quantization

    kwargs = dict(weights=None, quantize=False)
    if name in ("googlenet", "inception_v3"):
        kwargs.update(aux_logits=False, init_weights=False)  # default init: fast
    return getattr(quantization, name)(**kwargs)


def _measure_batch_norms(model: torch.nn.Module, size: int, g: torch.Generator,
                         batches: int = 4) -> None:
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative average over the batches
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(8, 3, size, size, generator=g))
    model.eval()


def quantized_model(name: str, backend: str = "x86", size: int = 224, batch: int = 1,
                    calibration_batches: int = 4, seed: int = 0):
    """``(model, (x,))``: torchvision's quantizable ``name``, converted for ``backend``.

    ``backend`` picks the qconfig (``x86``/``fbgemm``: per-channel weights;
    ``qnnpack``: per-tensor weights) and sets ``torch.backends.quantized.engine``
    to it, as a user deploying with that engine would. ``size``: the input's side.
    """
    if name not in QUANTIZED_ZOO:
        raise ValueError(f"name must be one of {QUANTIZED_ZOO}, got {name!r}")
    if backend not in QCONFIGS:
        raise ValueError(f"backend must be one of {QCONFIGS}, got {backend!r}")
    if size < MIN_SIZE.get(name, 32):
        raise ValueError(f"{name} takes inputs of side {MIN_SIZE.get(name, 32)} or more, "
                         f"got {size}")
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = _float_model(name)
    _measure_batch_norms(model, size, g)
    eager_quantize(model, backend, size, g, calibration_batches)
    return model, (torch.randn(batch, 3, size, size, generator=g),)


def eager_quantize(model: torch.nn.Module, backend: str, size: int, g: torch.Generator,
                   calibration_batches: int = 4) -> None:
    """torchvision's recipe, in place: ``fuse_model`` -> ``backend``'s qconfig (and
    engine) -> ``prepare`` -> calibrate on generated images -> ``convert``."""
    import torch.ao.quantization as tq

    model.fuse_model()
    if backend in torch.backends.quantized.supported_engines:
        torch.backends.quantized.engine = backend
    model.qconfig = tq.get_default_qconfig(backend)
    tq.prepare(model, inplace=True)
    with torch.no_grad():
        for _ in range(calibration_batches):
            model(torch.randn(4, 3, size, size, generator=g))
    tq.convert(model, inplace=True)
