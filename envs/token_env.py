"""Token generation as an environment: the observation is the token ids so far, the action is the next token.

An episode starts from a task's prompt, appends one token per step, and ends at EOS (terminated) or
when the completion reaches `max_new_tokens` or the sequence fills `context_length` (truncated).
The only reward comes at the end: the task's verifier on the decoded completion (EOS excluded).
A verifier that raises or returns something other than a finite number gives that sample reward 0;
the env counts it (`verifier_errors`), warns once, and goes on.

`GroupTokenEnv` is the batched form RLVR trains on: P prompts, each repeated G times (the group),
N = P·G rows stepped together. Rows end independently; an ended row ignores its actions until
every row has ended and the caller resets. `TokenEnv` is the single-sequence gymnasium env (P = G = 1),
for classic agents and gymnasium's tools.

Observations are (context_length,) int64 arrays per row: the prompt and generated tokens from the
left, then UNFILLED (-1) in the positions not written yet. The tokenizer needs `encode(text,
add_special_tokens=False)`, `decode(ids, skip_special_tokens=True)`, `eos_token_id` and `len()`;
Hugging Face tokenizers and keelrl.networks.char_lm.CharTokenizer both have them.
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any

import gymnasium as gym
import numpy as np

from keelrl.envs.rlvr_tasks import Problem, Task

UNFILLED = -1
"""Observation value of positions not written yet."""


def safe_reward(task: Task, problem: Problem, completion: str) -> tuple[float, str | None]:
    """The verifier's reward, or (0.0, what went wrong) when it raises or returns a non-number."""
    try:
        reward = task.verify(problem, completion)
    except Exception as err:  # a user's verifier may raise anything; the run must go on
        return 0.0, f"raised {type(err).__name__}: {err}"
    if not isinstance(reward, numbers.Real) or not math.isfinite(reward):
        return 0.0, f"returned {reward!r}, not a finite number"
    return float(reward), None


