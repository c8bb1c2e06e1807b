"""Resume restores what the checkpoint saved, item by item.

The other resume tests (test_sac.py, test_offline_agents.py, test_streaming.py, test_rlvr.py, ...) check
logs, step counts and counters: a resumed SAC run that forgot its replay buffer, or its Adam moments,
passes them. These tests check contents: after an interruption and `--resume`, the state the run goes
on from EQUALS, bit for bit, the live state of the interrupted run at the moment it wrote the
checkpoint it resumes from:
- off-policy (SAC, TD3, SAC-Lag, TD3-Lag): the replay buffer (every stored field, position, size, sampling
  generator), every optimiser's state (Adam's exp_avg / exp_avg_sq / step, its param groups), the
  observation normaliser, the reward scaler, λ and the PID state, the random states (python, numpy,
  torch), the networks and the update counter;
- offline (IQL, CQL): networks, optimisers, the batch sampler's generator, num_updates, random states;
  and a straight run and an interrupted-and-resumed one end in the same state, optimisers and sampler
  included;
- streaming (stream Q, stream AC): networks, ObGD state, the env's normaliser and reward-scaler
  statistics, the agent's exploration generator and the global random states.

How: each run is made in this process with a recording subclass of the agent (and of the buffer), so
the test holds the live objects. The loop's checkpoint writer (`write_checkpoint` as the harness loop
module imported it) is wrapped to snapshot the live state as each checkpoint is written; the run then dies
(an exception raised from inside the loop, a few updates after that checkpoint, so the live objects
have moved on). The resumed run is snapshotted when it opens its logger (`RunLogger`), which every
loop does right after restoring and before it acts or updates. The snapshots are taken from the live
objects, not from the checkpoint file, so something that is never saved fails as surely as something
saved and not loaded.
"""

from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from keelrl.agents import cql, iql, sac, sac_lag, stream_ac, stream_q, td3, td3_lag
from keelrl.agents.harness import loop as harness_loop
from keelrl.agents.harness.checkpoints import CHECKPOINT_FILE, restore_rng_state, rng_state
from keelrl.envs import CostWrapper
from keelrl.envs.streaming_wrappers import stream_wrapper
from keelrl.networks import RewardScaler

from helpers import random_pendulum_npz


