"""Data provenance: every value an agent trains on comes from the right row and the right field.

Datasets here encode their own coordinates: field f of row i, column j holds 1000·i + 10·f + j
(observations f = 0, actions 1, next_observations 2, rewards 3), and `terminals` / `timeouts` follow two
disjoint known patterns. The data goes through the real loading paths (.npz, .hdf5, D4RL's raw layout,
a Minari dataset written by `write_minari_dataset`), the `DatasetBuffer`, the online `ReplayBuffer` fed by
keelrl's vector env, and the corruption the offline loop applies (`prepare_dataset`, then a real `train`
run whose `update` is spied on); each sampled field is decoded back to (row, field).
"""

from __future__ import annotations

import gymnasium as gym
import h5py
import numpy as np
import pytest

import keelrl.buffers.offline as offline_data
from keelrl.agents.iql import IQL, IQLConfig
from keelrl.agents.iql import train as train_iql
from keelrl.buffers import ReplayBuffer
from keelrl.buffers.offline import D4RL_KEYS, DatasetBuffer, load_dataset, load_dataset_with_info, write_minari_dataset
from keelrl.envs import make_vec_env

N, OBS_DIM, ACTION_DIM = 40, 4, 1  # InvertedPendulum-v5's dimensions, so the agent can train on it
FIELD_ID = {"observations": 0, "actions": 1, "next_observations": 2, "rewards": 3}
TERMINAL_ROWS = np.arange(N) % 6 == 2
TIMEOUT_ROWS = np.arange(N) % 6 == 4
SAMPLES = 512  # from 40 rows: every row is drawn (checked)


def encoded(field: str, rows: np.ndarray, width: int) -> np.ndarray:
    """The value field `field` of row i, column j carries: 1000·i + 10·field_id + j."""
    return (1000.0 * rows[:, None] + 10 * FIELD_ID[field] + np.arange(width)[None, :]).astype(np.float32)


def encoded_dataset() -> dict[str, np.ndarray]:
    rows = np.arange(N)
    return {
        "observations": encoded("observations", rows, OBS_DIM),
        "actions": encoded("actions", rows, ACTION_DIM),
        "rewards": encoded("rewards", rows, 1)[:, 0],
        "next_observations": encoded("next_observations", rows, OBS_DIM),
        "terminals": TERMINAL_ROWS.astype(np.float32),
        "timeouts": TIMEOUT_ROWS.astype(np.float32),
    }


