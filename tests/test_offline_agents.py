"""CQL, IQL and RIQL: update rules on a fixed batch, save/load, the offline loop end to end with
corruption, resume, and clear errors for bad input."""

import json

import numpy as np
import pytest
import torch

from keelrl.agents.common import run_cli
from keelrl.agents.cql import CQL, CQLConfig
from keelrl.agents.cql import train as train_cql
from keelrl.agents.iql import IQL, IQLConfig
from keelrl.agents.iql import train as train_iql
from keelrl.agents.riql import RIQL, RIQLConfig
from keelrl.agents.riql import train as train_riql
from keelrl.benchmarks.make_datasets import collect
from keelrl.buffers.offline import DatasetBuffer

OBS_DIM, ACTION_DIM = 5, 2  # as the fixed_batch fixture in conftest.py
AGENTS = {"cql": (CQL, CQLConfig), "iql": (IQL, IQLConfig), "riql": (RIQL, RIQLConfig)}


def make_agent(algo: str, **overrides):
    torch.manual_seed(0)
    agent_cls, config_cls = AGENTS[algo]
    config = config_cls(hidden_sizes=(64, 64), **overrides)
    return agent_cls(OBS_DIM, -np.ones(ACTION_DIM), np.ones(ACTION_DIM), config)


@pytest.mark.parametrize("algo", ["cql", "iql", "riql"])
def test_update_runs_and_critic_loss_falls_on_a_fixed_batch(algo, fixed_batch):
    options = {"cql_n_actions": 4} if algo == "cql" else {}
    agent = make_agent(algo, normalize_obs=False, **options)
    target_before = [p.clone() for p in agent.critic_target.parameters()]
    losses = [agent.update(fixed_batch) for _ in range(150)]
    expected = {"losses/qf_loss", "losses/actor_loss", "losses/qf_values"}
    assert expected <= set(losses[0]) and all(v.dim() == 0 and torch.isfinite(v) for v in losses[-1].values())
    assert agent.num_updates == 150
    qf = [step["losses/qf_loss"].item() for step in losses]
    assert np.mean(qf[-10:]) < 0.3 * np.mean(qf[:10])
    assert all(not torch.equal(a, b) for a, b in zip(target_before, agent.critic_target.parameters()))


def test_riql_defaults_and_quantile_target():
    agent = make_agent("riql")
    assert agent.critic.num_critics == 5 and agent.config.q_loss == "huber" and agent.config.deterministic_actor
    q_all = torch.arange(10.0).view(5, 2)  # 5 critics, 2 transitions
    torch.testing.assert_close(agent._combine_targets(q_all), torch.quantile(q_all, 0.25, dim=0))
    torch.testing.assert_close(make_agent("iql")._combine_targets(q_all[:2]), q_all[0])


def test_cql_penalty_lowers_unseen_actions(fixed_batch):
    """The conservative term widens the margin of dataset actions' Q over random actions' Q."""
    random_actions = torch.rand(fixed_batch.actions.shape, generator=torch.Generator().manual_seed(1)) * 2 - 1
    margins = {}
    for cql_alpha in (0.0, 5.0):
        agent = make_agent("cql", normalize_obs=False, cql_alpha=cql_alpha, cql_n_actions=4)
        for _ in range(150):
            agent.update(fixed_batch)
        with torch.no_grad():
            margins[cql_alpha] = (agent.q_value(fixed_batch.obs, fixed_batch.actions)
                                  - agent.q_value(fixed_batch.obs, random_actions)).mean().item()
    assert margins[5.0] > margins[0.0] + 0.05


@pytest.mark.parametrize("algo", ["cql", "iql", "riql"])
def test_save_and_load_keep_policy_and_observation_statistics(algo, tmp_path, fixed_batch):
    agent = make_agent(algo)
    agent.fit_normalizer({"observations": fixed_batch.obs.numpy() * 3 + 1, "next_observations": fixed_batch.obs.numpy()})
    agent.update(fixed_batch)
    agent.save(tmp_path / "model.pt")
    loaded = AGENTS[algo][0].load(tmp_path / "model.pt")
    torch.testing.assert_close(loaded.obs_norm.mean, agent.obs_norm.mean)
    obs = np.random.default_rng(0).normal(size=(4, OBS_DIM))
    np.testing.assert_array_equal(loaded.act(obs, deterministic=True), agent.act(obs, deterministic=True))