class DriftEnv(gym.Env):
    """15-step episodes (time limit, never terminal): observations drawn around (1, −2, 0.5), so the
    normaliser's statistics are far from their initial values; reward −(action − obs[0])²."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    episode_steps = 15

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.obs = self._draw()
        return self.obs, {}

    def _draw(self) -> np.ndarray:
        return (self.np_random.normal(size=3) + np.array([1.0, -2.0, 0.5])).astype(np.float32)

    def step(self, action):
        self.t += 1
        reward = -float((action[0] - self.obs[0]) ** 2)
        self.obs = self._draw()
        return self.obs, reward, False, self.t >= self.episode_steps, {}


gym.register("keelrl_test/ResumeDrift-v0", entry_point=DriftEnv)
gym.register("keelrl_test/ResumeDriftCost-v0",
             entry_point=lambda: CostWrapper(DriftEnv(), lambda action, obs, info: float(action[0] > 0)))


class Killed(Exception):
    """Stands in for a kill of the training process."""


# --------------------------------------------------------------------------------------------------
# comparing states


def assert_same(saved: Any, restored: Any, path: str = "state") -> None:
    """`restored` equals `saved` exactly: same keys, same types, tensors bit for bit (NaN equals NaN)."""
    if isinstance(saved, dict):
        assert isinstance(restored, dict), f"{path}: saved a dict, restored {type(restored).__name__}"
        assert set(saved) == set(restored), f"{path}: keys {sorted(map(str, saved))} != {sorted(map(str, restored))}"
        for key in saved:
            assert_same(saved[key], restored[key], f"{path}[{key!r}]")
    elif isinstance(saved, (list, tuple)):
        assert isinstance(restored, (list, tuple)) and len(saved) == len(restored), \
            f"{path}: saved {saved!r:.200}, restored {restored!r:.200}"
        for i, (a, b) in enumerate(zip(saved, restored)):
            assert_same(a, b, f"{path}[{i}]")
    elif isinstance(saved, torch.Tensor):
        assert isinstance(restored, torch.Tensor), f"{path}: saved a tensor, restored {restored!r:.200}"
        assert (saved.dtype, saved.shape) == (restored.dtype, restored.shape), \
            f"{path}: saved {saved.dtype} {tuple(saved.shape)}, restored {restored.dtype} {tuple(restored.shape)}"
        if saved.is_floating_point():
            same = torch.equal(torch.nan_to_num(saved, nan=0.0), torch.nan_to_num(restored, nan=0.0)) and \
                torch.equal(saved.isnan(), restored.isnan())
        else:
            same = torch.equal(saved, restored)
        assert same, f"{path}: restored differs from saved (max |diff| {_max_diff(saved, restored)})"
    elif isinstance(saved, np.ndarray):
        np.testing.assert_array_equal(restored, saved, err_msg=path)
    else:
        assert type(saved) is type(restored) and saved == restored, \
            f"{path}: saved {saved!r:.200}, restored {restored!r:.200}"


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().nan_to_num(nan=float("inf")).max()) if a.numel() else 0.0


def global_rng_states(generator: np.random.Generator | None) -> dict[str, Any]:
    """python's, torch's and the loop's numpy generator's states (the ones a checkpoint carries)."""
    return {"python": random.getstate(), "torch": torch.get_rng_state(),
            "numpy_generator": None if generator is None else generator.bit_generator.state}


def assert_optimizers_drive_the_agent(agent: torch.nn.Module) -> None:
    """Each restored optimiser steps the agent's own parameters (not copies left behind by the restore)."""
    own = {id(p) for p in agent.parameters()}
    for name, optimizer in agent.optimizers.items():
        params = optimizer.params if hasattr(optimizer, "params") else \
            [p for group in optimizer.param_groups for p in group["params"]]
        assert params and all(id(p) in own for p in params), f"optimizer {name!r} holds parameters the agent does not"
        if hasattr(optimizer, "flat_params"):  # ObGD steps one flat buffer that the parameters are views of
            assert torch.equal(optimizer.flat_params, torch.cat([p.detach().reshape(-1) for p in params]))
            start = optimizer.flat_params.data_ptr()
            end = start + optimizer.flat_params.numel() * optimizer.flat_params.element_size()
            assert all(start <= p.data_ptr() < end for p in params), \
                f"ObGD {name!r}: the parameters are no longer views of its flat buffer"


# --------------------------------------------------------------------------------------------------
# interrupting and resuming a run in this process


