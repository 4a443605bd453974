"""A small BERT-style encoder: embeddings, multi-head attention, layer norm, GELU (random init)."""

from __future__ import annotations

import math

import torch
from torch import nn


class EncoderLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.ln1 = nn.LayerNorm(hidden)
        self.ff1 = nn.Linear(hidden, ffn)
        self.ff2 = nn.Linear(ffn, hidden)
        self.ln2 = nn.LayerNorm(hidden)

    def forward(self, x, bias=None):
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / math.sqrt(h // self.heads)
        if bias is not None:  # (b, 1, 1, s): -10000 on padded keys
            scores = scores + bias
        att = torch.softmax(scores, dim=-1)
        ctx = (att @ v).transpose(1, 2).reshape(b, s, h)
        x = self.ln1(x + self.out(ctx))
        return self.ln2(x + self.ff2(nn.functional.gelu(self.ff1(x))))


class BertEncoder(nn.Module):
    def __init__(self, vocab=1000, hidden=128, heads=4, layers=2, ffn=512, max_len=128):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(max_len, hidden)
        self.ln = nn.LayerNorm(hidden)
        self.layers = nn.ModuleList(EncoderLayer(hidden, heads, ffn) for _ in range(layers))

    def forward(self, ids, mask=None):
        """``ids`` (batch, seq) int64; ``mask`` (batch, seq), 1 for tokens, 0 for padding."""
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.ln(self.tok(ids) + self.pos(pos))
        bias = None if mask is None else (1.0 - mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            x = layer(x, bias)
        return x


def bert_encoder(seq: int = 128, seed: int = 0, max_len: int = 128):
    """``(model, (ids,))`` with int64 token ids of shape (1, seq); positions up to
    ``max(seq, max_len)``."""
    torch.manual_seed(seed)
    m = BertEncoder(max_len=max(seq, max_len)).eval()
    g = torch.Generator().manual_seed(seed)
    return m, (torch.randint(0, 1000, (1, seq), generator=g),)
