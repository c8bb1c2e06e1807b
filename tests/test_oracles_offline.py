"""One update of every offline agent (CQL, IQL, RIQL) against an independent oracle.

Each test copies the agent's initial weights into plain float64 tensors, recomputes ONE update by hand
from the papers and their anchor code (CORL `algorithms/offline/iql.py` and `cql.py`, RIQL's `RIQL.py`)
with matmul-and-ReLU forward passes, the losses written out, gradients from autograd on those plain
tensors, and Adam's first step written out (m̂ = g, v̂ = g², p − lr·m̂/(√v̂ + ε)), in the order the agent
documents (IQL/RIQL: V, Q, Polyak, actor; CQL: actor, α, critic, Polyak). None of the code under test's
loss functions, networks or optimisers is called by the oracle. It then compares the losses the agent
returns, its targets, the gradients it backpropagated, and EVERY parameter after the step.

Tolerances: the oracle runs in float64, the agent in float32. Losses, targets and parameters: rtol 1e-5 /
atol 1e-6 (float32 rounding and summation order). Gradients: rtol 1e-4 / atol 1e-7 (they are sums over the
batch and hidden units with cancellation, so their float32 relative error is larger than a forward value's).

Adam's first step moves each parameter by ≈ ±lr whatever the size of its gradient, so the parameter
check alone would not see a loss scaled by a positive factor: the gradient check does.

Randomness (CQL's sampled actions): torch is seeded identically before the agent's update and before the
oracle draws its noise, and the oracle draws in the agent's order (actor step: ε (B, A); critic step: ε
for a' (B, A), uniform proposals (N·B, A), ε for π(s) proposals (N·B, A), ε for π(s') proposals
(N·B, A); row k·B + b of the proposals belongs to state b).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional

from keelrl.agents.cql import CQL, CQLConfig
from keelrl.agents.iql import IQL, IQLConfig
from keelrl.agents.riql import RIQL, RIQLConfig
from keelrl.buffers import Batch

OBS_DIM, BATCH = 3, 6
HIDDEN = (8, 8)
NUM_LAYERS = len(HIDDEN) + 1
ADAM_BETA1, ADAM_BETA2, ADAM_EPS = 0.9, 0.999, 1e-8  # torch.optim.Adam's defaults (the agents pass none)
TOL = dict(rtol=1e-5, atol=1e-6)
GRAD_TOL = dict(rtol=1e-4, atol=1e-7)
TERMINATED = torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0, 0.0])


# ---------------------------------------------------------------------------------------------------
# the oracle's building blocks: plain tensors only


def snapshot(agent: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of the agent (online, target, actor, temperature) as a float64 copy, by name."""
    return {name: p.detach().to(torch.float64).clone() for name, p in agent.named_parameters()}


