"""WSRL and the pieces it is built from: Cal-QL's bound, REDQ's subset targets, LayerNorm ensembles, loading the
pre-trained run, the warm-up, the empty buffer, and the refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from keelrl.agents.cql import CQL, CQLConfig
from keelrl.agents.cql import train as train_cql
from keelrl.agents.harness.loop import Run
from keelrl.agents.harness.options import run_cli
from keelrl.agents.iql import IQLConfig
from keelrl.agents.iql import train as train_iql
from keelrl.agents.sac import SAC, SACConfig
from keelrl.agents.wsrl import WSRL, WSRLConfig
from keelrl.agents.wsrl import train as train_wsrl
from keelrl.benchmarks.make_datasets import collect
from keelrl.buffers import Batch, ReplayBuffer
from keelrl.evaluate import EvaluateConfig, evaluate_saved
from keelrl.networks import CriticEnsemble

from helpers import killed_in_call

ARCHITECTURE = dict(hidden_sizes=(16, 16), num_critics=4, critic_subset_size=2, layer_norm=True, normalize_obs=True)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A finished CQL run with WSRL's kind of networks (4 LayerNorm critics, targets over a random pair) on 600
    random transitions of InvertedPendulum, and that data."""
    tmp_path = tmp_path_factory.mktemp("pretrained")
    rng = np.random.default_rng(0)
    data = collect("InvertedPendulum-v5", lambda obs: rng.uniform(-3, 3, (len(obs), 1)), 600, 2, seed=0)
    np.savez(tmp_path / "pendulum.npz", **data)
    config = CQLConfig(dataset=str(tmp_path / "pendulum.npz"), env_id="InvertedPendulum-v5", total_updates=20,
                       batch_size=32, max_target_backup=True, eval_freq=0, eval_episodes=1, runs_dir=str(tmp_path),
                       quiet=True, **ARCHITECTURE)
    return train_cql(config).run_dir, data


def tiny(pretrained_dir, tmp_path, **overrides) -> WSRLConfig:
    settings = dict(pretrained=str(pretrained_dir), total_timesteps=120, warmup_steps=60, batch_size=32, utd=4,
                    eval_freq=0, eval_episodes=1, checkpoint_freq=60, buffer_size=1000, runs_dir=str(tmp_path),
                    quiet=True)
    return WSRLConfig(**{**settings, **overrides})


def test_cal_ql_raises_the_policy_q_values_below_the_return_to_go_to_it_by_hand():
    """Two proposals of each kind (uniform, π(s), π(s')) for two states, one critic: Cal-QL's bound raises the
    policy proposals' Q-values below the state's Monte-Carlo return to that return; the uniform ones and the
    policy ones above it stay as they are."""
    agent = CQL(3, np.array([-1.0]), np.array([1.0]), CQLConfig(cal_ql=True, cql_n_actions=2, hidden_sizes=(4,)))
    q = torch.tensor([[[-5.0, 9.0], [-6.0, 0.5],    # uniform proposals: never bounded
                       [0.0, 3.0], [2.5, -1.0],     # π(·|s)
                       [1.0, 2.0], [4.0, 7.0]]])    # π(·|s'), scored at s; shape (E=1, 3·N=6, B=2)
    mc_returns = torch.tensor([2.0, 1.0])  # state 0's and state 1's returns-to-go
    bounded, rate = agent.calibrated(q, mc_returns)
    expected = torch.tensor([[[-5.0, 9.0], [-6.0, 0.5],
                              [2.0, 3.0], [2.5, 1.0],
                              [2.0, 2.0], [4.0, 7.0]]])
    torch.testing.assert_close(bounded, expected, rtol=0, atol=0)
    assert rate.item() == 3 / 8  # 0.0 < 2, −1 < 1 and 1 < 2 of the 8 policy Q-values


def constant_critics(critic: CriticEnsemble, values: list[float]) -> None:
    """Make member i output values[i] whatever its input: zero output weights, bias values[i]."""
    with torch.no_grad():
        critic.net.layers[-1].weight.zero_()
        critic.net.layers[-1].bias.copy_(torch.tensor(values).view(-1, 1, 1))


VALUES = [5.0, 1.0, 4.0, 2.0, 3.0]


