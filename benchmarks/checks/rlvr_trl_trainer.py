"""The TRL side of benchmarks/checks/rlvr_trl.py: TRL 1.16's GRPOTrainer on keelrl's model, prompts and verifier.

Imported only by `python -m keelrl.benchmarks.checks.rlvr_trl trl`, in a scratch virtual environment that has trl
(rlvr_trl.py's docstring gives the recipe); trl is never a keelrl dependency.

- the model: keelrl's load_model of the packaged GGUF file (float32), handed to the trainer as an instance; with
  β > 0 it is also saved to the scratch folder, from which TRL builds its reference model (TRL reads the reference
  from the policy's `_name_or_path`, which for a GGUF file names a folder that holds no config);
- the prompts: text that keelrl's ChatTask already rendered with the chat template, as a plain (not
  conversational) dataset, in keelrl's order (rlvr_trl_settings.keelrl_train_problems) with TRL's shuffling off; TRL
  tokenises plain prompts with the tokenizer's call, checked here to give keelrl's token ids (no special tokens added);
- the reward: keelrl's verifier through its env's own scoring (safe_reward) on the completion decoded as keelrl's
  env decodes it (EOS dropped, special tokens skipped);
- the evaluations: keelrl's heldout_metrics on the trained model wrapped in keelrl's LMPolicy (a TrainerCallback),
  before the first step, every eval_freq steps and after the last.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig as TRLConfig
from trl import GRPOTrainer

from keelrl.agents.grpo import build_task, heldout_metrics
from keelrl.benchmarks.checks.rlvr_trl_record import Clock, run_file, write_record
from keelrl.benchmarks.checks.rlvr_trl_settings import (
    EvalAgent,
    RunArgs,
    keelrl_config,
    keelrl_train_problems,
    trl_kwargs,
)
from keelrl.envs.rlvr_tasks import Problem, Task
from keelrl.envs.token_env import safe_reward
from keelrl.networks.lm_policy import LMPolicy, load_model, packaged_model_file


class TimedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose sampling (`_generate`) and scoring (`_calculate_rewards`) time goes to a Clock, with the
    generated tokens and the prompt token ids of every row."""

    def __init__(self, *args, clock: Clock, **kwargs):
        self.clock = clock
        super().__init__(*args, **kwargs)

    def _generate(self, prompts: list):
        generate = super()._generate
        output = self.clock.generating(lambda: generate(prompts))
        prompt_ids, completion_ids = output[0], output[1]
        self.clock.generated(sum(len(ids) for ids in completion_ids), prompt_ids)
        return output

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        calculate = super()._calculate_rewards
        return self.clock.generating(lambda: calculate(inputs, prompts, completions, completion_ids_list))


class Evaluations(TrainerCallback):
    """keelrl's held-out evaluation of the trainer's model (before training, every eval_freq steps, after the last
    step) and the iteration clock (an iteration starts at each step)."""

    def __init__(self, clock: Clock, agent_of: Callable[[torch.nn.Module], EvalAgent], task: Task,
                 problems: list[Problem], args: RunArgs):
        self.clock, self.agent_of, self.task, self.problems, self.args = clock, agent_of, task, problems, args
        self.rows: list[dict] = []

    def evaluate(self, model) -> None:
        was_training = model.training
        agent = self.agent_of(model)  # LMPolicy puts the model in eval mode (no dropout), as keelrl's side has it
        _, row = self.clock.evaluation(lambda: heldout_metrics(agent, self.task, self.problems, self.args.eval_samples,
                                                               self.args.pass_k), self.args.pass_k)
        self.rows.append(row)
        model.train(was_training)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        torch.set_num_threads(self.args.threads)  # after the trainer and accelerate have set themselves up
        self.evaluate(model)

    def on_step_begin(self, args, state, control, **kwargs):
        self.clock.iteration_begins()

    def on_step_end(self, args, state, control, model=None, **kwargs):
        every = self.args.eval_freq > 0 and state.global_step % self.args.eval_freq == 0
        if every or state.global_step == state.max_steps:
            self.evaluate(model)


