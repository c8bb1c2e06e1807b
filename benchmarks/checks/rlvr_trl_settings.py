"""What both sides of benchmarks/checks/rlvr_trl.py run with (`Settings`), and how each side gets them: keelrl's
GRPOConfig (`keelrl_config`), TRL's GRPOConfig keyword arguments (`trl_kwargs`) and keelrl's order of train prompts
(`keelrl_train_problems`); what cannot be matched is KNOWN_DIFFERENCES."""

from __future__ import annotations

import dataclasses
from typing import Literal, NamedTuple

import numpy as np

from keelrl.agents.grpo import GRPOConfig
from keelrl.envs.rlvr_tasks import Problem, Task
from keelrl.networks.lm_policy import LMPolicy

RESULTS = "benchmarks/results/rlvr_trl"
CONTEXT_LENGTH = 512
"""keelrl's context: room for the longest chat prompt (about 50 tokens for a+b) and any max_new_tokens used here"""
AGGREGATIONS = {"grpo": "sequence-mean", "bnpo": "token-mean", "dapo": "token-mean", "dr_grpo": "constant"}
"""TRL's loss_type -> keelrl's loss_aggregation (bnpo's micro-batch is the whole batch here, so it is dapo's)"""
KNOWN_DIFFERENCES = (
    "Sampling: keelrl samples with its own KV-cache decoder (position ids count real tokens only), TRL with "
    "transformers' `generate`; same temperature, top-p 1, no top-k, so the same distribution, but different random "
    "draws: the runs of one seed do not sample the same completions.",
    "Random streams: each side seeds python, numpy and torch with the run's seed, but they draw from them in "
    "different orders (TRL also shuffles the rows of each batch before its loss, which changes nothing of the loss).",
    "The ratio's denominator: keelrl divides by the log-probs its decoder sampled with (the same weights, computed "
    "with the KV cache at another batch shape, so equal up to rounding), TRL by the loss pass's own, detached (a "
    "ratio of exactly 1 before its one step).",
    "Weight decay (when not 0): keelrl decays every parameter, TRL (transformers' Trainer) all but biases and "
    "normalisation weights.",
    "TRL's forward passes for the loss (and the reference model's) take no position ids; SmolLM2's rotary positions "
    "then count the left padding too, which shifts every position of a row alike and leaves attention unchanged "
    "(up to rounding).",
    "Time split: TRL computes the reference model's log-probs (β > 0) while scoring, keelrl in its update; both are "
    "counted as update time here.",
)
"""What the two sides do differently although the settings match (the page lists them)"""


@dataclasses.dataclass
class Settings:
    """What both sides run with (the mappings below give each side its own names for them)."""

    task: str = "add"
    """RLVR task of keelrl.envs.rlvr_tasks, asked as a chat prompt"""
    task_size: int = 2
    """operands (add, chain), list length (sort), numbers (countdown) or quantities (word)"""
    max_value: int = 20
    """largest operand or value of the task"""
    model: str = "smollm2-135m"
    """a packaged model of keelrl.networks.lm_policy (SmolLM2-135M-Instruct, dequantised to float32)"""
    num_prompts: int = 8
    """P: train prompts per iteration"""
    group_size: int = 8
    """G: completions sampled per prompt"""
    max_new_tokens: int = 64
    """tokens per completion (EOS included) before it is cut"""
    learning_rate: float = 1e-6
    """AdamW learning rate"""
    anneal_lr: bool = True
    """decay the learning rate linearly to 0 over `iterations` (otherwise constant)"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    max_grad_norm: float = 1.0
    """gradient norm clip"""
    beta: float = 0.0
    """coefficient of the k3 KL to the untrained model (0: no reference model)"""
    clip_low: float = 0.2
    """ε_low: the ratio is clipped below at 1 − ε_low"""
    clip_high: float = 0.28
    """ε_high: the ratio is clipped above at 1 + ε_high"""
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo"] = "dapo"
    """loss aggregation under TRL's name: grpo (sequence mean), dapo and bnpo (token mean over the batch), dr_grpo
    (sum / (completions × max_new_tokens))"""
    scale_std: bool = True
    """divide the group-relative advantages by the group's reward std (+ 1e-4)"""
    temperature: float = 1.0
    """sampling temperature (and the policy's in the loss)"""
    iterations: int = 100
    """N: iterations (one batch of P·G completions and one optimiser step each)"""
    eval_freq: int = 10
    """iterations between evaluations (also before the first and after the last)"""
    eval_split: Literal["heldout", "validation"] = "heldout"
    """problems evaluated on: 'heldout' (the page's figures) or 'validation' (for choosing settings)"""
    eval_episodes: int = 100
    """problems per evaluation (the split may hold fewer)"""
    eval_samples: int = 8
    """sampled completions per evaluation problem for pass@1 and pass@k"""
    pass_k: int = 4
    """k of pass@k"""
    seed: int = 1
    """seed of python, numpy and torch on both sides, and of keelrl's prompt order"""
    threads: int = 1
    """torch CPU threads"""
    precision: Literal["fp32"] = "fp32"
    """float32 weights and products on both sides"""