def redq_batch(batch_size: int = 6) -> Batch:
    return Batch(obs=torch.randn(batch_size, 3), actions=torch.rand(batch_size, 1) * 2 - 1,
                 rewards=torch.zeros(batch_size), next_obs=torch.randn(batch_size, 3),
                 terminated=torch.zeros(batch_size), discounts=torch.full((batch_size,), 0.5))


def subset_minimum(seed: int, draws_before: int) -> float:
    """min of VALUES over the subset the agent draws after `draws_before` normal samples, seeded as it was."""
    torch.manual_seed(seed)
    torch.randn(draws_before)
    return min(VALUES[i] for i in torch.randint(len(VALUES), (2,)).tolist())


def test_redq_targets_take_the_minimum_over_the_drawn_subset_of_critics():
    """5 target critics with constant values 5, 1, 4, 2, 3 and a pair drawn per update: WSRL's and SAC's TD
    targets (reward 0, discount 0.5) and CQL's backed-up value are 0.5 × (the pair's minimum), seed after seed,
    which is not the minimum over all five (1) whenever member 1 is not drawn."""
    low, high, batch = np.array([-1.0]), np.array([1.0]), redq_batch()
    wsrl = WSRL(3, low, high, WSRLConfig(hidden_sizes=(8,), num_critics=5, critic_subset_size=2, normalize_obs=False))
    sac = SAC(3, low, high, SACConfig(hidden_sizes=(8,), num_critics=5, critic_subset_size=2, alpha=1e-9,
                                      autotune=False))
    cql = CQL(3, low, high, CQLConfig(hidden_sizes=(8,), num_critics=5, critic_subset_size=2, normalize_obs=False))
    for agent in (wsrl, sac, cql):
        constant_critics(agent.critic_target, VALUES)
        constant_critics(agent.critic, [0.0] * 5)
    minima = []
    for seed in range(12):
        minimum = subset_minimum(seed, draws_before=6)  # a' ~ π(s'): one normal per state and action dimension
        minima.append(minimum)
        torch.manual_seed(seed)  # the critics output 0: the TD loss is 5 critics × (0.5 · min)²
        wsrl_loss, logged = wsrl.critic_loss(batch)
        torch.testing.assert_close(wsrl_loss, torch.tensor(5 * (0.5 * minimum) ** 2))
        assert logged["losses/qf_values"] == 0.0 and logged["losses/qf_targets"] == 0.5 * minimum
        torch.manual_seed(seed)  # SAC draws its noise and subset as its update does, then takes them in
        noise = sac.random.normal(6, 1)
        sac_loss, _ = sac.critic_loss(batch, noise, sac.random.members(5, 2))
        torch.testing.assert_close(sac_loss, torch.tensor(5 * (0.5 * minimum) ** 2), rtol=1e-6, atol=1e-6)
        torch.manual_seed(seed)
        torch.testing.assert_close(cql.next_value(batch.next_obs), torch.full((6,), minimum))
    assert min(minima) == 1.0 and max(minima) > 1.0  # some pairs hold member 1 and some do not


def test_cql_max_target_backup_takes_the_best_of_the_sampled_next_actions():
    """With one critic whose Q grows with the action, the backed-up value is Q at the largest of the n sampled
    next actions, above the value at one sampled action."""
    low, high = np.array([-1.0]), np.array([1.0])
    config = CQLConfig(hidden_sizes=(8,), num_critics=1, cql_n_actions=10, max_target_backup=True,
                       normalize_obs=False)
    agent = CQL(3, low, high, config)
    with torch.no_grad():  # Q(s, a) = 2a: zero weights but the action's
        agent.critic_target.net.layers[-1].weight.zero_()
        agent.critic_target.net.layers[-1].bias.zero_()
    agent.critic_target.forward = lambda obs, actions, members=slice(None): 2 * actions[None]  # (1, n·B, 1)
    next_obs = torch.randn(4, 3)
    torch.manual_seed(0)
    backed_up = agent.next_value(next_obs)
    torch.manual_seed(0)
    actions, _ = agent.actor.sample(next_obs.repeat(10, 1))
    torch.testing.assert_close(backed_up, 2 * actions.view(10, 4).max(dim=0).values)
    assert (backed_up > 2 * actions.view(10, 4)[0]).any()


