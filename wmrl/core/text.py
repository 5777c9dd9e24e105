"""The built-in instruction encoder: a word tokenizer and a bag-of-words embedding, shared by the world model and
the VLA policy. It is pluggable through `TEXT_ENCODERS` (anything mapping a list of B strings to (B, dim))."""

from __future__ import annotations

import re
import warnings

import numpy as np
import torch
from torch import nn

from wmrl.core.registry import Registry

TEXT_ENCODERS = Registry("text encoder")


def words(text: str) -> list[str]:
    """The tokenizer: lower-case alphanumeric words."""
    return re.findall(r"[a-z0-9]+", text.lower())


def word_presence(tasks, vocab: list[str]) -> np.ndarray:
    """(B, V) float32: 1 where word v of `vocab` occurs in instruction b (a fixed, parameter-free bag of words for
    small state policies; `tasks`: one instruction or B of them)."""
    tasks = [tasks] if isinstance(tasks, str) else [str(t) for t in np.asarray(tasks, dtype=object).reshape(-1)]
    index = {w: i for i, w in enumerate(vocab)}
    out = np.zeros((len(tasks), len(vocab)), np.float32)
    for b, t in enumerate(tasks):
        for w in words(t):
            if w in index:
                out[b, index[w]] = 1.0
    return out


@TEXT_ENCODERS.register("bow")
class TaskEncoder(nn.Module):
    """Bag-of-words embedding of the instruction over a vocabulary fixed at construction. Unknown words are
    ignored (with a warning, once per word), so new combinations of known words (a colour with another zone) still
    embed meaningfully."""

    def __init__(self, vocab: list[str], dim: int = 32):
        super().__init__()
        self.vocab = sorted(set(vocab))
        self.index = {w: i + 1 for i, w in enumerate(self.vocab)}  # 0 = padding
        self.emb = nn.EmbeddingBag(len(self.vocab) + 1, dim, mode="mean", padding_idx=0)
        self._warned: set[str] = set()

    words = staticmethod(words)

    def forward(self, tasks: list[str] | torch.Tensor) -> torch.Tensor:
        """B instructions, or their (B, n) token ids from `token_ids` (a training loop gathers those on the device
        by task index instead of tokenising strings every step)."""
        return self.emb(tasks if torch.is_tensor(tasks) else self.token_ids(tasks))

    def token_ids(self, tasks: list[str]) -> torch.Tensor:
        """(B, n) word ids, right-padded with 0, on the embedding's device."""
        toks = [words(t) for t in tasks]
        unknown = {w for ws in toks for w in ws if w not in self.index} - self._warned
        if unknown:
            self._warned |= unknown
            warnings.warn(f"instruction words outside the training vocabulary are ignored: {sorted(unknown)}",
                          stacklevel=2)
        ids = [[self.index.get(w, 0) for w in ws] or [0] for ws in toks]
        n = max(len(i) for i in ids)
        return torch.tensor([i + [0] * (n - len(i)) for i in ids], device=self.emb.weight.device)
