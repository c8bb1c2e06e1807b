"""SAC: update rule, save/load, determinism, resume after a kill, and clear errors for bad input."""

import csv
import dataclasses
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from keelrl.agents.harness.options import run_cli
from keelrl.agents.sac import SAC, SACConfig, train

from helpers import assert_critic_update_then_fit

REPO = Path(__file__).resolve().parents[1]
OBS_DIM, ACTION_DIM = 5, 2  # as the fixed_batch fixture in conftest.py


def tiny_config(tmp_path, **overrides) -> SACConfig:
    settings = dict(env_id="InvertedPendulum-v5", total_timesteps=600, learning_starts=200, batch_size=32,
                    hidden_sizes=(32, 32), buffer_size=10_000, eval_freq=0, eval_episodes=2,
                    checkpoint_freq=300, log_freq=100, runs_dir=str(tmp_path), quiet=True)
    return SACConfig(**{**settings, **overrides})


def make_agent(**overrides) -> SAC:
    torch.manual_seed(0)
    return SAC(OBS_DIM, -np.ones(ACTION_DIM), np.ones(ACTION_DIM), SACConfig(hidden_sizes=(64, 64), **overrides))


def test_update_shapes_schedule_and_target_tracking(fixed_batch):
    agent = make_agent()
    batch = fixed_batch
    target_before = [p.clone() for p in agent.critic_target.parameters()]
    first = agent.update(batch)
    assert set(first) == {"losses/qf_loss", "losses/qf_values"}  # actor waits for policy_frequency
    second = agent.update(batch)
    assert {"losses/actor_loss", "losses/alpha", "losses/alpha_loss"} <= set(second)
    assert all(v.dim() == 0 and torch.isfinite(v) for v in second.values())
    assert agent.num_updates == 2
    assert make_agent().alpha.item() == 1.0  # autotuning starts from α = 1, as in CleanRL
    assert agent.critic(batch.obs, batch.actions).shape == (2, 256, 1)
    # Polyak: target <- target + tau * (online - target), twice
    for before, target, online in zip(target_before, agent.critic_target.parameters(), agent.critic.parameters()):
        assert not torch.equal(before, target)
        assert (target - before).abs().max() < 0.02 * (online - before).abs().max() + 1e-6


@pytest.mark.parametrize("preset", ["simba", "simbav2"])
def test_rescaled_actions_learn_as_on_a_unit_box(preset, fixed_batch):
    """--rescale-actions (the SimBa presets'): on a [0.2, 1.0] × [−0.4, 0.4] box the agent acts and learns as a
    SAC on [−1, 1] given the same actions rescaled, as gymnasium's RescaleAction makes them: the same actions
    (mapped into the box) and the same losses, the entropy target's included."""
    from keelrl.agents.sac import resolve

    low, high = np.array([0.2, -0.4]), np.array([1.0, 0.4])
    centre, half_width = (low + high) / 2, (high - low) / 2
    config = resolve(SACConfig(preset=preset, critic_hidden_dim=16, actor_hidden_dim=16))
    assert config.rescale_actions
    torch.manual_seed(0)
    rescaled = SAC(OBS_DIM, low, high, config)
    torch.manual_seed(0)
    unit = SAC(OBS_DIM, -np.ones(2), np.ones(2), dataclasses.replace(config, rescale_actions=False))
    obs = np.random.default_rng(0).normal(size=(4, OBS_DIM)).astype(np.float32)
    box_actions = rescaled.act(obs, deterministic=True)
    np.testing.assert_allclose(box_actions, centre + half_width * unit.act(obs, deterministic=True), atol=1e-6)
    assert np.all((box_actions >= low) & (box_actions <= high))
    unit_actions = fixed_batch.actions.clamp(-0.99, 0.99)
    box_batch = fixed_batch._replace(actions=torch.as_tensor(centre + half_width * unit_actions.numpy(),
                                                             dtype=torch.float32))
    for step in range(3):
        torch.manual_seed(step)  # the same noise for both
        expected = unit.update(fixed_batch._replace(actions=unit_actions))
        torch.manual_seed(step)
        got = rescaled.update(box_batch)
        for name, value in expected.items():
            torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=name)