def decode(values) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, field id, column) of encoded values."""
    values = np.rint(np.asarray(values, dtype=np.float64)).astype(np.int64)
    return values // 1000, values % 1000 // 10, values % 10


def rows_of(batch_values, field: str) -> np.ndarray:
    """The single row every column of each sampled entry of `field` decodes to (and checks field and column)."""
    values = np.asarray(batch_values).reshape(len(batch_values), -1)
    row, field_id, column = decode(values)
    assert np.all(field_id == FIELD_ID[field]), f"{field}: values of field ids {np.unique(field_id)}"
    assert np.all(column == np.arange(values.shape[1])[None, :]), f"{field}: columns out of order"
    assert np.all(row == row[:, :1]), f"{field}: one entry mixes rows"
    return row[:, 0]


def assert_batch_from_rows(batch, terminals: np.ndarray, next_obs_of_row) -> np.ndarray:
    """Every field of every sampled transition comes from the same dataset row; returns the rows."""
    row = rows_of(batch.obs.numpy(), "observations")
    np.testing.assert_array_equal(rows_of(batch.actions.numpy(), "actions"), row)
    np.testing.assert_array_equal(rows_of(batch.rewards.numpy(), "rewards"), row)
    np.testing.assert_array_equal(batch.next_obs.numpy(), next_obs_of_row(row))
    # `terminated` is the row's `terminals` flag, never its `timeouts` flag
    np.testing.assert_array_equal(batch.terminated.numpy(), terminals[row].astype(np.float32))
    return row


@pytest.fixture
def npz_path(tmp_path):
    path = tmp_path / "encoded.npz"
    np.savez(path, **encoded_dataset())
    return path


@pytest.mark.parametrize("suffix", ["npz", "hdf5"])
def test_d4rl_file_rows_and_fields_reach_the_batch_unmixed(tmp_path, suffix):
    data = encoded_dataset()
    path = tmp_path / f"encoded.{suffix}"
    if suffix == "npz":
        np.savez(path, **data)
    else:
        with h5py.File(path, "w") as file:
            for key, value in data.items():
                file.create_dataset(key, data=value)
    loaded = load_dataset(path)
    assert set(loaded) == set(D4RL_KEYS)
    for key in D4RL_KEYS:
        np.testing.assert_array_equal(loaded[key], data[key], err_msg=key)
    batch = DatasetBuffer(loaded, gamma=0.9, seed=0).sample(SAMPLES)
    rows = assert_batch_from_rows(batch, TERMINAL_ROWS, lambda row: encoded("next_observations", row, OBS_DIM))
    assert set(rows) == set(range(N))  # every row (so every terminal and timeout row) was drawn
    assert batch.terminated[TIMEOUT_ROWS[rows]].sum() == 0 and batch.terminated[TERMINAL_ROWS[rows]].min() == 1


def test_d4rl_raw_file_takes_next_observation_from_the_following_row(tmp_path):
    """D4RL's own files have no next_observations: row i's comes from row i + 1, and time-limit rows go."""
    data = encoded_dataset()
    del data["next_observations"]
    np.savez(tmp_path / "raw.npz", **data)
    loaded = load_dataset(tmp_path / "raw.npz")
    kept = np.flatnonzero(~TIMEOUT_ROWS[:-1])  # timeout rows and the last row have no next observation
    np.testing.assert_array_equal(rows_of(loaded["observations"], "observations"), kept)
    batch = DatasetBuffer(loaded, seed=1).sample(SAMPLES)
    rows = assert_batch_from_rows(batch, TERMINAL_ROWS, lambda row: encoded("observations", row + 1, OBS_DIM))
    assert set(rows) == set(kept)


def minari_encoded_dataset() -> dict[str, np.ndarray]:
    """Contiguous episodes (Minari stores observation sequences): next_observations[i] = observations[i + 1]
    inside an episode; an episode's last row ends with its own final observation 1000·i + 20 + j."""
    data = encoded_dataset()
    ends = TERMINAL_ROWS | TIMEOUT_ROWS
    ends[-1] = True
    data["timeouts"][-1] = 1.0  # the last episode is cut by the end of the data: a timeout, as Minari reads it
    following = np.concatenate([data["observations"][1:], data["observations"][-1:]])
    data["next_observations"] = np.where(ends[:, None], data["next_observations"], following)
    return data


def test_minari_dataset_rows_and_fields_reach_the_batch_unmixed(tmp_path):
    data = minari_encoded_dataset()
    write_minari_dataset("keelrl/provenance-test-v0", data, "InvertedPendulum-v5", tmp_path)
    loaded, info = load_dataset_with_info("keelrl/provenance-test-v0", data_path=tmp_path)
    assert info.env_id == "InvertedPendulum-v5"
    for key in D4RL_KEYS:
        np.testing.assert_array_equal(loaded[key], data[key], err_msg=key)
    terminals, timeouts = loaded["terminals"] > 0, loaded["timeouts"] > 0
    np.testing.assert_array_equal(terminals, TERMINAL_ROWS)
    np.testing.assert_array_equal(np.flatnonzero(timeouts), np.flatnonzero(TIMEOUT_ROWS).tolist() + [N - 1])
    ends = terminals | timeouts

    def next_obs_of_row(row):  # an episode's last row: its final observation; otherwise the following row
        final = encoded("next_observations", row, OBS_DIM)
        return np.where(ends[row][:, None], final, encoded("observations", np.minimum(row + 1, N - 1), OBS_DIM))

    batch = DatasetBuffer(loaded, seed=2).sample(SAMPLES)
    rows = assert_batch_from_rows(batch, TERMINAL_ROWS, next_obs_of_row)
    assert set(rows) == set(range(N))


# ---------------------------------------------------------------------------------------------------
# the online replay buffer, fed by keelrl's vector env as the off-policy loop feeds it

BASE_SEED = 50
TIME_LIMIT = 4


