"""A compiled causal LM's generator: prefill and decode artifacts, greedy ``generate``.

``aot.causal_lm.compile_causal_lm`` makes one; ``CausalLMGenerator.save`` writes a folder
(``prefill.aot``, ``decode.aot``, ``generator.json``: numbers and token ids only) and
``aot.load(folder)`` reads it back (``read_description`` validates the JSON; nothing
read from it runs). docs/generation.md.
"""

from __future__ import annotations

import json
import os
import threading

from ..errors import ArtifactError, InputMismatch

__all__ = ["CausalLMGenerator", "read_description", "check_entry_points", "static_cache",
           "GENERATOR_FILE", "FORMAT", "CACHES"]

GENERATOR_FILE = "generator.json"
FORMAT = 1
# how decode holds the cache: the generator's own, written in place ("static"), or
# passed in and returned one position longer ("dynamic"; docs/generation.md)
CACHES = ("static", "dynamic")


class CausalLMGenerator:
    """Prefill and decode of one model, and greedy ``generate`` over them."""

    def __init__(self, prefill, decode, meta: dict, prefill_long=None):
        self.prefill, self.decode, self.prefill_long = prefill, decode, prefill_long
        # prompts longer than this go to ``prefill_long`` (None: every prompt to prefill)
        self.long_from = meta.get("long_prompt_from")
        self.max_length = meta["max_length"]
        self.batch_size = meta["batch_size"]
        self.n_layers = meta["n_layers"]
        self.eos = list(meta["eos"])
        self.pad = meta["pad"]
        self.cache = meta.get("cache", "dynamic")
        self.meta = dict(meta)
        self._lock = threading.Lock()
        self._static = None  # the static cache's tensors, made by the first call

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
            long = self.long_from is not None and input_ids.shape[1] >= self.long_from
            logits, *cache = (self.prefill_long if long else self.prefill)(input_ids)
            if self.cache == "static":  # made once, then reused (under the lock)
                cache = self._static = static_cache(cache, self.max_length, self._static)
                at = torch.empty((self.batch_size, 1), dtype=torch.int64)
            position = input_ids.shape[1]
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
                if self.cache == "static":
                    at.fill_(position)
                    logits, *rows = self.decode(token[:, None], at, *cache)
                    for c, r in zip(cache, rows):  # this token's keys and values, in place
                        c[:, :, position:position + 1].copy_(r)
                else:
                    logits, *cache = self.decode(token[:, None], *cache)
                position += 1
        return torch.cat([input_ids, torch.stack(new, 1)], 1)

    def save(self, folder: str) -> None:
        """Write the generator to ``folder`` (made if missing), loadable by ``aot.load``."""
        os.makedirs(folder, exist_ok=True)
        self.prefill.save(os.path.join(folder, "prefill.aot"))
        self.decode.save(os.path.join(folder, "decode.aot"))
        if self.prefill_long is not None:
            self.prefill_long.save(os.path.join(folder, "prefill_long.aot"))
        with open(os.path.join(folder, GENERATOR_FILE), "w") as f:
            json.dump(self.meta, f, indent=1)

    def report(self) -> str:
        """Where each entry point's time goes (the candidate each runs as, and its
        measured time a call), then each one's report: what was compiled, what runs
        in ATen, and why."""
        short = (self.long_from or self.max_length) - 1
        entries = [(f"prefill, prompts of 1..{short} tokens", self.prefill)]
        if self.prefill_long is not None:
            entries.append((f"prefill, prompts of {self.long_from}..{self.max_length - 1} "
                            "tokens", self.prefill_long))
        entries.append(("decode, one token a step", self.decode))
        out = "entry points (each measured on the machine that compiled it):\n" + "".join(
            f"  {name}: {_runs_as(module)}\n" for name, module in entries)
        out += "== prefill ==\n" + self.prefill.report()
        if self.prefill_long is not None:
            out += (f"\n== prefill of prompts of {self.long_from} tokens or more ==\n"
                    + self.prefill_long.report())
        return out + "\n== decode ==\n" + self.decode.report()