class Run:
    """One training loop run in this process: its live agent, buffer, env and numpy generator, the
    snapshots taken as it wrote checkpoints, and the snapshot taken right after a resume restored."""

    def __init__(self, monkeypatch, loop, agent_cls, snapshot):
        """`loop`: the module whose `write_checkpoint`, `RunLogger`, `rng_state` and `restore_rng_state` the run
        calls."""
        self.live: dict[str, Any] = {}
        self.saved: list[tuple[int, dict]] = []  # (global step, snapshot) of each checkpoint written
        self.restored: list[tuple[int, dict]] = []  # (global step resumed at, snapshot) after a restore
        run = self

        class Recording(agent_cls):
            kill_at: int | None = None
            """the run dies when this many updates are done (None: it runs to the end)"""

            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                run.live["agent"] = self

            def update(self, *args, **kwargs):
                if self.kill_at is not None and self.num_updates == self.kill_at:
                    raise Killed
                return super().update(*args, **kwargs)

        self.agent_cls = Recording
        real_save, real_logger = loop.write_checkpoint, loop.RunLogger
        real_rng_state, real_restore = loop.rng_state, loop.restore_rng_state

        def save_and_snapshot(run_dir, state, replay):
            self.saved.append((int(state["global_step"]), snapshot(self.live)))
            return real_save(run_dir, state, replay)

        def logger_after_restore(run_dir, resume_step=None, **options):
            if resume_step is not None:
                self.restored.append((int(resume_step), snapshot(self.live)))
            return real_logger(run_dir, resume_step, **options)

        def rng_state(generator):
            self.live["generator"] = generator
            return real_rng_state(generator)

        def restore_rng_state(state, generator):
            self.live["generator"] = generator
            return real_restore(state, generator)

        monkeypatch.setattr(loop, "write_checkpoint", save_and_snapshot)
        monkeypatch.setattr(loop, "RunLogger", logger_after_restore)
        monkeypatch.setattr(loop, "rng_state", rng_state)
        monkeypatch.setattr(loop, "restore_rng_state", restore_rng_state)

    def interrupt_and_resume(self, train, config, resume_config, kill_at: int) -> tuple[dict, dict, Any]:
        """Run `config` until `kill_at` updates, then resume it; the snapshot at the checkpoint it resumed
        from, the snapshot right after the restore, and the resumed run's result."""
        self.agent_cls.kill_at = kill_at
        with pytest.raises(Killed):
            train(config)
        self.agent_cls.kill_at = None
        assert self.saved, "the run died before its first checkpoint"
        last_step, last_saved = self.saved[-1]
        (run_dir,) = Path(config.runs_dir).iterdir()
        self.live.clear()
        result = train(resume_config(run_dir))
        assert len(self.restored) == 1, "the resumed run did not restore (or restored twice)"
        step, restored = self.restored[0]
        assert step == last_step, f"resumed at step {step}, not at the last checkpoint written (step {last_step})"
        return last_saved, restored, result


# --------------------------------------------------------------------------------------------------
# off-policy: SAC, TD3, SAC-Lag, TD3-Lag

BUFFER_FIELDS = ("obs", "next_obs", "actions", "rewards", "terminated", "truncated", "costs")


def off_policy_snapshot(live: dict) -> dict:
    agent, buffer = live["agent"], live["buffer"]
    networks = agent.state_dict()
    # The reward scaler's per-env return trace is left out here: the resumed run starts new episodes, so
    # arguably it should start from 0 (see test_resumed_reward_scaler_trace_restarts_with_the_new_episodes).
    networks.pop("reward_scaler.returns", None)
    state = {
        "networks": networks,
        "optimizers": {name: optimizer.state_dict() for name, optimizer in agent.optimizers.items()},
        "num_updates": agent.num_updates,
        "buffer": {
            **{name: getattr(buffer, name) for name in BUFFER_FIELDS if getattr(buffer, name) is not None},
            "pos": buffer.pos, "size": buffer.size, "generator": buffer.generator.get_state(),
        },
        "rng": global_rng_states(live.get("generator")),
    }
    # named again, apart from the state dict, so that statistics dropped from it (never saved) still count
    if agent.config.normalize_obs:
        state["obs_norm"] = {"mean": agent.obs_norm.mean, "var": agent.obs_norm.var, "count": agent.obs_norm.count}
    if agent.reward_scaler is not None:
        stats = agent.reward_scaler.return_stats
        state["reward_scaler"] = {"mean": stats.mean, "var": stats.var, "count": stats.count,
                                  "max_abs_return": agent.reward_scaler.max_abs_return}
    if hasattr(agent, "lagrange"):
        state["lagrange"] = dict(agent.lagrange.named_buffers())  # λ (and the PID integral and previous cost)
        state["lambda"] = agent.lagrange_multiplier
    return copy.deepcopy(state)


def off_policy_run(monkeypatch, module, agent_cls) -> Run:
    run = Run(monkeypatch, harness_loop, agent_cls, off_policy_snapshot)
    monkeypatch.setattr(module, agent_cls.__name__, run.agent_cls)  # the agent file's loop builds the recording agent
    record_buffer(monkeypatch, run, module, "ReplayBuffer")
    return run


def record_buffer(monkeypatch, run: Run, module, name: str) -> None:
    """The agent file's buffer class `name` replaced by one that hands each new buffer to run.live["buffer"]."""

    class Recording(getattr(module, name)):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            run.live["buffer"] = self

    monkeypatch.setattr(module, name, Recording)


