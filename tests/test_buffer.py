"""Replay buffer semantics: layout, wrap-around, terminated vs truncated, n-step returns, save/load."""

import numpy as np
import pytest
import torch

from keelrl.buffers import ReplayBuffer, SeedReplay


def add_steps(buffer, steps, num_envs, terminated=None, truncated=None, start=0):
    """Vector step t of env e gets reward 100*t + e and obs filled with the same number."""
    for t in range(start, start + steps):
        tag = np.array([100.0 * t + e for e in range(num_envs)])
        buffer.add(
            obs=np.repeat(tag[:, None], 3, 1),
            actions=np.repeat(tag[:, None], 2, 1),
            rewards=tag,
            next_obs=np.repeat(tag[:, None] + 0.5, 3, 1),
            terminated=np.zeros(num_envs, bool) if terminated is None else terminated(t),
            truncated=np.zeros(num_envs, bool) if truncated is None else truncated(t),
            costs=tag / 10 if buffer.costs is not None else None,
        )


def test_rows_are_env_interleaved_and_samples_only_filled_rows():
    buffer = ReplayBuffer(100, (3,), (2,), num_envs=2)
    add_steps(buffer, 5, 2)
    assert len(buffer) == 10 and buffer.pos == 10
    np.testing.assert_array_equal(buffer.rewards[:4].numpy(), [0, 1, 100, 101])
    batch = buffer.sample(512)
    assert batch.obs.shape == (512, 3) and batch.actions.shape == (512, 2) and batch.rewards.shape == (512,)
    assert set(batch.rewards.tolist()) == {0, 1, 100, 101, 200, 201, 300, 301, 400, 401}
    np.testing.assert_array_equal(batch.obs[:, 0].numpy(), batch.rewards.numpy())
    np.testing.assert_array_equal(batch.next_obs[:, 0].numpy(), batch.rewards.numpy() + 0.5)
    np.testing.assert_allclose(batch.discounts.numpy(), 0.99)
    # uniform over the 10 filled rows: a χ² statistic (9 degrees of freedom) below its 0.1% critical value 27.9
    seeded = ReplayBuffer(100, (3,), (2,), num_envs=2, seed=0)
    add_steps(seeded, 5, 2)
    counts = np.unique(seeded.sample(5000).rewards.numpy(), return_counts=True)[1]
    assert len(counts) == 10 and ((counts - 500) ** 2 / 500).sum() < 27.9


def test_wraps_around_overwriting_the_oldest():
    buffer = ReplayBuffer(7, (3,), (2,), num_envs=2)  # rounded up to 8 rows
    assert buffer.capacity == 8
    add_steps(buffer, 6, 2)
    assert len(buffer) == 8 and buffer.pos == 4
    assert sorted(buffer.rewards.tolist()) == [200, 201, 300, 301, 400, 401, 500, 501]


def test_terminated_is_stored_apart_from_truncated():
    buffer = ReplayBuffer(10, (3,), (2,), num_envs=1)
    add_steps(buffer, 3, 1, terminated=lambda t: np.array([t == 1]), truncated=lambda t: np.array([t == 2]))
    np.testing.assert_array_equal(buffer.terminated[:3].numpy(), [False, True, False])
    np.testing.assert_array_equal(buffer.truncated[:3].numpy(), [False, False, True])
    batch = buffer.sample(300)
    # only the terminated transition (reward 100) stops bootstrapping; the truncated one (200) does not
    np.testing.assert_array_equal(batch.terminated.numpy(), (batch.rewards == 100).float().numpy())