def test_wsrl_starts_from_exactly_the_pretrained_networks_and_optimisers(pretrained, tmp_path):
    """A run whose every step is warm-up never updates: its saved networks are the pre-trained run's, tensor for
    tensor, its actions and Q-values the same, and its Adam states the pre-trained ones."""
    run_dir, _ = pretrained
    result = train_wsrl(tiny(run_dir, tmp_path, total_timesteps=50, warmup_steps=50))
    cql, wsrl = CQL.load(run_dir / "model.pt"), WSRL.load(result.run_dir / "model.pt")
    assert wsrl.config.num_critics == 4 and wsrl.config.layer_norm and wsrl.config.critic_subset_size == 2
    cql_state = cql.state_dict()
    assert set(cql_state) == set(wsrl.state_dict())
    for name, tensor in wsrl.state_dict().items():
        torch.testing.assert_close(tensor, cql_state[name], rtol=0, atol=0, msg=name)
    obs = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    np.testing.assert_array_equal(wsrl.act(obs, deterministic=True), cql.act(obs, deterministic=True))
    obs_t, actions = torch.as_tensor(obs), torch.rand(5, 1) * 6 - 3
    torch.testing.assert_close(wsrl.critic(wsrl.obs_norm(obs_t), actions), cql.critic(cql.obs_norm(obs_t), actions),
                               rtol=0, atol=0)
    saved = torch.load(result.run_dir / "checkpoint.pt", weights_only=True)["agent"]
    pretrained_state = torch.load(run_dir / "checkpoint.pt", weights_only=True)["agent"]
    assert saved["num_updates"] == 0
    for name in ("actor", "critic", "log_alpha"):
        for index, moments in pretrained_state["optimizers"][name]["state"].items():
            torch.testing.assert_close(saved["optimizers"][name]["state"][index]["exp_avg"], moments["exp_avg"])
    assert saved["optimizers"]["critic"]["param_groups"][0]["lr"] == 3e-4  # this run's learning rates


def test_warm_up_without_updates_then_updates_from_an_empty_buffer_of_online_data(pretrained, tmp_path, monkeypatch):
    """No update in the warm-up; the buffer holds exactly the online steps taken when the first update samples
    it; every transition ever sampled is an online one, none from the offline dataset; `utd` critic steps of
    batch/utd transitions each, then one actor step on the whole batch, per environment step."""
    run_dir, data = pretrained
    sizes_at_sample, sampled, critic_batches, actor_batches = [], [], [], []
    sample, update_critic = ReplayBuffer.sample, WSRL.update_critic
    update_actor = WSRL.update_actor_and_alpha

    def recording_sample(self, batch_size):
        sizes_at_sample.append(self.size)
        sampled.append(sample(self, batch_size))
        return sampled[-1]

    monkeypatch.setattr(ReplayBuffer, "sample", recording_sample)
    monkeypatch.setattr(WSRL, "update_critic", lambda self, b: critic_batches.append(len(b.obs)) or update_critic(
        self, b))
    monkeypatch.setattr(WSRL, "update_actor_and_alpha", lambda self, obs: actor_batches.append(len(obs)) or
                        update_actor(self, obs))
    result = train_wsrl(tiny(run_dir, tmp_path))
    assert sizes_at_sample == list(range(61, 121))  # the first update after 60 warm-up steps (and its own)
    assert critic_batches == [8] * 4 * 60 and actor_batches == [32] * 60
    # transitions as (s, a) rows: an online episode may start in a state of the data (seeded alike), not with its action
    dataset_rows = {tuple(row) for row in np.concatenate([data["observations"], data["actions"]], 1).astype(np.float32)}
    stored = torch.load(result.run_dir / "buffer.pt", weights_only=True)
    online_rows = {tuple(row) for row in torch.cat([stored["obs"], stored["actions"]], 1).numpy()}
    assert len(stored["obs"]) == 120
    for batch in sampled:
        rows = {tuple(row) for row in torch.cat([batch.obs, batch.actions], 1).numpy()}
        assert rows <= online_rows and not rows & dataset_rows
    assert result.global_step == 120