class EncodedEnv(gym.Env):
    """Observation [100000·env + 100·count, 10·step + kind]: `count` numbers the env's observations, `step`
    the steps into the episode, kind 0 after a reset and 1 after a step. Reward = action + 20.
    Env 0 never terminates (every episode is truncated by the time limit), env 1 terminates at step 3,
    env 2 terminates at step 4, on the time limit's own step (terminated and truncated together)."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Box(-1e7, 1e7, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.env_index, self.count = seed - BASE_SEED, 0
        else:
            self.count += 1
        self.step_in_episode = 0
        return self._obs(kind=0), {}

    def step(self, action):
        self.count += 1
        self.step_in_episode += 1
        terminated = (self.env_index, self.step_in_episode) in ((1, 3), (2, 4))
        return self._obs(kind=1), float(action[0]) + 20.0, terminated, False, {}

    def _obs(self, kind: int) -> np.ndarray:
        return np.array([100000 * self.env_index + 100 * self.count, 10 * self.step_in_episode + kind], np.float32)


gym.register("keelrl_provenance/Encoded-v0", entry_point=EncodedEnv, max_episode_steps=TIME_LIMIT,
             disable_env_checker=True)


def expected_flags(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(terminated, truncated) of the transition taken from each observation, from the env's rules."""
    env, step = obs[:, 0] // 100000, obs[:, 1] // 10 + 1
    terminated = ((env == 1) & (step == 3)) | ((env == 2) & (step == 4))
    return terminated, step == TIME_LIMIT


def test_replay_buffer_keeps_each_transition_whole_and_truncation_apart():
    num_envs, steps = 3, 20
    env = make_vec_env("keelrl_provenance/Encoded-v0", num_envs=num_envs, seed=BASE_SEED)
    buffer = ReplayBuffer(num_envs * steps, (2,), (1,), num_envs=num_envs, seed=0)
    obs, _ = env.reset()
    for _ in range(steps):
        actions = obs[:, :1] + 7.0  # the action names the observation it was taken in
        next_obs, rewards, terminated, truncated, info = env.step(actions)
        buffer.add(obs, actions, rewards, info["final_obs"], terminated, truncated)  # as agents/sac.py's loop
        done = terminated | truncated
        assert np.all(next_obs[done, 1] == 0) and np.all(next_obs[~done, 1] % 10 == 1)  # same-step autoreset
        obs = next_obs
    env.close()
    # the stored flags: terminated and truncated each from the env's rules, kept apart
    stored_obs = buffer.obs[: len(buffer)].numpy()
    terminated, truncated = expected_flags(stored_obs)
    np.testing.assert_array_equal(buffer.terminated[: len(buffer)].numpy(), terminated)
    np.testing.assert_array_equal(buffer.truncated[: len(buffer)].numpy(), truncated)
    assert (truncated & ~terminated).any() and (terminated & ~truncated).any() and (terminated & truncated).any()
    # every sampled field comes from the one transition its observation names
    batch = buffer.sample(512)
    obs_b = batch.obs.numpy()
    np.testing.assert_array_equal(batch.actions.numpy()[:, 0], obs_b[:, 0] + 7)
    np.testing.assert_array_equal(batch.rewards.numpy(), obs_b[:, 0] + 27)
    # next observation: the same env's next one, a step's (kind 1) even where the episode ended, never the reset's
    np.testing.assert_array_equal(batch.next_obs.numpy()[:, 0], obs_b[:, 0] + 100)
    np.testing.assert_array_equal(batch.next_obs.numpy()[:, 1], obs_b[:, 1] - obs_b[:, 1] % 10 + 11)
    terminated_b, truncated_b = expected_flags(obs_b)
    np.testing.assert_array_equal(batch.terminated.numpy(), terminated_b.astype(np.float32))
    assert (truncated_b & ~terminated_b).any() and set(np.unique(obs_b[:, 0])) == set(np.unique(stored_obs[:, 0]))


# ---------------------------------------------------------------------------------------------------
# corruption: what the offline loop trains on

RATE, RANGE = 0.25, 0.02  # a small range keeps each corrupted value within ±231 of its own row's (rows are 1000 apart)
CORRUPTED = {"obs": "observations", "act": "actions", "reward": "rewards", "dynamics": "next_observations"}


def spy_on_corruption(monkeypatch) -> list:
    """Record what the loop's corrupt_dataset call returned (data, reported indices)."""
    calls, corrupt = [], offline_data.corrupt_dataset

    def spy(*args, **kwargs):
        calls.append(corrupt(*args, **kwargs))
        return calls[-1]

    monkeypatch.setattr(offline_data, "corrupt_dataset", spy)
    return calls


