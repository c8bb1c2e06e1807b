"""Independent oracles for one update of SAC-Lag, TD3-Lag, stream TD(λ), stream Q(λ) and stream AC(λ).

Each test copies the agent's initial weights into plain float64 tensors, redoes the update with its own
forward passes (matmuls, written out here, not keelrl's modules), autograd on those, and a hand-written
optimiser step (Adam's first step p − lr·g/(|g| + ε), since m̂ = g and v̂ = g² after one step; ObGD from
its specification in the stream-x paper, Elsayed et al. 2024), then compares the agent's returned losses, its targets,
its traces and EVERY parameter after the step. Float32 agent against a float64 oracle: the tolerances
only absorb rounding.

Randomness: SAC's sampled actions and TD3's target smoothing noise come from `torch.randn_like`, which
the tests replace (monkeypatch) by a queue of fixed noise tensors; the oracle uses the same tensors in the
order the agent documents (reward critic target, actor, cost critic target). The queue must be empty at
the end: the agent drew exactly as many times as documented.

Lagrangian actor loss (agents/lagrange.py, agents/sac_lag.py, agents/td3_lag.py), the same form as
OmniSafe's SACLag/TD3Lag `_loss_pi` (omnisafe/algorithms/off_policy/sac_lag.py, td3_lag.py at 15603dd):
    SAC-Lag: mean(α log π(a|s) − min_i Q_i(s, a) + λ Q_c(s, a)) / (1 + λ),  a ~ π(·|s)
    TD3-Lag: mean(−Q_1(s, π(s)) + λ Q_c(s, π(s))) / (1 + λ)
Q_c is the mean of the cost ensemble; the cost critics regress onto c + γ(1 − terminated)·Q_c,target(s', a').
"""

import dataclasses
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from keelrl.agents.sac_lag import SACLag, SACLagConfig
from keelrl.agents.stream_ac import StreamAC, StreamACConfig
from keelrl.agents.stream_q import StreamQ, StreamQConfig
from keelrl.agents.stream_td import StreamTD, StreamTDConfig
from keelrl.agents.td3_lag import TD3Lag, TD3LagConfig
from keelrl.buffers import Batch
from keelrl.envs.streaming_wrappers import Transition

OBS_DIM, ACTION_DIM, BATCH = 3, 2, 6
LOW = np.array([-1.0, -2.0], np.float32)  # asymmetric bounds: action scale (1, 1.25), bias (0, -0.75)
HIGH = np.array([1.0, 0.5], np.float32)
ADAM_EPS = 1e-8
F64 = torch.float64


# ----------------------------------------------------------------------------------------------------------
# shared helpers


def plain(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's parameters as detached float64 copies, by name."""
    return {name: p.detach().clone().to(F64) for name, p in module.named_parameters()}


def leaves(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: p.clone().requires_grad_(True) for name, p in params.items()}


def adam_first_step(params: dict[str, torch.Tensor], grads: dict[str, torch.Tensor], lr: float):
    """Adam's first step (β₁, β₂ whatever): m̂ = g, v̂ = g², so p ← p − lr·g/(√g² + ε)."""
    return {name: p - lr * grads[name] / (grads[name].abs() + ADAM_EPS) for name, p in params.items()}


def polyak(target: dict[str, torch.Tensor], online: dict[str, torch.Tensor], tau: float):
    return {name: t + tau * (online[name] - t) for name, t in target.items()}


def grad_of(loss: torch.Tensor, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    names = list(params)
    return dict(zip(names, torch.autograd.grad(loss, [params[n] for n in names])))


def assert_params(module: torch.nn.Module, expected: dict[str, torch.Tensor], what: str, atol=2e-6, rtol=1e-5):
    got = dict(module.named_parameters())
    assert set(got) == set(expected), what
    for name, value in expected.items():
        torch.testing.assert_close(got[name].detach().to(F64), value.detach(), atol=atol, rtol=rtol,
                                   msg=lambda m, name=name: f"{what}.{name}: {m}")


def close(value, expected, atol=2e-6, rtol=1e-5):
    value = torch.as_tensor(value).detach().to(F64)
    torch.testing.assert_close(value, torch.as_tensor(expected, dtype=F64).detach(), atol=atol, rtol=rtol)


def mixed(q_twin: torch.Tensor) -> bool:
    """Each of the two critics is the smaller one on some sample."""
    return bool((q_twin[0] < q_twin[1]).any() and (q_twin[0] > q_twin[1]).any())


class FixedNoise:
    """Stands in for torch.randn_like and for an agent's `random.normal`: hands out the given tensors in order
    (shape-checked)."""

    def __init__(self, draws: list[torch.Tensor]):
        self.draws = list(draws)

    def __call__(self, like: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return self.normal(*like.shape).to(dtype=like.dtype, device=like.device)

    def normal(self, *shape: int) -> torch.Tensor:
        assert self.draws, "the agent drew more Gaussian noise than its update documents"
        noise = self.draws.pop(0)
        assert noise.shape == shape
        return noise


def cost_batch() -> Batch:
    """6 transitions, two of them terminal, costs 0/1, discount γ = 0.9."""
    g = torch.Generator().manual_seed(3)
    obs = torch.randn(BATCH, OBS_DIM, generator=g)
    actions = torch.rand(BATCH, ACTION_DIM, generator=g) * torch.as_tensor(HIGH - LOW) + torch.as_tensor(LOW)
    return Batch(obs=obs, actions=actions, rewards=torch.randn(BATCH, generator=g),
                 next_obs=torch.randn(BATCH, OBS_DIM, generator=g),
                 terminated=torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0, 0.0]),
                 discounts=torch.full((BATCH,), 0.9),
                 costs=torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0]))