def test_no_warm_up_still_waits_for_one_batch(pretrained, tmp_path, monkeypatch):
    run_dir, _ = pretrained
    sizes = []
    sample = ReplayBuffer.sample
    monkeypatch.setattr(ReplayBuffer, "sample", lambda self, n: sizes.append(self.size) or sample(self, n))
    train_wsrl(tiny(run_dir, tmp_path, total_timesteps=40, warmup_steps=0))
    assert sizes[0] == 33 and len(sizes) == 8  # updates from the step after the buffer holds batch_size (32)


def assert_same_run(run_dir, other_dir) -> None:
    """The two runs logged the same episodes and evaluations and saved the same weights, bit for bit."""
    for log in ("episodes.csv", "eval.csv"):
        assert (run_dir / log).read_text() == (other_dir / log).read_text(), log
    weights, other = WSRL.load(run_dir / "model.pt").state_dict(), WSRL.load(other_dir / "model.pt").state_dict()
    assert weights.keys() == other.keys()
    for name, tensor in weights.items():
        assert torch.equal(tensor, other[name]), name


def test_resume_extend_and_evaluate_a_wsrl_run(pretrained, tmp_path, monkeypatch):
    run_dir, _ = pretrained

    def interrupted_run(runs_dir, at_update: int):
        """A run that dies in its `at_update`-th update (after the checkpoint at step 60: updates from step 60 on),
        resumed to its end: its directory and result."""
        killed_in_call(monkeypatch, WSRL, "update", at_update,
                       lambda: train_wsrl(tiny(run_dir, runs_dir, warmup_steps=40)))
        (interrupted_dir,) = runs_dir.iterdir()
        return interrupted_dir, train_wsrl(WSRLConfig(resume=str(interrupted_dir), quiet=True))

    wsrl_dir, resumed = interrupted_run(tmp_path / "runs", 30)
    assert resumed.global_step == 120
    # up to its checkpoint (step 60) the run logged what a straight run logs; the resumed part starts new episodes
    # (the one in progress at the checkpoint is lost), so from there its numbers are those of any run resumed from
    # that checkpoint: one that died 15 updates later ends bit for bit where it does, and extends as it does
    straight = train_wsrl(tiny(run_dir, tmp_path / "straight", warmup_steps=40))
    for log in ("episodes.csv", "eval.csv"):
        lines, straight_lines = ((d / log).read_text().splitlines() for d in (wsrl_dir, straight.run_dir))
        kept = [line for line in straight_lines[1:] if int(line.split(",")[0]) <= 60]
        assert kept and lines[:1 + len(kept)] == straight_lines[:1 + len(kept)], log
    other_dir, other = interrupted_run(tmp_path / "other", 45)
    assert_same_run(wsrl_dir, other_dir)
    assert np.array_equal(resumed.final_eval_returns, other.final_eval_returns)
    extended = train_wsrl(WSRLConfig(resume=str(wsrl_dir), extend_to=150, quiet=True))
    assert extended.global_step == 150
    other_extended = train_wsrl(WSRLConfig(resume=str(other_dir), extend_to=150, quiet=True))
    assert_same_run(wsrl_dir, other_extended.run_dir)
    assert np.array_equal(extended.final_eval_returns, other_extended.final_eval_returns)
    eval_steps = [row.split(",")[0] for row in (wsrl_dir / "eval.csv").read_text().strip().splitlines()[1:]]
    assert eval_steps == ["0", "120", "150"]  # the pre-trained policy at step 0, then the ends of the run
    evaluation = evaluate_saved(EvaluateConfig(path=str(wsrl_dir / "model.pt"), episodes=2, seed=5))
    assert evaluation.algo == "wsrl" and evaluation.env_id == "InvertedPendulum-v5" and len(evaluation.returns) == 2
    assert json.loads((wsrl_dir / "dataset.json").read_text())["env_id"] == "InvertedPendulum-v5"


