"""Greedy generation with a Hugging Face causal language model compiled ahead of time.

``compile_causal_lm(model, max_length=..., batch_size=...)`` compiles the model's entry
points (``aot.compile`` each, with its placement and kernel calls):

- **prefill**: the prompt's ids (``batch x T``, ``T`` dynamic in ``1..SHORT_PROMPT``)
  -> the last position's logits and each layer's keys and values; prompts longer than
  ``SHORT_PROMPT`` go to a second prefill, one ATen region (``_long_prefill`` says why);
- **decode**, static cache (the default): one token per sequence, its position and the
  whole cache (``max_length`` positions per layer's keys and values) -> the logits and
  this token's keys and values, which ``generate`` writes into the cache in place;
- **decode**, dynamic cache: one token and the cache so far (its length dynamic) -> the
  logits and the cache one position longer (the model's own ``DynamicCache`` update).

``generate`` (``aot.runtime.generator``) picks the most likely token each step and stops
where ``model.generate(do_sample=False)`` stops (an end-of-sequence token ends a row;
finished rows get the pad token), so its tokens are Hugging Face's. Each call starts
from an empty cache and holds the generator's lock: calls from several threads run one
after another. The generator saves as a folder; ``aot.load(folder)`` returns it.
"""

from __future__ import annotations

import functools
import logging

from .errors import AotError
from .runtime.generator import CACHES, FORMAT, CausalLMGenerator, static_cache

__all__ = ["compile_causal_lm"]
log = logging.getLogger(__name__)
# prompts up to this many tokens go to prefill as the placement race chooses it; longer
# ones to a prefill run as one ATen region (``_long_prefill``)
SHORT_PROMPT = 32
_ATEN_REGION = {"format": 1, "program": None, "region": "aten-prepacked", "candidates_ms": {}}
# generation settings that change greedy tokens, and the values that leave them alone
_NEUTRAL = {"repetition_penalty": (None, 1.0), "no_repeat_ngram_size": (None, 0),
            "min_length": (None, 0), "min_new_tokens": (None, 0),
            "forced_bos_token_id": (None,), "forced_eos_token_id": (None,),
            "suppress_tokens": (None, []), "begin_suppress_tokens": (None, []),
            "bad_words_ids": (None, []), "sequence_bias": (None, {}),
            "encoder_no_repeat_ngram_size": (None, 0), "exponential_decay_length_penalty": (None,),
            "diversity_penalty": (None, 0.0), "num_beams": (None, 1)}


def _flat_cache(cache) -> list:
    """Keys and values of every layer of a ``transformers`` cache, in layer order."""
    out = []
    for layer in cache.layers:
        out += [layer.keys, layer.values]
    return out


def _out_cache(out):
    """The cache a model output holds: its ``cache`` field from transformers 5.2x, its
    ``past_key_values`` before."""
    for name in ("cache", "past_key_values"):
        if name in out.keys():
            return out[name]
    raise AotError(f"{type(out).__name__} holds no cache (use_cache=True was asked)",
                   stage="import")


def _step_modules(model, n_layers: int):
    import inspect

    import torch
    from transformers.cache_utils import Cache, DynamicCache

    PositionLayer = _position_layer_type()  # noqa: N806  (a class)
    # the cache argument's name: ``cache`` from transformers 5.2x (``past_key_values``
    # before, and deprecated since)
    params = inspect.signature(model.forward).parameters
    cache_arg = "cache" if "cache" in params else "past_key_values"

    # only the last position's logits (as ``generate`` asks): the head's product over
    # one row, not the prompt's
    last = {"logits_to_keep": 1} if "logits_to_keep" in params else {}

    class Prefill(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids):
            out = self.model(input_ids=input_ids, use_cache=True, **last)
            return (out.logits[:, -1, :], *_flat_cache(_out_cache(out)))

    class Decode(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, *past):
            cache = DynamicCache(ddp_cache_data=[
                (past[2 * i], past[2 * i + 1]) for i in range(n_layers)])
            out = self.model(input_ids=input_ids, use_cache=True, **{cache_arg: cache})
            return (out.logits[:, -1, :], *_flat_cache(_out_cache(out)))

    class StaticDecode(torch.nn.Module):
        """One token at ``position`` (``batch x 1``: the tokens before it) over the
        whole cache (``batch x heads x max_length x head dim`` per keys and values,
        read where it lies): the logits and this token's keys and values, which the
        caller writes into the cache at ``position``."""

        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, position, *past):
            length = past[0].shape[2]
            slots = torch.arange(length, device=position.device)
            here = (slots.view(1, 1, length, 1) == position.view(-1, 1, 1, 1))
            seen = slots.view(1, 1, 1, length) <= position.view(-1, 1, 1, 1)
            dtype = past[0].dtype
            mask = torch.where(seen, torch.zeros((), dtype=dtype),
                               torch.full((), torch.finfo(dtype).min, dtype=dtype))
            layers = [PositionLayer(past[2 * i], past[2 * i + 1], here)
                      for i in range(n_layers)]
            cache = Cache(layers=layers)
            out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=position,
                             use_cache=True, **{cache_arg: cache})
            return (out.logits[:, -1, :], *[t for layer in layers for t in layer.rows])

    return Prefill().eval(), Decode().eval(), StaticDecode().eval()