def check_entry_points(prefill, decode, meta: dict, folder: str, prefill_long=None) -> None:
    """An ``ArtifactError`` unless each prefill takes the ids alone and decode the inputs
    its cache form needs (the token, its position for the static cache, then each
    layer's keys and values): a description that does not match its artifacts."""
    want = 2 * meta["n_layers"] + (2 if meta["cache"] == "static" else 1)
    entries = [("prefill", prefill, 1), ("decode", decode, want)]
    if prefill_long is not None:
        entries.append(("prefill_long", prefill_long, 1))
    for name, module, n in entries:
        got = len(module.manifest.inputs)
        if got != n:
            raise ArtifactError(f"{folder!r}: {GENERATOR_FILE} describes a {meta['cache']} "
                                f"cache over {meta['n_layers']} layers, whose {name} takes "
                                f"{n} inputs; {name}.aot takes {got}", stage="load")


def static_cache(prompt: list, max_length: int, reuse: list | None = None) -> list:
    """Cache tensors of ``max_length`` positions (``batch x heads x max_length x head
    dim``), the prompt's keys and values (``prompt``, in layer order) at the start:
    ``reuse``'s tensors where they have those shapes and dtypes, new ones otherwise.
    What lies past the prompt is never read before a token's keys and values are
    written there."""
    import torch

    shapes = [((*p.shape[:2], max_length, *p.shape[3:]), p.dtype) for p in prompt]
    if reuse is None or len(reuse) != len(prompt) or any(
            (tuple(c.shape), c.dtype) != s for c, s in zip(reuse, shapes)):
        reuse = [torch.zeros(shape, dtype=dtype) for shape, dtype in shapes]
    for c, p in zip(reuse, prompt):
        c[:, :, :p.shape[2]].copy_(p)
    return reuse


def _runs_as(module) -> str:
    """The candidate a compiled module runs as, its time a call where measured."""
    m = module.manifest
    region = m.region or m.variant or {}
    chosen = region.get("chosen")
    calls = len(m.kernel_calls)
    what = f"{chosen or 'per-op placement'}, {calls} kernel call(s) into ATen"
    ms = (region.get("candidates_ms") or {}).get(chosen)
    if ms is None:
        return what + (f" ({region['source']})" if region.get("source") else "")
    at = ", ".join(f"{e.get('name') or s}={e['example']}" for s, e in (m.symbols or {}).items())
    return what + f", {ms:.2f} ms a call" + (f" at {at}" if at else "")


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


def read_description(folder: str) -> dict:
    """The generator description in ``folder``, every field checked."""
    path = os.path.join(folder, GENERATOR_FILE)
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise ArtifactError(f"{path!r}: {e}", stage="load") from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ArtifactError(f"{path!r}: not a generator description of format {FORMAT}",
                            stage="load")
    clean = {"format": FORMAT, "max_length": _int(meta, "max_length", 2),
             "batch_size": _int(meta, "batch_size", 1), "n_layers": _int(meta, "n_layers", 1),
             "vocab_size": _int(meta, "vocab_size", 1)}
    eos, pad = meta.get("eos"), meta.get("pad")
    if not isinstance(eos, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                            for x in eos):
        raise ArtifactError(f"{path!r}: eos is {eos!r}, not a list of token ids", stage="load")
    if pad is not None and (not isinstance(pad, int) or isinstance(pad, bool)):
        raise ArtifactError(f"{path!r}: pad is {pad!r}, not a token id", stage="load")
    cache = meta.get("cache", "dynamic")  # folders written before the static cache
    if cache not in CACHES:
        raise ArtifactError(f"{path!r}: cache is {cache!r}, not one of {', '.join(CACHES)}",
                            stage="load")
    clean.update(eos=eos, pad=pad, cache=cache)
    if meta.get("long_prompt_from") is not None:  # absent: one prefill for every prompt
        clean["long_prompt_from"] = _int(meta, "long_prompt_from", 2)
        if clean["long_prompt_from"] >= clean["max_length"]:
            raise ArtifactError(f"{path!r}: long_prompt_from is {clean['long_prompt_from']}, "
                                f"not below max_length {clean['max_length']}", stage="load")
    return clean
