"""A character tokenizer and a tiny GPT-2 built from a config, for tests and CPU demos of RLVR.

No model or tokenizer is downloaded: `CharTokenizer` gives one token per character of its vocabulary
string (plus <pad> and <eos>), and `tiny_gpt2` builds a randomly initialised `GPT2LMHeadModel`
(needs the `llm` extra: transformers). Both speak the small part of the Hugging Face interface
that keelrl uses, so a real model and tokenizer loaded from disk drop in unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable

from keelrl.networks.lm_policy import import_transformers

DEFAULT_VOCAB = "0123456789+-*/()=,:<> abcdefghijklmnopqrstuvwxyz"
"""Every character the keelrl RLVR tasks write (digits, operators, separators, lowercase letters)."""


class CharTokenizer:
    """One token per character; id 0 is <pad>, id 1 is <eos>, then the vocabulary string in order."""

    pad_token = "<pad>"
    eos_token = "<eos>"

    def __init__(self, vocab: str = DEFAULT_VOCAB):
        if len(set(vocab)) != len(vocab):
            repeated = sorted({ch for ch in vocab if vocab.count(ch) > 1})
            raise ValueError(f"CharTokenizer vocabulary repeats {repeated}; give each character once.")
        self.vocab = vocab
        self.pad_token_id = 0
        self.eos_token_id = 1
        self._char_to_id = {ch: i + 2 for i, ch in enumerate(vocab)}

    def __len__(self) -> int:
        return len(self.vocab) + 2

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text` (no special tokens are ever added; the flag mirrors Hugging Face's)."""
        unknown = sorted(set(text) - self._char_to_id.keys())
        if unknown:
            raise ValueError(f"characters {unknown} are not in the tokenizer vocabulary {self.vocab!r}; "
                             f"build CharTokenizer with a vocabulary that contains them.")
        return [self._char_to_id[ch] for ch in text]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        specials = {self.pad_token_id: self.pad_token, self.eos_token_id: self.eos_token}
        pieces = []
        for token in ids:
            token = int(token)
            if token in specials:
                if not skip_special_tokens:
                    pieces.append(specials[token])
            else:
                pieces.append(self.vocab[token - 2])
        return "".join(pieces)


def tiny_gpt2(tokenizer, context_length: int = 32, n_layer: int = 2, n_embd: int = 64, n_head: int = 4):
    """A randomly initialised GPT2LMHeadModel sized for CPU demos (2 layers × 64 wide: about 100k parameters).

    Dropout is off: RL policies are sampled and trained in the same (deterministic) mode.
    """
    transformers = import_transformers()
    if n_embd % n_head:
        raise ValueError(f"n_embd ({n_embd}) must be a multiple of n_head ({n_head}).")
    config = transformers.GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=context_length,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        activation_function="gelu",  # torch's fused GELU: faster on CPU than GPT-2's tanh approximation
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return transformers.GPT2LMHeadModel(config)
