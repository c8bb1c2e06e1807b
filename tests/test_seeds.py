"""--num-seeds: S seeds of SAC, TD3, PPO or their Lagrangian forms trained in one process as one batched network.
Seed i trains as a run of seed i alone (same environment seeds, replay samples or rollouts, noise, shuffles; losses
and weights equal to float tolerance), keeps its own α, λ, reward scale, observation statistics and gradient norm,
and lives in a run directory of its own that loads, evaluates and resumes as a single run's."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from keelrl.agents import ppo, ppo_lag, sac, sac_lag, td3, td3_lag
from keelrl.agents.harness import loop
from keelrl.agents.harness.checkpoints import CHECKPOINT_FILE, NEXT_CHECKPOINT_FILE, saved_step
from keelrl.agents.harness.options import run_cli
from keelrl.agents.harness.seeds import SEEDS_FILE, SeedView
from keelrl.buffers import Batch, ReplayBuffer
from keelrl.envs import CostWrapper
from keelrl.evaluate import EvaluateConfig, evaluate_saved
from keelrl.networks import clip_gradient_norm
from keelrl.networks.seeds import stack_seeds

REPO = Path(__file__).resolve().parents[1]
AGENTS = {"sac": (sac.SAC, sac.SACConfig, sac.train), "td3": (td3.TD3, td3.TD3Config, td3.train),
          "sac_lag": (sac_lag.SACLag, sac_lag.SACLagConfig, sac_lag.train),
          "td3_lag": (td3_lag.TD3Lag, td3_lag.TD3LagConfig, td3_lag.train),
          "ppo": (ppo.PPO, ppo.PPOConfig, ppo.train), "ppo_lag": (ppo_lag.PPOLag, ppo_lag.PPOLagConfig, ppo_lag.train)}
TINY = dict(env_id="InvertedPendulum-v5", total_timesteps=150, learning_starts=100, batch_size=16,
            hidden_sizes=(16, 16), buffer_size=1_000, eval_freq=0, eval_episodes=2, checkpoint_freq=150, log_freq=10,
            threads=1, quiet=True)
"""50 updates after 100 random steps."""
SIMBAV2 = dict(network="simbav2", critic_head="c51", num_bins=11, scale_rewards=True, normalize_obs=True,
               obs_clip=None, optimizer="adam", final_lr_fraction=0.5, critic_hidden_dim=16, actor_hidden_dim=16)
"""SimbaV2's preset at TINY's widths"""
SIMBA = dict(network="simba", normalize_obs=True, obs_clip=None, optimizer="adamw", weight_decay=1e-2,
             critic_hidden_dim=16, actor_hidden_dim=16)
"""SimBa's preset at TINY's widths"""
gym.register("keelrl_test/PendulumCost-v0",
             entry_point=lambda: CostWrapper(gym.make("InvertedPendulum-v5").unwrapped, lambda a, o, i: float(a[0] > 0)),
             max_episode_steps=1000)
gym.register("keelrl_test/ShortPendulum-v0", entry_point=lambda: gym.make("InvertedPendulum-v5").unwrapped,
             max_episode_steps=12)
"""InvertedPendulum cut at 12 steps: many of its episodes end by the time limit, their last rewards bootstrapped"""
LAG = dict(env_id="keelrl_test/PendulumCost-v0", cost_limit=2.0, lambda_lr=0.05)
"""InvertedPendulum costing 1 a step for a positive action: each seed's episodes cost differently, so each λ moves
its own way"""


PPO_TINY = dict(env_id="InvertedPendulum-v5", total_timesteps=384, num_envs=2, num_steps=64, num_minibatches=4,
                update_epochs=2, hidden_sizes=(16, 16), eval_freq=0, eval_episodes=2, checkpoint_freq=400, log_freq=1,
                threads=1, quiet=True)
"""3 rollouts of 2 envs × 64 steps, each 2 passes of 4 minibatches"""


def recorded(monkeypatch, algo: str) -> tuple[dict[int, list], list]:
    """Every replay sample (by buffer), and every update's losses, from now on."""
    samples: dict[int, list] = {}
    updates: list = []
    sample, update = ReplayBuffer.sample, AGENTS[algo][0].update

    def recording_sample(self, batch_size):
        batch = sample(self, batch_size)
        samples.setdefault(id(self), []).append(batch)
        return batch

    def recording_update(self, batch):
        losses = update(self, batch)
        updates.append({name: value.detach().clone() for name, value in losses.items()})
        return losses

    monkeypatch.setattr(ReplayBuffer, "sample", recording_sample)
    monkeypatch.setattr(AGENTS[algo][0], "update", recording_update)
    return samples, updates