class GroupTokenEnv:
    """N = num_prompts × group_size token sequences generated in lockstep; row i belongs to group i // group_size."""

    def __init__(self, task: Task, tokenizer, num_prompts: int = 1, group_size: int = 1, max_new_tokens: int = 16,
                 context_length: int = 64, split: str = "train", seed: int | None = None):
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no EOS token, so no episode could terminate; set one "
                             "(e.g. tokenizer.eos_token = '</s>') before building the env.")
        if num_prompts < 1 or group_size < 1 or max_new_tokens < 1:
            raise ValueError(f"num_prompts, group_size and max_new_tokens must be positive, "
                             f"got {num_prompts}, {group_size}, {max_new_tokens}.")
        if context_length < 2:
            raise ValueError(f"context_length must hold a prompt token and an answer token, got {context_length}.")
        self.task = task
        self.tokenizer = tokenizer
        self.num_prompts = num_prompts
        self.group_size = group_size
        self.num_envs = num_prompts * group_size
        self.max_new_tokens = max_new_tokens
        self.context_length = context_length
        self.split = split
        self.vocab_size = len(tokenizer)
        self.single_observation_space = gym.spaces.Box(UNFILLED, self.vocab_size - 1, (context_length,), np.int64)
        self.single_action_space = gym.spaces.Discrete(self.vocab_size)
        self.np_random = np.random.default_rng(seed)
        self.verifier_errors = 0
        self._warned = False
        self.done = np.ones(self.num_envs, dtype=bool)  # nothing to step before the first reset

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        """Start N new sequences. options={'problems': [...]} gives the num_prompts problems instead of sampling them.

        info holds 'problems' (one per row) and 'prompt_ids' (list of token id lists, one per row).
        """
        if seed is not None:
            self.np_random = np.random.default_rng(seed)
        problems = (options or {}).get("problems")
        if problems is None:
            problems = [self.task.sample(self.np_random, self.split) for _ in range(self.num_prompts)]
        elif len(problems) != self.num_prompts:
            raise ValueError(f"reset got {len(problems)} problems for an env of {self.num_prompts} prompts.")
        encoded = [self.tokenizer.encode(p.prompt, add_special_tokens=False) for p in problems]
        for problem, ids in zip(problems, encoded):
            if not 1 <= len(ids) < self.context_length:
                raise ValueError(f"prompt {problem.prompt!r} has {len(ids)} tokens, but the context holds "
                                 f"{self.context_length} and must keep room for an answer; raise context_length "
                                 f"(within the model's limit) or use shorter prompts.")
        self.problems = [p for p in problems for _ in range(self.group_size)]
        prompt_ids = [ids for ids in encoded for _ in range(self.group_size)]
        self.prompt_lengths = np.array([len(ids) for ids in prompt_ids])
        self.lengths = self.prompt_lengths.copy()
        self.tokens = np.full((self.num_envs, self.context_length), UNFILLED, dtype=np.int64)  # (N, L)
        for row, ids in enumerate(prompt_ids):
            self.tokens[row, : len(ids)] = ids
        self.done = np.zeros(self.num_envs, dtype=bool)
        self.completions: list[str | None] = [None] * self.num_envs
        return self.tokens.copy(), {"problems": self.problems, "prompt_ids": prompt_ids}

    @property
    def completion_lengths(self) -> np.ndarray:
        """Tokens generated so far in each row (EOS included)."""
        return self.lengths - self.prompt_lengths

    def step(self, actions) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        """Append one token to every running row; rows that end are scored by the verifier.

        terminated / truncated are True only at the step where a row ends; `self.done` marks ended rows.
        """
        if self.done.all():
            raise RuntimeError("every sequence has ended; call reset() before stepping again.")
        actions = np.asarray(actions, dtype=np.int64).reshape(self.num_envs)
        if actions.min() < 0 or actions.max() >= self.vocab_size:
            raise ValueError(f"actions must be token ids in [0, {self.vocab_size}), "
                             f"got {actions.min()}..{actions.max()}.")
        running = np.flatnonzero(~self.done)
        self.tokens[running, self.lengths[running]] = actions[running]
        self.lengths[running] += 1
        terminated = ~self.done & (actions == self.tokenizer.eos_token_id)
        full = (self.completion_lengths >= self.max_new_tokens) | (self.lengths >= self.context_length)
        truncated = ~self.done & ~terminated & full
        rewards = np.zeros(self.num_envs)
        errors = 0
        for row in np.flatnonzero(terminated | truncated):
            end = self.lengths[row] - int(terminated[row])  # the EOS token is not part of the answer
            text = self.tokenizer.decode(self.tokens[row, self.prompt_lengths[row]:end].tolist(),
                                         skip_special_tokens=True)
            self.completions[row] = text
            rewards[row], problem = safe_reward(self.task, self.problems[row], text)
            if problem is not None:
                errors += 1
                self._warn(problem)
        self.verifier_errors += errors
        self.done |= terminated | truncated
        return self.tokens.copy(), rewards, terminated, truncated, {"verifier_errors": errors}

    def _warn(self, problem: str) -> None:
        if not self._warned:
            warnings.warn(f"the {self.task.name} verifier {problem}; such samples get reward 0 and are counted "
                          f"in verifier_errors (warned once per env).", RuntimeWarning, stacklevel=3)
            self._warned = True


class TokenEnv(gym.Env):
    """One token sequence: observation (context_length,) token ids with UNFILLED (-1) padding, action the next token."""

    metadata = {"render_modes": []}

    def __init__(self, task: Task, tokenizer, max_new_tokens: int = 16, context_length: int = 64, split: str = "train"):
        self._group = GroupTokenEnv(task, tokenizer, 1, 1, max_new_tokens, context_length, split)
        self.observation_space = self._group.single_observation_space
        self.action_space = self._group.single_action_space

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        """options={'problem': Problem} starts from that problem instead of a sampled one."""
        super().reset(seed=seed)
        self._group.np_random = self.np_random
        problem = (options or {}).get("problem")
        obs, info = self._group.reset(options=None if problem is None else {"problems": [problem]})
        return obs[0], {"problem": info["problems"][0], "prompt_length": int(self._group.prompt_lengths[0])}

    def step(self, action) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs, rewards, terminated, truncated, info = self._group.step(np.asarray([action]))
        step_info = {"verifier_error": bool(info["verifier_errors"])}
        if terminated[0] or truncated[0]:
            step_info["completion"] = self._group.completions[0]
        return obs[0], float(rewards[0]), bool(terminated[0]), bool(truncated[0]), step_info
