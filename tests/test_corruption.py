"""RIQL's data corruption: each kind changes exactly the chosen fraction of transitions, in its own field only."""

import numpy as np
import pytest
import torch

from keelrl.buffers.corruption import CORRUPTED_FIELD, RANDOM_REWARD_SCALE, corrupt_dataset

N, OBS_DIM, ACTION_DIM = 1000, 3, 2


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(N, OBS_DIM)).astype(np.float32) * np.array([1.0, 5.0, 0.1], np.float32)
    return {
        "observations": obs,
        "actions": rng.uniform(-1, 1, (N, ACTION_DIM)).astype(np.float32),
        "rewards": rng.normal(size=N).astype(np.float32) + 2.0,
        "next_observations": obs + 0.01,
        "terminals": (rng.random(N) < 0.05).astype(np.float32),
        "timeouts": np.zeros(N, np.float32),
    }


def changed_rows(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    return np.flatnonzero((before != after).reshape(len(before), -1).any(axis=1))


@pytest.mark.parametrize("kind", ["obs", "act", "reward", "dynamics"])
@pytest.mark.parametrize("rate", [0.3, 0.05])
def test_random_corruption_changes_the_fraction_and_only_its_field(data, kind, rate):
    corrupted, indices = corrupt_dataset(data, kind, rate, corruption_range=1.0, seed=1)
    field = CORRUPTED_FIELD[kind]
    assert len(indices) == round(rate * N)
    np.testing.assert_array_equal(changed_rows(data[field], corrupted[field]), indices)
    for other in data:
        if other != field:
            np.testing.assert_array_equal(corrupted[other], data[other], err_msg=other)
    assert not np.shares_memory(corrupted[field], data[field])  # the input is left alone
    assert np.all(np.diff(indices) > 0)  # sorted, each transition once
    if kind == "reward":  # rewards are replaced by U(-range, range) * 30
        assert RANDOM_REWARD_SCALE == 30.0
        assert np.abs(corrupted[field][indices]).max() <= RANDOM_REWARD_SCALE
        assert np.abs(corrupted[field][indices]).max() > 10
        unit = corrupted[field][indices].astype(np.float64) / 30.0
    else:  # noise within range * per-dimension std
        bound = data[field].std(axis=0)
        noise = corrupted[field][indices] - data[field][indices]
        assert np.all(np.abs(noise) <= bound * (1 + 1e-5))
        assert np.all(np.abs(noise).max(axis=0) > 0.5 * bound)
        unit = (noise.astype(np.float64) / data[field].std(axis=0).astype(np.float64))
    # the unit noise is U(−1, 1) in every dimension: Kolmogorov–Smirnov distance to its CDF (x + 1) / 2 below
    # the 1% critical value 1.63 / √n, and mean and variance (1/3) within 4 standard errors
    for column in unit.reshape(len(indices), -1).T:
        n, ordered = len(column), np.sort(column)
        cdf = (ordered + 1) / 2
        distance = max((np.arange(1, n + 1) / n - cdf).max(), (cdf - np.arange(n) / n).max())
        assert distance < 1.63 / np.sqrt(n), distance
        assert abs(column.mean()) < 4 * np.sqrt(1 / 3 / n)
        assert abs(column.var() - 1 / 3) < 4 * np.sqrt(4 / 45 / n)  # var of U² − 1/3 is 4/45
    again, _ = corrupt_dataset(data, kind, rate, corruption_range=1.0, seed=1)
    np.testing.assert_array_equal(again[field], corrupted[field])  # same seed, same corruption


def linear_critic():
    weights_obs, weights_act = torch.tensor([1.0, -2.0, 0.5]), torch.tensor([0.3, -1.0])
    return lambda obs, act: obs @ weights_obs + act @ weights_act


@pytest.mark.parametrize("kind", ["obs", "act", "dynamics"])
def test_adversarial_corruption_lowers_q_within_the_bound(data, kind):
    q = linear_critic()
    policy = lambda obs: torch.tanh(obs[:, :ACTION_DIM])  # noqa: E731
    corrupted, indices = corrupt_dataset(data, kind, 0.2, corruption_range=0.5, mode="adversarial", seed=0,
                                         q_function=q, policy=policy, attack_steps=60, step_size=0.05)
    field = CORRUPTED_FIELD[kind]
    np.testing.assert_array_equal(changed_rows(data[field], corrupted[field]), indices)
    for other in set(data) - {field}:
        np.testing.assert_array_equal(corrupted[other], data[other])
    delta = corrupted[field][indices] - data[field][indices]
    assert np.all(np.abs(delta) <= 0.5 * data[field].std(axis=0) * (1 + 1e-5))

    def q_of(d):
        obs = torch.as_tensor(d["next_observations" if kind == "dynamics" else "observations"][indices])
        act = policy(obs) if kind == "dynamics" else torch.as_tensor(d["actions"][indices])
        return q(obs, act).mean().item()

    # a linear critic is minimised at the corner of the box: the attack gets there
    assert q_of(corrupted) < q_of(data) - 0.4 * np.abs(delta).sum(axis=1).mean()
    # exactly there: 60 signed steps of 0.05 · 0.5 cover the box's width 1 from any start, so every δ ends
    # at −0.5 · sign(∂Q/∂x): for obs (and s', where the policy adds 0.3 sech² and −sech² to the first two
    # weights without flipping a sign) the weights (1, −2, 0.5); for actions (0.3, −1)
    corner = np.array([-0.5, 0.5] if kind == "act" else [-0.5, 0.5, -0.5], np.float32)
    expected = data[field][indices] + corner * data[field].std(axis=0)
    np.testing.assert_allclose(corrupted[field][indices], expected, rtol=1e-6, atol=1e-6)


def test_the_adversarial_start_is_riqls(data):
    """Before any step δ is U(−range, range) · std, as RIQL's attack.py samples it (`sample_para`), and the
    perturbation δ · std: within range · std² per dimension, and filling it (observations' stds are 1, 5, 0.1)."""
    corrupted, indices = corrupt_dataset(data, "obs", 0.5, corruption_range=0.5, mode="adversarial", seed=0,
                                         q_function=linear_critic(), attack_steps=0)
    std = data["observations"].std(axis=0)
    start = (corrupted["observations"][indices] - data["observations"][indices]) / std**2  # δ / std, (rows, dim)
    assert np.all(np.abs(start) <= 0.5 * (1 + 1e-4))
    np.testing.assert_allclose(np.abs(start).max(axis=0), 0.5, rtol=0.02)
    np.testing.assert_allclose(np.abs(start).mean(axis=0), 0.25, rtol=0.15)  # uniform: E|U(−0.5, 0.5)| = 0.25


def test_adversarial_reward_flips_and_scales(data):
    corrupted, indices = corrupt_dataset(data, "reward", 0.3, corruption_range=2.0, mode="adversarial", seed=0)
    np.testing.assert_allclose(corrupted["rewards"][indices], -2.0 * data["rewards"][indices])
    assert len(indices) == 300


def test_bad_corruption_options(data):
    with pytest.raises(ValueError, match="Unknown corruption"):
        corrupt_dataset(data, "next_obs", 0.3, 1.0)
    with pytest.raises(ValueError, match="corruption-rate"):
        corrupt_dataset(data, "obs", 1.5, 1.0)
    with pytest.raises(ValueError, match="attack-model"):
        corrupt_dataset(data, "dynamics", 0.3, 1.0, mode="adversarial", q_function=linear_critic())