def test_refusals_in_one_line(pretrained, tmp_path, capsys):
    run_dir, _ = pretrained
    cases = [
        ([], "give --pretrained RUN_DIR"),
        (["--pretrained", str(tmp_path / "nothing")], "no run directory there"),
        (["--pretrained", str(run_dir), "--env-id", "Hopper-v5"], "acts on 4 observations and 1 actions, but "
                                                                  "Hopper-v5 has 11 and 3"),
        (["--pretrained", str(run_dir), "--num-critics", "3"], "--num-critics 3 differs from the pre-trained run's 4"),
        (["--pretrained", str(run_dir), "--batch-size", "30"], "must split into --utd 4 equal minibatches"),
        (["--pretrained", str(run_dir), "--alpha-lr", "0"], "--alpha-lr must be positive, got 0.0."),
    ]
    iql = train_iql(IQLConfig(dataset=str(run_dir.parent / "pendulum.npz"), env_id="InvertedPendulum-v5",
                              total_updates=2, batch_size=8, hidden_sizes=(8,), eval_freq=0, eval_episodes=1,
                              runs_dir=str(tmp_path / "iql"), quiet=True)).run_dir
    cases.append((["--pretrained", str(iql)], f"--pretrained {iql} is a run of iql; WSRL fine-tunes"))
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "config.json").write_text(json.dumps({"algo": "cql", "config": {}}))
    cases.append((["--pretrained", str(unfinished)], "has not finished (no model.pt): resume it"))
    capsys.readouterr()
    for args, message in cases:
        assert run_cli(train_wsrl, WSRLConfig, [*args, "--runs-dir", str(tmp_path / "refused"), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, (args, err)
    assert not (tmp_path / "refused").exists()  # no run directory is made for a refused run


class Handed(Exception):
    """Ends a run once it has handed its agent to the harness."""


def optimiser_mismatches(agent: WSRL) -> list[str]:
    """Each optimiser state tensor that is not on its parameter's device, or (moments) not of its dtype."""
    mismatches = []
    for name, optimizer in agent.optimizers.items():
        for group in optimizer.param_groups:
            for param in group["params"]:
                for key, value in optimizer.state[param].items():
                    same_dtype = key == "step" or value.dtype == param.dtype  # Adam keeps `step` float32
                    if value.device != param.device or not same_dtype:
                        mismatches.append(f"{name} {key}: {value.dtype} on {value.device}, parameter {param.dtype} on "
                                          f"{param.device}")
    return mismatches


def test_the_pretrained_adam_states_follow_the_networks_to_the_run_device(pretrained, tmp_path, monkeypatch):
    """Moving the agent to the run's device does not move optimiser state (Adam puts its moments on the parameters'
    device and dtype when they are loaded), so the networks must move first. A move to float64 stands in for the
    move to CUDA: the agent handed to the harness has every moment in its parameter's dtype and on its device, with
    the pre-trained values."""
    run_dir, _ = pretrained
    handed = []

    def hand_over(self, name, agent, *args, **kwargs):
        handed.append(agent)
        raise Handed

    monkeypatch.setattr(WSRL, "to", lambda self, device: nn.Module.to(self, torch.float64))
    monkeypatch.setattr(Run, "start", hand_over)
    with pytest.raises(Handed):
        train_wsrl(tiny(run_dir, tmp_path))
    (agent,) = handed
    assert agent.critic.net.layers[0].weight.dtype == torch.float64
    assert optimiser_mismatches(agent) == []
    pretrained_state = torch.load(run_dir / "checkpoint.pt", weights_only=True)["agent"]["optimizers"]
    for name, optimizer in agent.optimizers.items():
        loaded = optimizer.state_dict()["state"]
        assert set(loaded) == set(pretrained_state[name]["state"]), name
        for index, moments in pretrained_state[name]["state"].items():
            for key in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(loaded[index][key], moments[key].double(), rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_wsrl_fine_tunes_on_cuda_from_the_pretrained_adam_states(pretrained, tmp_path):
    """On CUDA, the run takes its updates with the pre-trained Adam states (the first fused step used to meet CPU
    moments beside CUDA parameters and fail): every state tensor on the GPU, finite weights, 20 updates counted."""
    run_dir, _ = pretrained
    handed = []
    start = Run.start

    def keep(self, name, agent, *args, **kwargs):
        handed.append(agent)
        return start(self, name, agent, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Run, "start", keep)
        result = train_wsrl(tiny(run_dir, tmp_path, total_timesteps=80, warmup_steps=60, device="cuda"))
    (agent,) = handed
    assert result.global_step == 80 and agent.num_updates == 20
    assert agent.critic.net.layers[0].weight.is_cuda and optimiser_mismatches(agent) == []
    assert all(value.is_cuda for optimizer in agent.optimizers.values() for state in optimizer.state.values()
               for value in state.values())
    assert all(torch.isfinite(tensor).all() for tensor in agent.state_dict().values())