@pytest.fixture(scope="module")
def pendulum_npz(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "pendulum.npz"
    rng = np.random.default_rng(0)
    data = collect("InvertedPendulum-v5", lambda obs: rng.uniform(-3, 3, (len(obs), 1)), 600, 2, seed=0)
    np.savez(path, **data)
    return path


def tiny(config_cls, path, tmp_path, **overrides):
    settings = dict(dataset=str(path), env_id="InvertedPendulum-v5", total_updates=120, batch_size=32,
                    hidden_sizes=(32, 32), eval_freq=60, eval_episodes=2, checkpoint_freq=60, log_freq=30,
                    runs_dir=str(tmp_path), quiet=True)
    return config_cls(**{**settings, **overrides})


def test_train_end_to_end_with_corruption(pendulum_npz, tmp_path):
    result = train_riql(tiny(RIQLConfig, pendulum_npz, tmp_path, corruption="dynamics", corruption_rate=0.3))
    assert result.global_step == 120 and len(result.final_eval_returns) == 2
    summary = json.loads((result.run_dir / "dataset.json").read_text())
    assert summary["corruption"]["corrupted_transitions"] == 180 and summary["transitions"] == 600
    assert summary["ref_scores"] is None  # InvertedPendulum has no D4RL reference
    eval_rows = (result.run_dir / "eval.csv").read_text().strip().splitlines()
    assert [row.split(",")[0] for row in eval_rows[1:]] == ["60", "120"]
    agent = RIQL.load(result.run_dir / "model.pt")
    assert agent.obs_norm.count.item() == 1200  # observations and next observations
    # the trained critic can drive an adversarial attack on the same data
    attacked = train_cql(tiny(CQLConfig, pendulum_npz, tmp_path, total_updates=30, eval_freq=0, corruption="act",
                              corruption_mode="adversarial", attack_model=str(result.run_dir / "model.pt")))
    assert json.loads((attacked.run_dir / "dataset.json").read_text())["corruption"]["mode"] == "adversarial"


def test_resume_after_an_interruption_reaches_the_same_weights(pendulum_npz, tmp_path, monkeypatch):
    straight = train_iql(tiny(IQLConfig, pendulum_npz, tmp_path / "a"))
    sample, calls = DatasetBuffer.sample, []

    def interrupted_sample(self, batch_size):
        calls.append(1)
        if len(calls) == 90:  # after the checkpoint at update 60
            raise KeyboardInterrupt
        return sample(self, batch_size)

    monkeypatch.setattr(DatasetBuffer, "sample", interrupted_sample)
    with pytest.raises(KeyboardInterrupt):
        train_iql(tiny(IQLConfig, pendulum_npz, tmp_path / "b"))
    monkeypatch.undo()
    (run_dir,) = (tmp_path / "b").iterdir()
    resumed = train_iql(IQLConfig(resume=str(run_dir), quiet=True))
    assert resumed.global_step == 120
    eval_steps = [row.split(",")[0] for row in (run_dir / "eval.csv").read_text().strip().splitlines()[1:]]
    assert eval_steps == ["60", "120"]
    straight_params = IQL.load(straight.run_dir / "model.pt").parameters()
    for a, b in zip(straight_params, IQL.load(run_dir / "model.pt").parameters()):
        torch.testing.assert_close(a, b)


def test_cli_errors_exit_2_with_one_line(pendulum_npz, tmp_path, capsys):
    assert run_cli(train_iql, IQLConfig, ["--dataset", "keelrl/hopper-medium-v0", "--data-path", str(tmp_path)]) == 2
    assert "make_datasets --env-id Hopper-v5 --datasets medium" in capsys.readouterr().err
    assert run_cli(train_iql, IQLConfig, ["--dataset", str(pendulum_npz), "--env-id", "Hopper-v5"]) == 2
    assert "evaluate in the environment the data came from" in capsys.readouterr().err
    assert run_cli(train_iql, IQLConfig, ["--dataset", str(pendulum_npz)]) == 2
    assert "give --env-id" in capsys.readouterr().err
    args = ["--dataset", str(pendulum_npz), "--corruption", "obs", "--corruption-mode", "adversarial"]
    assert run_cli(train_cql, CQLConfig, args) == 2
    assert "--attack-model" in capsys.readouterr().err