def test_target_critic_follows_by_polyak_averaging_after_every_update(fixed_batch):
    """θ' ← θ' + τ(θ − θ'), τ = 0.005, with θ the online critic right after each update's critic step."""
    agent = make_agent()
    expected = [p.detach().clone().double() for p in agent.critic_target.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(agent.critic_target.parameters(), agent.critic.parameters()))
    for _ in range(3):
        agent.update(fixed_batch)
        online = [p.detach().double() for p in agent.critic.parameters()]
        expected = [e + 0.005 * (o - e) for e, o in zip(expected, online)]
        for e, target in zip(expected, agent.critic_target.parameters()):
            torch.testing.assert_close(target.detach().double(), e, rtol=1e-6, atol=1e-7)  # float32 lerp rounding


def test_critic_loss_falls_on_a_fixed_batch(fixed_batch):
    agent = make_agent(autotune=False, alpha=0.05)  # a small α keeps the sampled entropy term from masking the fit
    batch = fixed_batch
    # the first loss by hand: y = r + 0.99 (1 − d)(min_k Q'_k(s', a') − 0.05 log π(a'|s')), a' ~ π(·|s') drawn
    # with the same seed; the logged loss is the critics' mean of their mean squared errors
    torch.manual_seed(11)
    with torch.no_grad():
        next_actions, next_log_prob = agent.actor.sample(batch.next_obs)
        next_q = agent.critic_target(batch.next_obs, next_actions).squeeze(-1).double()  # (2, B)
        y = batch.rewards.double() + 0.99 * (1 - batch.terminated.double()) * (
            next_q.min(dim=0).values - 0.05 * next_log_prob.double())
        q = agent.critic(batch.obs, batch.actions).squeeze(-1).double()
    assert_critic_update_then_fit(agent, batch, 11, q, y)


def test_actor_loss_falls_and_alpha_tracks_entropy_on_a_fixed_batch(fixed_batch):
    agent = make_agent()
    batch = fixed_batch
    for _ in range(100):
        agent.update_critic(batch)
    alpha_before = agent.alpha.item()
    assert alpha_before == 1.0 and agent.target_entropy == -2.0  # α starts at 1; target entropy −|A|
    # the first actor and α losses by hand: a ~ π(·|s) drawn with the same seed,
    # actor loss = mean(α log π(a|s) − min_k Q_k(s, a)), α loss = −mean(α (log π(a|s) − 2))
    torch.manual_seed(12)
    with torch.no_grad():
        actions, log_prob = agent.actor.sample(batch.obs)
        q_min = agent.critic(batch.obs, actions).squeeze(-1).min(dim=0).values
    expected_actor = (1.0 * log_prob.double() - q_min.double()).mean().item()
    expected_alpha = -(1.0 * (log_prob.double() - 2.0)).mean().item()
    torch.manual_seed(12)
    first = agent.update_actor_and_alpha(batch.obs)
    assert first["losses/actor_loss"].item() == pytest.approx(expected_actor, rel=1e-5)
    assert first["losses/alpha_loss"].item() == pytest.approx(expected_alpha, rel=1e-5)
    assert first["losses/alpha"].item() == 1.0  # logged before the α step
    # d(α loss)/d log α = the α loss itself; Adam's first step moves log α by −lr · sign(gradient), lr 1e-3
    assert agent.log_alpha.item() == pytest.approx(-1e-3 * math.copysign(1.0, expected_alpha), abs=1e-8)
    losses = [first["losses/actor_loss"].item()]
    losses += [agent.update_actor_and_alpha(batch.obs)["losses/actor_loss"].item() for _ in range(199)]
    assert np.mean(losses[-10:]) < np.mean(losses[:10])
    # entropy of a fresh tanh-Gaussian exceeds the target -|A|, so alpha must shrink
    assert agent.alpha.item() < alpha_before