@dataclasses.dataclass
class RunArgs(Settings):
    """Settings, and where a run writes."""

    runs_dir: str = "/tmp/keelrl-rlvr-trl"
    """scratch folder (outside the repository): keelrl's run directories, TRL's trainer output"""
    out: str = RESULTS
    """folder the run's CSVs (and the TRL side's GRPOConfig JSON) are written into"""
    commit_note: str = ""
    """written after the commit hash (e.g. 'with uncommitted changes')"""


def keelrl_config(s: Settings, runs_dir: str = "runs") -> GRPOConfig:
    """keelrl's GRPOConfig for the settings: no warm-up, 1 epoch × 1 minibatch, no entropy bonus, no preset."""
    return GRPOConfig(
        task=s.task, task_size=s.task_size, max_value=s.max_value, model=s.model, prompt_format="chat",
        precision=s.precision, context_length=CONTEXT_LENGTH, max_new_tokens=s.max_new_tokens,
        num_prompts=s.num_prompts, group_size=s.group_size, temperature=s.temperature, iterations=s.iterations,
        learning_rate=s.learning_rate, anneal_lr=s.anneal_lr, weight_decay=s.weight_decay,
        max_grad_norm=s.max_grad_norm, update_epochs=1, num_minibatches=1, loss_type=None, importance_level="token",
        sample_weighting="grpo", scale_std=s.scale_std, std_eps=1e-4, clip_low=s.clip_low, clip_high=s.clip_high,
        loss_aggregation=AGGREGATIONS[s.loss_type], beta=s.beta, ent_coef=0.0, top_entropy_fraction=1.0,
        filter_zero_std=False, warmup_steps=0, eval_freq=s.eval_freq, eval_split=s.eval_split,
        eval_episodes=s.eval_episodes, eval_samples=s.eval_samples, pass_k=s.pass_k, checkpoint_freq=s.iterations,
        checkpoint_minutes=0.0, log_freq=1, seed=s.seed, threads=s.threads, quiet=True, runs_dir=runs_dir, device="cpu")


def trl_kwargs(s: Settings) -> dict:
    """Keyword arguments of TRL 1.16's GRPOConfig (all but output_dir) that make one trainer step one iteration."""
    rows = s.num_prompts * s.group_size
    return {
        "num_generations": s.group_size, "per_device_train_batch_size": rows, "generation_batch_size": rows,
        # (TRL refuses steps_per_generation beside generation_batch_size; it derives 1 from these two)
        "gradient_accumulation_steps": 1, "num_iterations": 1, "max_steps": s.iterations,
        "max_completion_length": s.max_new_tokens, "temperature": s.temperature, "top_p": 1.0, "top_k": 0,
        "min_p": None, "repetition_penalty": 1.0, "learning_rate": s.learning_rate,
        "lr_scheduler_type": "linear" if s.anneal_lr else "constant", "warmup_steps": 0, "optim": "adamw_torch_fused",
        "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8, "weight_decay": s.weight_decay,
        "max_grad_norm": s.max_grad_norm, "beta": s.beta, "use_bias_correction_kl": False, "epsilon": s.clip_low,
        "epsilon_high": s.clip_high, "loss_type": s.loss_type, "scale_rewards": "group" if s.scale_std else "none",
        "importance_sampling_level": "token", "mask_truncated_completions": False, "top_entropy_quantile": 1.0,
        "entropy_coef": 0.0, "shuffle_dataset": False, "disable_dropout": True, "activation_checkpointing": False,
        "bf16": False, "fp16": False, "use_cpu": True, "seed": s.seed, "save_strategy": "no", "report_to": "none",
        "logging_steps": 1, "disable_tqdm": True, "dataloader_num_workers": 0, "remove_unused_columns": False,
    }


def keelrl_train_problems(task: Task, s: Settings) -> list[Problem]:
    """The train problems keelrl's GRPO trains on, in its order: its env draws P problems per reset from
    default_rng(seed), once before the loop (train's check that the prompts fit) and then once per iteration."""
    rng = np.random.default_rng(s.seed)
    drawn = [task.sample(rng, "train") for _ in range(s.num_prompts * (s.iterations + 1))]
    return drawn[s.num_prompts:]


class EvalAgent(NamedTuple):
    """What keelrl's heldout_metrics reads of an agent."""

    policy: LMPolicy
    config: GRPOConfig
