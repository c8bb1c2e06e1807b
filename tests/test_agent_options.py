"""SAC/TD3 options: networks × value heads, UTD, presets, learning-rate decay, reward scaling, bad options."""

import dataclasses
import re

import numpy as np
import pytest
import torch

from keelrl.agents.common import run_cli
from keelrl.agents.off_policy import apply_preset
from keelrl.agents.sac import SAC, SACConfig
from keelrl.agents.sac import train as train_sac
from keelrl.agents.td3 import TD3, TD3Config
from keelrl.networks import C51Head, HLGaussHead, ScalarHead

OBS_DIM, ACTION_DIM = 5, 2  # as the fixed_batch fixture in conftest.py
SMALL = dict(hidden_sizes=(32, 32), actor_hidden_dim=16, critic_hidden_dim=32, critic_num_blocks=1)


def make(agent_cls, config_cls, **options):
    torch.manual_seed(0)
    config = apply_preset(config_cls(**{**SMALL, **options}), agent_cls.presets)
    return agent_cls(OBS_DIM, -np.ones(ACTION_DIM), np.ones(ACTION_DIM), config)


@pytest.mark.parametrize("agent_cls, config_cls", [(SAC, SACConfig), (TD3, TD3Config)])
@pytest.mark.parametrize("network", ["mlp", "simba", "simbav2"])
@pytest.mark.parametrize("head", ["scalar", "c51", "hlgauss"])
def test_every_network_and_head_learns_a_fixed_batch(agent_cls, config_cls, network, head, fixed_batch):
    support = {} if head == "scalar" else dict(v_min=-10.0, v_max=10.0, num_bins=21)
    agent = make(agent_cls, config_cls, network=network, critic_head=head, **support)
    outputs = agent.critic(fixed_batch.obs, fixed_batch.actions)
    assert outputs.shape == (2, 256, agent.head.num_outputs)
    # the critic fits a fixed target through its head ...
    target = agent.td_target(fixed_batch, fixed_batch.actions, next_bonus=0.0)
    losses = [agent.critic_step(fixed_batch, target)["losses/qf_loss"].item() for _ in range(30)]
    assert losses[-1] < losses[0]
    # ... and full updates (actor, targets, projection) run and stay finite
    for _ in range(4):
        assert all(torch.isfinite(v) for v in agent.update(fixed_batch).values())
    assert agent.act(fixed_batch.obs.numpy()[:3]).shape == (3, ACTION_DIM)


def test_heads_follow_the_option():
    assert isinstance(make(SAC, SACConfig).head, ScalarHead)
    assert isinstance(make(SAC, SACConfig, critic_head="c51", v_min=-1.0, v_max=1.0).head, C51Head)
    hl = make(SAC, SACConfig, critic_head="hlgauss", v_min=0.0, v_max=10.0, num_bins=10).head
    assert isinstance(hl, HLGaussHead) and hl.sigma == pytest.approx(0.75)


def test_simbav2_weight_rows_have_unit_norm_after_an_agent_update(fixed_batch):
    agent = make(SAC, SACConfig, preset="simbav2")
    for _ in range(2):
        agent.update(fixed_batch)
    weights = [m.weight for net in (agent.actor, agent.critic) for m in net.modules()
               if type(m).__name__ == "HyperLinear"]
    assert len(weights) > 6
    for weight in weights:
        torch.testing.assert_close(weight.norm(dim=-1), torch.ones(weight.shape[:-1]), atol=1e-5, rtol=0)


def test_critic_target_uses_the_c51_projection_of_the_pessimistic_member(fixed_batch):
    agent = make(TD3, TD3Config, critic_head="c51", v_min=-10.0, v_max=10.0, num_bins=21)
    batch = fixed_batch._replace(rewards=torch.full((256,), 0.05))  # small rewards keep γz + r inside the support
    target = agent.td_target(batch, batch.actions, next_bonus=0.0)
    assert target.shape == (256, 21)
    torch.testing.assert_close(target.sum(-1), torch.ones(256))
    next_values = agent.head.value(agent.critic_target(batch.next_obs, batch.actions))  # (E, B)
    pessimistic = next_values.min(dim=0).values
    expected_mean = batch.rewards + 0.99 * (1 - batch.terminated) * pessimistic
    torch.testing.assert_close(target @ agent.head.support, expected_mean, atol=1e-4, rtol=0)