@pytest.mark.parametrize("normalize_obs", [False, True])
def test_save_and_load_give_the_same_policy(tmp_path, normalize_obs, fixed_batch):
    agent = make_agent(normalize_obs=normalize_obs)
    seen = torch.randn(100, OBS_DIM) * 5 + 3
    if normalize_obs:
        agent.obs_norm.update(seen)
    agent.update(fixed_batch)
    agent.save(tmp_path / "model.pt")
    loaded = SAC.load(tmp_path / "model.pt")
    obs = np.random.default_rng(1).normal(size=(4, OBS_DIM))
    np.testing.assert_array_equal(loaded.act(obs, deterministic=True), agent.act(obs, deterministic=True))
    assert loaded.config.hidden_sizes == (64, 64)
    seen64 = seen.double().numpy()
    if normalize_obs:  # the statistics travel with the model: those of the 100 observations seen
        torch.testing.assert_close(loaded.obs_norm.mean, agent.obs_norm.mean)
        assert loaded.obs_norm.count.item() == 100
        np.testing.assert_allclose(loaded.obs_norm.mean.double().numpy(), seen64.mean(0), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(loaded.obs_norm.var.double().numpy(), seen64.var(0), rtol=1e-6)
    # the loaded policy's deterministic action by hand: tanh(mean head of the trunk) on the normalised obs
    # ((obs − mean) / sqrt(var + 1e-8), clipped at ±10, with --normalize-obs), in float64; 1e-5: a network pass
    normalised = np.clip((obs - seen64.mean(0)) / np.sqrt(seen64.var(0) + 1e-8), -10, 10) if normalize_obs else obs
    with torch.no_grad():
        mean = loaded.actor.mean(loaded.actor.trunk(torch.as_tensor(normalised, dtype=torch.float32)))
    np.testing.assert_allclose(loaded.act(obs, deterministic=True), torch.tanh(mean).numpy(), rtol=1e-5, atol=1e-6)


def test_loading_another_algorithms_checkpoint_is_refused(tmp_path):
    torch.save({"algo": "td3", "networks": {}}, tmp_path / "td3.pt")
    with pytest.raises(ValueError, match="'td3' checkpoint"):
        SAC.load(tmp_path / "td3.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a readable keelrl checkpoint"):
        SAC.load(tmp_path / "junk.pt")


def read_episodes(run_dir: Path) -> list[dict]:
    with (run_dir / "episodes.csv").open() as f:
        return list(csv.DictReader(f))


def test_same_seed_gives_identical_runs(tmp_path):
    first = train(tiny_config(tmp_path / "a", seed=3))
    second = train(tiny_config(tmp_path / "b", seed=3))
    other = train(tiny_config(tmp_path / "c", seed=4))
    returns = lambda result: [row["return"] for row in read_episodes(result.run_dir)]  # noqa: E731
    assert len(returns(first)) > 10
    assert returns(first) == returns(second)
    np.testing.assert_array_equal(first.final_eval_returns, second.final_eval_returns)
    assert returns(first) != returns(other)
    for name in ("config.json", "episodes.csv", "eval.csv", "checkpoint.pt", "buffer.pt", "model.pt"):
        assert (first.run_dir / name).is_file(), name
    assert any(p.name.startswith("events.out.tfevents") for p in first.run_dir.iterdir())
    check_run_files(first.run_dir, tiny_config(tmp_path / "a", seed=3), first.final_eval_returns)


def check_run_files(run_dir: Path, config: SACConfig, final_eval_returns: np.ndarray) -> None:
    """What a finished 600-step InvertedPendulum-v5 run wrote, against what it must contain."""
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["algo"] == "sac"
    assert saved["config"] == json.loads(json.dumps(dataclasses.asdict(config), default=str))
    # episodes.csv: InvertedPendulum-v5 pays 1 per step and 0 on the terminating step (no episode reaches the
    # 1000-step limit in 600 steps), and one env's episode ends at the sum of the lengths so far
    rows = read_episodes(run_dir)
    lengths = [int(row["length"]) for row in rows]
    assert [float(row["return"]) for row in rows] == [length - 1.0 for length in lengths]
    assert [int(row["global_step"]) for row in rows] == np.cumsum(lengths).tolist()
    assert [float(row["cost"]) for row in rows] == [0.0] * len(rows)
    # eval.csv: the final evaluation only (eval_freq 0), its mean and population std of the returns
    (evaluation,) = csv.DictReader((run_dir / "eval.csv").open())
    assert int(evaluation["global_step"]) == 600 and int(evaluation["episodes"]) == 2
    assert float(evaluation["mean_return"]) == pytest.approx(final_eval_returns.mean(), rel=1e-12)
    assert float(evaluation["std_return"]) == pytest.approx(final_eval_returns.std(), abs=1e-12)
    # the evaluation episodes by hand: single envs seeded 10000 + seed * episodes + i (seeds evaluate on disjoint
    # episodes), the saved deterministic policy
    model = SAC.load(run_dir / "model.pt")
    for i, episode_return in enumerate(final_eval_returns):
        env = gym.make("InvertedPendulum-v5")
        obs, _ = env.reset(seed=10_000 + config.seed * 2 + i)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(model.act(obs[None], deterministic=True)[0])
            total, done = total + reward, terminated or truncated
        assert total == episode_return, i
    # the checkpoint and buffer: 600 steps, updates after learning_starts 200, every transition stored
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert checkpoint["global_step"] == 600 and checkpoint["agent"]["num_updates"] == 400
    buffer = torch.load(run_dir / "buffer.pt", weights_only=True)
    assert int(buffer["pos"]) == 600 and buffer["rewards"].shape == (600,)
    terminated = buffer["terminated"].bool()
    assert int(terminated.sum()) == len(rows)  # every finished episode terminated
    torch.testing.assert_close(buffer["rewards"], (~terminated).float(), rtol=0, atol=0)
    assert (buffer["next_obs"][terminated, 1].abs() > 0.2).all()  # the pole fell past 0.2 rad
    assert (buffer["next_obs"][~terminated, 1].abs() <= 0.2).all()
    # TensorBoard holds the same episode figures under CleanRL's names
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir))
    events.Reload()
    logged = [(e.step, e.value) for e in events.Scalars("charts/episodic_return")]
    assert logged == [(int(row["global_step"]), pytest.approx(float(row["return"]))) for row in rows]
    assert [e.step for e in events.Scalars("losses/qf_loss")] == [300, 400, 500, 600]  # every log_freq 100 once updating