def completion_text(ids: list[int], tokenizer) -> str:
    """A completion as keelrl's env gives it to the verifier: the final EOS dropped, special tokens skipped."""
    if ids and ids[-1] == tokenizer.eos_token_id:
        ids = ids[:-1]
    return tokenizer.decode(ids, skip_special_tokens=True)


def train_dataset(task: Task, problems: list[Problem], tokenizer) -> Dataset:
    """The prompts as TRL reads plain text ones, each with its problem's index; refuses prompts that TRL's
    tokenisation (the tokenizer's call) would give other token ids than keelrl's (encode without special tokens)."""
    prompts = [p.prompt for p in problems]
    for prompt, ids in zip(prompts, tokenizer(text=prompts)["input_ids"]):
        if ids != tokenizer.encode(prompt, add_special_tokens=False):
            raise ValueError(f"TRL would tokenise the prompt {prompt!r} differently from keelrl (special tokens "
                             f"added?): the comparison needs the same prompt tokens on both sides.")
    return Dataset.from_dict({"prompt": prompts, "problem": list(range(len(problems)))})


def run_trl(args: RunArgs) -> None:
    """TRL's GRPOTrainer for the settings; the same records as the keelrl side, and its GRPOConfig as JSON."""
    torch.set_num_threads(args.threads)
    config = keelrl_config(args)  # what keelrl's task, chat prompts and heldout_metrics read
    model, tokenizer = load_model(str(packaged_model_file(args.model)))
    task = build_task(config, tokenizer)
    problems = keelrl_train_problems(task, args)
    eval_problems = task.problems(args.eval_split, args.eval_episodes, seed=0)
    folder = Path(args.runs_dir) / f"trl-{args.task}-seed{args.seed}"
    if args.beta > 0:
        model.save_pretrained(folder / "reference")
        model.config._name_or_path = str(folder / "reference")

    def reward(prompts, completions, completion_ids, problem, **kwargs) -> list[float]:
        return [safe_reward(task, problems[index], completion_text(ids, tokenizer))[0]
                for index, ids in zip(problem, completion_ids)]

    def agent_of(trained) -> EvalAgent:
        return EvalAgent(LMPolicy(trained, tokenizer, args.temperature, args.precision), config)

    clock = Clock()
    callback = Evaluations(clock, agent_of, task, eval_problems, args)
    kwargs = trl_kwargs(args)
    trainer = TimedGRPOTrainer(model=model, reward_funcs=reward, args=TRLConfig(output_dir=str(folder), **kwargs),
                               train_dataset=train_dataset(task, problems, tokenizer), processing_class=tokenizer,
                               callbacks=[callback], clock=clock)
    check_trainer(trainer, tokenizer)
    trainer.train()
    config_file = run_file(args.out, args.task, "trl", args.seed, "grpo_config.json")
    config_file.parent.mkdir(parents=True, exist_ok=True)
    config_file.write_text(json.dumps(kwargs, indent=1) + "\n")
    write_record(args, "trl", clock, callback.rows)


def check_trainer(trainer: GRPOTrainer, tokenizer) -> None:
    """What the trainer derived from its config must make one step one iteration, ended by keelrl's EOS alone."""
    derived = trainer.args
    if derived.steps_per_generation != 1 or derived.generation_batch_size != derived.per_device_train_batch_size:
        raise ValueError(f"TRL derived steps_per_generation {derived.steps_per_generation} and generation batch "
                         f"{derived.generation_batch_size}: one generation per optimiser step is needed.")
    if trainer.eos_token_ids != [tokenizer.eos_token_id]:
        raise ValueError(f"TRL ends completions at token ids {trainer.eos_token_ids}, keelrl at "
                         f"{tokenizer.eos_token_id} only: the two sides would sample differently.")