def test_n_step_returns_stop_at_episode_ends_and_newest_data():
    gamma = 0.5
    buffer = ReplayBuffer(100, (3,), (2,), num_envs=2, n_step=3, gamma=gamma)
    # env 0 terminates at step 1; env 1 is truncated at step 2; 5 steps in all
    add_steps(buffer, 5, 2, terminated=lambda t: np.array([t == 1, False]),
              truncated=lambda t: np.array([False, t == 2]))
    batch = buffer._sample_n_step(torch.arange(10))
    r = lambda t, e: 100.0 * t + e  # noqa: E731
    expected = {
        # index: (n-step reward, discount, last step, terminated)
        0: (r(0, 0) + gamma * r(1, 0), gamma**2, 1, 1.0),  # stops at env 0's termination
        1: (r(0, 1) + gamma * r(1, 1) + gamma**2 * r(2, 1), gamma**3, 2, 0.0),  # truncation ends the sum
        2: (r(1, 0), gamma, 1, 1.0),
        4: (r(2, 0) + gamma * r(3, 0) + gamma**2 * r(4, 0), gamma**3, 4, 0.0),
        5: (r(2, 1), gamma, 2, 0.0),  # truncated: bootstrap from its true final obs
        7: (r(3, 1) + gamma * r(4, 1), gamma**2, 4, 0.0),  # only one newer step stored
        8: (r(4, 0), gamma, 4, 0.0),
    }
    for index, (reward, discount, last_step, terminated) in expected.items():
        env = index % 2
        assert batch.rewards[index].item() == pytest.approx(reward), index
        assert batch.discounts[index].item() == pytest.approx(discount), index
        assert batch.next_obs[index, 0].item() == r(last_step, env) + 0.5, index
        assert batch.terminated[index].item() == terminated, index


def test_n_step_does_not_read_past_wrapped_newest_rows():
    buffer = ReplayBuffer(4, (3,), (2,), num_envs=1, n_step=3, gamma=0.5)
    add_steps(buffer, 6, 1)  # rows now hold steps [4, 5, 2, 3]; the newest is step 5 at row 1
    batch = buffer._sample_n_step(torch.tensor([1, 3]))
    assert batch.rewards[0].item() == 500.0  # nothing newer than step 5
    assert batch.rewards[1].item() == pytest.approx(300 + 0.5 * 400 + 0.25 * 500)


def test_costs_are_stored_and_required():
    buffer = ReplayBuffer(10, (3,), (2,), store_cost=True)
    add_steps(buffer, 3, 1)
    batch = buffer.sample(50)
    np.testing.assert_allclose(batch.costs.numpy(), batch.rewards.numpy() / 10, rtol=1e-6)
    with pytest.raises(ValueError, match="costs"):
        buffer.add(np.zeros((1, 3)), np.zeros((1, 2)), [0.0], np.zeros((1, 3)), [False], [False])


def test_save_load_round_trip_continues_the_same_samples(tmp_path):
    buffer = ReplayBuffer(50, (3,), (2,), num_envs=2, store_cost=True, seed=3)
    add_steps(buffer, 30, 2)  # wrapped
    buffer.sample(8)
    buffer.save(tmp_path / "buffer.pt")
    expected = buffer.sample(64)
    restored = ReplayBuffer(50, (3,), (2,), num_envs=2, store_cost=True, seed=99)
    restored.load(tmp_path / "buffer.pt")
    assert (restored.pos, restored.size) == (buffer.pos, buffer.size)
    got = restored.sample(64)
    for name in expected._fields:
        torch.testing.assert_close(getattr(got, name), getattr(expected, name))
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(60, (3,), (2,), num_envs=2, store_cost=True).load(tmp_path / "buffer.pt")


def test_saved_file_holds_the_filled_rows_not_the_capacity(tmp_path):
    """A run checkpoints early and often: 10 transitions in a 100k buffer must not write 100k rows (torch.save of a
    slice view writes its whole storage)."""
    buffer = ReplayBuffer(100_000, (3,), (2,), store_cost=True)
    add_steps(buffer, 10, 1)
    buffer.save(tmp_path / "buffer.pt")
    full_capacity_bytes = 100_000 * (3 + 3 + 2 + 1 + 1) * 4
    assert (tmp_path / "buffer.pt").stat().st_size < full_capacity_bytes / 100


def test_bad_arguments():
    with pytest.raises(ValueError):
        ReplayBuffer(0, (3,), (2,))
    with pytest.raises(ValueError):
        ReplayBuffer(10, (3,), (2,), n_step=0)
    with pytest.raises(ValueError, match="empty"):
        ReplayBuffer(10, (3,), (2,)).sample(4)