# One update per env step after step 100; the checkpoint at step 160 is 10 steps into a 15-step episode;
# the run dies when it has made 90 updates (in the update of step 191, or 192 with two envs) and is
# resumed to step 220.
LEARNING_STARTS, CHECKPOINT_AT, KILL_AT, TOTAL = 100, 160, 90, 220
OFF_POLICY_COMMON = dict(total_timesteps=TOTAL, learning_starts=LEARNING_STARTS, checkpoint_freq=CHECKPOINT_AT,
                         batch_size=16, hidden_sizes=(16, 16), buffer_size=128, eval_freq=0, eval_episodes=1,
                         log_freq=100, normalize_obs=True, quiet=True)
OFF_POLICY_CASES = {
    # two envs, reward scaling and a learning-rate decay (param groups' lr moves every update)
    "sac": (sac, sac.SAC, sac.SACConfig,
            dict(env_id="keelrl_test/ResumeDrift-v0", num_envs=2, scale_rewards=True, final_lr_fraction=0.5)),
    "td3": (td3, td3.TD3, td3.TD3Config, dict(env_id="keelrl_test/ResumeDrift-v0", scale_rewards=True)),
    # the PID multiplier: λ, its integral and the previous episode cost
    "sac_lag": (sac_lag, sac_lag.SACLag, sac_lag.SACLagConfig,
                dict(env_id="keelrl_test/ResumeDriftCost-v0", multiplier="pid", cost_limit=3.0, lambda_init=0.1,
                     pid_kp=0.05, pid_ki=0.02, pid_kd=0.01)),
    # reward scaling and the PID multiplier on TD3's update
    "td3_lag": (td3_lag, td3_lag.TD3Lag, td3_lag.TD3LagConfig,
                dict(env_id="keelrl_test/ResumeDriftCost-v0", scale_rewards=True, multiplier="pid", cost_limit=3.0,
                     lambda_init=0.1, pid_kp=0.05, pid_ki=0.02, pid_kd=0.01)),
}


@pytest.mark.parametrize("algo", list(OFF_POLICY_CASES))
def test_off_policy_resume_restores_buffer_optimizers_normalizers_multiplier_rng_and_networks(
        algo, tmp_path, monkeypatch):
    """Checkpoint at step 160, killed about step 190, resumed: everything the resumed run starts from
    equals what the run held at step 160. The 128-row buffer has wrapped (pos ≠ size)."""
    module, agent_cls, config_cls, options = OFF_POLICY_CASES[algo]
    run = off_policy_run(monkeypatch, module, agent_cls)
    config = config_cls(**OFF_POLICY_COMMON, **options, runs_dir=str(tmp_path))
    saved, restored, result = run.interrupt_and_resume(
        module.train, config, lambda run_dir: config_cls(resume=str(run_dir), quiet=True), kill_at=KILL_AT)
    assert result.global_step == TOTAL

    # the saved state is worth restoring: a wrapped buffer, moved optimisers, statistics, λ
    buffer = saved["buffer"]
    assert buffer["size"] == 128 and buffer["pos"] == CHECKPOINT_AT % 128
    for name, optimizer in saved["optimizers"].items():
        for param_state in optimizer["state"].values():
            assert param_state["step"].item() > 0 and param_state["exp_avg_sq"].abs().sum() > 0, name
    assert saved["num_updates"] == CHECKPOINT_AT - LEARNING_STARTS
    assert saved["obs_norm"]["count"].item() == CHECKPOINT_AT
    if algo == "sac":
        assert saved["optimizers"]["actor"]["param_groups"][0]["lr"] < 3e-4  # decayed
    if options.get("scale_rewards"):
        assert saved["reward_scaler"]["count"].item() == CHECKPOINT_AT
    if options.get("multiplier") == "pid":
        assert saved["lambda"].item() != pytest.approx(0.1) and saved["lagrange"]["integral"].item() > 0
        assert saved["lagrange"]["calls"].item() > 0

    saved_truncated, restored_truncated = saved["buffer"].pop("truncated"), restored["buffer"].pop("truncated")
    assert_same(saved, restored)
    assert_optimizers_drive_the_agent(run.live["agent"])
    # The rows of the last vector step before the checkpoint may come back marked truncated (a fix of
    # test_n_step_returns_do_not_cross_the_resume_cut may mark the cut so); nothing else may change.
    last_rows = [(buffer["pos"] - i - 1) % 128 for i in range(options.get("num_envs", 1))]
    assert torch.equal(restored_truncated[last_rows] | saved_truncated[last_rows], restored_truncated[last_rows])
    saved_truncated[last_rows] = restored_truncated[last_rows]
    assert_same(saved_truncated, restored_truncated, "state['buffer']['truncated']")
    # Not compared with an uninterrupted run: the resumed run reseeds its envs (seed + global step) and
    # starts new episodes, so its stream of transitions differs from a straight run's by design.


