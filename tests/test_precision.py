"""--precision bf16: one update on a fixed batch matches the fp32 update within a stated tolerance, every forward
pass of later updates multiplies by the weights as they are then, the weights and optimiser state stay float32,
and bad values or slow hardware are said in one line. --precision tf32: torch's float32 matrix-product precision
is "high" (TF32 tensor cores on CUDA) for the whole run, single seed or seed group, and "highest" for fp32, the
caller's own setting given back when the run ends; no autocast is opened for it."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from keelrl.agents import cql, iql, sac, sac_lag, td3, td3_lag
from keelrl.agents.harness.options import run_cli
from keelrl.buffers import Batch
from keelrl.networks import training

LOW, HIGH = -np.ones(3, np.float32), np.ones(3, np.float32)
SMALL = dict(hidden_sizes=(64, 64))
AGENTS = {
    "sac mlp/scalar": lambda p: sac.SAC(11, LOW, HIGH, sac.SACConfig(**SMALL, policy_frequency=1, precision=p)),
    "sac simbav2/c51": lambda p: sac.SAC(11, LOW, HIGH, sac.SACConfig(
        network="simbav2", critic_head="c51", v_min=-5.0, v_max=5.0, num_bins=21, actor_hidden_dim=32,
        critic_hidden_dim=64, critic_num_blocks=1, policy_frequency=1, precision=p)),
    "td3 mlp": lambda p: td3.TD3(11, LOW, HIGH, td3.TD3Config(**SMALL, policy_frequency=1, precision=p)),
    "cql": lambda p: cql.CQL(11, LOW, HIGH, cql.CQLConfig(**SMALL, cql_n_actions=4, precision=p)),
    "iql": lambda p: iql.IQL(11, LOW, HIGH, iql.IQLConfig(**SMALL, precision=p)),
}
LOSS_TOLERANCE = 1e-2
"""|loss_bf16 − loss_fp32| / (|loss_fp32| + 1e-3) for every logged loss (measured: at most 0.005)"""
UPDATE_COSINE = 0.95
"""cosine between the bf16 and fp32 parameter changes of the first Adam step (measured: 0.977 to 0.996)"""


def fixed_batch(n: int = 64) -> Batch:
    g = torch.Generator().manual_seed(0)
    return Batch(obs=torch.randn(n, 11, generator=g), actions=torch.rand(n, 3, generator=g) * 2 - 1,
                 rewards=torch.randn(n, generator=g), next_obs=torch.randn(n, 11, generator=g),
                 terminated=(torch.rand(n, generator=g) < 0.1).float(), discounts=torch.full((n,), 0.99),
                 costs=torch.zeros(n))


def parameter_change(agent, before: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([(value - before[name]).flatten() for name, value in agent.state_dict().items()
                      if value.dtype == torch.float32])


@pytest.mark.parametrize("name", list(AGENTS))
def test_one_bf16_update_matches_the_fp32_update_and_keeps_float32_weights(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # this machine may have no native bf16
        torch.manual_seed(0)
        fp32 = AGENTS[name]("fp32")
        torch.manual_seed(0)
        bf16 = AGENTS[name]("bf16")
    before = {key: value.clone() for key, value in fp32.state_dict().items()}
    torch.manual_seed(1)
    losses_fp32 = fp32.update(fixed_batch())
    torch.manual_seed(1)
    losses_bf16 = bf16.update(fixed_batch())
    for key, value in losses_fp32.items():
        assert losses_bf16[key].dtype == torch.float32, key
        assert abs(float(losses_bf16[key]) - float(value)) / (abs(float(value)) + 1e-3) < LOSS_TOLERANCE, key
    change_fp32, change_bf16 = parameter_change(fp32, before), parameter_change(bf16, before)
    assert torch.nn.functional.cosine_similarity(change_bf16, change_fp32, dim=0) > UPDATE_COSINE
    assert not torch.equal(change_bf16, change_fp32)  # the products did run in bfloat16
    assert all(p.dtype == torch.float32 for p in bf16.parameters())  # master weights
    for optimizer in bf16.optimizers.values():
        for state in optimizer.state.values():
            assert all(v.dtype == torch.float32 for v in state.values() if v.is_floating_point() and v.dim() > 0)


MULTI_STEP_AGENTS = {
    "sac": lambda: sac.SAC(11, LOW, HIGH, sac.SACConfig(**SMALL, precision="bf16")),
    "sac_lag": lambda: sac_lag.SACLag(11, LOW, HIGH, sac_lag.SACLagConfig(**SMALL, precision="bf16")),
    "td3": lambda: td3.TD3(11, LOW, HIGH, td3.TD3Config(**SMALL, precision="bf16")),
    "td3_lag": lambda: td3_lag.TD3Lag(11, LOW, HIGH, td3_lag.TD3LagConfig(**SMALL, precision="bf16")),
    "cql": lambda: cql.CQL(11, LOW, HIGH, cql.CQLConfig(**SMALL, cql_n_actions=4, precision="bf16")),
    "iql": lambda: iql.IQL(11, LOW, HIGH, iql.IQLConfig(**SMALL, precision="bf16")),
}


@pytest.mark.parametrize("name", list(MULTI_STEP_AGENTS))
def test_every_bf16_forward_pass_multiplies_by_the_current_weights(name):
    """Autocast keeps the bfloat16 copies of the weights it cast until its region closes: a region around a
    whole update (SAC with policy_frequency 2: critic step, then two actor/α steps; the Lagrangian cost targets
    after the actor step) made later forward passes use the weights from before the steps in between. Each layer
    call under autocast is recomputed here from the layer's weights at that moment, with the cache off."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # this machine may have no native bf16
        torch.manual_seed(0)
        agent = MULTI_STEP_AGENTS[name]()
    stale, checked = [], []

    def recompute(layer, inputs, output) -> None:
        if not torch.is_autocast_enabled("cpu"):
            return
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
            current = layer.forward(*inputs)
        checked.append(layer)
        if not torch.equal(output.detach(), current):
            stale.append(type(layer).__name__)

    for layer in agent.modules():
        if not list(layer.children()) and isinstance(getattr(layer, "weight", None), torch.nn.Parameter):
            layer.register_forward_hook(recompute)
    batch = fixed_batch()
    batch = batch._replace(costs=torch.rand(len(batch.rewards)))
    for _ in range(4):
        agent.update(batch)
    assert len(checked) > 20  # the hooks did see the update's layers under autocast
    assert not stale, f"{len(stale)} of {len(checked)} layer calls used weights from before an optimiser step"