def test_fields_of_any_shape_land_in_their_rows_and_a_wrong_shape_is_refused():
    """add() packs a step's fields side by side (one copy to a GPU) and splits them back into their storage: obs of
    shape (2, 3), flags given as bools or as 0/1 floats. A field of the wrong size is named, and nothing is stored."""
    buffer = ReplayBuffer(8, (2, 3), (2,), num_envs=2)
    obs = np.arange(12.0).reshape(2, 2, 3)
    buffer.add(obs, [[1, 2], [3, 4]], [5.0, 6.0], obs + 100, [True, False], np.array([0.0, 1.0]))
    np.testing.assert_array_equal(buffer.obs[:2].numpy(), obs)
    np.testing.assert_array_equal(buffer.next_obs[:2].numpy(), obs + 100)
    np.testing.assert_array_equal(buffer.actions[:2].numpy(), [[1, 2], [3, 4]])
    np.testing.assert_array_equal(buffer.rewards[:2].numpy(), [5, 6])
    assert buffer.terminated[:2].tolist() == [True, False] and buffer.truncated[:2].tolist() == [False, True]
    with pytest.raises(ValueError, match=r"next_obs has shape \(2, 5\); this buffer stores \(2, 2, 3\) per vector"):
        buffer.add(obs, [[1, 2], [3, 4]], [5.0, 6.0], np.zeros((2, 5)), [True, False], [False, False])
    assert len(buffer) == 2 and buffer.pos == 2


def test_a_seed_group_adds_each_seed_its_own_step():
    """SeedReplay.add packs the S seeds' steps (S, num_envs, ...) at once: each seed's buffer holds what its own adds
    would have stored."""
    group = SeedReplay([ReplayBuffer(10, (3,), (2,), num_envs=2, store_cost=True, seed=s) for s in range(3)])
    singles = [ReplayBuffer(10, (3,), (2,), num_envs=2, store_cost=True, seed=s) for s in range(3)]
    rng = np.random.default_rng(0)
    for _ in range(7):  # wrapped
        step = (rng.normal(size=(3, 2, 3)), rng.normal(size=(3, 2, 2)), rng.normal(size=(3, 2)),
                rng.normal(size=(3, 2, 3)), rng.random((3, 2)) < 0.5, rng.random((3, 2)) < 0.5, rng.random((3, 2)))
        group.add(*step)
        for i, single in enumerate(singles):
            single.add(*(field[i] for field in step))
    for grouped, single in zip(group.buffers, singles, strict=True):
        assert (grouped.pos, grouped.size) == (single.pos, single.size) == (4, 10)
        for name in ReplayBuffer.FIELDS:
            torch.testing.assert_close(getattr(grouped, name), getattr(single, name), rtol=0, atol=0)
    assert not torch.equal(group.buffers[0].obs, group.buffers[1].obs)


def test_a_packed_step_written_as_a_tensor_stores_what_the_numpy_path_stores():
    """A buffer on a GPU writes the packed step as a tensor on its device, one on the CPU through numpy views of its
    storage: the tensor path, run here on the CPU, stores the same rows (obs of shape (2, 2), flags, costs)."""
    through_numpy = ReplayBuffer(6, (2, 2), (1,), num_envs=2, store_cost=True)
    through_tensor = ReplayBuffer(6, (2, 2), (1,), num_envs=2, store_cost=True)
    rng = np.random.default_rng(1)
    for _ in range(4):  # wrapped
        step = (rng.normal(size=(2, 2, 2)), rng.normal(size=(2, 1)), rng.normal(size=2), rng.normal(size=(2, 2, 2)),
                rng.random(2) < 0.5, rng.random(2) < 0.5, rng.random(2))
        through_numpy.add(*step)
        through_tensor.write(torch.from_numpy(through_tensor.pack(*step)))
    for name in ReplayBuffer.FIELDS:
        torch.testing.assert_close(getattr(through_tensor, name), getattr(through_numpy, name), rtol=0, atol=0)
    assert through_numpy.terminated.any() and not through_numpy.terminated.all()
