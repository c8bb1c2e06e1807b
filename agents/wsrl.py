"""Warm-start RL (WSRL; Zhou et al. 2024, "Efficient Online Reinforcement Learning Fine-Tuning Need Not Retain
Offline Data"): online SAC fine-tuning of an offline pre-trained CQL (or Cal-QL) run, keeping none of its data.

Run:     python -m keelrl.agents.cql --dataset keelrl/hopper-medium-v0 --preset wsrl --total-updates 250000
         python -m keelrl.agents.wsrl --pretrained RUN_DIR          (RUN_DIR: the finished CQL run's directory)
Import:  from keelrl.agents.wsrl import WSRL, WSRLConfig, train, evaluate

The algorithm, top to bottom (github.com/zhouzypaul/wsrl at 891ee35; file:line below are that repository's,
finetune.py at its root, sac_config.py and cql_config.py under experiments/configs/, the launch scripts under
experiments/scripts/locomotion/):
- start from the pre-trained run as it ended: actor, critics, target critics, temperature and the optimisers'
  states (finetune.py:209-219 restores the whole checkpoint); its observation statistics stay fixed; the
  environment is its dataset's;
- warm-up: `warmup_steps` environment steps with the pre-trained policy's sampled actions, stored in a replay
  buffer that starts empty, with no update (finetune.py:304-318,338-342); the offline data is never loaded;
- then SAC without the conservative term: per environment step one batch of `batch_size` transitions, split
  into `utd` minibatches; on each in turn a critic step onto r + γ(1 − terminated) min_{j∈S} Q'_j(s', a'),
  a' ~ π(s') and S a random subset of the critics (REDQ), then a target update; then one actor step on
  α log π(a|s) − min over all critics of Q(s, a) and one temperature step, on the whole batch
  (wsrl/agents/sac.py:624-678).
The networks are the pre-trained run's (agents/cql.py: `CQLActor`, a `CriticEnsemble`), the replay buffer
comes from keelrl.buffers, the run plumbing (logs, evaluations, checkpoints, resume) from keelrl.agents.harness.

Where keelrl differs from the reference (read at 891ee35; keelrl's behaviour as it is, matching is later work):
- the temperature: the reference's is α = softplus(θ) (wsrl/networks/lagrange.py:28-29,47-49,77-79; built at
  wsrl/agents/sac.py:605-610) with loss α·(H − H̄) (lagrange.py:65-72, sac.py:165-177), H = −mean log π(a'|s')
  of one fresh sample a' ~ π(s') per next state (sac.py:179-196,340-351); keelrl's is α = exp(log α) with loss
  log α·(H − H̄), H from the actions the actor step samples at s;
- the actor: the reference's has separate output layers for the mean and the log-std, std = exp(log-std) clipped
  to [1e-5, 10] (wsrl/networks/actor_critic_nets.py:92-93,112-126,153); keelrl keeps the pre-training's, CORL's
  actor (`CQLActor`: one output layer for both, log-std = m·raw + c with learnable m and c, clamped to [−20, 2]);
- the pre-training (agents/cql.py --preset wsrl) measures its temperature's entropy at s like this file; the
  reference's CQL at s′, over its 10 max-backup samples per next state (wsrl/agents/cql.py:206-223 in place of
  sac.py:179-196; cql_config.py:10,12);
- the warm-up is one transition shorter: the reference skips the update while (online steps before this one) ≤
  max(warmup_steps, batch_size) (finetune.py:111,338-342, the step counted at :375 after the transition is stored at
  :318), so its first update samples a buffer of warmup_steps + 2 transitions; keelrl's of warmup_steps + 1
  (`learning_starts`), and makes one update more in the same budget;
- the logged `losses/qf_loss`, `losses/qf_values` and `losses/qf_targets` are the last critic minibatch's; the
  reference logs their mean over the `utd` minibatches (sac.py:662-664);
- Cal-QL's logged bound rate (CQL with --cal-ql) counts the policy proposals below the bound out of the 2·N policy
  proposals; the reference out of all 3·N, the uniform ones (bound −∞, never below) included (wsrl/agents/
  cql.py:135-153), so keelrl's rate is 3/2 of the reference's;
- the initialisation: the reference's layers are orthogonal with gain √2, 0.01 on the last hidden layer (which
  LayerNorm then normalises) and √2 on the output layers (wsrl/networks/mlp.py:32-33); keelrl's critics put 0.01 on
  the output layer, and `CQLActor` keeps PyTorch's default on its hidden layers and Xavier 0.01 on its output;
- the reference's critics share one output layer (actor_critic_nets.py:41-72 around the ensemble of
  sac.py:595-603), and its frozen networks still take momentum-only Adam steps during a partial update (their
  losses replaced by 0.0 at sac.py:395-396, every optimiser's update still applied: wsrl/common/common.py:134-162).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from keelrl.agents.cql import cql_networks
from keelrl.agents.harness.checkpoints import CHECKPOINT_FILE, MODEL_FILE, read_checkpoint
from keelrl.agents.harness.loop import Run, TrainResult
from keelrl.agents.harness.options import (
    RunOptions,
    evaluation_seed,
    given_options,
    require_positive,
    require_positive_counts,
    run_cli,
    validate_run_options,
)
from keelrl.agents.harness.run_directory import CONFIG_FILE, DATASET_FILE
from keelrl.agents.harness.saved_agent import SavedAgent
from keelrl.buffers import Batch, ReplayBuffer
from keelrl.envs import make_vec_env, play_episodes, require_box_actions
from keelrl.envs.video import gym_video
from keelrl.networks import (
    check_device,
    frozen,
    make_optimizer,
    optimizer_step,
    random_members,
    soft_update,
    to_device,
)

ALGO = "wsrl"
__all__ = ["WSRL", "WSRLConfig", "train", "evaluate"]
PRETRAINED_ALGOS = ("cql",)
"""the agents whose runs WSRL fine-tunes"""
ARCHITECTURE = ("hidden_sizes", "num_critics", "critic_subset_size", "layer_norm", "normalize_obs")
"""the options the networks take from the pre-trained run"""


@dataclasses.dataclass
class WSRLConfig(RunOptions):
    pretrained: str | None = None
    """directory of the finished offline run to fine-tune (CQL, or CQL with --cal-ql)"""
    env_id: str | None = None
    """environment to fine-tune in (default: the pre-trained run's dataset's)"""
    total_timesteps: int = 500_000
    """online environment steps, warm-up included (finetune.py:40)"""
    warmup_steps: int = 5_000
    """environment steps of the pre-trained policy, stored but not learned from, before updates begin
    (launch_wsrl_finetune.sh:15); updates wait at least until the buffer holds one batch (finetune.py:111)"""
    batch_size: int = 1_024
    """transitions sampled per environment step, split into `utd` critic minibatches (launch_wsrl_finetune.sh:14)"""
    utd: int = 4
    """critic updates per environment step (launch_wsrl_finetune.sh:13)"""
    buffer_size: int = 2_000_000
    """replay buffer capacity (finetune.py:66)"""
    gamma: float = 0.99
    """discount factor (sac_config.py:6)"""
    tau: float = 0.005
    """target network Polyak rate (sac_config.py:9)"""
    policy_lr: float = 1e-4
    """actor learning rate (sac_config.py:37-41)"""
    qf_lr: float = 3e-4
    """critic learning rate (sac_config.py:42-46)"""
    alpha_lr: float = 1e-4
    """temperature learning rate (sac_config.py:47-51)"""
    target_entropy_scale: float = -1.0
    """target entropy = target_entropy_scale * action dimension (wsrl/agents/sac.py:526-527)"""
    backup_entropy: bool = False
    """subtract α log π(a'|s') in the TD target (sac_config.py:7: not for WSRL)"""
    load_optimizers: bool = True
    """start from the pre-trained run's Adam states, as WSRL restores its whole checkpoint (False: fresh Adam)"""
    hidden_sizes: tuple[int, ...] = (256, 256)
    """hidden layer sizes of actor and critics: the pre-trained run's (set from --pretrained)"""
    num_critics: int = 10
    """critics in the ensemble: the pre-trained run's (set from --pretrained)"""
    critic_subset_size: int | None = 2
    """critics the TD target takes its minimum over, drawn at random with replacement per update (None: all):
    the pre-trained run's (set from --pretrained)"""
    layer_norm: bool = True
    """LayerNorm in actor and critics: the pre-trained run's (set from --pretrained)"""
    normalize_obs: bool = False
    """standardise observations by the pre-trained run's dataset statistics, kept fixed (set from --pretrained)"""
    device: str = "cpu"
    """torch device for networks and replay buffer"""