def test_networks_return_float32_under_bf16_autocast():
    agent = sac.SAC(11, LOW, HIGH, sac.SACConfig(**SMALL))
    obs, actions = torch.randn(8, 11), torch.rand(8, 3)
    with training.matmul_precision("bf16", "cpu"):
        assert agent.critic(obs, actions).dtype == torch.float32
        _, log_prob = agent.actor.sample(obs)
        assert log_prob.dtype == torch.float32
        assert torch.nn.functional.linear(obs, torch.randn(4, 11)).dtype == torch.bfloat16  # autocast is on


def test_td3s_saturated_actions_keep_their_gradient_under_bf16_autocast():
    # a pre-activation of 4 (bias 4, zero weights): tanh 4 = 0.99933 in float32, exactly 1 as a bfloat16 tanh,
    # whose gradient 1 − tanh² would then be 0 and hold the actor there
    agent = td3.TD3(11, LOW, HIGH, td3.TD3Config(**SMALL))
    last = agent.actor.net[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.fill_(4.0)
    with training.matmul_precision("bf16", "cpu"):
        actions = agent.actor(torch.randn(8, 11))
    assert actions.dtype == torch.float32
    torch.testing.assert_close(actions, torch.full((8, 3), float(np.tanh(4.0))), rtol=0, atol=1e-6)
    actions.sum().backward()  # the gradient enters the bfloat16 output layer rounded to 8 bits: 2⁻⁸ relative
    torch.testing.assert_close(last.bias.grad, torch.full((3,), 8 * (1 - np.tanh(4.0) ** 2), dtype=torch.float32),
                               rtol=2**-8, atol=0)


def test_bad_precision_is_refused_in_one_line_and_emulated_bf16_warns_once(monkeypatch, capsys, tmp_path):
    with pytest.raises(SystemExit) as refused:  # the command line offers the choices (--help: {fp32,tf32,bf16})
        run_cli(sac.train, sac.SACConfig, args=["--precision", "fp16", "--runs-dir", str(tmp_path)])
    assert refused.value.code == 2 and "fp16" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"^--precision must be one of fp32, tf32, bf16, got 'fp16'\.$"):  # in Python
        sac.train(sac.SACConfig(precision="fp16", runs_dir=str(tmp_path)))
    caught = precision_warnings(monkeypatch, native=False, precisions=("bf16", "bf16"))
    assert len(caught) == 1 and "no native bfloat16" in str(caught[0].message)
    assert not precision_warnings(monkeypatch, native=True, precisions=("bf16", "fp32"))