@functools.cache
def _position_layer_type():
    """A ``transformers`` cache layer over tensors given to it (a static decode's
    inputs): ``update`` puts the new keys and values at the position's slot of what the
    attention reads, without writing the given tensors, and keeps them as ``rows``."""
    import torch
    from transformers.cache_utils import StaticLayer

    class PositionLayer(StaticLayer):
        def __init__(self, keys, values, here):
            super().__init__(max_cache_len=keys.shape[2])
            self.keys, self.values, self.here = keys, values, here
            self.device = keys.device
            self.batch_size, self.num_heads = keys.shape[:2]
            self.k_head_dim, self.v_head_dim = keys.shape[-1], values.shape[-1]
            self.is_initialized = True
            self.rows = None

        def update(self, key_states, value_states, *args, **kwargs):
            self.rows = (key_states, value_states)
            return (torch.where(self.here, key_states, self.keys),
                    torch.where(self.here, value_states, self.values))

    return PositionLayer


def _token_ids(v) -> list[int]:
    if v is None:
        return []
    if isinstance(v, int):
        return [v]
    return [int(x) for x in v]


def _generation_settings(model) -> dict:
    """End-of-sequence and pad token ids from the model's generation config; an
    ``AotError`` for a setting that would change greedy tokens (not applied here)."""
    cfg = getattr(model, "generation_config", None)
    if cfg is None:
        return {"eos": [], "pad": None}
    for name, neutral in _NEUTRAL.items():
        v = getattr(cfg, name, None)
        if v not in neutral:
            raise AotError(f"the model's generation config sets {name}={v!r}, which "
                           "greedy generation here does not apply; set it to "
                           f"{neutral[-1]!r} to compile", stage="import")
    eos = _token_ids(cfg.eos_token_id)
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else (eos[0] if eos else None)
    return {"eos": eos, "pad": pad}


