"""Hugging Face ``transformers`` models built from their configs, for benchmarks (random weights).

Nothing is downloaded: each model is constructed from a config written out here
(the published sizes of the checkpoint it stands for) and initialised by
``transformers`` itself after ``torch.manual_seed(seed)``, so every process that
builds a model gets the same weights. The example is int64 token ids of shape
``(batch, seq)``, without an attention mask or a KV cache.

The models are wrapped so that ``forward(ids)`` returns one tensor (the encoder's
``last_hidden_state``, or the language model's ``logits``) instead of a
``ModelOutput``. Needs ``transformers`` (the ``bench`` extra).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["HF", "hf_model"]

# name -> (what it stands for, vocabulary size)
HF = {
    "bert_base": ("bert-base-uncased: 12 layers, hidden 768, 12 heads, FFN 3072", 30522),
    "distilbert": ("distilbert-base-uncased: 6 layers, hidden 768, 12 heads, FFN 3072", 30522),
    "t5_small_enc": ("t5-small's encoder: 6 layers, d_model 512, 8 heads, d_ff 2048", 32128),
    "llama_small": ("a small Llama: 4 layers, hidden 512, 8 heads, MLP 1376, with its LM head",
                    32000),
    "mobilebert": ("google/mobilebert-uncased: 24 layers, hidden 512 with bottlenecks of 128, "
                   "4 heads, four FFNs of 512 per layer", 30522),
}


class _TensorOut(nn.Module):
    """``forward(ids)`` -> ``getattr(model(input_ids=ids), field)``."""

    def __init__(self, model: nn.Module, field: str):
        super().__init__()
        self.model, self.field = model, field

    def forward(self, ids):
        return getattr(self.model(input_ids=ids), self.field)


def _build(name: str) -> _TensorOut:
    import transformers as tf

    if name == "bert_base":
        return _TensorOut(tf.BertModel(tf.BertConfig(), add_pooling_layer=False),
                          "last_hidden_state")
    if name == "distilbert":
        return _TensorOut(tf.DistilBertModel(tf.DistilBertConfig()), "last_hidden_state")
    if name == "t5_small_enc":
        cfg = tf.T5Config(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6,
                          num_heads=8, feed_forward_proj="relu", use_cache=False)
        return _TensorOut(tf.T5EncoderModel(cfg), "last_hidden_state")
    if name == "llama_small":
        cfg = tf.LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1376,
                             num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
                             max_position_embeddings=2048, use_cache=False)
        return _TensorOut(tf.LlamaForCausalLM(cfg), "logits")
    if name == "mobilebert":
        return _TensorOut(tf.MobileBertModel(tf.MobileBertConfig(), add_pooling_layer=False),
                          "last_hidden_state")
    raise ValueError(f"no Hugging Face model {name!r}; choose one of {tuple(HF)}")


def hf_model(name: str, batch: int = 1, seq: int = 128, seed: int = 0):
    """``(model.eval(), (ids,))`` for model ``name`` of ``HF``; ``ids`` int64
    ``(batch, seq)`` drawn from the model's vocabulary."""
    if name not in HF:
        raise ValueError(f"no Hugging Face model {name!r}; choose one of {tuple(HF)}")
    torch.manual_seed(seed)
    m = _build(name).eval()
    g = torch.Generator().manual_seed(seed)
    return m, (torch.randint(0, HF[name][1], (batch, seq), generator=g),)
