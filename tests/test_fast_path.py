"""keelrl's fast SAC/TD3 update (batched critic ensemble, fused Adam, foreach Polyak averaging, no
critic weight gradients in the actor step) against a plain one written the CleanRL way: separate
critic MLPs, per-parameter Adam, a Python loop for the target update. Same weights, batches and
seed: the same parameters after several updates, up to float reordering."""

import copy
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from keelrl.agents.sac import SAC, SACConfig
from keelrl.agents.td3 import TD3, TD3Config

OBS_DIM, ACTION_DIM = 5, 2  # as the fixed_batch fixture in conftest.py
UPDATES = 6


def separate_critics(agent) -> list[nn.Sequential]:
    """Each member of the agent's critic ensemble as its own nn.Sequential (copied weights)."""
    critics = []
    for k in range(agent.critic.num_critics):
        layers = []
        for i, layer in enumerate(agent.critic.net.layers):
            linear = nn.Linear(layer.weight.shape[1], layer.weight.shape[2])
            linear.weight.data = layer.weight.data[k].T.clone()
            linear.bias.data = layer.bias.data[k, 0].clone()
            layers += [linear] if i == len(agent.critic.net.layers) - 1 else [linear, nn.ReLU()]
        critics.append(nn.Sequential(*layers))
    return critics


def q(critic, obs, actions):
    return critic(torch.cat([obs, actions], 1)).view(-1)


def polyak(online, target, tau):
    for param, target_param in zip(online.parameters(), target.parameters()):
        target_param.data.copy_(tau * param.data + (1 - tau) * target_param.data)


def plain_sac(agent: SAC, batches, config: SACConfig, seed: int):
    actor, log_alpha = copy.deepcopy(agent.actor), agent.log_alpha.detach().clone().requires_grad_(True)
    critics = separate_critics(agent)
    targets = [copy.deepcopy(c) for c in critics]
    q_opt = torch.optim.Adam([p for c in critics for p in c.parameters()], lr=config.q_lr, foreach=False)
    actor_opt = torch.optim.Adam(actor.parameters(), lr=config.policy_lr, foreach=False)
    alpha_opt = torch.optim.Adam([log_alpha], lr=config.q_lr, foreach=False)
    torch.manual_seed(seed)  # after building the copies, whose nn.Linear constructors draw random numbers
    for step, data in enumerate(batches, start=1):
        alpha = log_alpha.exp().item()
        with torch.no_grad():
            next_actions, next_log_pi = actor.sample(data.next_obs)
            min_next = torch.min(q(targets[0], data.next_obs, next_actions), q(targets[1], data.next_obs, next_actions))
            next_value = data.rewards + (1 - data.terminated) * config.gamma * (min_next - alpha * next_log_pi)
        qf_loss = sum(F.mse_loss(q(c, data.obs, data.actions), next_value) for c in critics)
        q_opt.zero_grad()
        qf_loss.backward()
        q_opt.step()
        if step % config.policy_frequency == 0:
            for _ in range(config.policy_frequency):
                pi, log_pi = actor.sample(data.obs)
                actor_loss = (log_alpha.exp().item() * log_pi - torch.min(q(critics[0], data.obs, pi),
                                                                          q(critics[1], data.obs, pi))).mean()
                actor_opt.zero_grad()
                actor_loss.backward()
                actor_opt.step()
                alpha_loss = (-log_alpha.exp() * (log_pi.detach() + agent.target_entropy)).mean()
                alpha_opt.zero_grad()
                alpha_loss.backward()
                alpha_opt.step()
        for critic, target in zip(critics, targets):
            polyak(critic, target, config.tau)
    return actor, critics, targets, log_alpha


