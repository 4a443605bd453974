"""Hugging Face ``transformers`` containers in torch's pytree: capture and load.

A ``transformers`` language model returns a ``ModelOutput`` (``CausalLMOutputWith...``)
whose ``past_key_values`` is a ``DynamicCache`` with its defaults (``use_cache=True``).
``ModelOutput`` subclasses register themselves with torch's pytree when their module is
imported; ``DynamicCache`` does not, and ``torch.export`` refuses an output it cannot
flatten. ``register_cache`` registers it as ``transformers``' own export path does
(``transformers.integrations.executorch.register_dynamic_cache_export_support``), so
such a model compiles with its defaults and its artifact returns what eager returns.

Loading reads the output structure with torch's pytree, which knows only the types
registered in this process: ``register_for_load`` makes the ones a spec names known
before it is read, and only these, by importing ``transformers``' own modules (never a
module a file names freely):

- ``transformers.cache_utils.DynamicCache``, registered by ``register_cache``;
- a model output class of ``transformers.modeling_outputs`` or of a model's modeling
  module (``transformers.models.<name>.modeling_<name>``), which registers itself when
  that module is imported.

Any other unknown type stays unknown, and the spec is refused as before.
"""

from __future__ import annotations

import importlib
import logging
import re

__all__ = ["register_cache", "register_for_load", "is_transformers_model"]
log = logging.getLogger(__name__)

CACHE_TYPE = "transformers.cache_utils.DynamicCache"
# modules whose import registers the model output classes they define
_OUTPUT_MODULE = re.compile(
    r"transformers\.(modeling_outputs|models\.[a-z0-9_]{1,64}\.modeling_[a-z0-9_]{1,64})")


def is_transformers_model(model) -> bool:
    """``model`` is a module defined by ``transformers`` (its class, or a class it derives
    from): only then is its cache type registered (importing nothing)."""
    return any((c.__module__ or "").startswith("transformers.") for c in type(model).__mro__)


def register_cache() -> bool:
    """Register ``DynamicCache`` with torch's pytree where this ``transformers`` can
    (True), else False (an older or newer one without the helper: its own export path
    is then what registers it, if anything)."""
    try:
        from transformers.integrations.executorch import register_dynamic_cache_export_support
    except ImportError as e:
        log.info("transformers cannot register DynamicCache with torch's pytree: %s", e)
        return False
    register_dynamic_cache_export_support()  # idempotent
    return True


def register_for_load(type_names) -> None:
    """Make the ``transformers`` types among ``type_names`` (serialized pytree type names)
    known to torch's pytree, importing only ``transformers``' own modules as the module
    docstring says; the others are left alone (the reader then refuses them)."""
    import torch.utils._pytree as pytree
    known = pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE
    for name in sorted(set(type_names)):
        if not isinstance(name, str) or name in known or not name.startswith("transformers."):
            continue
        module = name.rpartition(".")[0]
        try:
            if name == CACHE_TYPE:
                register_cache()
            elif _OUTPUT_MODULE.fullmatch(module):
                importlib.import_module(module)
        except ImportError as e:  # the reader then names the type it does not know
            log.info("could not import %s for %s: %s", module, name, e)
