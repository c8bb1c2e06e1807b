"""The NaN guard names what went non-finite — the agent's actions, one of its losses, its weights, or the
environment — and never keeps as the last good checkpoint one whose weights are not finite."""

from __future__ import annotations

import signal

import numpy as np
import pytest
import torch

from keelrl.agents import iql, sac
from keelrl.agents.harness.checkpoints import CHECKPOINT_FILE, non_finite_entry
from keelrl.agents.harness.options import run_cli

from helpers import random_pendulum_npz


@pytest.fixture(scope="module")
def pendulum_npz(tmp_path_factory):
    return random_pendulum_npz(tmp_path_factory.mktemp("data") / "pendulum.npz", 400, num_envs=1)


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


def test_non_finite_actions_blame_the_agent_not_the_environment(tmp_path, monkeypatch, capsys):
    """NaN actions make MuJoCo return NaN observations: the message used to say 'fix the environment'."""
    real_act = sac.SAC.act

    def diverged_act(agent, obs, deterministic=False):
        actions = real_act(agent, obs, deterministic)
        return np.full_like(actions, np.nan) if agent.num_updates >= 250 else actions

    monkeypatch.setattr(sac.SAC, "act", diverged_act)
    code = run_cli(sac.train, sac.SACConfig, args=[
        "--env-id", "InvertedPendulum-v5", "--total-timesteps", "600", "--learning-starts", "100", "--batch-size", "16",
        "--hidden-sizes", "16", "16", "--checkpoint-freq", "200", "--eval-freq", "0", "--runs-dir", str(tmp_path),
        "--quiet"])
    assert code == 2
    err = one_error_line(capsys)
    (run_dir,) = tmp_path.iterdir()
    assert err == (f"error: The actions given to 'InvertedPendulum-v5' are not finite (NaN or inf) at vector step 351 "
                   f"in sub-env(s) [0]: the agent diverged, not the environment (see losses/* in TensorBoard; a new run "
                   f"with lower learning rates may not diverge). (global step 351). Training stopped; the checkpoint of "
                   f"step 200 in {run_dir} is kept (--resume {run_dir} continues from it).\n")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the run's handlers are gone with it


def train_iql(data, runs_dir, monkeypatch, poison_at: int, poison, **options) -> int:
    """An IQL run of 60 updates, checkpoints every 20, whose agent `poison`s itself after update `poison_at`."""
    real_update = iql.IQL.update

    def update(agent, batch):
        losses = real_update(agent, batch)
        return poison(agent, losses) if agent.num_updates >= poison_at else losses

    monkeypatch.setattr(iql.IQL, "update", update)
    args = ["--dataset", str(data), "--env-id", "InvertedPendulum-v5", "--total-updates", "60", "--batch-size", "16",
            "--hidden-sizes", "8", "8", "--checkpoint-freq", "20", "--eval-freq", "0", "--eval-episodes", "1",
            "--runs-dir", str(runs_dir), "--quiet"]
    for name, value in options.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    return run_cli(iql.train, iql.IQLConfig, args=args)


def test_a_non_finite_loss_is_named(pendulum_npz, tmp_path, monkeypatch, capsys):
    def nan_critic_loss(agent, losses):
        return {**losses, "losses/qf_loss": torch.tensor(float("nan"))}

    assert train_iql(pendulum_npz, tmp_path, monkeypatch, 25, nan_critic_loss, log_freq=10) == 2
    err = one_error_line(capsys)
    assert err.startswith("error: losses/qf_loss is nan at update 30: the agent diverged: see losses/* in "
                          "TensorBoard; a new run with lower learning rates may not diverge. Training stopped; the "
                          "checkpoint of update 20 in ")


def test_weights_that_are_not_finite_are_never_saved_as_the_last_good_checkpoint(pendulum_npz, tmp_path,
                                                                                   monkeypatch, capsys):
    def nan_critic(agent, losses):
        with torch.no_grad():
            next(agent.critic.parameters()).fill_(float("nan"))
        return losses

    assert train_iql(pendulum_npz, tmp_path, monkeypatch, 30, nan_critic, log_freq=1000) == 2
    err = one_error_line(capsys)
    assert err.startswith("error: The agent's networks/critic.") and "is not finite (NaN or inf) at update 40: its " \
        "networks diverged, so this state is not saved. Training stopped; the checkpoint of update 20 in " in err
    (run_dir,) = tmp_path.iterdir()
    checkpoint = torch.load(run_dir / CHECKPOINT_FILE, weights_only=True)
    assert checkpoint["global_step"] == 20 and non_finite_entry(checkpoint) is None


def test_non_finite_entry_names_the_first_bad_tensor():
    state = {"networks": {"a": torch.zeros(2), "b": torch.tensor([1.0, float("inf")])}, "steps": [torch.ones(1), 3]}
    assert non_finite_entry(state) == "networks/b"
    assert non_finite_entry({"steps": [torch.ones(1), torch.tensor([float("nan")])]}) == "steps/1"
    assert non_finite_entry({"count": torch.tensor([2**62]), "ok": torch.zeros(3)}) is None  # integers are finite