# --------------------------------------------------------------------------------------------------
# what a resume must not carry over: the interrupted episodes end at the checkpoint (fixed bugs)


@pytest.fixture(scope="module")
def resumed_n_step_sac(tmp_path_factory):
    """A SAC run with 3-step returns and reward scaling, killed and resumed (one env, 1000-row buffer);
    its live buffer, and the reward scaler's per-env return trace as each `RewardScaler.update` began."""
    traces = []
    update = RewardScaler.update

    def recording_update(self, rewards, dones):
        traces.append(self.returns.clone())
        return update(self, rewards, dones)

    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(RewardScaler, "update", recording_update)
        run = off_policy_run(monkeypatch, sac, sac.SAC)
        config = sac.SACConfig(**{**OFF_POLICY_COMMON, "buffer_size": 1000}, n_step=3, scale_rewards=True,
                               env_id="keelrl_test/ResumeDrift-v0", runs_dir=str(tmp_path_factory.mktemp("n_step")))
        run.interrupt_and_resume(sac.train, config, lambda run_dir: sac.SACConfig(resume=str(run_dir), quiet=True),
                                 kill_at=KILL_AT)
    assert run.restored[0][0] == CHECKPOINT_AT and CHECKPOINT_AT % DriftEnv.episode_steps == 10  # mid-episode
    return run.live["buffer"], traces


def test_n_step_returns_do_not_cross_the_resume_cut(resumed_n_step_sac):
    """With --n-step 3 the checkpoint at step 160 is 10 steps into a 15-step episode. The resumed run resets
    its env: row 160 holds the first step of a new episode. The 3-step return of row 159 (the last step
    stored before the cut) must stop at row 159, as at any episode end, and bootstrap from its own true
    next observation; it must not add the rewards of rows 160-161 and bootstrap from row 161's."""
    buffer, _ = resumed_n_step_sac
    last = CHECKPOINT_AT - 1
    assert buffer.size == TOTAL
    assert not torch.equal(buffer.obs[last + 1], buffer.next_obs[last])  # the cut: row 160 does not follow row 159
    batch = buffer._sample_n_step(torch.tensor([last]))
    assert batch.rewards.item() == buffer.rewards[last].item()
    assert torch.equal(batch.next_obs[0], buffer.next_obs[last])
    assert batch.discounts.item() == pytest.approx(buffer.gamma)


def test_resumed_reward_scaler_trace_restarts_with_the_new_episodes(resumed_n_step_sac):
    """RewardScaler's docstring: "G is always the return of the current episode so far". The resumed run's
    first env step is the first step of a new episode, so G must be 0 before it, as stream agents do
    (test_streaming.py: "u ← γu + r restarts from 0"). The checkpoint at step 160 is mid-episode."""
    _, traces = resumed_n_step_sac
    # the killed run folded steps 1-191 into the scaler (it died in the update of step 191, its 91st);
    # the resumed run steps 161-220
    killed_steps = LEARNING_STARTS + KILL_AT + 1
    assert len(traces) == killed_steps + TOTAL - CHECKPOINT_AT
    assert torch.count_nonzero(traces[killed_steps - 1]) > 0  # a live trace in the interrupted run
    first_after_resume = traces[killed_steps]
    assert torch.count_nonzero(first_after_resume) == 0, first_after_resume