def precision_warnings(monkeypatch, native: bool, precisions: tuple[str, ...]) -> list:
    """The warnings of check_precision on the CPU for each of `precisions` in turn, on a CPU with or without
    native bfloat16, from a process that has not warned yet."""
    monkeypatch.setattr(training, "native_bf16", lambda device: native)
    monkeypatch.setattr(training, "_warned_emulated_bf16", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for precision in precisions:
            training.check_precision(precision, "cpu")
    return caught


def test_a_gpu_that_only_emulates_bf16_is_not_taken_for_native(monkeypatch):
    """Before Ampere (V100, T4) torch emulates bf16: a bare is_bf16_supported() says True there, and the
    emulated, slow run went unwarned."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert not training.native_bf16("cuda")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)  # Ampere on
    assert training.native_bf16("cuda")


RUN = dict(env_id="InvertedPendulum-v5", total_timesteps=120, learning_starts=100, batch_size=16, hidden_sizes=(16,),
           buffer_size=500, eval_freq=0, eval_episodes=1, checkpoint_freq=120, threads=1, quiet=True)
"""20 updates after 100 random steps"""


@pytest.mark.parametrize("precision, caller, during", [("tf32", "highest", "high"), ("fp32", "high", "highest"),
                                                       ("bf16", "high", "highest")])
@pytest.mark.parametrize("num_seeds", [1, 2])
def test_a_runs_float32_matmul_precision_is_its_own_and_the_callers_comes_back(precision, caller, during, num_seeds,
                                                                                monkeypatch, tmp_path):
    seen = []
    update = sac.SAC.update
    monkeypatch.setattr(sac.SAC, "update", lambda agent, batch: seen.append(torch.get_float32_matmul_precision())
                        or update(agent, batch))
    torch.set_float32_matmul_precision(caller)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (tf32 on a CPU and emulated bf16 say so)
            sac.train(sac.SACConfig(**RUN, precision=precision, num_seeds=num_seeds, runs_dir=str(tmp_path)))
        after = torch.get_float32_matmul_precision()
    finally:
        torch.set_float32_matmul_precision("highest")
    assert seen == [during] * 20 and after == caller


def test_tf32_opens_no_autocast_and_warns_once_where_there_are_no_tensor_cores(monkeypatch):
    def loss(x):
        return x

    assert training.loss_function(loss, "tf32", "cpu") is loss and training.loss_function(loss, "fp32", "cpu") is loss
    with training.matmul_precision("tf32", "cpu"):
        assert torch.nn.functional.linear(torch.randn(2, 3), torch.randn(4, 3)).dtype == torch.float32
    monkeypatch.setattr(training, "_warned_no_tf32", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        training.check_precision("tf32", "cpu")
        training.check_precision("tf32", "cpu")
    assert len(caught) == 1 and str(caught[0].message) == (
        "--precision tf32: TensorFloat-32 tensor cores are NVIDIA GPUs' from Ampere (compute capability 8.0) on; on "
        "this CPU float32 matrix products stay full float32, as with --precision fp32.")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for capability, native in [((7, 5), False), ((8, 0), True), ((9, 0), True)]:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        assert training.native_tf32("cuda") is native and not training.native_tf32("cpu")