def as64(batch: Batch) -> Batch:
    return Batch(*(None if t is None else t.to(F64) for t in batch))


# plain forward passes of the off-policy networks (weights as named by the keelrl modules)

def q_ensemble(P: dict[str, torch.Tensor], obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """(E, B): relu(x W0 + b0) → relu(· W1 + b1) → · W2 + b2 per member, W_k (E, in, out), b_k (E, 1, out)."""
    x = torch.cat([obs, actions], dim=-1)
    h = torch.relu(torch.matmul(x, P["net.layers.0.weight"]) + P["net.layers.0.bias"])
    h = torch.relu(torch.matmul(h, P["net.layers.1.weight"]) + P["net.layers.1.bias"])
    return (torch.matmul(h, P["net.layers.2.weight"]) + P["net.layers.2.bias"]).squeeze(-1)


SCALE = torch.as_tensor((HIGH - LOW) / 2, dtype=F64)
BIAS = torch.as_tensor((HIGH + LOW) / 2, dtype=F64)


def gaussian_actor_sample(P, obs, noise):
    """SAC's tanh-Gaussian: u = μ + σ·n, a = tanh(u)·scale + bias, log π(a|s) by change of variables."""
    h = torch.relu(obs @ P["trunk.0.weight"].T + P["trunk.0.bias"])
    h = torch.relu(h @ P["trunk.2.weight"].T + P["trunk.2.bias"])
    mean = h @ P["mean.weight"].T + P["mean.bias"]
    log_std = -5.0 + 0.5 * (2.0 - (-5.0)) * (torch.tanh(h @ P["log_std.weight"].T + P["log_std.bias"]) + 1.0)
    std = log_std.exp()
    u = mean + std * noise
    z = (u - mean) / std
    normal_log_density = -0.5 * z**2 - torch.log(std) - 0.5 * math.log(2 * math.pi)
    squashed = torch.tanh(u)
    log_prob = (normal_log_density - torch.log(SCALE * (1 - squashed**2) + 1e-6)).sum(-1)
    return squashed * SCALE + BIAS, log_prob


def deterministic_actor(P, obs):
    h = torch.relu(obs @ P["net.0.weight"].T + P["net.0.bias"])
    h = torch.relu(h @ P["net.2.weight"].T + P["net.2.bias"])
    return torch.tanh(h @ P["net.4.weight"].T + P["net.4.bias"]) * SCALE + BIAS


# ----------------------------------------------------------------------------------------------------------
# SAC-Lag


@dataclasses.dataclass
class CostStep:
    """The oracle's cost critics after one step: their target critics' values at a', their values at (s, a), the
    loss, the critics after Adam's first step and the target critics after Polyak averaging."""
    next_qc: torch.Tensor
    qc_sa: torch.Tensor
    loss: torch.Tensor
    critic: dict[str, torch.Tensor]
    target: dict[str, torch.Tensor]


def cost_critic_step(cost, cost_t, b: Batch, next_a_c: torch.Tensor, lr: float, tau: float) -> CostStep:
    """Cost critics regressed on c + γ(1 − d)·mean_j Q_c,targ_j(s', a') (γ 0.9), a' from the actor after its step."""
    with torch.no_grad():
        next_qc = q_ensemble(cost_t, b.next_obs, next_a_c)  # (2, B)
        cost_target = b.costs + 0.9 * (1 - b.terminated) * next_qc.mean(dim=0)
    QC = leaves(cost)
    qc_sa = q_ensemble(QC, b.obs, b.actions)
    cost_loss = ((qc_sa - cost_target) ** 2).mean(dim=1).sum()
    cost_new = adam_first_step(cost, grad_of(cost_loss, QC), lr)
    return CostStep(next_qc, qc_sa, cost_loss, cost_new, polyak(cost_t, cost_new, tau))


def spied_update(agent, batch: Batch, noise, monkeypatch, documented: str) -> tuple[dict, dict]:
    """agent.update(batch) drawing `noise`, and what it saw: its reward critics' target (the head's loss input) and
    the cost target critic's (a', output); `documented`: the draws the agent is documented to make."""
    seen = {}
    head_loss = agent.head.loss  # the reward critics' loss against their target (the cost critics' is not the head's)
    monkeypatch.setattr(agent.head, "loss", lambda outputs, target: (
        seen.setdefault("reward_target", target.clone()), head_loss(outputs, target))[1])
    hook = agent.cost.target.register_forward_hook(
        lambda module, inputs, output: seen.update(cost_next=(inputs[1].clone(), output.clone())))
    fixed = FixedNoise(noise)
    monkeypatch.setattr(torch, "randn_like", fixed)
    monkeypatch.setattr(agent.random, "normal", fixed.normal)
    losses = agent.update(batch)
    monkeypatch.undo()
    hook.remove()
    assert not fixed.draws, f"the agent drew fewer Gaussian noises than documented ({documented})"
    return losses, seen


@dataclasses.dataclass
class LagUpdate:
    """What the oracle expects of one Lagrangian update: the reward critics' target, their values at (s, a), their
    loss and their weights after the step (and their targets'), the actor's loss and weights, λ, and the cost
    critics' step on the a' (`next_a_c`) the agent is to hand the cost target critic."""
    reward_target: torch.Tensor
    q_sa: torch.Tensor
    critic_loss: torch.Tensor
    critic: dict[str, torch.Tensor]
    critic_target: dict[str, torch.Tensor]
    actor_loss: torch.Tensor
    actor: dict[str, torch.Tensor]
    lam: float
    next_a_c: torch.Tensor
    cost: CostStep


def assert_lag_update(agent, losses: dict, seen: dict, expected: LagUpdate) -> None:
    """What SAC-Lag and TD3-Lag share after one update: the targets the agent saw, its returned losses and λ, and its
    reward critics, their targets, its actor and its cost critics, parameter by parameter, are the oracle's."""
    close(seen["reward_target"], expected.reward_target)
    close(seen["cost_next"][0], expected.next_a_c)
    close(seen["cost_next"][1].squeeze(-1), expected.cost.next_qc)
    close(losses["losses/qf_loss"], expected.critic_loss / 2)
    close(losses["losses/qf_values"], expected.q_sa.mean())
    close(losses["losses/actor_loss"], expected.actor_loss)
    close(losses["losses/cost_qf_loss"], expected.cost.loss / 2)
    close(losses["losses/cost_qf_values"], expected.cost.qc_sa.mean())
    close(losses["losses/lagrange_multiplier"], expected.lam)  # λ never moves on a gradient update
    assert_params(agent.critic, expected.critic, "critic")
    assert_params(agent.critic_target, expected.critic_target, "critic_target")
    assert_params(agent.actor, expected.actor, "actor")
    assert_params(agent.cost.critic, expected.cost.critic, "cost_critic")
    assert_params(agent.cost.target, expected.cost.target, "cost_critic_target")


def test_sac_lag_one_update_matches_an_independent_oracle(monkeypatch):
    """One SAC-Lag update (policy_frequency 1, autotuned α, λ = 0.7) against a hand-written update:
    reward critic target and loss, the Lagrangian actor loss, α's loss, the cost critic target and loss,
    one Adam step each, Polyak targets; every parameter and every returned scalar compared."""
    torch.manual_seed(2)  # a seed whose twin critics disagree on which is smaller across the batch
    config = SACLagConfig(hidden_sizes=(16, 16), policy_frequency=1, tau=0.1, gamma=0.9, alpha_init=0.5,
                          q_lr=1e-3, policy_lr=3e-4, lambda_init=0.7)
    agent = SACLag(OBS_DIM, LOW, HIGH, config)
    batch = cost_batch()
    b = as64(batch)
    lam = 0.7
    lr_q, lr_pi, tau = config.q_lr, config.policy_lr, config.tau
    target_entropy = -1.0 * ACTION_DIM
    # initial weights, copied
    critic, critic_t = plain(agent.critic), plain(agent.critic_target)
    actor = plain(agent.actor)
    cost, cost_t = plain(agent.cost.critic), plain(agent.cost.target)
    log_alpha = torch.tensor(math.log(0.5), dtype=F64)
    assert agent.log_alpha.item() == pytest.approx(math.log(0.5))
    g = torch.Generator().manual_seed(11)
    noise = [torch.randn(BATCH, ACTION_DIM, generator=g) * 1.5 for _ in range(3)]  # critic, actor, cost target

    # --- oracle
    alpha = log_alpha.exp()
    with torch.no_grad():
        next_a, next_logp = gaussian_actor_sample(actor, b.next_obs, noise[0].to(F64))
        next_q_both = q_ensemble(critic_t, b.next_obs, next_a)
        assert mixed(next_q_both), "the min over the twin target critics should matter"
        next_q = next_q_both.min(dim=0).values
        reward_target = b.rewards + 0.9 * (1 - b.terminated) * (next_q - alpha * next_logp)
    C = leaves(critic)
    q_sa = q_ensemble(C, b.obs, b.actions)  # (2, B)
    critic_loss = ((q_sa - reward_target) ** 2).mean(dim=1).sum()
    critic_new = adam_first_step(critic, grad_of(critic_loss, C), lr_q)

    A = leaves(actor)
    a_pi, logp_pi = gaussian_actor_sample(A, b.obs, noise[1].to(F64))
    q_pi_both = q_ensemble(critic_new, b.obs, a_pi)  # the critic after its step
    assert mixed(q_pi_both), "the min over the twin critics should matter"
    q_pi = q_pi_both.min(dim=0).values
    qc_pi = q_ensemble(cost, b.obs, a_pi).mean(dim=0)
    actor_loss = (alpha * logp_pi - q_pi + lam * qc_pi).mean() / (1 + lam)
    actor_new = adam_first_step(actor, grad_of(actor_loss, A), lr_pi)

    LA = log_alpha.clone().requires_grad_(True)
    alpha_loss = -(LA.exp() * (logp_pi.detach() + target_entropy)).mean()
    (alpha_grad,) = torch.autograd.grad(alpha_loss, LA)
    log_alpha_new = log_alpha - lr_q * alpha_grad / (alpha_grad.abs() + ADAM_EPS)
    critic_t_new = polyak(critic_t, critic_new, tau)

    with torch.no_grad():  # the cost target's a' comes from the actor after its step
        next_a_c, _ = gaussian_actor_sample(actor_new, b.next_obs, noise[2].to(F64))
    expected = LagUpdate(reward_target, q_sa, critic_loss, critic_new, critic_t_new, actor_loss, actor_new, lam,
                         next_a_c, cost_critic_step(cost, cost_t, b, next_a_c, lr_q, tau))

    # --- the agent, with spies on its reward target and on the cost target critic's inputs/outputs
    losses, seen = spied_update(agent, batch, noise, monkeypatch, "critic, actor, cost target")

    assert_lag_update(agent, losses, seen, expected)
    close(losses["losses/alpha"], alpha)
    close(losses["losses/alpha_loss"], alpha_loss)
    close(agent.log_alpha, log_alpha_new)
    assert agent.lagrange_multiplier.item() == pytest.approx(lam)
    # the oracle is sensitive: each Adam step moved every parameter that had a gradient
    assert not torch.allclose(actor_new["mean.weight"], actor["mean.weight"])


# ----------------------------------------------------------------------------------------------------------
# TD3-Lag


def smoothed(actor_target, next_obs, noise, policy_noise, noise_clip):
    a = deterministic_actor(actor_target, next_obs)
    eps = (noise * policy_noise).clamp(-noise_clip, noise_clip) * SCALE
    low, high = torch.as_tensor(LOW, dtype=F64), torch.as_tensor(HIGH, dtype=F64)
    return torch.maximum(torch.minimum(a + eps, high), low)


def test_td3_lag_one_update_matches_an_independent_oracle(monkeypatch):
    """One TD3-Lag update with an actor step (policy_frequency 1, λ = 0.7): smoothed target actions with
    clipped noise (large enough that both the noise clip and the action bounds act), twin-min reward target,
    the Lagrangian actor loss on the first critic, Polyak targets of actor and critics, then the cost critic
    on a' from the (just updated) target actor with fresh smoothing noise."""
    torch.manual_seed(2)  # a seed whose twin critics disagree on which is smaller across the batch
    config = TD3LagConfig(hidden_sizes=(16, 16), policy_frequency=1, tau=0.1, gamma=0.9, learning_rate=1e-3,
                          policy_noise=1.0, noise_clip=1.5, lambda_init=0.7)
    agent = TD3Lag(OBS_DIM, LOW, HIGH, config)
    batch = cost_batch()
    b = as64(batch)
    lam, lr, tau = 0.7, config.learning_rate, config.tau
    critic, critic_t = plain(agent.critic), plain(agent.critic_target)
    actor, actor_t = plain(agent.actor), plain(agent.actor_target)
    cost, cost_t = plain(agent.cost.critic), plain(agent.cost.target)
    g = torch.Generator().manual_seed(12)
    noise = [torch.randn(BATCH, ACTION_DIM, generator=g) * 2.0 for _ in range(2)]  # critic target, cost target

    with torch.no_grad():
        next_a = smoothed(actor_t, b.next_obs, noise[0].to(F64), 1.0, 1.5)
        next_q_both = q_ensemble(critic_t, b.next_obs, next_a)
        assert mixed(next_q_both), "the min over the twin target critics should matter"
        reward_target = b.rewards + 0.9 * (1 - b.terminated) * next_q_both.min(dim=0).values
    clipped = ((noise[0] * 1.0).abs() > 1.5).any() and ((next_a == torch.as_tensor(LOW, dtype=F64)) |
                                                         (next_a == torch.as_tensor(HIGH, dtype=F64))).any()
    assert clipped, "the fixed noise should exercise the noise clip and the action bounds"
    C = leaves(critic)
    q_sa = q_ensemble(C, b.obs, b.actions)
    critic_loss = ((q_sa - reward_target) ** 2).mean(dim=1).sum()
    critic_new = adam_first_step(critic, grad_of(critic_loss, C), lr)

    A = leaves(actor)
    a_pi = deterministic_actor(A, b.obs)
    q_pi_both = q_ensemble(critic_new, b.obs, a_pi)
    assert mixed(q_pi_both), "Q1 and the twin minimum should differ, so that the first-critic rule is tested"
    q1_pi = q_pi_both[0]
    qc_pi = q_ensemble(cost, b.obs, a_pi).mean(dim=0)
    actor_loss = (-q1_pi + lam * qc_pi).mean() / (1 + lam)
    actor_new = adam_first_step(actor, grad_of(actor_loss, A), lr)
    actor_t_new, critic_t_new = polyak(actor_t, actor_new, tau), polyak(critic_t, critic_new, tau)

    with torch.no_grad():
        next_a_c = smoothed(actor_t_new, b.next_obs, noise[1].to(F64), 1.0, 1.5)
    expected = LagUpdate(reward_target, q_sa, critic_loss, critic_new, critic_t_new, actor_loss, actor_new, lam,
                         next_a_c, cost_critic_step(cost, cost_t, b, next_a_c, lr, tau))

    losses, seen = spied_update(agent, batch, noise, monkeypatch, "critic target, cost target")

    assert_lag_update(agent, losses, seen, expected)
    assert_params(agent.actor_target, actor_t_new, "actor_target")


# ----------------------------------------------------------------------------------------------------------
# λ


def multipliers_after(agent, batches: list[tuple[list[float], int]]) -> list[float]:
    """The agent's λ after it observes each batch of episode costs at its step, in turn."""
    got = []
    for costs, step in batches:
        agent.lagrange.observe(np.array(costs), step)
        got.append(agent.lagrange_multiplier.item())
    return got


@pytest.mark.parametrize("agent_cls, config_cls", [(SACLag, SACLagConfig), (TD3Lag, TD3LagConfig)])
def test_lambda_updates_by_hand_from_batches_of_episode_costs(agent_cls, config_cls):
    """Gradient multiplier: λ ← max(0, λ + lr(mean(costs) − d)) per call past the warmup, by hand;
    PID multiplier: I ← max(0, I + k_i e), λ = max(0, k_p e + I + k_d max(0, J − J_prev)), by hand."""
    torch.manual_seed(0)
    batches = [([40.0, 20.0], 5), ([50.0], 20), ([30.0, 10.0, 14.0], 30), ([0.0, 2.0], 40), ([0.0], 50),
               ([5.0], 60), ([24.0, 36.0], 70)]
    limit, warmup = 20.0, 10
    agent = agent_cls(OBS_DIM, LOW, HIGH, config_cls(hidden_sizes=(8, 8), cost_limit=limit, lambda_init=0.3,
                                                     lambda_lr=0.05, lambda_warmup=warmup))
    lam, expected = 0.3, []
    for costs, step in batches:
        if step > warmup:
            lam = max(0.0, lam + 0.05 * (sum(costs) / len(costs) - limit))
        expected.append(lam)
    assert multipliers_after(agent, batches) == pytest.approx(expected, abs=1e-6)
    assert expected[0] == 0.3 and min(expected) == 0.0 and expected[-1] > 0  # warmup, clamp, recovery seen

    kp, ki, kd = 0.2, 0.05, 0.1
    agent = agent_cls(OBS_DIM, LOW, HIGH, config_cls(hidden_sizes=(8, 8), cost_limit=limit, lambda_init=0.3,
                                                     multiplier="pid", pid_kp=kp, pid_ki=ki, pid_kd=kd,
                                                     lambda_warmup=warmup))
    integral, lam, previous, expected = 0.3, 0.3, None, []
    for costs, step in batches:
        if step > warmup:
            j = sum(costs) / len(costs)
            integral = max(0.0, integral + ki * (j - limit))
            rise = 0.0 if previous is None else max(0.0, j - previous)
            lam = max(0.0, kp * (j - limit) + integral + kd * rise)
            previous = j
        expected.append(lam)
    assert multipliers_after(agent, batches) == pytest.approx(expected, abs=1e-6)


# ----------------------------------------------------------------------------------------------------------
# streaming: plain StreamMLP forward pass and ObGD, from the paper's specification


def stream_mlp(params: list[torch.Tensor], x: torch.Tensor, num_hidden: int) -> torch.Tensor:
    """[x Wᵀ + b → LayerNorm (no affine, eps 1e-5, biased variance) → leaky ReLU (0.01)] × hidden, then x Wᵀ + b."""
    for i in range(num_hidden):
        x = x @ params[2 * i].T + params[2 * i + 1]
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        x = (x - mu) / torch.sqrt(var + 1e-5)
        x = torch.where(x > 0, x, 0.01 * x)
    return x @ params[-2].T + params[-1]


def obgd(params, trace, grads, delta, lr, kappa, gamma, lam, reset):
    """e ← γλe + ∇; η = lr / max(1, lr·κ·max(|δ|, 1)·‖e‖₁); θ ← θ + ηδe; e ← 0 at an episode end."""
    trace = [gamma * lam * e + g for e, g in zip(trace, grads)]
    l1 = sum(float(e.abs().sum()) for e in trace)
    eta = lr / max(1.0, lr * kappa * max(abs(delta), 1.0) * l1)
    params = [p + eta * delta * e for p, e in zip(params, trace)]
    if reset:
        trace = [torch.zeros_like(e) for e in trace]
    return params, trace, eta, lr * kappa * max(abs(delta), 1.0) * l1 > 1.0


def params_and_zero_trace(module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The oracle's start for one of a stream agent's networks: its parameters as float64 copies and an eligibility
    trace of zeros like them."""
    params = [p.detach().clone().to(F64) for p in module.parameters()]
    return params, [torch.zeros_like(p) for p in params]


def assert_stream_state(module, optimizer, params, trace, what, atol=2e-6, rtol=1e-5):
    for i, (p, expected) in enumerate(zip(module.parameters(), params)):
        torch.testing.assert_close(p.detach().to(F64), expected, atol=atol, rtol=rtol,
                                   msg=lambda m, i=i: f"{what} parameter {i}: {m}")
    flat = torch.cat([e.reshape(-1) for e in trace])
    torch.testing.assert_close(optimizer.trace.to(F64), flat, atol=atol, rtol=rtol,
                               msg=lambda m: f"{what} trace: {m}")


def observations(n, dim=OBS_DIM, seed=5):
    return np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)


GAMMA, LAM = 0.9, 0.6  # γλ = 0.54, distinct from γ and from λ


def stream_agent(agent_cls, config_cls, seed: int, space: gym.Space, **options):
    """A stream agent over `space` with hidden sizes (6, 5), γ = GAMMA and λ = LAM (and `options`), its weights
    drawn under torch seed `seed`."""
    torch.manual_seed(seed)
    return agent_cls(OBS_DIM, space, config_cls(hidden_sizes=(6, 5), gamma=GAMMA, lam=LAM, **options))


def test_stream_td_steps_match_an_obgd_oracle():
    """Four stream TD(λ) steps: ordinary (|δ| > 1, bound active), ordinary (trace decays by γλ and
    accumulates), a time-limit truncation (bootstraps, then resets the trace), a termination (no bootstrap);
    δ, η, the trace and every parameter compared after each step."""
    agent = stream_agent(StreamTD, StreamTDConfig, 2, gym.spaces.Discrete(2))
    optimizer = agent.optimizers["critic"]
    params, trace = params_and_zero_trace(agent.critic)
    s = observations(5)
    steps = [(s[0], 3.0, s[1], False, False), (s[1], -0.4, s[2], False, False), (s[2], 0.7, s[3], False, True),
             (s[3], 1.5, s[4], True, True)]
    active = []
    for obs, reward, next_obs, terminated, end in steps:
        P = [p.clone().requires_grad_(True) for p in params]
        value = stream_mlp(P, torch.as_tensor(obs, dtype=F64), 2)[0]
        with torch.no_grad():
            next_value = stream_mlp(params, torch.as_tensor(next_obs, dtype=F64), 2)[0]
        delta = reward + (0.0 if terminated else GAMMA * float(next_value)) - float(value.detach())
        grads = torch.autograd.grad(value, P)
        params, trace, eta, bound = obgd(params, trace, grads, delta, 1.0, 2.0, GAMMA, LAM, end)
        active.append(bound)
        out = agent.update(Transition(obs, 0, reward, next_obs, terminated, end))
        assert out["losses/td_error"] == pytest.approx(delta, abs=2e-6, rel=1e-5)
        assert out["losses/critic_step_size"] == pytest.approx(eta, rel=1e-5)
        assert_stream_state(agent.critic, optimizer, params, trace, f"stream TD step {len(active)}")
    assert active[0] and abs(steps[0][1]) > 1  # the bound and its max(|δ|, 1) factor were exercised


def test_stream_q_greedy_keeps_and_exploratory_cuts_the_watkins_trace():
    """Five stream Q(λ) steps: greedy, greedy (trace γλe + ∇Q(s, a)), exploratory (trace cut to ∇Q(s, a)
    before the step), greedy, then a terminal greedy step (no bootstrap, trace reset after);
    greedy/exploratory decided by the oracle's own Q-values."""
    agent = stream_agent(StreamQ, StreamQConfig, 3, gym.spaces.Discrete(3))
    optimizer = agent.optimizers["q_network"]
    params, trace = params_and_zero_trace(agent.q_network)
    s = observations(6, seed=6)
    plan = [(False, 2.0, False), (False, -0.5, False), (True, 1.2, False), (False, 0.3, False), (False, 1.0, True)]
    for i, (explore, reward, terminal) in enumerate(plan):
        obs, next_obs = s[i], s[i + 1]
        P = [p.clone().requires_grad_(True) for p in params]
        q = stream_mlp(P, torch.as_tensor(obs, dtype=F64), 2)
        ranked = q.detach().argsort(descending=True)
        assert float(q.detach()[ranked[0]] - q.detach()[ranked[1]]) > 1e-4  # a clear greedy action
        action = int(ranked[1] if explore else ranked[0])
        with torch.no_grad():
            next_q = stream_mlp(params, torch.as_tensor(next_obs, dtype=F64), 2)
        delta = reward + (0.0 if terminal else GAMMA * float(next_q.max())) - float(q[action].detach())
        if explore:
            trace = [torch.zeros_like(e) for e in trace]  # Watkins: the exploratory action cuts the trace
        grads = torch.autograd.grad(q[action], P)
        previous_l1 = sum(float(e.abs().sum()) for e in trace)
        params, trace, eta, _ = obgd(params, trace, grads, delta, 1.0, 2.0, GAMMA, LAM, terminal)
        out = agent.update(Transition(obs, action, reward, next_obs, terminal, terminal))
        assert out["losses/td_error"] == pytest.approx(delta, abs=2e-6, rel=1e-5)
        assert out["losses/q_network_step_size"] == pytest.approx(eta, rel=1e-5)
        assert_stream_state(agent.q_network, optimizer, params, trace, f"stream Q step {i + 1}")
        if i in (1, 3):
            assert previous_l1 > 0  # a greedy step after a non-terminal step really carried an old trace


def gaussian_objective(P, obs, action, delta, coef):
    """log N(a; μ, σ) + c·sign(δ)·H, μ and softplus⁻¹σ the two halves of the actor's output."""
    out = stream_mlp(P, obs, 2)
    mean, std = out[:ACTION_DIM], torch.log1p(torch.exp(out[ACTION_DIM:]))
    log_prob = (-0.5 * ((action - mean) / std) ** 2 - torch.log(std) - 0.5 * math.log(2 * math.pi)).sum()
    entropy = (0.5 + 0.5 * math.log(2 * math.pi) + torch.log(std)).sum()
    return log_prob + coef * math.copysign(1.0, delta) * entropy


def softmax_objective(P, obs, action, delta, coef):
    logits = stream_mlp(P, obs, 2)
    log_probs = logits - torch.logsumexp(logits, dim=-1)
    entropy = -(log_probs.exp() * log_probs).sum()
    return log_probs[action] + coef * math.copysign(1.0, delta) * entropy


@pytest.mark.parametrize("continuous, coef", [(True, 0.01), (True, 0.5), (False, 0.01), (False, 0.5)],
                         ids=["box-c0.01", "box-c0.5", "discrete-c0.01", "discrete-c0.5"])
def test_stream_ac_steps_match_an_obgd_oracle(continuous, coef):
    """Three stream AC(λ) steps with δ > 0, δ < 0 and a terminal δ: critic trace ∇V(s) (κ 2), actor trace
    ∇[log π(a|s) + c·sign(δ)·H(π(·|s))] (κ 3), both stepped along the same δ and reset at the episode end;
    δ, both step sizes, both traces and every parameter compared after each step."""
    space = gym.spaces.Box(-np.ones(ACTION_DIM, np.float32), np.ones(ACTION_DIM, np.float32)) if continuous \
        else gym.spaces.Discrete(3)
    agent = stream_agent(StreamAC, StreamACConfig, 4, space, entropy_coef=coef)
    objective = gaussian_objective if continuous else softmax_objective
    critic, critic_trace = params_and_zero_trace(agent.critic)
    actor, actor_trace = params_and_zero_trace(agent.actor)
    s = observations(4, seed=7)
    actions = [np.array([0.3, -0.8], np.float32), np.array([-1.1, 0.4], np.float32), np.array([0.9, 0.9], np.float32)] \
        if continuous else [2, 0, 1]
    plan = [(2.5, False), (-2.5, False), (0.4, True)]
    signs = []
    for i, ((reward, terminal), action) in enumerate(zip(plan, actions)):
        obs, next_obs = s[i], s[i + 1]
        obs64 = torch.as_tensor(obs, dtype=F64)
        Pc = [p.clone().requires_grad_(True) for p in critic]
        value = stream_mlp(Pc, obs64, 2)[0]
        with torch.no_grad():
            next_value = stream_mlp(critic, torch.as_tensor(next_obs, dtype=F64), 2)[0]
        delta = reward + (0.0 if terminal else GAMMA * float(next_value)) - float(value.detach())
        signs.append(delta > 0)
        critic_grads = torch.autograd.grad(value, Pc)
        Pa = [p.clone().requires_grad_(True) for p in actor]
        action64 = torch.as_tensor(action, dtype=F64) if continuous else action
        actor_grads = torch.autograd.grad(objective(Pa, obs64, action64, delta, coef), Pa)
        critic, critic_trace, eta_c, _ = obgd(critic, critic_trace, critic_grads, delta, 1.0, 2.0, GAMMA, LAM, terminal)
        actor, actor_trace, eta_a, _ = obgd(actor, actor_trace, actor_grads, delta, 1.0, 3.0, GAMMA, LAM, terminal)
        out = agent.update(Transition(obs, action, reward, next_obs, terminal, terminal))
        assert out["losses/td_error"] == pytest.approx(delta, abs=2e-6, rel=1e-5)
        assert out["losses/critic_step_size"] == pytest.approx(eta_c, rel=1e-5)
        assert out["losses/actor_step_size"] == pytest.approx(eta_a, rel=1e-5)
        assert_stream_state(agent.critic, agent.optimizers["critic"], critic, critic_trace, f"critic step {i + 1}")
        assert_stream_state(agent.actor, agent.optimizers["actor"], actor, actor_trace, f"actor step {i + 1}")
    assert signs[:2] == [True, False]  # both signs of δ exercised the entropy term


def test_the_multipliers_say_when_they_step():
    """The schedule in the docs is the one the λ tests above pin: once per batch of finished training
    episodes, never per gradient update (the docstring used to say "one step per update")."""
    import inspect

    from keelrl.agents import lagrange

    for doc in (inspect.getdoc(lagrange), inspect.getdoc(lagrange.GradientMultiplier),
                inspect.getdoc(lagrange.PIDMultiplier)):
        assert "once per batch of finished" in " ".join(doc.split()), doc
    assert "one step per update" not in inspect.getdoc(lagrange.GradientMultiplier)
    assert "OmniSafe" in inspect.getdoc(lagrange) and "omnisafe/common/lagrange.py" in inspect.getdoc(lagrange)