def assert_corruption_as_documented(clean: dict, corrupted: dict, kind: str, reported: np.ndarray) -> None:
    field = CORRUPTED[kind]
    for key in D4RL_KEYS:
        if key != field:
            np.testing.assert_array_equal(corrupted[key], clean[key], err_msg=f"{kind} changed {key}")
    before, after = clean[field].reshape(N, -1), corrupted[field].reshape(N, -1)
    changed = np.flatnonzero((before != after).any(axis=1))
    assert len(changed) == round(RATE * N)
    np.testing.assert_array_equal(changed, np.sort(reported))  # the rows it reports are the rows it changed
    if kind == "reward":  # replaced by U(−range, range)·30
        assert np.all(np.abs(after[changed]) <= RANGE * 30 * (1 + 1e-6))
    else:  # moved by U(−range, range)·std per dimension, std of the clean field over the dataset
        bound = RANGE * before.std(axis=0)
        assert np.all(np.abs(after[changed] - before[changed]) <= bound * (1 + 1e-5))
        assert np.all(np.abs(after[changed] - before[changed]).max(axis=0) > 0.2 * bound)


@pytest.mark.parametrize("kind", list(CORRUPTED))
def test_prepare_dataset_corrupts_exactly_the_reported_rows_of_one_field(kind, npz_path, monkeypatch):
    calls = spy_on_corruption(monkeypatch)
    config = IQLConfig(dataset=str(npz_path), env_id="InvertedPendulum-v5", corruption=kind, corruption_rate=RATE,
                       corruption_range=RANGE, seed=7, normalize_obs=False)
    data, summary = offline_data.prepare_dataset(config, config.seed)
    assert len(calls) == 1
    assert_corruption_as_documented(encoded_dataset(), data, kind, calls[0][1])
    for key in D4RL_KEYS:  # what the loop trains on is what the corruption returned
        np.testing.assert_array_equal(data[key], calls[0][0][key])
    assert summary["corruption"]["corrupted_transitions"] == round(RATE * N) and summary["transitions"] == N


@pytest.mark.parametrize("kind", list(CORRUPTED))
def test_the_agent_updates_on_the_corrupted_values(kind, npz_path, tmp_path, monkeypatch):
    """One real `train` update: the batch `update` receives (observations not normalised) holds the corrupted
    rows' corrupted values, every other value clean, each from its own row."""
    calls, batches = spy_on_corruption(monkeypatch), []
    update = IQL.update

    def spy_update(self, batch):
        batches.append(batch)
        return update(self, batch)

    monkeypatch.setattr(IQL, "update", spy_update)
    config = IQLConfig(dataset=str(npz_path), env_id="InvertedPendulum-v5", corruption=kind, corruption_rate=RATE,
                       corruption_range=RANGE, seed=3, normalize_obs=False, total_updates=1, batch_size=SAMPLES,
                       hidden_sizes=(8, 8), eval_freq=0, eval_episodes=1, runs_dir=str(tmp_path), quiet=True)
    train_iql(config)
    (batch,) = batches
    (corrupted, reported), clean = calls[0], encoded_dataset()
    assert_corruption_as_documented(clean, corrupted, kind, reported)
    # the row of each sample, read from a field this corruption leaves alone
    row = rows_of(batch.actions.numpy(), "actions") if kind == "obs" else rows_of(batch.obs.numpy(), "observations")
    assert set(row) == set(range(N))
    fields = {"observations": batch.obs, "actions": batch.actions, "rewards": batch.rewards,
              "next_observations": batch.next_obs, "terminals": batch.terminated}
    for key, values in fields.items():
        np.testing.assert_array_equal(values.numpy(), corrupted[key][row], err_msg=key)
    field = CORRUPTED[kind]
    hit = np.isin(row, reported)
    assert hit.any() and (~hit).any()
    sampled = fields[field].numpy().reshape(len(row), -1)
    assert np.all((sampled[hit] != clean[field][row[hit]].reshape(hit.sum(), -1)).any(axis=1))
    np.testing.assert_array_equal(sampled[~hit], clean[field][row[~hit]].reshape((~hit).sum(), -1))
    np.testing.assert_array_equal(batch.terminated.numpy(), TERMINAL_ROWS[row].astype(np.float32))