def validate(config: WSRLConfig) -> None:
    """Reject option values no run can use, with the option's command-line name."""
    validate_run_options(config, "total_timesteps")
    check_device(config.device, compile=False, cudagraphs=False)
    require_positive_counts(config, "batch_size", "utd", "buffer_size", "num_critics")
    require_positive(config, "policy_lr", "qf_lr", "alpha_lr")
    if config.warmup_steps < 0:
        raise ValueError(f"--warmup-steps must be non-negative, got {config.warmup_steps}.")
    if config.batch_size % config.utd:
        raise ValueError(f"--batch-size {config.batch_size} must split into --utd {config.utd} equal minibatches.")
    if not 0.0 < config.gamma <= 1.0 or not 0.0 < config.tau <= 1.0:
        raise ValueError(f"--gamma and --tau must lie in (0, 1], got {config.gamma} and {config.tau}.")
    subset = config.critic_subset_size
    if subset is not None and not 1 <= subset <= config.num_critics:
        raise ValueError(f"--critic-subset-size must lie in [1, --num-critics {config.num_critics}], got {subset}.")


def read_pretrained(run_dir: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The finished offline run's model file and dataset summary; anything else is refused in one line."""
    if run_dir is None:
        raise ValueError("WSRL fine-tunes an offline run: give --pretrained RUN_DIR (a finished run of "
                         "python -m keelrl.agents.cql).")
    path = Path(run_dir)
    if not (path / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"--pretrained {run_dir}: no run directory there (no {CONFIG_FILE}).")
    algo = json.loads((path / CONFIG_FILE).read_text()).get("algo")
    if algo not in PRETRAINED_ALGOS:
        raise ValueError(f"--pretrained {run_dir} is a run of {algo}; WSRL fine-tunes the critics and actor of a run "
                         f"of {' or '.join(PRETRAINED_ALGOS)}.")
    if not (path / MODEL_FILE).is_file():
        raise ValueError(f"--pretrained {run_dir} has not finished (no {MODEL_FILE}): resume it to its end first "
                         f"(python -m keelrl.agents.{algo} --resume {run_dir}).")
    return read_checkpoint(path / MODEL_FILE, algo), json.loads((path / DATASET_FILE).read_text())


def with_pretrained_architecture(config: WSRLConfig, pretrained: dict[str, Any]) -> WSRLConfig:
    """The config with the pre-trained run's architecture; an option given on the command line that differs from
    it is refused (the networks are the pre-trained ones)."""
    saved, given = pretrained["config"], given_options(config)
    values = {name: tuple(saved[name]) if isinstance(saved[name], list) else saved[name] for name in ARCHITECTURE}
    for name, value in values.items():
        if name in given and getattr(config, name) != value:
            raise ValueError(f"--{name.replace('_', '-')} {getattr(config, name)} differs from the pre-trained run's "
                             f"{value}: WSRL fine-tunes that run's networks; drop the option.")
    return dataclasses.replace(config, **values)


class WSRL(SavedAgent):
    """The pre-trained networks and WSRL's online update rule; takes raw observations (standardised inside by the
    pre-trained statistics when configured). Saving and loading come from SavedAgent. Its attributes have the
    names of the CQL agent's, so a CQL state dict loads into it as it is."""

    algo = ALGO
    config_cls = WSRLConfig

    def __init__(self, obs_dim: int, action_low: np.ndarray, action_high: np.ndarray, config: WSRLConfig):
        super().__init__()
        self.remember(obs_dim, action_low, action_high, config)
        self.obs_norm, self.actor, self.critic, self.critic_target = cql_networks(
            obs_dim, action_low, action_high, config, orthogonal=False)  # the pre-trained weights come in later
        # the parameter lists Polyak averaging walks, gathered once (the tensors stay the same objects)
        self.polyak_target, self.polyak_online = list(self.critic_target.parameters()), list(self.critic.parameters())
        self.log_alpha = nn.Parameter(torch.tensor(0.0))
        self.target_entropy = config.target_entropy_scale * len(action_low)
        # named as CQL's optimisers, whose states `load_pretrained` takes over
        self.optimizers = {"actor": make_optimizer(list(self.actor.parameters()), "adam", config.policy_lr),
                           "critic": make_optimizer(list(self.critic.parameters()), "adam", config.qf_lr),
                           "log_alpha": make_optimizer([self.log_alpha], "adam", config.alpha_lr)}
        self.num_updates = 0

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.detach().exp()

    def load_pretrained(self, networks: dict[str, torch.Tensor], optimizers: dict[str, Any] | None) -> None:
        """Take the pre-trained run's networks (a CQL state dict) and, when given, its optimisers' states; the
        learning rates stay this run's. Call it on the agent already on its device: the loaded moments take the
        parameters' device and dtype as they are now, and a later `.to()` leaves them behind."""
        self.load_state_dict(networks)
        for name, state in (optimizers or {}).items():
            optimizer = self.optimizers[name]
            learning_rates = [group["lr"] for group in optimizer.param_groups]
            optimizer.load_state_dict(state)
            for group, lr in zip(optimizer.param_groups, learning_rates):
                group["lr"] = lr

    @torch.inference_mode()
    def act(self, obs: np.ndarray, deterministic: bool = False) -> np.ndarray:
        """Actions for a batch of raw observations (B, obs_dim) -> (B, action_dim): sampled, or tanh of the mean."""
        obs = self.observation_batch(obs)
        obs_t = self.obs_norm(to_device(obs, self.action_low.device))
        return self.actor.act(obs_t, deterministic).cpu().numpy()

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        """WSRL's high-UTD update on one batch of raw transitions: `utd` critic steps, each on its own minibatch and
        followed by a target update, then one actor step and one temperature step on the whole batch. The critic's
        logged values are the last minibatch's (the reference's: their mean over the minibatches)."""
        if self.config.normalize_obs:
            batch = batch._replace(obs=self.obs_norm(batch.obs), next_obs=self.obs_norm(batch.next_obs))
        minibatches = zip(*(field.chunk(self.config.utd) if field is not None else [None] * self.config.utd
                            for field in batch))  # utd minibatches of B/utd transitions each
        for minibatch in minibatches:
            losses = self.update_critic(Batch(*minibatch))
            soft_update(self.polyak_target, self.polyak_online, self.config.tau)
        losses.update(self.update_actor_and_alpha(batch.obs))
        self.num_updates += 1
        return losses

    def critic_loss(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The TD loss summed over critics, against r + γ(1 − terminated) min_{j∈S} Q'_j(s', a'), a' ~ π(·|s'); the
        logged per-critic TD loss, Q-values and targets (their divergence is the collapse the warm-up prevents)."""
        with torch.no_grad():
            next_actions, next_log_prob = self.actor.sample(batch.next_obs)
            members = random_members(self.config.num_critics, self.config.critic_subset_size, batch.rewards.device)
            next_q = self.critic_target(batch.next_obs, next_actions, members)[..., 0].min(dim=0).values  # (B,)
            if self.config.backup_entropy:
                next_q = next_q - self.alpha * next_log_prob
            target = batch.rewards + batch.discounts * (1.0 - batch.terminated) * next_q
        q_data = self.critic(batch.obs, batch.actions)[..., 0]  # (E, B)
        td_loss = (q_data - target).pow(2).mean(dim=1).sum()
        return td_loss, {"losses/qf_loss": td_loss.detach() / self.config.num_critics,
                         "losses/qf_values": q_data.detach().mean(), "losses/qf_targets": target.mean()}

    def actor_and_alpha_losses(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The actor's loss α log π(a|s) − min_i Q_i(s, a), a ~ π(·|s), over every critic (wsrl/agents/sac.py:
        297-310), and the temperature's −log α (log π(a|s) + target_entropy) = log α·(H − H̄), as keelrl's CQL
        pre-training has it (the reference: softplus(θ)·(H − H̄) with H at s′; module docstring)."""
        actions, log_prob = self.actor.sample(obs)
        with frozen(self.critic):  # the actor loss needs gradients w.r.t. actions only
            q_pi = self.critic(obs, actions)[..., 0].min(dim=0).values  # (E, B) -> (B,)
        actor_loss = (self.alpha * log_prob - q_pi).mean()
        alpha_loss = -(self.log_alpha * (log_prob.detach() + self.target_entropy)).mean()
        return actor_loss, alpha_loss

    def update_critic(self, batch: Batch) -> dict[str, torch.Tensor]:
        critic_loss, logged = self.critic_loss(batch)
        optimizer_step(self.optimizers["critic"], critic_loss, self.critic)
        return logged

    def update_actor_and_alpha(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        actor_loss, alpha_loss = self.actor_and_alpha_losses(obs)
        optimizer_step(self.optimizers["actor"], actor_loss, self.actor)
        optimizer_step(self.optimizers["log_alpha"], alpha_loss, self.log_alpha)
        return {"losses/actor_loss": actor_loss.detach(), "losses/alpha_loss": alpha_loss.detach(),
                "losses/alpha": self.alpha}


def evaluate(agent: WSRL, env_id: str, episodes: int = 10, seed: int = 0,
             deterministic: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Returns and costs of `episodes` episodes of the agent's deterministic (or stochastic) policy."""
    return play_episodes(lambda obs: agent.act(obs, deterministic=deterministic), env_id, episodes, seed)


def start_from_pretrained(config: WSRLConfig) -> tuple[WSRLConfig, dict[str, Any], dict[str, Any]]:
    """A new run's config (the pre-trained architecture and environment filled in), the pre-trained model file and
    its dataset summary."""
    pretrained, dataset = read_pretrained(config.pretrained)
    config = with_pretrained_architecture(config, pretrained)
    return dataclasses.replace(config, env_id=config.env_id or dataset["env_id"]), pretrained, dataset


def train(config: WSRLConfig) -> TrainResult:
    """Fine-tune the pre-trained run online for `config.total_timesteps` environment steps."""
    pretrained = dataset = None
    if config.resume is None:
        config, pretrained, dataset = start_from_pretrained(config)
    run = Run(config, ALGO, validate, total="total_timesteps")
    config = run.config
    with run:  # from here on, a failure releases the run's lock, threads and signals
        env = make_vec_env(config.env_id, 1, config.seed + run.step)  # resumed runs start fresh episodes
        require_box_actions(env, "WSRL")
        obs_dim = int(np.prod(env.single_observation_space.shape))
        low, high = env.single_action_space.low, env.single_action_space.high
        # on the run's device before any optimiser state is loaded: Adam puts loaded moments on the parameters'
        # device (and dtype) as they are then, and moving the module later does not move them
        agent = WSRL(obs_dim, low, high, config).to(config.device)
        if pretrained is not None:
            check_sizes(pretrained, obs_dim, low, config, env)
            checkpoint = Path(config.pretrained) / CHECKPOINT_FILE
            optimizers = read_checkpoint(checkpoint, None)["agent"]["optimizers"] if config.load_optimizers else None
            agent.load_pretrained(pretrained["networks"], optimizers)
        buffer = ReplayBuffer(config.buffer_size, (obs_dim,), low.shape, 1, config.device, gamma=config.gamma,
                              seed=config.seed)
        learning_starts = max(config.warmup_steps, config.batch_size)
        eval_seed = evaluation_seed(config.seed, config.eval_episodes)  # evaluation episode i is seeded eval_seed + i
        if dataset is None:
            dataset = json.loads((Path(run.dir) / DATASET_FILE).read_text())
        run.start(config.env_id, agent, replay=buffer, reference_returns=dataset["ref_scores"],
                  play_evaluation=lambda agent, eval_seed: evaluate(
                      agent, config.env_id, config.eval_episodes, eval_seed),
                  files={DATASET_FILE: json.dumps(dataset)},
                  video=gym_video(config.env_id, lambda obs: agent.act(obs, deterministic=True), eval_seed))
        if not run.resumed:
            run.evaluate_and_record()  # the pre-trained policy, at online step 0

        obs, _ = env.reset()
        with env:
            for global_step in run.steps():
                actions = agent.act(obs)  # the policy's samples, from the pre-trained policy on in the warm-up
                next_obs, rewards, terminated, truncated, info = env.step(actions)
                buffer.add(obs, actions, rewards, info["final_obs"], terminated, truncated)
                obs = next_obs
                run.record_episodes(info)
                if global_step >= learning_starts:
                    run.log(agent.update(buffer.sample(config.batch_size)))
    return run.result()


def check_sizes(pretrained: dict[str, Any], obs_dim: int, low: np.ndarray, config: WSRLConfig, env: Any) -> None:
    """Close `env` and refuse it, in one line, unless its observation and action sizes are the pre-trained
    networks'."""
    saved_actions = pretrained["networks"]["action_low"].numel()
    if pretrained["obs_dim"] != obs_dim or saved_actions != low.size:
        env.close()
        raise ValueError(f"--pretrained {config.pretrained} acts on {pretrained['obs_dim']} observations and "
                         f"{saved_actions} actions, but {config.env_id} has {obs_dim} and {low.size}: fine-tune it in "
                         f"its dataset's environment.")


if __name__ == "__main__":
    raise SystemExit(run_cli(train, WSRLConfig))
