"""Greedy generation with a Hugging Face causal language model compiled ahead of time.

``compile_causal_lm(model, max_length=..., batch_size=...)`` compiles two entry points
of one model (``aot.compile`` each, with its placement and kernel calls):

- **prefill**: the prompt's ids (``batch x T``, ``T`` dynamic in ``1..max_length``) ->
  the last position's logits and each layer's keys and values;
- **decode**: one token per sequence and the cache so far (length ``P`` dynamic in
  ``1..max_length - 1``) -> the logits and the cache one position longer.

The cache is a flat list of tensors (per layer: keys, values; ``batch x heads x length
x head dim``) held by one ``generate`` call: decode returns it one position longer (the
model's own ``DynamicCache`` update, a concatenation). ``generate`` picks the most
likely token each step and stops where ``model.generate(do_sample=False)`` stops (an
end-of-sequence token ends a row; finished rows get the pad token), so its tokens are
Hugging Face's. Each call starts from an empty cache and holds the generator's lock:
calls from several threads run one after another.

``save(folder)`` writes ``prefill.aot``, ``decode.aot`` and ``generator.json`` (numbers
and token ids only); ``aot.load(folder)`` returns the generator.
"""

from __future__ import annotations

import json
import os
import threading

from .errors import AotError, ArtifactError, InputMismatch

__all__ = ["compile_causal_lm", "CausalLMGenerator", "load_generator", "GENERATOR_FILE"]

GENERATOR_FILE = "generator.json"
_FORMAT = 1
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
    from transformers.cache_utils import DynamicCache

    # the cache argument's name: ``cache`` from transformers 5.2x (``past_key_values``
    # before, and deprecated since)
    params = inspect.signature(model.forward).parameters
    cache_arg = "cache" if "cache" in params else "past_key_values"

    class Prefill(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids):
            out = self.model(input_ids=input_ids, use_cache=True)
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

    return Prefill().eval(), Decode().eval()


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