def test_presets_set_the_papers_options():
    simba = apply_preset(SACConfig(preset="simba"), SAC.presets)
    assert (simba.network, simba.optimizer, simba.weight_decay, simba.utd, simba.alpha_init) == ("simba", "adamw", 1e-2, 2, 0.01)
    assert simba.normalize_obs and simba.target_entropy_scale == -0.5 and simba.q_lr == 1e-4
    v2 = apply_preset(SACConfig(preset="simbav2"), SAC.presets)
    assert (v2.network, v2.critic_head, v2.v_min, v2.v_max, v2.num_bins) == ("simbav2", "c51", -5.0, 5.0, 101)
    assert v2.scale_rewards and v2.final_lr_fraction == 0.5
    assert apply_preset(SACConfig(preset="simbav2", utd=2), SAC.presets).utd == 2  # agreeing flags are fine


def test_learning_rates_decay_linearly(fixed_batch):
    agent = make(SAC, SACConfig, final_lr_fraction=0.5, total_timesteps=5_010, learning_starts=5_000)
    for _ in range(5):
        agent.update(fixed_batch)
    # the 5th update ran with progress 4/10
    assert agent.optimizers["critic"].param_groups[0]["lr"] == pytest.approx(1e-3 * (1 - 0.5 * 0.4))
    assert agent.optimizers["actor"].param_groups[0]["lr"] == pytest.approx(3e-4 * (1 - 0.5 * 0.4))


def test_reward_scaling_divides_batch_rewards(fixed_batch, monkeypatch):
    agent = make(TD3, TD3Config, scale_rewards=True)
    for _ in range(50):
        agent.reward_scaler.update(np.full(1, 10.0), np.zeros(1, bool))
    seen = {}

    def learn(batch):
        seen["rewards"] = batch.rewards
        return {}

    monkeypatch.setattr(agent, "learn", learn)
    agent.update(fixed_batch)
    torch.testing.assert_close(seen["rewards"], fixed_batch.rewards / agent.reward_scaler.denominator().float())
    assert "reward_scaler.returns" in agent.state_dict()  # saved with checkpoints and the model


def test_utd_sets_updates_per_environment_step(tmp_path):
    result = train_sac(SACConfig(env_id="InvertedPendulum-v5", total_timesteps=300, learning_starts=200, utd=3,
                                 batch_size=16, eval_freq=0, eval_episodes=1, runs_dir=str(tmp_path), quiet=True,
                                 **SMALL))
    state = torch.load(result.run_dir / "checkpoint.pt", weights_only=True)
    assert state["agent"]["num_updates"] == 3 * 100


@pytest.mark.parametrize(
    "args, message",
    [
        (["--critic-head", "c51", "--v-min", "5", "--v-max", "5"], "--v-min .* must be smaller than --v-max"),
        (["--critic-head", "hlgauss", "--v-min", "0", "--v-max", "1", "--num-bins", "1"], "--num-bins must be at least 2"),
        (["--critic-head", "c51"], "needs a support: give --v-min and --v-max"),
        (["--utd", "0"], "--utd .* must be at least 1"),
        (["--preset", "simbav2", "--network", "simba"], "--preset simbav2 sets --network simbav2, but --network simba"),
        (["--preset", "simba", "--q-lr", "0.003"], "--preset simba sets --q-lr 0.0001, but --q-lr 0.003"),
    ],
)
def test_bad_options_are_refused_clearly(args, message, tmp_path, capsys):
    assert run_cli(train_sac, SACConfig, args=[*args, "--runs-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert not any(tmp_path.iterdir())


def test_options_survive_save_and_load(tmp_path, fixed_batch):
    agent = make(SAC, SACConfig, preset="simbav2")
    agent.update(fixed_batch)
    agent.save(tmp_path / "model.pt")
    loaded = SAC.load(tmp_path / "model.pt")
    assert dataclasses.asdict(loaded.config) == dataclasses.asdict(agent.config)
    obs = fixed_batch.obs.numpy()[:4]
    np.testing.assert_array_equal(loaded.act(obs, deterministic=True), agent.act(obs, deterministic=True))
