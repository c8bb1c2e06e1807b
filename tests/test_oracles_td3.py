"""Four TD3 updates against an independent float64 oracle: the policy delay, the target networks and Adam's moments
carried across updates, as Fujimoto et al. (2018, Algorithm 1) and CleanRL's td3_continuous_action.py lay them out.

The oracle copies the agent's initial weights into plain float64 tensors and redoes every update with its own
forward passes (test_oracles_lag_stream.py's matmuls), autograd on those and Adam written out in full (m, v, bias
corrections), one Adam state per optimiser (the critics' steps at every update, the actor's at its own). Per update:
the critics regress on r + γ(1 − terminated) min_j Q'_j(s', ã'), ã' the target actor's action plus the fixed noise
× policy_noise clipped to ±noise_clip, × action scale, clipped to the bounds; every second update (the second and the
fourth: the agent counts updates from 1) the actor ascends Q1(s, π(s)) of the critics just stepped, then the target
actor and critics move by Polyak averaging; on the other updates actor and targets stay exactly as they were. Each
update has its own batch; the smoothing noise is the only draw (the test's fixed tensors, in order).
"""

from __future__ import annotations

import torch

from keelrl.agents.td3 import TD3, TD3Config
from keelrl.buffers import Batch
from test_oracles_lag_stream import (ACTION_DIM, BATCH, F64, HIGH, LOW, OBS_DIM, FixedNoise, as64, assert_params,
                                     close, cost_batch, deterministic_actor, grad_of, leaves, mixed, plain,
                                     polyak, q_ensemble, smoothed)

BETA1, BETA2, EPS = 0.9, 0.999, 1e-8  # torch.optim.Adam's defaults, which TD3 keeps
UPDATES = 4


class Adam:
    """Adam (Kingma & Ba 2015, Algorithm 1) on a dict of float64 tensors."""

    def __init__(self, params: dict[str, torch.Tensor], lr: float):
        self.lr, self.t = lr, 0
        self.m = {name: torch.zeros_like(p) for name, p in params.items()}
        self.v = {name: torch.zeros_like(p) for name, p in params.items()}

    def step(self, params: dict[str, torch.Tensor], grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        self.t += 1
        new = {}
        for name, p in params.items():
            self.m[name] = BETA1 * self.m[name] + (1 - BETA1) * grads[name]
            self.v[name] = BETA2 * self.v[name] + (1 - BETA2) * grads[name] ** 2
            m_hat, v_hat = self.m[name] / (1 - BETA1**self.t), self.v[name] / (1 - BETA2**self.t)
            new[name] = p.detach() - self.lr * m_hat / (v_hat.sqrt() + EPS)
        return new


def batches() -> list[Batch]:
    """One batch per update: cost_batch's terminal pattern and γ 0.9, the rest drawn afresh for each."""
    g = torch.Generator().manual_seed(5)
    template = cost_batch()
    return [template._replace(obs=torch.randn(BATCH, OBS_DIM, generator=g),
                              next_obs=torch.randn(BATCH, OBS_DIM, generator=g),
                              rewards=torch.randn(BATCH, generator=g),
                              actions=torch.rand(BATCH, ACTION_DIM, generator=g) * torch.as_tensor(HIGH - LOW)
                              + torch.as_tensor(LOW), costs=None)
            for _ in range(UPDATES)]


def test_four_td3_updates_match_an_independent_oracle(monkeypatch):
    torch.manual_seed(2)
    config = TD3Config(hidden_sizes=(16, 16), policy_frequency=2, tau=0.1, gamma=0.9, learning_rate=1e-3,
                       policy_noise=0.5, noise_clip=0.6)
    agent = TD3(OBS_DIM, LOW, HIGH, config)
    critic, critic_t = plain(agent.critic), plain(agent.critic_target)
    actor, actor_t = plain(agent.actor), plain(agent.actor_target)
    critic_adam, actor_adam = Adam(critic, config.learning_rate), Adam(actor, config.learning_rate)
    g = torch.Generator().manual_seed(12)
    noises = [torch.randn(BATCH, ACTION_DIM, generator=g) * 2.0 for _ in range(UPDATES)]
    assert all(((n * config.policy_noise).abs() > config.noise_clip).any() for n in noises), "the clip should act"
    twin_min_mattered = []

    for update, (batch, noise) in enumerate(zip(batches(), noises), start=1):
        b = as64(batch)
        with torch.no_grad():
            next_a = smoothed(actor_t, b.next_obs, noise.to(F64), config.policy_noise, config.noise_clip)
            next_q_both = q_ensemble(critic_t, b.next_obs, next_a)  # (2, B)
            target = b.rewards + 0.9 * (1 - b.terminated) * next_q_both.min(dim=0).values
        C = leaves(critic)
        q_sa = q_ensemble(C, b.obs, b.actions)
        critic_loss = ((q_sa - target) ** 2).mean(dim=1).sum()
        critic = critic_adam.step(critic, grad_of(critic_loss, C))
        actor_step = update % config.policy_frequency == 0
        if actor_step:
            A = leaves(actor)
            q_pi_both = q_ensemble(critic, b.obs, deterministic_actor(A, b.obs))
            actor_loss = -q_pi_both[0].mean()
            actor = actor_adam.step(actor, grad_of(actor_loss, A))
            actor_t, critic_t = polyak(actor_t, actor, config.tau), polyak(critic_t, critic, config.tau)

        held = [p.detach().clone() for p in (*agent.actor.parameters(), *agent.polyak_target)]
        fixed = FixedNoise([noise])
        monkeypatch.setattr(agent.random, "normal", fixed.normal)
        losses = agent.update(batch)
        monkeypatch.undo()

        assert not fixed.draws, f"update {update}: the agent did not draw its smoothing noise"
        twin_min_mattered.append(mixed(next_q_both))
        close(losses["losses/qf_loss"], critic_loss / 2)
        close(losses["losses/qf_values"], q_sa.mean())
        assert_params(agent.critic, critic, f"critic after update {update}")
        assert_params(agent.actor, actor, f"actor after update {update}")
        assert_params(agent.actor_target, actor_t, f"actor_target after update {update}")
        assert_params(agent.critic_target, critic_t, f"critic_target after update {update}")
        assert ("losses/actor_loss" in losses) == actor_step, f"update {update}: the actor stepped off its schedule"
        if actor_step:
            assert mixed(q_pi_both), "Q1 and the twin minimum should differ, so that the first-critic rule is tested"
            close(losses["losses/actor_loss"], actor_loss)
        else:  # between actor steps the actor and both targets stay exactly as they were
            now = (*agent.actor.parameters(), *agent.polyak_target)
            assert all(torch.equal(p, before) for p, before in zip(now, held, strict=True)), f"update {update}"
    assert any(twin_min_mattered), "the min over the twin target critics should matter on some update"
