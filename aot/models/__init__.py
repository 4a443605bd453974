"""Bundled models: name -> factory returning ``(model.eval(), example_args)``.

All weights are random (seeded): nothing is downloaded.
"""

from __future__ import annotations

__all__ = ["MODELS", "get"]


def _resnet18():
    from .resnet18 import resnet18
    return resnet18()


def _bert():
    from .bert import bert_encoder
    return bert_encoder()


def _custom_op():
    from .custom_op import custom_op_model
    return custom_op_model()


def _unlowerable():
    from .unlowerable import unlowerable_model
    return unlowerable_model()


def _quantized_resnet18():
    from .quantized_resnet18 import quantized_resnet18
    return quantized_resnet18()


MODELS = {"resnet18": _resnet18, "bert": _bert, "custom_op": _custom_op,
          "unlowerable": _unlowerable, "quantized_resnet18": _quantized_resnet18}


def get(name: str):
    """``(model, example_args)`` of a bundled model; KeyError lists the names."""
    try:
        return MODELS[name]()
    except KeyError:
        raise KeyError(f"no bundled model {name!r}; choose one of {sorted(MODELS)}") from None