def plain_td3(agent: TD3, batches, config: TD3Config, seed: int):
    actor, actor_target = copy.deepcopy(agent.actor), copy.deepcopy(agent.actor_target)
    critics = separate_critics(agent)
    targets = [copy.deepcopy(c) for c in critics]
    q_opt = torch.optim.Adam([p for c in critics for p in c.parameters()], lr=config.learning_rate, foreach=False)
    actor_opt = torch.optim.Adam(actor.parameters(), lr=config.learning_rate, foreach=False)
    torch.manual_seed(seed)  # after building the copies, whose nn.Linear constructors draw random numbers
    for step, data in enumerate(batches, start=1):
        with torch.no_grad():
            noise = (torch.randn_like(data.actions) * config.policy_noise).clamp(-config.noise_clip, config.noise_clip)
            next_actions = (actor_target(data.next_obs) + noise * actor.action_scale).clamp(-1, 1)
            min_next = torch.min(q(targets[0], data.next_obs, next_actions), q(targets[1], data.next_obs, next_actions))
            next_value = data.rewards + (1 - data.terminated) * config.gamma * min_next
        qf_loss = sum(F.mse_loss(q(c, data.obs, data.actions), next_value) for c in critics)
        q_opt.zero_grad()
        qf_loss.backward()
        q_opt.step()
        if step % config.policy_frequency == 0:
            actor_loss = -q(critics[0], data.obs, actor(data.obs)).mean()
            actor_opt.zero_grad()
            actor_loss.backward()
            actor_opt.step()
            polyak(actor, actor_target, config.tau)
            for critic, target in zip(critics, targets):
                polyak(critic, target, config.tau)
    return actor, critics, targets


def batches_from(fixed_batch):
    generator = torch.Generator().manual_seed(0)
    return [fixed_batch._replace(**{name: getattr(fixed_batch, name)[perm] for name in
                                    ("obs", "actions", "rewards", "next_obs", "terminated")})
            for perm in (torch.randperm(256, generator=generator) for _ in range(UPDATES))]


# Parameters after 6 updates agree to ~1e-7 absolute here (batched vs separate matmuls, fused vs per-parameter
# Adam); Adam divides each step by the root of its second moment, which amplifies rounding in small
# gradients, so the bound is 10× that: atol 1e-6, rtol 1e-5 (it was 2e-5 and 1e-4).
ATOL, RTOL = 1e-6, 1e-5


def assert_critics_match(agent, critics, targets):
    for k, (critic, target) in enumerate(zip(critics, targets)):
        for plain_net, fast_net in ((critic, agent.critic), (target, agent.critic_target)):
            linears = [m for m in plain_net if isinstance(m, nn.Linear)]
            for linear, layer in zip(linears, fast_net.net.layers):
                torch.testing.assert_close(layer.weight[k].T, linear.weight, atol=ATOL, rtol=RTOL)
                torch.testing.assert_close(layer.bias[k, 0], linear.bias, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("agent_cls, config_cls, plain_update", [(SAC, SACConfig, plain_sac),
                                                                 (TD3, TD3Config, plain_td3)])
def test_fast_update_equals_the_plain_update(agent_cls, config_cls, plain_update, fixed_batch):
    torch.manual_seed(0)
    config = config_cls(hidden_sizes=(32, 32))
    agent = agent_cls(OBS_DIM, -np.ones(ACTION_DIM), np.ones(ACTION_DIM), config)
    batches = batches_from(fixed_batch)
    actor, critics, targets, *log_alpha = plain_update(agent, batches, config, seed=1)  # SAC's log α too
    torch.manual_seed(1)
    for batch in batches:
        agent.update(batch)
    assert_critics_match(agent, critics, targets)
    for plain, fast in zip(actor.parameters(), agent.actor.parameters()):
        torch.testing.assert_close(fast, plain, atol=ATOL, rtol=RTOL)
    for expected in log_alpha:
        torch.testing.assert_close(agent.log_alpha.detach(), expected.detach(), atol=1e-7, rtol=1e-6)


@pytest.mark.skipif(not any(map(shutil.which, ("g++", "c++", "clang++"))),
                    reason="no C++ compiler (g++, c++ or clang++) on PATH: torch.compile cannot build CPU kernels")
def test_compiled_sac_update_equals_the_eager_update(fixed_batch):
    """--compile changes how the losses run, not what they compute (random draws as in eager mode)."""
    torch._dynamo.reset()
    agents = []
    # inductor's own config patch: monkeypatch's undo deleted the option, and every later compile failed on it
    with torch._inductor.config.patch(fallback_random=True):
        for compile_losses in (False, True):
            torch.manual_seed(0)
            agent = SAC(OBS_DIM, -np.ones(ACTION_DIM), np.ones(ACTION_DIM),
                        SACConfig(hidden_sizes=(32, 32), compile=compile_losses))
            torch.manual_seed(1)
            for batch in batches_from(fixed_batch)[:2]:  # a critic step, then critic, actor and α steps
                agent.update(batch)
            agents.append(agent)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 2  # both losses went through the compiler
    eager, compiled = agents
    for name, param in eager.state_dict().items():
        torch.testing.assert_close(compiled.state_dict()[name], param, atol=ATOL, rtol=RTOL, msg=name)