# --------------------------------------------------------------------------------------------------
# offline: IQL, CQL


@pytest.fixture(scope="module")
def pendulum_npz(tmp_path_factory):
    return random_pendulum_npz(tmp_path_factory.mktemp("data") / "pendulum.npz", 600, num_envs=2)


def offline_snapshot(live: dict) -> dict:
    agent = live["agent"]
    return copy.deepcopy({
        "networks": agent.state_dict(),
        "optimizers": {name: optimizer.state_dict() for name, optimizer in agent.optimizers.items()},
        "num_updates": agent.num_updates,
        "obs_norm": {"mean": agent.obs_norm.mean, "var": agent.obs_norm.var, "count": agent.obs_norm.count},
        "sampler": live["buffer"].generator.get_state(),
        "rng": global_rng_states(live.get("generator")),
    })


OFFLINE_CASES = {"iql": (iql, iql.IQL, iql.IQLConfig, {}),
                 "cql": (cql, cql.CQL, cql.CQLConfig, dict(cql_n_actions=4))}


def offline_config(algo, data, runs_dir, **overrides):
    _, _, config_cls, options = OFFLINE_CASES[algo]
    return config_cls(dataset=str(data), env_id="InvertedPendulum-v5", total_updates=60, batch_size=16,
                      hidden_sizes=(16, 16), eval_freq=0, eval_episodes=1, checkpoint_freq=30, log_freq=30,
                      runs_dir=str(runs_dir), quiet=True, **{**options, **overrides})


def offline_run(monkeypatch, algo):
    module, agent_cls, config_cls, _ = OFFLINE_CASES[algo]
    run = Run(monkeypatch, harness_loop, agent_cls, offline_snapshot)
    monkeypatch.setattr(module, agent_cls.__name__, run.agent_cls)  # the agent file's loop builds the recording agent
    record_buffer(monkeypatch, run, module, "DatasetBuffer")
    return run, module.train, lambda run_dir: config_cls(resume=str(run_dir), quiet=True)


@pytest.mark.parametrize("algo", list(OFFLINE_CASES))
def test_offline_resume_restores_networks_optimizers_sampler_and_rng(algo, pendulum_npz, tmp_path, monkeypatch):
    """Checkpoint at update 30, killed at update 45, resumed: the agent, its optimisers, the batch
    sampler's generator and the random states equal those of update 30."""
    run, train, resume_config = offline_run(monkeypatch, algo)
    saved, restored, result = run.interrupt_and_resume(train, offline_config(algo, pendulum_npz, tmp_path),
                                                       resume_config, kill_at=45)
    assert result.global_step == 60
    assert saved["num_updates"] == 30
    for name, optimizer in saved["optimizers"].items():
        for param_state in optimizer["state"].values():
            assert param_state["step"].item() == 30 and param_state["exp_avg"].abs().sum() > 0, name
    assert_same(saved, restored)
    assert_optimizers_drive_the_agent(run.live["agent"])


@pytest.mark.parametrize("algo", list(OFFLINE_CASES))
def test_offline_straight_and_resumed_runs_end_in_the_same_state(algo, pendulum_npz, tmp_path, monkeypatch):
    """The offline loop's data stream is the sampler alone, so an interrupted-and-resumed run must end
    exactly where a straight one does: networks, optimiser moments, sampler, update count, random states."""
    run, train, resume_config = offline_run(monkeypatch, algo)
    straight = train(offline_config(algo, pendulum_npz, tmp_path / "straight"))
    run.interrupt_and_resume(train, offline_config(algo, pendulum_npz, tmp_path / "resumed"), resume_config,
                             kill_at=45)
    (resumed_dir,) = (tmp_path / "resumed").iterdir()
    final = {name: torch.load(run_dir / CHECKPOINT_FILE, weights_only=True)
             for name, run_dir in (("straight", straight.run_dir), ("resumed", resumed_dir))}
    assert final["straight"]["global_step"] == 60 and final["straight"]["agent"]["num_updates"] == 60
    for checkpoint in final.values():  # each save's own stamp (which pairs it with a replay buffer) differs
        assert checkpoint.pop("stamp")["global_step"] == 60
    assert_same(final["straight"], final["resumed"], "final checkpoint")