@pytest.mark.parametrize("algo, options, rtol, atol", [
    ("sac", {}, 1e-5, 1e-6), ("td3", {}, 1e-5, 1e-6),
    # float32 rounding, which batched and single products do differently, grows through SimBa's LayerNorms, the
    # actions and the environment in 50 updates: to ~2e-5 on AMD EPYCs, to 2.9e-4 in one action on an Intel Xeon
    # with avx512_bf16 (2026-11-27); the preset's 2 updates per step, 100 updates, reach 5e-4 relative on an EPYC
    # (left out). A seed given another seed's noise, samples or statistics is off by far more
    ("sac", SIMBA, 2e-3, 2e-3),
    # per-seed reward scales, weights projected back on the sphere per seed
    ("sac", SIMBAV2, 1e-5, 1e-6), ("td3", SIMBAV2, 1e-5, 1e-6),
    ("sac", {"critic_head": "hlgauss", "scale_rewards": True}, 1e-5, 1e-6),
    ("sac", {"rescale_actions": True}, 1e-5, 1e-6),  # each seed's actions mapped into InvertedPendulum's [−3, 3]
    # a cost critic and λ per seed, λ stepped on each seed's own episodes
    ("sac_lag", LAG, 1e-5, 1e-6), ("td3_lag", dict(LAG, multiplier="pid"), 1e-5, 1e-6),
    # OmniSafe's Adam on λ (its moments per seed), two envs a seed, two updates a step
    ("sac_lag", dict(LAG, multiplier="adam", num_envs=2, utd=2), 1e-5, 1e-6),
])
def test_each_seed_of_a_batched_run_trains_as_its_single_seed_run(algo, options, rtol, atol, tmp_path, monkeypatch):
    agent_cls, config_cls, train = AGENTS[algo]
    samples, updates = recorded(monkeypatch, algo)
    group = train(config_cls(**{**TINY, **options}, seed=4, num_seeds=3, runs_dir=str(tmp_path / "group")))
    group_samples, group_updates = list(samples.values()), list(updates)
    assert len(group_samples) == 3 and len(group_updates) == 50 * options.get("utd", 1)
    group_dirs = {json.loads((Path(d) / "config.json").read_text())["config"]["seed"]: Path(d)
                  for d in (tmp_path / "group").iterdir()}
    assert sorted(group_dirs) == [4, 5, 6] and group.run_dir == group_dirs[4]
    for i, seed in enumerate((4, 5, 6)):
        samples.clear()
        updates.clear()
        single = train(config_cls(**{**TINY, **options}, seed=seed, runs_dir=str(tmp_path / f"single{seed}")))
        (single_samples,) = samples.values()
        # the same environment steps: episodes (InvertedPendulum counts steps) and the data sampled for the updates
        assert (group_dirs[seed] / "episodes.csv").read_text() == (single.run_dir / "episodes.csv").read_text()
        for group_batch, single_batch in zip(group_samples[i], single_samples, strict=True):
            torch.testing.assert_close(group_batch.obs, single_batch.obs, rtol=rtol, atol=atol)
            torch.testing.assert_close(group_batch.actions, single_batch.actions, rtol=rtol, atol=atol)
        for group_losses, single_losses in zip(group_updates, updates, strict=True):
            for name, value in single_losses.items():
                torch.testing.assert_close(group_losses[name][i], value, rtol=rtol, atol=atol, msg=name)
        grouped, alone = agent_cls.load(group_dirs[seed] / "model.pt"), agent_cls.load(single.run_dir / "model.pt")
        for (name, tensor), other in zip(grouped.state_dict().items(), alone.state_dict().values(), strict=True):
            torch.testing.assert_close(tensor, other, rtol=rtol, atol=atol, msg=name)
        assert grouped.config.seed == seed and grouped.config.num_seeds == 3
    if algo.endswith("_lag"):  # each seed's λ went its own way
        multipliers = [agent_cls.load(group_dirs[seed] / "model.pt").lagrange_multiplier.item() for seed in (4, 5, 6)]
        assert len(set(multipliers)) == 3 and max(multipliers) > 0