def killed_past(module: str, args: list[str], runs_dir: Path, step: int = 1300) -> Path:
    """The run directory of `python -m module *args` (its --runs-dir `runs_dir`), killed with SIGKILL once it holds a
    checkpoint and an episode ended past `step`."""
    process = subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    deadline, run_dir = time.time() + 120, None
    while time.time() < deadline and process.poll() is None:
        runs = list(runs_dir.iterdir())
        if runs and (runs[0] / "checkpoint.pt").exists():
            run_dir = runs[0]
            rows = read_episodes(run_dir)
            if rows and int(rows[-1]["global_step"]) > step:
                break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert run_dir is not None, process.stderr.read().decode()
    return run_dir


def test_resume_after_kill_leaves_no_gap_or_duplicate(tmp_path):
    args = ["--env-id", "InvertedPendulum-v5", "--total-timesteps", "4000", "--learning-starts", "300",
            "--batch-size", "32", "--hidden-sizes", "32", "32", "--checkpoint-freq", "1000",
            "--eval-freq", "0", "--eval-episodes", "2", "--normalize-obs", "--runs-dir", str(tmp_path), "--quiet"]
    run_dir = killed_past("keelrl.agents.sac", args, tmp_path)
    checkpoint_step = torch.load(run_dir / "checkpoint.pt", weights_only=True)["global_step"]
    assert 1000 <= checkpoint_step < 4000
    before = read_episodes(run_dir)
    assert int(before[-1]["global_step"]) > checkpoint_step  # episodes logged after the checkpoint

    result = train(SACConfig(resume=str(run_dir), quiet=True))
    assert result.global_step == 4000
    after = read_episodes(run_dir)
    steps = [int(row["global_step"]) for row in after]
    assert steps == sorted(set(steps))  # strictly increasing: nothing duplicated
    kept = [row for row in before if int(row["global_step"]) <= checkpoint_step]
    assert after[: len(kept)] == kept  # nothing lost up to the checkpoint
    assert steps[len(kept)] > checkpoint_step and steps[-1] > 3500  # and training went on to the end
    evals = list(csv.DictReader((run_dir / "eval.csv").open()))
    assert [int(row["global_step"]) for row in evals] == [4000]
    # the observation statistics were restored: they count every observation acted on, before and after
    assert SAC.load(run_dir / "model.pt").obs_norm.count.item() == 4000




