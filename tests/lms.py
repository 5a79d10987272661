"""Tiny Hugging Face models built from configs in code (nothing is downloaded).

Each has 2 layers of width 16 and a vocabulary of :data:`VOCAB`, random
weights (seed 0), in eval mode: GPT-2 and GPT-Neo (learned absolute
positions), Llama (rotary positions), BERT (absolute, an encoder).
"""

from __future__ import annotations

import pytest
import torch

VOCAB = 50
LENGTHS = (8, 5, 3)
"""The real tokens of :func:`padded`'s rows; the batch is 8 positions wide."""


def gpt2() -> torch.nn.Module:
    """A GPT-2 language model (``GPT2LMHeadModel``)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=16, n_head=2, vocab_size=VOCAB, n_positions=32,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config).eval()


def gpt_neo() -> torch.nn.Module:
    """A GPT-Neo language model, one global and one local attention layer."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPTNeoConfig(
        num_layers=2, attention_types=[[["global", "local"], 1]], hidden_size=16,
        num_heads=2, vocab_size=VOCAB, max_position_embeddings=32, window_size=4,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return transformers.GPTNeoForCausalLM(config).eval()


def llama() -> torch.nn.Module:
    """A Llama language model (grouped-query attention)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
        max_position_embeddings=32, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval()


def bert() -> torch.nn.Module:
    """A BERT masked language model (``BertForMaskedLM``)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=32,
    )  # fmt: skip
    return transformers.BertForMaskedLM(config).eval()


def padded(side: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Three rows of :data:`LENGTHS` real tokens, padded on ``side`` (id 0)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (len(LENGTHS), max(LENGTHS)), generator=gen)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(LENGTHS):
        if side == "left":
            mask[row, max(LENGTHS) - length :] = 1
        else:
            mask[row, :length] = 1
    return {"input_ids": ids * mask, "attention_mask": mask}