@pytest.mark.parametrize("algo, options, per_seed", [
    ("sac", SIMBAV2, "reward_scaler.max_abs_return"),  # the trace, return statistics and maximum
    ("sac_lag", dict(LAG, multiplier="pid"), "lagrange.value"),  # λ and the PID's integral, previous cost, calls
])
def test_a_group_resumes_each_seed_as_its_single_run(algo, options, per_seed, tmp_path):
    """Each seed's own state (reward scale, λ) is saved in its own checkpoint and stacked back on resume: a group
    stopped at 200 steps and extended to 300 ends as each seed's single run stopped and extended the same way."""
    agent_cls, config_cls, train = AGENTS[algo]
    options = {**TINY, **options, "total_timesteps": 200, "checkpoint_freq": 200}

    def stopped_and_extended(runs_dir: Path, **seeds) -> list[Path]:
        train(config_cls(**options, **seeds, runs_dir=str(runs_dir)))
        run_dirs = sorted(runs_dir.iterdir(), key=lambda d: json.loads((d / "config.json").read_text())["config"]["seed"])
        assert run_cli(train, config_cls, ["--resume", str(run_dirs[-1]), "--extend-to", "300"]) == 0
        return run_dirs

    group_dirs = stopped_and_extended(tmp_path / "group", seed=4, num_seeds=2)
    for seed, group_dir in zip((4, 5), group_dirs):
        (single_dir,) = stopped_and_extended(tmp_path / f"single{seed}", seed=seed)
        grouped, alone = (agent_cls.load(d / "model.pt").state_dict() for d in (group_dir, single_dir))
        if "reward_scaler.return_stats.count" in alone:
            assert grouped["reward_scaler.return_stats.count"] == 300  # one G per env step, across the resume
        for name, tensor in alone.items():
            torch.testing.assert_close(grouped[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
    first, second = (agent_cls.load(d / "model.pt").state_dict()[per_seed] for d in group_dirs)
    assert abs(first - second) > 1e-3  # two seeds, two states


def test_a_compiled_lagrangian_group_compiles_each_loss_once():
    """Three losses (critic, actor, cost critic), each compiled once whatever the actor's schedule: the cost
    target keeps no gradients through the actor steps (frozen() once gave them back, and every loss of the group,
    whose compiled call takes all the agent's parameters, recompiled on the changed flag). The compiled group
    learns as the eager one, each seed's λ, changed between updates as the loop changes it, read afresh."""
    config = sac_lag.SACLagConfig(hidden_sizes=(16,), policy_frequency=4)
    rng = np.random.default_rng(0)
    batches = [Batch(*(torch.as_tensor(rng.normal(size=(2, 8, *shape)), dtype=torch.float32)
                       for shape in ((3,), (1,), (), (3,))), torch.zeros(2, 8), torch.full((2, 8), 0.99),
                     costs=torch.ones(2, 8)) for _ in range(9)]
    eager = stack_seeds(lambda: sac_lag.SACLag(3, np.array([-1.0]), np.array([1.0]), config), [1, 2])
    compiled = stack_seeds(lambda: sac_lag.SACLag(3, np.array([-1.0]), np.array([1.0]),
                                                  dataclasses.replace(config, compile=True)), [1, 2])
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for k, batch in enumerate(batches):  # actor steps at updates 4 and 8
        for group in (eager, compiled):
            group.lagrange.value.copy_(torch.tensor([0.5 * k, 2.0 * k]))  # each seed's λ, as its episodes set it
        expected, got = eager.update(batch), compiled.update(batch)
        for name, value in expected.items():
            torch.testing.assert_close(got[name], value, rtol=1e-4, atol=1e-5, msg=name)
    for name, value in eager.state_dict().items():
        torch.testing.assert_close(compiled.state_dict()[name], value, rtol=1e-4, atol=1e-5, msg=name)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs == 3
    assert not any(parameter.requires_grad for parameter in compiled.cost.target.parameters())


def test_alpha_and_observation_statistics_stay_per_seed():
    """Two seeds stacked, given different data: each seed's α and observation statistics move as those of a single
    agent given that seed's data, and apart from the other seed's."""
    config = sac.SACConfig(hidden_sizes=(16,), normalize_obs=True, obs_clip=None)
    rng = np.random.default_rng(0)
    data = [rng.normal(loc, 1.0, size=(20, 3)).astype(np.float32) for loc in (0.0, 5.0)]

    def batch(obs, k):  # seed k's batches: actions near the bounds for seed 1, so its entropy and α differ
        scale = 0.99 if k else 0.1
        return Batch(torch.as_tensor(obs[:8]), torch.full((8, 1), scale), torch.ones(8), torch.as_tensor(obs[8:16]),
                     torch.zeros(8), torch.full((8,), 0.99))

    group = stack_seeds(lambda: sac.SAC(3, np.array([-1.0]), np.array([1.0]), config), [1, 2])
    group.obs_norm.update(torch.as_tensor(np.stack(data)))
    for _ in range(20):
        group.update(Batch(*(torch.stack(fields) for fields in zip(batch(data[0], 0)[:6], batch(data[1], 1)[:6]))))
    for k, seed in enumerate((1, 2)):
        torch.manual_seed(seed)
        single = sac.SAC(3, np.array([-1.0]), np.array([1.0]), config)
        single.obs_norm.update(torch.as_tensor(data[k]))
        for _ in range(20):
            single.update(batch(data[k], k))
        torch.testing.assert_close(group.obs_norm.mean[k], single.obs_norm.mean)
        torch.testing.assert_close(group.log_alpha[k], single.log_alpha, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(group.obs_norm.mean[1].numpy(), data[1].mean(0), rtol=1e-6)
    assert abs(group.obs_norm.mean[1] - group.obs_norm.mean[0]).min() > 3
    assert abs(group.log_alpha[1] - group.log_alpha[0]) > 1e-3


@pytest.mark.parametrize("algo", ["sac", "td3"])
@pytest.mark.parametrize("head", ["c51", "hlgauss"])
def test_categorical_critics_of_a_group_learn_and_log_as_each_seed_alone(algo, head):
    """Stacked, each seed's categorical head holds its own support: the group's updates (its logged Q-values
    included, once computed outside the batched pass on the stacked (S, K) support and failing) equal each seed's
    own."""
    agent_cls, config_cls, _ = AGENTS[algo]
    config = config_cls(hidden_sizes=(16,), critic_head=head, v_min=-10.0, v_max=10.0, num_bins=11)
    rng = np.random.default_rng(0)
    batches = [Batch(*(torch.as_tensor(rng.normal(size=shape), dtype=torch.float32)
                       for shape in ((8, 3), (8, 1), (8,), (8, 3))), torch.zeros(8), torch.full((8,), 0.99))
               for _ in range(2)]
    group = stack_seeds(lambda: agent_cls(3, np.array([-1.0]), np.array([1.0]), config), [1, 2])
    stacked = Batch(*(torch.stack(fields) for fields in zip(*(batch[:6] for batch in batches))))
    group_losses = [group.update(stacked) for _ in range(3)]
    for k, seed in enumerate((1, 2)):
        torch.manual_seed(seed)
        single = agent_cls(3, np.array([-1.0]), np.array([1.0]), config)
        for losses in group_losses:
            for name, value in single.update(batches[k]).items():
                torch.testing.assert_close(losses[name][k], value, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_seed_of_a_group_on_cuda_is_remade_alone_on_cuda():
    """Each seed's view remakes that seed alone from its model file, whose tensors lie on the group's device (on an
    H100 the bounds' .numpy() once failed there: --num-seeds with --device cuda exited at its first evaluation)."""
    config = sac.SACConfig(hidden_sizes=(16,), device="cuda")
    group = stack_seeds(lambda: sac.SAC(3, np.array([-1.0]), np.array([1.0]), config), [1, 2], device="cuda").cuda()
    for index in range(2):
        single = SeedView(group, index, config, {}).single
        assert single.action_low.device.type == "cuda" and single.num_seeds == 1
        for name, tensor in single.state_dict().items():
            torch.testing.assert_close(tensor, group.state_dict()[name][index], msg=name)


def test_a_seeds_evaluated_agent_is_brought_up_to_date_in_place_at_each_snapshot():
    """Evaluations play `snapshot()`: the one agent made for the seed, loaded with the seed's networks (observation
    statistics included) and update count as they are then, as a remade one would be."""
    config = sac.SACConfig(hidden_sizes=(16,), normalize_obs=True, obs_clip=None, policy_frequency=1)
    group = stack_seeds(lambda: sac.SAC(3, np.array([-1.0]), np.array([1.0]), config), [1, 2])
    view = SeedView(group, 1, config, {})
    first = view.single
    rng = np.random.default_rng(0)
    group.obs_norm.update(torch.as_tensor(rng.normal(3.0, 1.0, size=(2, 20, 3)), dtype=torch.float32))
    for _ in range(3):
        group.update(Batch(*(torch.as_tensor(rng.normal(size=(2, *shape)), dtype=torch.float32)
                             for shape in ((8, 3), (8, 1), (8,), (8, 3))), torch.zeros(2, 8), torch.full((2, 8), 0.99)))
    assert view.snapshot() is first and first.num_updates == group.num_updates == 3
    remade = sac.SAC.from_model_file(view.model_file())
    for name, tensor in remade.state_dict().items():
        assert torch.equal(first.state_dict()[name], tensor), name
    obs = rng.normal(size=(4, 3))
    np.testing.assert_array_equal(first.act(obs, deterministic=True), remade.act(obs, deterministic=True))
    assert not torch.equal(first.obs_norm.mean, SeedView(group, 0, config, {}).single.obs_norm.mean)


def test_seed_directories_load_evaluate_and_resume_together(tmp_path, capsys):
    """A SIGTERM stops every seed at the same step, each with its checkpoint; the run directories look like
    single runs' (config.json with their seed, model.pt that SAC.load and the evaluation command read), and
    --resume of any one of them continues all."""
    args = ["--env-id", "InvertedPendulum-v5", "--learning-starts", "100", "--batch-size", "16", "--hidden-sizes",
            "16", "16", "--eval-episodes", "2", "--total-timesteps", "3000", "--num-seeds", "2", "--seed", "7",
            "--runs-dir", str(tmp_path / "seed{seed}"), "--progress-seconds", "0"]
    process = subprocess.Popen([sys.executable, "-m", "keelrl.agents.sac", *args], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    for line in process.stdout:
        if line.startswith("[") and int(line.split()[2].split("/")[0]) >= 400:
            break
    run_dirs = [next((tmp_path / f"seed{seed}").iterdir()) for seed in (7, 8)]
    for run_dir in run_dirs:  # while the group trains, neither seed's directory can be resumed
        assert run_cli(sac.train, sac.SACConfig, ["--resume", str(run_dir), "--quiet"]) == 2
        assert f"is in use: process {process.pid} on " in capsys.readouterr().err
    process.send_signal(signal.SIGTERM)
    process.stdout.read()
    assert process.wait(timeout=60) == 128 + signal.SIGTERM
    (stopped,) = [line for line in process.stderr.read().splitlines() if "continue with:" in line]  # one for both
    assert stopped.endswith(f"--resume {run_dirs[0]} (it resumes all 2 seeds)")
    stopped_at = [torch.load(d / CHECKPOINT_FILE, weights_only=True)["global_step"] for d in run_dirs]
    assert stopped_at[0] == stopped_at[1] and 400 <= stopped_at[0] < 3000
    assert json.loads((run_dirs[1] / SEEDS_FILE).read_text())["runs"] == ["../../seed7/" + run_dirs[0].name, "."]
    # a group's --seed is its first seed's, as on the command line that began it
    assert run_cli(sac.train, sac.SACConfig, ["--resume", str(run_dirs[1]), "--seed", "8", "--quiet"]) == 2
    assert "gives others: --seed 8 (the run's: 7)." in capsys.readouterr().err
    assert run_cli(sac.train, sac.SACConfig, ["--resume", str(run_dirs[1]), "--seed", "7", "--quiet"]) == 0
    for seed, run_dir in zip((7, 8), run_dirs):
        assert torch.load(run_dir / CHECKPOINT_FILE, weights_only=True)["global_step"] == 3000
        assert json.loads((run_dir / "config.json").read_text())["config"]["seed"] == seed
        agent = sac.SAC.load(run_dir / "model.pt")
        assert agent.log_alpha.dim() == 0 and agent.actor.trunk[0].weight.shape == (16, 4)
        evaluation = evaluate_saved(EvaluateConfig(path=str(run_dir), episodes=2))
        assert evaluation.algo == "sac" and len(evaluation.returns) == 2
    first, second = (sac.SAC.load(d / "model.pt").actor.trunk[0].weight for d in run_dirs)
    assert not torch.allclose(first, second)  # two seeds, two agents


def test_the_seeds_of_a_group_checkpoint_by_the_clock_at_the_same_steps(tmp_path, monkeypatch):
    """--checkpoint-minutes: one clock decides for the group at each step (each seed's own once crossed the minute
    at different steps: 1297 for one seed, 1298 for the other)."""
    written: dict[str, list[int]] = {"seed7": [], "seed8": []}
    real_write = loop.write_checkpoint

    def write(run_dir, state, replay):
        written[Path(run_dir).parent.name].append(state["global_step"])
        real_write(run_dir, state, replay)

    monkeypatch.setattr(loop, "write_checkpoint", write)
    sac.train(sac.SACConfig(**{**TINY, "total_timesteps": 1500, "checkpoint_freq": 100_000}, checkpoint_minutes=0.002,
                            num_seeds=2, seed=7, runs_dir=str(tmp_path / "seed{seed}")))
    assert len(written["seed7"]) > 3 and written["seed7"] == written["seed8"]


class Killed(Exception):
    """Stands in for a SIGKILL of the training process."""


@pytest.mark.parametrize("kill, resumed_at", [("before seed 8 wrote", 200), ("after seed 7 was put in place", 300)])
def test_a_group_killed_while_checkpointing_resumes_every_seed_from_one_step(kill, resumed_at, tmp_path, monkeypatch):
    """The seeds write their checkpoints one after the other, and the group puts them in place once all are
    written: killed before every seed wrote its step-300 checkpoint, both seeds resume from 200; killed while
    putting them in place, both from 300 (each seed's own clock and files once left them a checkpoint apart)."""
    config = sac.SACConfig(**{**TINY, "total_timesteps": 400, "checkpoint_freq": 100}, num_seeds=2, seed=7,
                           runs_dir=str(tmp_path / "seed{seed}"))
    real_write, real_commit, real_logger = loop.write_checkpoint, loop.commit_checkpoint, loop.RunLogger

    def write(run_dir, state, replay):
        if kill == "before seed 8 wrote" and "seed8" in str(run_dir) and state["global_step"] == 300:
            raise Killed
        real_write(run_dir, state, replay)

    def commit(run_dir):
        if kill == "after seed 7 was put in place" and "seed8" in str(run_dir) and saved_step(
                run_dir / NEXT_CHECKPOINT_FILE) == 300:
            raise Killed
        real_commit(run_dir)

    monkeypatch.setattr(loop, "write_checkpoint", write)
    monkeypatch.setattr(loop, "commit_checkpoint", commit)
    with pytest.raises(Killed):
        sac.train(config)
    run_dirs = [next((tmp_path / f"seed{seed}").iterdir()) for seed in (7, 8)]
    assert [saved_step(d / CHECKPOINT_FILE) for d in run_dirs] == ([200, 200] if resumed_at == 200 else [300, 200])
    assert any((d / NEXT_CHECKPOINT_FILE).is_file() for d in run_dirs)  # the step-300 checkpoint left pending
    monkeypatch.undo()
    resumed_from = []

    def logger(run_dir, resume_step=None, **options):
        resumed_from.append(resume_step)
        return real_logger(run_dir, resume_step, **options)

    monkeypatch.setattr(loop, "RunLogger", logger)
    assert sac.train(sac.SACConfig(resume=str(run_dirs[1]), quiet=True)).global_step == 400
    assert resumed_from == [resumed_at, resumed_at]
    for run_dir in run_dirs:
        assert saved_step(run_dir / CHECKPOINT_FILE) == 400 and (run_dir / "model.pt").is_file()
        assert not (run_dir / NEXT_CHECKPOINT_FILE).exists()


def test_refusals(tmp_path, capsys):
    assert run_cli(sac.train, sac.SACConfig, ["--num-seeds", "0", "--runs-dir", str(tmp_path), "--quiet"]) == 2
    assert capsys.readouterr().err == "error: --num-seeds must be positive, got 0.\n"
    assert not any(tmp_path.iterdir())


def test_a_compiled_group_learns_and_acts_as_the_eager_group():
    """--compile with --num-seeds: each loss's batched pass over the seeds (vmap) compiled as one, and so is the
    group's act; the updates and the actions (each seed's noise drawn alike) equal the eager group's within compiler
    rounding."""
    config = sac.SACConfig(hidden_sizes=(16,), policy_frequency=1)
    rng = np.random.default_rng(0)
    batches = [Batch(*(torch.as_tensor(rng.normal(size=(2, 8, *shape)), dtype=torch.float32)
                       for shape in ((3,), (1,), (), (3,))), torch.zeros(2, 8), torch.full((2, 8), 0.99))
               for _ in range(3)]
    eager = stack_seeds(lambda: sac.SAC(3, np.array([-1.0]), np.array([1.0]), config), [1, 2])
    compiled = stack_seeds(lambda: sac.SAC(3, np.array([-1.0]), np.array([1.0]),
                                           dataclasses.replace(config, compile=True)), [1, 2])
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for batch in batches:
        expected, got = eager.update(batch), compiled.update(batch)
        for name, value in expected.items():
            torch.testing.assert_close(got[name], value, rtol=1e-4, atol=1e-5, msg=name)
    for name, value in eager.state_dict().items():
        torch.testing.assert_close(compiled.state_dict()[name], value, rtol=1e-4, atol=1e-5, msg=name)
    obs = rng.normal(size=(2, 1, 3))  # each seed's observation of one env
    for _ in range(2):
        torch.testing.assert_close(torch.as_tensor(compiled.act(obs)), torch.as_tensor(eager.act(obs)), rtol=1e-5,
                                   atol=1e-6)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs == 3  # the critic's, actor's loss; act


def test_a_compiled_td3_group_acts_as_the_eager_group():
    """TD3's group act (the actor plus each seed's clipped exploration noise) compiled as one batched pass: the
    actions equal the eager group's, the deterministic ones too, each within compiler rounding."""
    config = td3.TD3Config(hidden_sizes=(16,))
    eager, compiled = (stack_seeds(lambda options=options: td3.TD3(3, np.array([-1.0]), np.array([1.0]), options),
                                   [1, 2]) for options in (config, dataclasses.replace(config, compile=True)))
    obs = np.random.default_rng(0).normal(size=(2, 4, 3))
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for deterministic in (False, False, True):
        actions = compiled.act(obs, deterministic)
        torch.testing.assert_close(torch.as_tensor(actions), torch.as_tensor(eager.act(obs, deterministic)),
                                   rtol=1e-5, atol=1e-6)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs == 2  # with noise, and without


def recorded_rollout_updates(monkeypatch, agent_cls: type) -> list[dict]:
    """Every PPO update's losses, from now on."""
    updates: list[dict] = []
    update = agent_cls.update

    def recording_update(self, rollout, next_values):
        losses = update(self, rollout, next_values)
        updates.append({name: torch.as_tensor(value).clone() for name, value in losses.items()})
        return losses

    monkeypatch.setattr(agent_cls, "update", recording_update)
    return updates


def seed_dirs(runs_dir: Path) -> dict[int, Path]:
    return {json.loads((d / "config.json").read_text())["config"]["seed"]: d for d in runs_dir.iterdir()}


@pytest.mark.parametrize("algo, options", [
    ("ppo", {}),  # Box: per-seed observation and reward statistics, action noise, shuffles, gradient norms
    ("ppo", {"env_id": "CartPole-v1"}),  # Discrete: per-seed Gumbel noise
    ("ppo", {"env_id": "keelrl_test/ShortPendulum-v0"}),  # truncations: each seed bootstraps from its own values
    ("ppo_lag", dict(LAG, lambda_lr=0.5)),  # a cost value and λ per seed, λ stepped on each seed's own episodes
])
def test_each_seed_of_a_ppo_group_trains_as_its_single_seed_run(algo, options, tmp_path, monkeypatch):
    agent_cls, config_cls, train = AGENTS[algo]
    updates = recorded_rollout_updates(monkeypatch, agent_cls)
    train(config_cls(**{**PPO_TINY, **options}, seed=4, num_seeds=3, runs_dir=str(tmp_path / "group")))
    group_updates = list(updates)
    assert len(group_updates) == 3 and group_updates[0]["losses/policy_loss"].shape == (3,)
    group_dirs = seed_dirs(tmp_path / "group")
    for i, seed in enumerate((4, 5, 6)):
        updates.clear()
        single = train(config_cls(**{**PPO_TINY, **options}, seed=seed, runs_dir=str(tmp_path / f"single{seed}")))
        # the same environment steps (InvertedPendulum and CartPole count steps): the same actions to the last bit
        assert (group_dirs[seed] / "episodes.csv").read_text() == (single.run_dir / "episodes.csv").read_text()
        for group_losses, single_losses in zip(group_updates, updates, strict=True):
            for name, value in single_losses.items():
                grouped = group_losses[name] if name == "charts/learning_rate" else group_losses[name][i]
                torch.testing.assert_close(grouped, value, rtol=1e-5, atol=1e-6, msg=name)
        grouped, alone = agent_cls.load(group_dirs[seed] / "model.pt"), agent_cls.load(single.run_dir / "model.pt")
        for (name, tensor), other in zip(grouped.state_dict().items(), alone.state_dict().values(), strict=True):
            torch.testing.assert_close(tensor, other, rtol=1e-5, atol=1e-6, msg=name)
        assert grouped.config.seed == seed and grouped.config.num_seeds == 3
    if algo == "ppo_lag":  # each seed's λ went its own way
        multipliers = [agent_cls.load(group_dirs[seed] / "model.pt").lagrange_multiplier.item() for seed in (4, 5, 6)]
        assert len(set(multipliers)) == 3 and min(multipliers) > 0.001


@pytest.mark.parametrize("options, episodes_saved", [
    ({}, True),  # InvertedPendulum's episodes go on from each seed's checkpoint
    ({"env_id": "CartPole-v1", "normalize_obs": False, "normalize_reward": False}, False),  # new episodes
])
def test_a_ppo_group_resumed_mid_rollout_trains_each_seed_as_its_single_run_resumed(options, episodes_saved,
                                                                                    tmp_path, monkeypatch):
    """Each seed's checkpoint keeps its own rollout so far and its own envs' episodes: a group killed 8 steps
    after its checkpoint, 36 steps into a rollout, and resumed ends as each seed's single run killed and resumed."""
    config = dict(PPO_TINY, **options, checkpoint_freq=200)
    real_record = loop.Run.record_episodes

    def killed(run, info):
        if run.step == 216:
            raise KeyboardInterrupt
        return real_record(run, info)

    def killed_and_resumed(runs_dir: Path, **seeds) -> dict[int, Path]:
        monkeypatch.setattr(loop.Run, "record_episodes", killed)
        with pytest.raises(KeyboardInterrupt):
            ppo.train(ppo.PPOConfig(**config, **seeds, runs_dir=str(runs_dir)))
        monkeypatch.undo()
        run_dirs = seed_dirs(runs_dir)
        checkpoint = torch.load(run_dirs[seeds["seed"]] / CHECKPOINT_FILE, weights_only=True)
        assert checkpoint["rollout"]["step"] == 36 and (checkpoint["episodes"] is not None) == episodes_saved
        ppo.train(ppo.PPOConfig(resume=str(run_dirs[max(run_dirs)]), quiet=True))
        return run_dirs

    group_dirs = killed_and_resumed(tmp_path / "group", seed=4, num_seeds=2)
    for seed in (4, 5):
        (single_dir,) = killed_and_resumed(tmp_path / f"single{seed}", seed=seed).values()
        assert (group_dirs[seed] / "episodes.csv").read_text() == (single_dir / "episodes.csv").read_text()
        grouped, alone = (ppo.PPO.load(d / "model.pt").state_dict() for d in (group_dirs[seed], single_dir))
        for name, tensor in alone.items():
            torch.testing.assert_close(grouped[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
    first, second = (ppo.PPO.load(group_dirs[seed] / "model.pt").actor[0].weight for seed in (4, 5))
    assert not torch.allclose(first, second)


def test_each_seeds_gradient_is_clipped_by_its_own_norm():
    """Seed 0's gradient (norm 5) is scaled to norm 0.5, seed 1's (norm 0.3) left alone, as clip_grad_norm_ does
    to each alone."""
    weight, bias = torch.zeros(2, 3, 4, requires_grad=True), torch.zeros(2, 3, requires_grad=True)
    weight.grad, bias.grad = torch.zeros(2, 3, 4), torch.zeros(2, 3)
    weight.grad[0, 0, :2], bias.grad[0, 0] = torch.tensor([3.0, 0.0]), 4.0  # norm 5
    weight.grad[1, 1, 1], bias.grad[1, 2] = 0.3 * 0.6, 0.3 * 0.8  # norm 0.3
    expected = []
    for i in range(2):
        single = [torch.zeros(3, 4, requires_grad=True), torch.zeros(3, requires_grad=True)]
        single[0].grad, single[1].grad = weight.grad[i].clone(), bias.grad[i].clone()
        torch.nn.utils.clip_grad_norm_(single, 0.5)
        expected.append(single)
    clip_gradient_norm([weight, bias], 0.5, seed_axis=True)
    for i in range(2):
        torch.testing.assert_close(weight.grad[i], expected[i][0].grad)
        torch.testing.assert_close(bias.grad[i], expected[i][1].grad)
    assert torch.linalg.vector_norm(torch.cat([weight.grad[0].flatten(), bias.grad[0]])) == pytest.approx(0.5, 1e-5)
    assert bias.grad[1, 2] == pytest.approx(0.24)


def test_ppo_refuses_an_early_stop_it_cannot_take_per_seed(tmp_path, capsys):
    args = ["--num-seeds", "2", "--target-kl", "0.02", "--runs-dir", str(tmp_path), "--quiet"]
    assert run_cli(ppo.train, ppo.PPOConfig, args) == 2
    assert capsys.readouterr().err.startswith("error: --target-kl stops a seed's passes over its rollout early")
    assert not any(tmp_path.iterdir())


def test_a_stop_signal_during_one_seeds_evaluation_stops_every_seed_at_one_step(tmp_path, monkeypatch):
    """The seeds decide whether to stop in turn at each step. A SIGTERM that came during seed 5's evaluation at step
    256, after seed 4 had decided to go on, once stopped seed 5 with a checkpoint at 256 and seed 4 without one: a
    group --resume could not take up. Now both stop at the next step, each with its checkpoint, and resume."""
    evaluate = ppo.evaluate

    def signalled(agent, *args):
        if agent.config.seed == 5 and signalled.first:
            signalled.first = False
            signal.raise_signal(signal.SIGTERM)  # noted by the run's handler, as a kill from outside would be
        return evaluate(agent, *args)

    signalled.first = True
    monkeypatch.setattr(ppo, "evaluate", signalled)
    with pytest.raises(loop.RunStopped):
        ppo.train(ppo.PPOConfig(**{**PPO_TINY, "eval_freq": 256}, seed=4, num_seeds=2, runs_dir=str(tmp_path)))
    monkeypatch.undo()
    run_dirs = seed_dirs(tmp_path)
    assert [saved_step(run_dirs[seed] / CHECKPOINT_FILE) for seed in (4, 5)] == [258, 258]  # the next step of 2 envs
    assert run_cli(ppo.train, ppo.PPOConfig, ["--resume", str(run_dirs[4]), "--quiet"]) == 0
    assert [saved_step(run_dirs[seed] / CHECKPOINT_FILE) for seed in (4, 5)] == [384, 384]


def test_a_group_checkpointed_at_different_steps_is_refused_in_one_line(tmp_path, capsys):
    """A group whose seeds' checkpoints disagree (as a stop signal could leave them before the fix above) is not
    resumed with each seed's envs reseeded from the first seed's step: the refusal names each seed's step."""
    ppo.train(ppo.PPOConfig(**{**PPO_TINY, "checkpoint_freq": 128}, seed=4, num_seeds=2, runs_dir=str(tmp_path)))
    run_dirs = seed_dirs(tmp_path)
    checkpoint = torch.load(run_dirs[5] / CHECKPOINT_FILE, weights_only=False)
    torch.save({**checkpoint, "global_step": 256}, run_dirs[5] / CHECKPOINT_FILE)
    assert run_cli(ppo.train, ppo.PPOConfig, ["--resume", str(run_dirs[4]), "--extend-to", "512", "--quiet"]) == 2
    assert capsys.readouterr().err == (f"error: --resume {run_dirs[4]}: the seeds of this group were checkpointed at "
                                       f"different steps (seed 4 at step 384, seed 5 at step 256), and a group resumes "
                                       f"every seed from one step.\n")