def compile_causal_lm(model, *, max_length: int, batch_size: int = 1, example_length: int = 8,
                      **compile_kwargs) -> "CausalLMGenerator":
    """Compile ``model`` (a ``transformers`` causal LM: ``...ForCausalLM``,
    ``GPT2LMHeadModel``) for greedy generation of sequences up to ``max_length``
    tokens (prompt and new ones), ``batch_size`` sequences at a time.

    ``example_length``: the prompt length prefill is captured and measured at (any
    length in range runs). ``compile_kwargs`` go to both ``aot.compile`` calls
    (``target``, ``fallback``, ...). Raises ``AotError`` for what this cannot serve:
    not a ``transformers`` model with a cache, sizes out of range, a generation config
    that changes greedy tokens."""
    import torch
    from torch.export import Dim

    from . import compile as aot_compile
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
    settings = _generation_settings(model)
    model = model.eval()
    prefill_m, decode_m = _step_modules(model, n_layers)
    vocab = int(cfg.vocab_size)
    t = min(example_length, max_length - 1)
    ids = torch.randint(0, vocab, (batch_size, t), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, *past = prefill_m(ids)
    prompt = Dim("prompt", min=1, max=max_length - 1)
    prefill = aot_compile(prefill_m, (ids,), dynamic_shapes=({1: prompt},), **compile_kwargs)
    last = ids[:, -1:].clone()
    seen = Dim("past", min=1, max=max_length - 1)
    decode = aot_compile(decode_m, (last, *past),
                         dynamic_shapes=(None, tuple({2: seen} for _ in past)),
                         **compile_kwargs)
    meta = {"format": _FORMAT, "max_length": max_length, "batch_size": batch_size,
            "n_layers": int(n_layers), "vocab_size": vocab, **settings}
    return CausalLMGenerator(prefill, decode, meta)


class CausalLMGenerator:
    """Prefill and decode of one model, and greedy ``generate`` over them."""

    def __init__(self, prefill, decode, meta: dict):
        self.prefill, self.decode = prefill, decode
        self.max_length = meta["max_length"]
        self.batch_size = meta["batch_size"]
        self.n_layers = meta["n_layers"]
        self.eos = list(meta["eos"])
        self.pad = meta["pad"]
        self.meta = dict(meta)
        self._lock = threading.Lock()

    def _check(self, input_ids, max_new_tokens, attention_mask):
        import torch

        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 \
                or input_ids.dtype != torch.int64:
            raise InputMismatch("input_ids: an int64 tensor of batch x prompt length is "
                                f"needed, not {_describe(input_ids)}")
        b, t = input_ids.shape
        if b != self.batch_size:
            raise InputMismatch(f"input_ids has a batch of {b}; this generator was compiled "
                                f"for {self.batch_size}")
        if t < 1:
            raise InputMismatch("input_ids: an empty prompt")
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) \
                or max_new_tokens < 1:
            raise InputMismatch(f"max_new_tokens={max_new_tokens!r}: a positive integer "
                                "is needed")
        if t + max_new_tokens > self.max_length:
            raise InputMismatch(f"a prompt of {t} tokens and {max_new_tokens} new ones make "
                                f"{t + max_new_tokens}, past max_length={self.max_length} "
                                "this generator was compiled for")
        if attention_mask is not None:
            if not isinstance(attention_mask, torch.Tensor) \
                    or tuple(attention_mask.shape) != (b, t):
                raise InputMismatch(f"attention_mask: a {b} x {t} tensor is needed, not "
                                    f"{_describe(attention_mask)}")
            if not bool((attention_mask == 1).all()):
                raise InputMismatch("attention_mask masks prompt tokens out: padded prompts "
                                    "are not served yet (give each row unpadded)")
        if int(input_ids.min()) < 0 or int(input_ids.max()) >= self.meta["vocab_size"]:
            raise InputMismatch(f"input_ids holds token ids outside the vocabulary "
                                f"(0..{self.meta['vocab_size'] - 1})")

    def generate(self, input_ids, max_new_tokens: int = 20, attention_mask=None):
        """``input_ids`` followed by up to ``max_new_tokens`` greedy tokens per row, as
        ``model.generate(input_ids, do_sample=False, max_new_tokens=...)`` returns."""
        import torch

        self._check(input_ids, max_new_tokens, attention_mask)
        eos = torch.tensor(self.eos, dtype=torch.int64)
        with self._lock, torch.no_grad():
            logits, *cache = self.prefill(input_ids)
            done = torch.zeros(self.batch_size, dtype=torch.bool)
            new = []
            for step in range(max_new_tokens):
                token = logits.argmax(-1)
                if self.pad is not None:
                    token = torch.where(done, torch.tensor(self.pad), token)
                new.append(token)
                if len(self.eos):
                    done = done | torch.isin(token, eos)
                if bool(done.all()) or step == max_new_tokens - 1:
                    break
                logits, *cache = self.decode(token[:, None], *cache)
        return torch.cat([input_ids, torch.stack(new, 1)], 1)

    def save(self, folder: str) -> None:
        """Write the generator to ``folder`` (made if missing), loadable by ``aot.load``."""
        os.makedirs(folder, exist_ok=True)
        self.prefill.save(os.path.join(folder, "prefill.aot"))
        self.decode.save(os.path.join(folder, "decode.aot"))
        with open(os.path.join(folder, GENERATOR_FILE), "w") as f:
            json.dump(self.meta, f, indent=1)

    def report(self) -> str:
        """Each entry point's report: what was compiled, what runs in ATen, and why."""
        return ("== prefill ==\n" + self.prefill.report()
                + "\n== decode ==\n" + self.decode.report())


def _describe(x) -> str:
    shape = getattr(x, "shape", None)
    dtype = getattr(x, "dtype", None)
    return f"{type(x).__name__}" + (f" {tuple(shape)} {dtype}" if shape is not None else "")


def _int(meta: dict, key: str, low: int) -> int:
    v = meta.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < low:
        raise ArtifactError(f"{GENERATOR_FILE}: {key} is {v!r}, not an integer of at least "
                            f"{low}", stage="load")
    return v


def load_generator(folder: str, **load_kwargs) -> CausalLMGenerator:
    """The generator ``CausalLMGenerator.save`` wrote to ``folder``; ``load_kwargs``
    apply to both entry points' files (``aot.load``'s)."""
    from .runtime.loading import load

    path = os.path.join(folder, GENERATOR_FILE)
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise ArtifactError(f"{path!r}: {e}", stage="load") from e
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
        raise ArtifactError(f"{path!r}: not a generator description of format {_FORMAT}",
                            stage="load")
    clean = {"format": _FORMAT, "max_length": _int(meta, "max_length", 2),
             "batch_size": _int(meta, "batch_size", 1), "n_layers": _int(meta, "n_layers", 1),
             "vocab_size": _int(meta, "vocab_size", 1)}
    eos, pad = meta.get("eos"), meta.get("pad")
    if not isinstance(eos, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                            for x in eos):
        raise ArtifactError(f"{path!r}: eos is {eos!r}, not a list of token ids", stage="load")
    if pad is not None and (not isinstance(pad, int) or isinstance(pad, bool)):
        raise ArtifactError(f"{path!r}: pad is {pad!r}, not a token id", stage="load")
    clean.update(eos=eos, pad=pad)
    prefill = load(os.path.join(folder, "prefill.aot"), **load_kwargs)
    decode = load(os.path.join(folder, "decode.aot"), **load_kwargs)
    return CausalLMGenerator(prefill, decode, clean)