# --------------------------------------------------------------------------------------------------
# streaming: stream Q, stream AC


def streaming_snapshot(live: dict) -> dict:
    agent, env = live["agent"], live["env"]
    state = {
        "networks": agent.state_dict(),
        "optimizers": {name: optimizer.state_dict() for name, optimizer in agent.optimizers.items()},
        "num_updates": agent.num_updates,
        "agent_rng": agent.rng.bit_generator.state,
        "rng": global_rng_states(None),
    }
    for key in ("obs_normalizer", "reward_scaler"):
        wrapper = stream_wrapper(env, key)
        state[key] = {"count": wrapper.stats.count, "mean": wrapper.stats.mean, "m2": wrapper.stats.m2}
    return copy.deepcopy(state)


STREAMING_CASES = {"stream_q": (stream_q, stream_q.StreamQ, stream_q.StreamQConfig, dict(env_id="CartPole-v1")),
                   "stream_ac": (stream_ac, stream_ac.StreamAC, stream_ac.StreamACConfig, dict(env_id="Pendulum-v1"))}


@pytest.mark.parametrize("algo", list(STREAMING_CASES))
def test_streaming_resume_restores_networks_obgd_statistics_and_rng(algo, tmp_path, monkeypatch):
    """Checkpoint at step 100, killed at step 150, resumed: networks, adaptive ObGD's second moments and
    step counts, the env's observation and reward statistics and every random state equal those of step
    100. (The eligibility traces are zeroed after the restore by design, as a new episode starts: see
    test_streaming.py; a straight run's stream differs from the resumed one's for the same reason.)"""
    module, agent_cls, config_cls, options = STREAMING_CASES[algo]
    run = Run(monkeypatch, harness_loop, agent_cls, streaming_snapshot)
    monkeypatch.setattr(module, agent_cls.__name__, run.agent_cls)  # the agent file's loop builds the recording agent
    stream_env_for = module.stream_env_for

    def recording_stream_env_for(config, env_id=None, rendering=False):
        env = stream_env_for(config, env_id, rendering)
        if env_id is None:  # the training env (evaluation passes its env id)
            run.live["env"] = env
        return env

    monkeypatch.setattr(module, "stream_env_for", recording_stream_env_for)
    config = config_cls(**options, total_timesteps=200, hidden_sizes=(8, 8), adaptive=True, eval_freq=0,
                        eval_episodes=1, checkpoint_freq=100, log_freq=50, runs_dir=str(tmp_path), quiet=True)
    saved, restored, result = run.interrupt_and_resume(
        module.train, config, lambda run_dir: config_cls(resume=str(run_dir), quiet=True), kill_at=150)
    assert result.global_step == 200
    assert saved["num_updates"] == 100 and saved["obs_normalizer"]["count"] >= 100
    assert saved["reward_scaler"]["count"] == 100
    for name, optimizer in saved["optimizers"].items():
        assert optimizer["num_steps"] == 100 and optimizer["second_moment"].abs().sum() > 0, name
    assert_same(saved, restored)
    assert_optimizers_drive_the_agent(run.live["agent"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_cuda_generators_are_saved_and_restored():
    """SAC's and TD3's noise on the GPU comes from CUDA's generators: a resumed run (which seeds everything anew
    first) goes on with their saved state, not the stream's beginning."""
    generator = np.random.default_rng(0)
    torch.randn(1, device="cuda")
    state = rng_state(generator)
    expected = torch.randn(4, device="cuda")
    torch.manual_seed(0)
    restore_rng_state(state, generator)
    torch.testing.assert_close(torch.randn(4, device="cuda"), expected)