@pytest.mark.parametrize(
    "args, message",
    [
        (["--env-id", "Hoper-v5"], "Did you mean 'Hopper-v5'"),
        (["--env-id", "CartPole-v1"], r"continuous \(Box\) action space"),
        (["--total-timesteps", "0"], "--total-timesteps must be positive"),
        (["--total-timesteps", "-5"], "--total-timesteps must be positive"),
        (["--batch-size", "0"], "--batch-size must be positive"),
        (["--learning-starts", "-1"], "non-negative"),
        (["--device", "cuda"] if not torch.cuda.is_available() else ["--gamma", "2"], "cuda|gamma"),
        (["--cudagraphs"], "--cudagraphs .* needs --device cuda"),
        (["--env-id", "keelrl_test/NanRewardLate-v0", "--learning-starts", "100", "--batch-size", "8",
          "--checkpoint-freq", "200"], r"non-finite reward .*global step 250.*checkpoint of step 200 .* is kept"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_code_2(args, message, tmp_path, capsys):
    code = run_cli(train, SACConfig, args=[*args, "--runs-dir", str(tmp_path), "--quiet", "--hidden-sizes", "8"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and "Traceback" not in err
    assert re.search(message, err), err


def test_extend_to_trains_a_finished_run_further(tmp_path, capsys):
    common = dict(env_id="InvertedPendulum-v5", learning_starts=100, batch_size=16, hidden_sizes=(8, 8),
                  eval_freq=0, eval_episodes=1, runs_dir=str(tmp_path), quiet=True)
    first = train(SACConfig(total_timesteps=300, **common))
    assert run_cli(train, SACConfig, args=["--extend-to", "600", "--runs-dir", str(tmp_path)]) == 2
    assert "--extend-to trains a saved run further: give it with --resume" in capsys.readouterr().err
    assert run_cli(train, SACConfig, args=["--resume", str(first.run_dir), "--extend-to", "200"]) == 2
    assert "below the run's --total-timesteps 300" in capsys.readouterr().err
    def updates() -> int:
        return torch.load(first.run_dir / "checkpoint.pt", weights_only=True)["agent"]["num_updates"]

    assert updates() == 200

    result = train(SACConfig(resume=str(first.run_dir), extend_to=600, quiet=True))
    assert result.global_step == 600 and result.run_dir == first.run_dir
    assert updates() == 500  # 200 updates, then 300 more
    evals = [int(row["global_step"]) for row in csv.DictReader((first.run_dir / "eval.csv").open())]
    assert evals == [300, 600]
    saved = json.loads((first.run_dir / "config.json").read_text())["config"]
    assert saved["total_timesteps"] == 600 and saved["extend_to"] is None  # a plain --resume now ends at 600


def test_resume_of_a_directory_that_is_not_a_run(tmp_path, capsys):
    assert run_cli(train, SACConfig, args=["--resume", str(tmp_path)]) == 2
    assert "not a keelrl run directory" in capsys.readouterr().err
    assert run_cli(train, SACConfig, args=["--resume", str(tmp_path / "missing")]) == 2
    assert "no such directory" in capsys.readouterr().err


def test_resume_of_another_algorithms_run(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"algo": "td3", "config": {}}))
    torch.save({"algo": "td3"}, tmp_path / "checkpoint.pt")
    assert run_cli(train, SACConfig, args=["--resume", str(tmp_path)]) == 2
    assert "that run is 'td3', not 'sac'" in capsys.readouterr().err


def test_cli_prints_no_traceback(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "keelrl.agents.sac", "--env-id", "Hoper-v5", "--runs-dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert completed.returncode == 2
    assert completed.stderr.strip().startswith("error: Unknown gymnasium environment id 'Hoper-v5'")
    assert "Traceback" not in completed.stderr
    assert not any(tmp_path.iterdir())  # no run directory is left behind for a run that never started