def leaves(params: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """Fresh differentiable copies of the parameters whose name starts with `prefix`."""
    return {n: p.clone().requires_grad_(True) for n, p in params.items() if n.startswith(prefix)}


def relu_mlp(x: torch.Tensor, params: dict[str, torch.Tensor], prefix: str) -> torch.Tensor:
    """nn.Sequential(Linear, ReLU, Linear, ReLU, Linear): Linear k has weight (out, in) at index 2k."""
    for k in range(NUM_LAYERS):
        x = x @ params[f"{prefix}.{2 * k}.weight"].T + params[f"{prefix}.{2 * k}.bias"]
        if k < NUM_LAYERS - 1:
            x = torch.relu(x)
    return x


def ensemble_q(obs: torch.Tensor, actions: torch.Tensor, params: dict[str, torch.Tensor], prefix: str) -> torch.Tensor:
    """E critics on [obs, action]: layer k has weight (E, in, out) and bias (E, 1, out). Returns (E, B)."""
    h = torch.cat([obs, actions], dim=-1).unsqueeze(0)  # (1, B, in), shared by every member
    for k in range(NUM_LAYERS):
        h = torch.matmul(h, params[f"{prefix}.net.layers.{k}.weight"]) + params[f"{prefix}.net.layers.{k}.bias"]
        if k < NUM_LAYERS - 1:
            h = torch.relu(h)
    return h[..., 0]


def adam_first_step(p: torch.Tensor, g: torch.Tensor, lr: float) -> torch.Tensor:
    m = (1 - ADAM_BETA1) * g
    v = (1 - ADAM_BETA2) * g * g
    m_hat, v_hat = m / (1 - ADAM_BETA1), v / (1 - ADAM_BETA2)
    return p - lr * m_hat / (v_hat.sqrt() + ADAM_EPS)


def step_group(loss: torch.Tensor, group: dict[str, torch.Tensor], lr: float, new: dict, grads: dict) -> None:
    """Gradients of `loss` w.r.t. one optimiser's parameters, and those parameters after one Adam step."""
    names = list(group)
    for name, g in zip(names, torch.autograd.grad(loss, [group[n] for n in names])):
        grads[name] = g
        new[name] = adam_first_step(group[name].detach(), g, lr)


def quantile_by_hand(values: torch.Tensor, q: float) -> torch.Tensor:
    """The q-quantile over dim 0 with linear interpolation between order statistics (numpy's default)."""
    ordered = values.sort(dim=0).values
    position = q * (values.shape[0] - 1)
    below = math.floor(position)
    above = min(below + 1, values.shape[0] - 1)
    return ordered[below] + (position - below) * (ordered[above] - ordered[below])


def move_target_critics(agent, scale: float = 0.02) -> None:
    """Target critics a little away from the online ones, as after some training (set-up, not the oracle):
    a first update from identical copies could not tell which of the two a target was computed with."""
    with torch.no_grad():
        for p in agent.critic_target.parameters():
            p.add_(scale * torch.randn_like(p))


def make_batch(action_low, action_high, gamma: float, rewards=None, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    low, high = torch.as_tensor(action_low, dtype=torch.float32), torch.as_tensor(action_high, dtype=torch.float32)
    obs = torch.randn(BATCH, OBS_DIM, generator=g)
    actions = low + (high - low) * torch.rand(BATCH, len(low), generator=g)
    if rewards is None:
        rewards = torch.randn(BATCH, generator=g)
    return Batch(obs=obs, actions=actions, rewards=torch.as_tensor(rewards, dtype=torch.float32),
                 next_obs=torch.randn(BATCH, OBS_DIM, generator=g), terminated=TERMINATED.clone(),
                 discounts=torch.full((BATCH,), gamma))


def as64(batch: Batch):
    return [t.to(torch.float64) for t in (batch.obs, batch.actions, batch.rewards, batch.next_obs, batch.terminated)]


def record_first(seen: dict, key: str, what):
    """A forward hook that keeps what the module's first call saw (and leaves its output alone)."""

    def hook(module, inputs, output):
        seen.setdefault(key, what(inputs, output))

    return hook


def assert_every_parameter(agent, expected: dict[str, torch.Tensor]) -> None:
    actual = dict(agent.named_parameters())
    assert set(expected) == set(actual), "the oracle must account for every parameter"
    for name, value in expected.items():
        torch.testing.assert_close(actual[name].detach().double(), value, **TOL, msg=lambda m, n=name: f"{n}: {m}")


def assert_gradients(agent, expected: dict[str, torch.Tensor]) -> None:
    actual = dict(agent.named_parameters())
    for name, value in expected.items():
        assert actual[name].grad is not None, name
        torch.testing.assert_close(actual[name].grad.double(), value, **GRAD_TOL, msg=lambda m, n=name: f"{n}: {m}")


# ---------------------------------------------------------------------------------------------------
# IQL / RIQL


def iql_oracle(params: dict, batch: Batch, config: IQLConfig, actor_lr: float, low, high) -> dict:
    """CORL's ImplicitQLearning.train (RIQL's with its options), written out on plain tensors."""
    obs, actions, rewards, next_obs, terminated = as64(batch)
    low, high = torch.as_tensor(low, dtype=torch.float64), torch.as_tensor(high, dtype=torch.float64)
    scale, shift = (high - low) / 2, (high + low) / 2
    new, grads = dict(params), {}
    # RIQL's options (IQL has none of them: its choices are the ones in the defaults here)
    q_target, target_clip = getattr(config, "q_target", "min"), getattr(config, "target_clip", None)
    q_loss = getattr(config, "q_loss", "mse")
    # V's target: the target critics on dataset actions, their min (IQL) or quantile (RIQL)
    target_q_all = ensemble_q(obs, actions, params, "critic_target")
    target_q = (quantile_by_hand(target_q_all, config.quantile) if q_target == "quantile"
                else target_q_all.min(dim=0).values)
    next_v = relu_mlp(next_obs, params, "value")[:, 0]  # V(s') before V's step
    # V: expectile regression, weight |τ − 1(u < 0)| u², u = target_q − V(s)
    value = leaves(params, "value.")
    u = target_q - relu_mlp(obs, value, "value")[:, 0]
    expectile_weight = torch.where(u < 0, 1.0 - config.expectile, config.expectile)
    value_loss = (expectile_weight * u**2).mean()
    step_group(value_loss, value, config.vf_lr, new, grads)
    # Q: every critic onto r + γ(1 − terminated) V(s'), clipped (RIQL); MSE or Huber (RIQL: β = 1/σ²)
    unclipped = rewards + config.gamma * (1.0 - terminated) * next_v
    y = unclipped if target_clip is None else unclipped.clamp(*target_clip)
    critic = leaves(params, "critic.")
    q = ensemble_q(obs, actions, critic, "critic")  # (E, B)
    error = q - y
    if q_loss == "huber":
        beta = 1.0 / config.huber_sigma**2
        q_loss = torch.where(error.abs() < beta, 0.5 * error**2 / beta, error.abs() - 0.5 * beta).mean()
    else:
        q_loss = (error**2).mean()
    step_group(q_loss, critic, config.qf_lr, new, grads)
    # target critics: (1 − τ) target + τ online, with the online critics after their step
    for name in params:
        if name.startswith("critic_target."):
            online = new[name.replace("critic_target.", "critic.", 1)]
            new[name] = (1 - config.tau) * params[name] + config.tau * online
    # actor: advantage-weighted regression with the advantage of V before its step
    weights = torch.exp(config.beta * u.detach()).clamp(max=config.exp_adv_max)
    actor = leaves(params, "actor.")
    if config.deterministic_actor:
        predicted = torch.tanh(relu_mlp(obs, actor, "actor.net")) * scale + shift
        regression = ((predicted - actions) ** 2).sum(-1)
    else:
        mean = torch.tanh(relu_mlp(obs, actor, "actor.mean_net.net")) * scale + shift
        log_std = actor["actor.log_std"].clamp(config.log_std_min, 2.0)
        log_density = -0.5 * ((actions - mean) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)
        regression = -log_density.sum(-1)
    actor_loss = (weights * regression).mean()
    step_group(actor_loss, actor, actor_lr, new, grads)
    return {"params": new, "grads": grads, "target_q_all": target_q_all, "target_q": target_q, "q_target": y,
            "unclipped_q_target": unclipped, "advantage": u.detach(), "weights": weights,
            "losses": {"losses/vf_loss": value_loss, "losses/qf_loss": q_loss, "losses/actor_loss": actor_loss,
                       "losses/qf_values": q.mean(), "losses/advantage": u.mean()}}


def run_iql_update(agent, batch, monkeypatch):
    """agent.update(batch), recording what its target critics saw and output, V's target and Q's target."""
    seen = {}
    agent.critic_target.register_forward_hook(record_first(seen, "target_q_all", lambda inputs, output: output))
    value_loss = agent.value_loss

    def spy_value_loss(obs, target_q):
        seen["target_q"] = target_q
        return value_loss(obs, target_q)

    monkeypatch.setattr(agent, "value_loss", spy_value_loss)
    for name in ("mse_loss", "smooth_l1_loss"):
        original = getattr(torch.nn.functional, name)

        def spy_loss(prediction, target, *args, _original=original, **kwargs):
            seen.setdefault("q_target", target)
            return _original(prediction, target, *args, **kwargs)

        monkeypatch.setattr(torch.nn.functional, name, spy_loss)
    losses = agent.update(batch)
    monkeypatch.undo()
    return losses, seen


def check_iql_against_oracle(agent, expected, losses, seen):
    assert set(expected["losses"]) <= set(losses)
    for key, value in expected["losses"].items():
        torch.testing.assert_close(losses[key].double(), value.detach(), **TOL, msg=lambda m, k=key: f"{k}: {m}")
    torch.testing.assert_close(seen["target_q_all"][..., 0].double(), expected["target_q_all"], **TOL)
    torch.testing.assert_close(seen["target_q"].double(), expected["target_q"], **TOL)
    q_target = seen["q_target"]  # (E, B) expanded, or (B,)
    torch.testing.assert_close(q_target.double(), expected["q_target"].expand_as(q_target), **TOL)
    assert_gradients(agent, expected["grads"])
    assert_every_parameter(agent, expected["params"])


@pytest.mark.parametrize("deterministic_actor", [False, True], ids=["gaussian", "deterministic"])
@pytest.mark.parametrize("num_updates", [0, 250])
def test_iql_update_matches_oracle(deterministic_actor, num_updates, monkeypatch):
    """IQL (CORL defaults, β raised so that some weights hit the clip at 100): expectile V, MSE twin Q with
    min target, Polyak, AWR actor with the cosine schedule at update 0 and 250 of 1000."""
    torch.manual_seed(0)
    low, high = -np.ones(2), np.ones(2)
    config = IQLConfig(hidden_sizes=HIDDEN, normalize_obs=False, beta=60.0, total_updates=1000,
                       deterministic_actor=deterministic_actor)
    agent = IQL(OBS_DIM, low, high, config)
    move_target_critics(agent)
    agent.num_updates = num_updates
    batch = make_batch(low, high, config.gamma)
    actor_lr = config.actor_lr * 0.5 * (1 + math.cos(math.pi * num_updates / 1000))  # CosineAnnealingLR
    expected = iql_oracle(snapshot(agent), batch, config, actor_lr, low, high)
    # the batch exercises both expectile branches, clipped and unclipped weights, terminal and not
    assert (expected["advantage"] < 0).any() and (expected["advantage"] > 0).any()
    assert (expected["weights"] == 100.0).any() and (expected["weights"] < 100.0).any()
    losses, seen = run_iql_update(agent, batch, monkeypatch)
    check_iql_against_oracle(agent, expected, losses, seen)
    assert agent.optimizers["actor"].param_groups[0]["lr"] == pytest.approx(actor_lr, rel=1e-12)
    assert agent.num_updates == num_updates + 1


@pytest.mark.parametrize("sigma, quantile", [(1.0, 0.25), (2.0, 0.3)])
def test_riql_update_matches_oracle(sigma, quantile, monkeypatch):
    """RIQL (its defaults: 5 EDAC-initialised critics, quantile target, Huber, targets clipped to [−100, 1000],
    deterministic actor), on an asymmetric action box, with rewards that push targets past both clip bounds,
    at update 1.5M of 3M (the actor's cosine at half its learning rate)."""
    torch.manual_seed(1)
    low, high = np.array([-1.0, -2.0]), np.array([1.0, 0.5])
    config = RIQLConfig(hidden_sizes=HIDDEN, normalize_obs=False, huber_sigma=sigma, quantile=quantile, beta=20.0)
    agent = RIQL(OBS_DIM, low, high, config)
    move_target_critics(agent)
    agent.num_updates = 1_500_000
    batch = make_batch(low, high, config.gamma, rewards=[0.4, -0.2, 1500.0, -250.0, 0.05, 0.6])
    with torch.no_grad():  # shift V so that its first advantages take both signs (set-up, not the oracle)
        target_q = torch.quantile(agent.critic_target(batch.obs, batch.actions)[..., 0], quantile, dim=0)
        agent.value[-1].bias += (target_q - agent.value(batch.obs)[:, 0]).median()
    expected = iql_oracle(snapshot(agent), batch, config, config.actor_lr * 0.5, low, high)
    assert (expected["unclipped_q_target"] > 1000).any() and (expected["unclipped_q_target"] < -100).any()
    error = (ensemble_q(*as64(batch)[:2], snapshot(agent), "critic") - expected["q_target"]).abs()
    assert (error < 1 / sigma**2).any() and (error > 1 / sigma**2).any()  # both Huber branches
    assert (expected["advantage"] < 0).any() and (expected["advantage"] > 0).any()
    losses, seen = run_iql_update(agent, batch, monkeypatch)
    check_iql_against_oracle(agent, expected, losses, seen)
    assert agent.optimizers["actor"].param_groups[0]["lr"] == pytest.approx(config.actor_lr * 0.5, rel=1e-9)


# ---------------------------------------------------------------------------------------------------
# CQL


def cql_policy(obs, params, noise, scale, shift):
    """CORL's TanhGaussianPolicy: mean and raw log-std from one MLP, log-std = m·raw + c clamped to [−20, 2],
    a = tanh(u)·scale + shift with u = mean + std·ε; log-density of a in the action box."""
    out = relu_mlp(obs, params, "actor.net")
    action_dim = out.shape[-1] // 2
    mean, raw = out[:, :action_dim], out[:, action_dim:]
    log_std = (params["actor.log_std_multiplier"] * raw + params["actor.log_std_offset"]).clamp(-20.0, 2.0)
    u = mean + log_std.exp() * noise
    gaussian = -0.5 * ((u - mean) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)
    log_density = gaussian - torch.log(1 - torch.tanh(u) ** 2) - torch.log(scale)
    return torch.tanh(u) * scale + shift, log_density.sum(-1)


def cql_oracle(params: dict, batch: Batch, config: CQLConfig, noise: dict, low, high) -> dict:
    obs, actions, rewards, next_obs, terminated = as64(batch)
    low, high = torch.as_tensor(low, dtype=torch.float64), torch.as_tensor(high, dtype=torch.float64)
    scale, shift = (high - low) / 2, (high + low) / 2
    n, action_dim = config.cql_n_actions, len(low)
    new, grads, losses = dict(params), {}, {}
    # actor: mean(α log π(a|s) − min_i Q_i(s, a)), a ~ π(s) reparameterised, critics held fixed
    alpha = params["log_alpha"].exp()
    actor = leaves(params, "actor.")
    pi_actions, pi_log_prob = cql_policy(obs, actor, noise["pi"], scale, shift)
    q_pi = ensemble_q(obs, pi_actions, params, "critic").min(dim=0).values
    actor_loss = (alpha * pi_log_prob - q_pi).mean()
    step_group(actor_loss, actor, config.policy_lr, new, grads)
    losses["losses/actor_loss"], losses["losses/alpha"] = actor_loss, alpha
    # temperature: −mean(log α (log π + target entropy)), target entropy −|A|
    if config.autotune:
        log_alpha = leaves(params, "log_alpha")
        alpha_loss = -(log_alpha["log_alpha"] * (pi_log_prob.detach() - action_dim)).mean()
        step_group(alpha_loss, log_alpha, config.policy_lr, new, grads)
        losses["losses/alpha_loss"] = alpha_loss
    # the critic's loss samples from the actor (and uses α) as they were before their steps (CORL's order)
    next_actions, next_log_prob = cql_policy(next_obs, params, noise["next"], scale, shift)
    next_q_all = ensemble_q(next_obs, next_actions, params, "critic_target")
    next_q = next_q_all.min(dim=0).values
    if config.backup_entropy:
        next_q = next_q - params["log_alpha"].exp() * next_log_prob
    y = rewards + config.gamma * (1.0 - terminated) * next_q
    uniform = low + noise["uniform"] * (high - low)
    current, current_log_prob = cql_policy(obs.repeat(n, 1), params, noise["current"], scale, shift)
    following, following_log_prob = cql_policy(next_obs.repeat(n, 1), params, noise["following"], scale, shift)
    critic = leaves(params, "critic.")
    q_data = ensemble_q(obs, actions, critic, "critic")  # (E, B)
    num_critics = q_data.shape[0]

    def q_at_obs(proposals):  # every proposal is scored at s: (E, N, B)
        return ensemble_q(obs.repeat(n, 1), proposals, critic, "critic").view(num_critics, n, BATCH)

    def q_of_policy_action(proposals):  # Cal-QL: raised to the Monte-Carlo return of the transition
        q = q_at_obs(proposals)
        return torch.maximum(q, batch.mc_returns.double()) if config.cal_ql else q

    if config.cql_importance_sample:
        uniform_log_density = -torch.log(high - low).sum()
        stacked = torch.cat([q_at_obs(uniform) - uniform_log_density,
                             q_of_policy_action(current) - current_log_prob.view(n, BATCH),
                             q_of_policy_action(following) - following_log_prob.view(n, BATCH)], dim=1)
    else:
        stacked = torch.cat([q_at_obs(uniform), q_data.unsqueeze(1), q_of_policy_action(following),
                             q_of_policy_action(current)], dim=1)
    soft_max = config.cql_temp * torch.logsumexp(stacked / config.cql_temp, dim=1)  # (E, B)
    td_losses = ((q_data - y) ** 2).mean(dim=1)  # one F.mse_loss per critic, as CORL's qf1_loss, qf2_loss
    gaps = (soft_max - q_data).mean(dim=1)
    critic_loss = td_losses.sum() + config.cql_alpha * gaps.sum()
    step_group(critic_loss, critic, config.qf_lr, new, grads)
    for name in params:
        if name.startswith("critic_target."):
            online = new[name.replace("critic_target.", "critic.", 1)]
            new[name] = (1 - config.tau) * params[name] + config.tau * online
    losses.update({"losses/qf_loss": td_losses.mean(), "losses/cql_gap": gaps.mean(), "losses/qf_values": q_data.mean()})
    return {"params": new, "grads": grads, "losses": losses, "next_actions": next_actions, "next_q_all": next_q_all}


CQL_CASES = {
    "corl-defaults": dict(box=([-1.0, -1.0], [1.0, 1.0]), options={}),
    "box-backup-temp": dict(box=([-1.0, -2.0], [1.0, 0.5]),
                            options=dict(backup_entropy=True, cql_temp=0.7, cql_alpha=3.0, alpha=0.5)),
    "no-importance-sampling": dict(box=([-1.0, -1.0], [1.0, 1.0]), options=dict(cql_importance_sample=False)),
    "fixed-alpha": dict(box=([-1.0, -1.0], [1.0, 1.0]), options=dict(autotune=False, alpha=0.2, backup_entropy=True)),
    "cal-ql": dict(box=([-1.0, -1.0], [1.0, 1.0]), options=dict(cal_ql=True)),
    "cal-ql-no-importance-sampling": dict(box=([-1.0, -2.0], [1.0, 0.5]),
                                          options=dict(cal_ql=True, cql_importance_sample=False)),
}
# Cal-QL's Monte-Carlo returns: every other state's far above any Q-value (all its policy Q-values raised to it),
# the others' far below (left as they are)
MC_RETURNS = torch.tensor([100.0, -100.0]).repeat(BATCH // 2)


@pytest.mark.parametrize("case", list(CQL_CASES))
def test_cql_update_matches_oracle(case):
    """CQL (CORL's loss): actor and α steps, TD onto min target Q at a' ~ π(s'), the conservative term over
    uniform / π(s) / π(s') proposals corrected by their log-densities, Polyak. Cal-QL: the π(s) and π(s')
    proposals' Q-values raised to the Monte-Carlo return where below it, the uniform ones not."""
    low, high = (np.array(v) for v in CQL_CASES[case]["box"])
    torch.manual_seed(2)
    config = CQLConfig(hidden_sizes=HIDDEN, normalize_obs=False, cql_n_actions=3, **CQL_CASES[case]["options"])
    agent = CQL(OBS_DIM, low, high, config)
    with torch.no_grad():  # move the output layer off its 0.01-gain init so log-stds and Q-values differ per state
        agent.actor.net[-1].weight.normal_(0, 0.3)
        for layer in agent.critic.net.layers[-1:]:
            layer.weight.normal_(0, 0.5)
        agent.critic_target.load_state_dict(agent.critic.state_dict())
    move_target_critics(agent)
    batch = make_batch(low, high, config.gamma, seed=3)._replace(mc_returns=MC_RETURNS if config.cal_ql else None)
    params = snapshot(agent)
    seen = {}
    agent.critic_target.register_forward_hook(record_first(seen, "target", lambda inputs, output: (inputs[:2], output)))
    torch.manual_seed(123)
    losses = agent.update(batch)
    if config.cal_ql:  # the policy's Q-values at the first half of the states, and only those, were below the bound
        assert losses["losses/calql_bound_rate"].item() == 0.5
    torch.manual_seed(123)  # the same draws, in the agent's order
    n, action_dim = config.cql_n_actions, len(low)
    noise = {"pi": torch.randn(BATCH, action_dim), "next": torch.randn(BATCH, action_dim),
             "uniform": torch.rand(n * BATCH, action_dim), "current": torch.randn(n * BATCH, action_dim),
             "following": torch.randn(n * BATCH, action_dim)}
    expected = cql_oracle(params, batch, config, {k: v.double() for k, v in noise.items()}, low, high)
    assert set(expected["losses"]) <= set(losses)
    for key, value in expected["losses"].items():
        torch.testing.assert_close(losses[key].double(), value.detach(), **TOL, msg=lambda m, k=key: f"{k}: {m}")
    (target_obs, target_actions), target_q = seen["target"]
    torch.testing.assert_close(target_obs.double(), batch.next_obs.double())
    torch.testing.assert_close(target_actions.double(), expected["next_actions"].detach(), **TOL)
    torch.testing.assert_close(target_q[..., 0].double(), expected["next_q_all"].detach(), **TOL)
    assert_gradients(agent, expected["grads"])
    assert_every_parameter(agent, expected["params"])