def compile_causal_lm(model, compile_fn, *, max_length: int, batch_size: int = 1,
                      example_length: int = 8, cache: str = "static",
                      **compile_kwargs) -> CausalLMGenerator:
    """Compile ``model`` (a ``transformers`` causal LM: ``...ForCausalLM``,
    ``GPT2LMHeadModel``) for greedy generation of sequences up to ``max_length``
    tokens (prompt and new ones), ``batch_size`` sequences at a time.

    ``example_length``: the prompt length prefill is captured and measured at (any
    length in range runs). ``cache``: ``"static"`` (the generator's cache, written in
    place; decode of fixed shapes) or ``"dynamic"`` (decode returns the cache one
    longer); a model whose static decode cannot be captured gets the dynamic one, and
    the log says why. ``compile_fn`` is ``aot.compile``; ``compile_kwargs`` go to each
    of its calls (``target``, ``fallback``, ...). Raises ``AotError`` for what this
    cannot serve: not a ``transformers`` model with a cache, sizes out of range, a
    generation config that changes greedy tokens."""
    import torch
    from torch.export import Dim

    from .hf_pytree import is_transformers_model

    if not isinstance(model, torch.nn.Module) or not is_transformers_model(model):
        raise AotError("compile_causal_lm takes a transformers causal LM (an nn.Module "
                       f"defined by transformers), not {type(model).__name__}",
                       stage="import")
    for name, v, low in (("max_length", max_length, 2), ("batch_size", batch_size, 1),
                         ("example_length", example_length, 1)):
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            raise AotError(f"{name}={v!r}: an integer of at least {low} is needed",
                           stage="import")
    if cache not in CACHES:
        raise AotError(f"cache={cache!r}: one of {', '.join(map(repr, CACHES))}",
                       stage="import")
    taken = sorted({"dynamic_shapes", "example_kwargs", "args"} & set(compile_kwargs))
    if taken:
        raise AotError(f"compile_causal_lm sets {', '.join(taken)} itself (the prompt and "
                       "cache lengths are dynamic up to max_length)", stage="import")
    cfg = model.config
    n_layers = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer", None)
    limit = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    if not n_layers:
        raise AotError(f"{type(model).__name__}'s config names no layer count", stage="import")
    if limit is not None and max_length > limit:
        raise AotError(f"max_length={max_length} is past the model's {limit} positions",
                       stage="import")
    _full_attention(cfg, max_length)
    settings = _generation_settings(model)
    model = model.eval()
    prefill_m, decode_m, static_m = _step_modules(model, n_layers)
    vocab = int(cfg.vocab_size)
    t = min(example_length, max_length - 1)
    ids = torch.randint(0, vocab, (batch_size, t), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, *past = prefill_m(ids)
    short = min(max_length - 1, SHORT_PROMPT)
    prefill_long = None
    if max_length - 1 > short:
        prefill_long = _long_prefill(prefill_m, compile_fn, ids, short, max_length,
                                     example_length, compile_kwargs)
    top = short if prefill_long is not None else max_length - 1
    prefill = compile_fn(prefill_m, (ids[:, :top],),
                         dynamic_shapes=({1: Dim("prompt", min=1, max=top)},), **compile_kwargs)
    last = ids[:, -1:].clone()
    decode = None
    if cache == "static":
        try:
            decode = _static_decode(static_m, compile_fn, last, past, max_length,
                                    compile_kwargs)
        except AotError as e:  # this model's cache cannot be served in place here
            log.warning("%s: the static-cache decode did not compile (%s); decode returns "
                        "the cache one longer instead", type(model).__name__, e)
            cache = "dynamic"
    if decode is None:
        seen = Dim("past", min=1, max=max_length - 1)
        decode = compile_fn(decode_m, (last, *past),
                             dynamic_shapes=(None, tuple({2: seen} for _ in past)),
                             **compile_kwargs)
    meta = {"format": FORMAT, "max_length": max_length, "batch_size": batch_size,
            "n_layers": int(n_layers), "vocab_size": vocab, "cache": cache, **settings}
    if prefill_long is not None:
        meta["long_prompt_from"] = short + 1
    return CausalLMGenerator(prefill, decode, meta, prefill_long)


def _long_prefill(prefill_m, compile_fn, ids, short: int, max_length: int,
                  example_length: int, compile_kwargs):
    """Prefill of prompts of ``short + 1`` to ``max_length - 1`` tokens as one ATen region
    with prepacked weights (``aten-prepacked``); None where the caller pinned a plan or
    a placement, or the program has no such region (a model too small to be measured):
    then one prefill serves every length. IREE's code for a dynamic prompt length falls
    behind ATen's as the prompt grows, and the placement race, timed at one length,
    cannot see it (docs/generation.md, ``benchmarks/prefill_lengths.py``)."""
    from torch.export import Dim

    from .errors import UnsupportedOp

    if "plan" in compile_kwargs or compile_kwargs.get("placement", "auto") != "auto":
        return None
    n = max(short + 1, min(example_length, max_length - 1))
    example = ids.repeat(1, -(-n // ids.shape[1]))[:, :n]
    shapes = ({1: Dim("long_prompt", min=short + 1, max=max_length - 1)},)
    try:
        return compile_fn(prefill_m, (example,), dynamic_shapes=shapes, plan=_ATEN_REGION,
                          **compile_kwargs)
    except UnsupportedOp as e:  # no such candidate here
        log.info("one prefill for every prompt length: %s", e)
        return None


def _full_attention(cfg, max_length: int) -> None:
    """An ``AotError`` unless every layer attends to every earlier position up to
    ``max_length`` (the masks both decodes and prefill's capture assume): a sliding
    window shorter than ``max_length`` specialises the prompt's length at capture, and
    layers of another kind (linear attention) keep states of their own."""
    window = getattr(cfg, "sliding_window", None)
    if isinstance(window, int) and window < max_length:
        raise AotError(f"the model's attention slides over {window} positions, fewer than "
                       f"max_length={max_length}: not served (compile with max_length <= "
                       f"{window})", stage="import")
    kinds = set(getattr(cfg, "layer_types", None) or ()) - {"full_attention",
                                                            "sliding_attention"}
    if kinds:
        raise AotError(f"the model has layers of kind {', '.join(sorted(kinds))}: only "
                       "attention layers are served", stage="import")


def _static_decode(static_m, compile_fn, last, past, max_length: int, compile_kwargs):
    """Decode over a cache of ``max_length`` positions, captured at the example's
    position (the prompt's length) with the prompt's keys and values in place."""
    import torch

    cache = static_cache(past, max_length)
    length = past[0].shape[2]
    position = torch.full((last.shape[0], 1), length, dtype=torch.int64)
    try:
        with torch.no_grad():
            static_m(last, position, *cache)
    except Exception as e:  # noqa: BLE001  (the model's own code refused the layout)
        raise AotError(f"{type(e).__name__}: {e}", stage="import") from e
    return compile_fn(static_m, (last, position, *cache), **compile_kwargs)
