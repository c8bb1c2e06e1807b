"""Offline datasets: D4RL layout round trips through Minari, timeouts vs terminals, normalised scores,
the dataset buffer, make_datasets at a tiny scale, and clear errors for bad input."""

import csv
import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from keelrl.benchmarks.make_datasets import collect, main, replay_buffer_dataset
from keelrl.buffers import ReplayBuffer
from keelrl.buffers.offline import (
    D4RL_KEYS,
    DatasetBuffer,
    DatasetInfo,
    check_env_matches,
    episode_ends,
    episode_returns,
    load_dataset,
    load_dataset_with_info,
    normalized_score,
    reference_scores,
    returns_to_go,
    write_minari_dataset,
)


def random_policy(obs):
    return np.random.default_rng(len(obs)).uniform(-1, 1, (len(obs), 1)).astype(np.float32)


def collect_by_hand(env_id: str, policy, vector_steps: int, num_envs: int, seed: int) -> dict[str, np.ndarray]:
    """The D4RL layout of `num_envs` single gymnasium envs stepped in lockstep by hand: env e seeded seed + e,
    reset (unseeded) right after an episode ends, `policy` called on the stacked observations each step;
    env-major rows, the last row of each env's stream marked a timeout unless terminal."""
    envs = [gym.make(env_id) for _ in range(num_envs)]
    obs = [env.reset(seed=seed + e)[0] for e, env in enumerate(envs)]
    rows = [[] for _ in range(num_envs)]
    for _ in range(vector_steps):
        actions = policy(np.stack(obs))
        for e, env in enumerate(envs):
            next_obs, reward, terminated, truncated, _ = env.step(actions[e])
            rows[e].append((obs[e], actions[e], reward, next_obs, terminated, truncated and not terminated))
            obs[e] = env.reset()[0] if terminated or truncated else next_obs
    columns = {key: np.array([row[i] for stream in rows for row in stream], np.float32)
               for i, key in enumerate(("observations", "actions", "rewards", "next_observations", "terminals",
                                        "timeouts"))}
    ends = np.arange(1, num_envs + 1) * vector_steps - 1
    columns["timeouts"][ends] = 1.0 - columns["terminals"][ends]
    return columns


@pytest.fixture
def pendulum_data():
    """300 InvertedPendulum transitions from 3 envs: short terminal episodes, cut streams marked as timeouts."""
    return collect("InvertedPendulum-v5", random_policy, 300, num_envs=3, seed=0)


def test_collect_layout_episodes_are_contiguous(pendulum_data):
    data = pendulum_data
    assert set(data) == set(D4RL_KEYS) and all(v.dtype == np.float32 for v in data.values())
    assert data["observations"].shape == (300, 4) and data["actions"].shape == (300, 1)
    ends = (data["terminals"] > 0) | (data["timeouts"] > 0)
    assert not np.any((data["terminals"] > 0) & (data["timeouts"] > 0))
    inside = ~ends[:-1]
    assert np.array_equal(data["next_observations"][:-1][inside], data["observations"][1:][inside])
    assert data["timeouts"][[99, 199, 299]].sum() + data["terminals"][[99, 199, 299]].sum() == 3  # each stream closes
    # every column against three single envs stepped by hand (random_policy draws the same 3 actions each step)
    by_hand = collect_by_hand("InvertedPendulum-v5", random_policy, 100, num_envs=3, seed=0)
    for key in D4RL_KEYS:
        np.testing.assert_array_equal(data[key], by_hand[key], err_msg=key)
    # InvertedPendulum-v5: reward 1, but 0 on the step the pole passes 0.2 rad, which terminates
    terminal = data["terminals"] > 0
    assert terminal.sum() > 10
    np.testing.assert_array_equal(data["rewards"], 1.0 - data["terminals"])
    assert (np.abs(data["next_observations"][terminal, 1]) > 0.2).all()
    assert (np.abs(data["next_observations"][~terminal, 1]) <= 0.2).all()


def test_keelrl_writer_round_trip(tmp_path, pendulum_data):
    path = write_minari_dataset("keelrl/pendulum-test-v0", pendulum_data, "InvertedPendulum-v5", tmp_path,
                                ref_min_score=1.0, ref_max_score=11.0)
    for source in ("keelrl/pendulum-test-v0", path):
        data, info = load_dataset_with_info(source, data_path=tmp_path)
        for key in D4RL_KEYS:
            np.testing.assert_array_equal(data[key], pendulum_data[key], err_msg=key)
        assert info.env_id == "InvertedPendulum-v5" and (info.ref_min_score, info.ref_max_score) == (1.0, 11.0)
    assert reference_scores(info) == (1.0, 11.0)
    assert normalized_score(6.0, *reference_scores(info)) == pytest.approx(50.0)


@pytest.mark.parametrize("root", ["rel/data", "~/data"])
@pytest.mark.parametrize("given", ["argument", "environment"])
def test_a_relative_data_path_is_written_and_read_where_it_points(root, given, tmp_path, pendulum_data, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "rel"))  # ~/data (not expanded by a shell: --data-path=~/data, TOML)
    if given == "environment":
        monkeypatch.setenv("MINARI_DATASETS_PATH", root)
    data_path = root if given == "argument" else None
    path = write_minari_dataset("keelrl/pendulum-test-v0", pendulum_data, "InvertedPendulum-v5", data_path)
    # Minari given a relative root writes under rel/data/keelrl/pendulum-test-v0/data/rel/data/... and fails
    assert path == tmp_path / "rel/data/keelrl/pendulum-test-v0"
    assert (path / "data" / "main_data.hdf5").is_file()
    np.testing.assert_array_equal(load_dataset("keelrl/pendulum-test-v0", data_path)["rewards"],
                                  pendulum_data["rewards"])


def hand_made_episodes(num_episodes=4, max_steps=25):
    """Pendulum-v1 stepped by hand with a 25-step limit (every episode ends by truncation), as Minari buffers."""
    from minari.data_collector import EpisodeBuffer

    env = gym.make("Pendulum-v1", max_episode_steps=max_steps)
    rng = np.random.default_rng(0)
    episodes, expected = [], {key: [] for key in D4RL_KEYS}
    for i in range(num_episodes):
        obs, _ = env.reset(seed=i)
        observations, actions, rewards, terms, truncs = [obs], [], [], [], []
        done = False
        while not done:
            action = rng.uniform(-2, 2, (1,)).astype(np.float32)
            obs, reward, terminated, truncated, _ = env.step(action)
            observations.append(obs), actions.append(action), rewards.append(reward)
            terms.append(terminated), truncs.append(truncated)
            done = terminated or truncated
        episodes.append(EpisodeBuffer(id=i, observations=np.array(observations), actions=np.array(actions),
                                      rewards=np.array(rewards), terminations=np.array(terms),
                                      truncations=np.array(truncs), infos={}))
        observations = np.array(observations, dtype=np.float32)
        expected["observations"].append(observations[:-1])
        expected["next_observations"].append(observations[1:])
        expected["actions"].append(np.array(actions))
        expected["rewards"].append(np.array(rewards))
        expected["terminals"].append(np.array(terms))
        expected["timeouts"].append(np.array(truncs))
    return episodes, {key: np.concatenate(parts).astype(np.float32) for key, parts in expected.items()}


def test_dataset_written_by_minari_api_loads_and_timeouts_are_handled(tmp_path, monkeypatch):
    import minari

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    episodes, expected = hand_made_episodes()
    minari.create_dataset_from_buffers("test/pendulum-v0", episodes, env="Pendulum-v1", algorithm_name="random",
                                       author="test", author_email="t@example.com", code_permalink="none",
                                       eval_env="Pendulum-v1", description="hand-made", ref_min_score=-1500.0,
                                       ref_max_score=-150.0)
    data = load_dataset("test/pendulum-v0")  # found through MINARI_DATASETS_PATH
    for key in D4RL_KEYS:
        np.testing.assert_allclose(data[key], expected[key], rtol=1e-6, err_msg=key)
    # every episode ends by the time limit: 4 timeouts, no terminal, and the final observation is kept
    assert data["timeouts"].sum() == 4 and data["terminals"].sum() == 0 and len(data["rewards"]) == 100
    dropped = load_dataset("test/pendulum-v0", drop_timeout_transitions=True)  # D4RL's qlearning_dataset
    assert len(dropped["rewards"]) == 96 and dropped["timeouts"].sum() == 0
    np.testing.assert_array_equal(dropped["observations"], data["observations"][data["timeouts"] == 0])
    np.testing.assert_allclose(episode_returns(data), expected["rewards"].reshape(4, 25).sum(1), rtol=1e-6)


def test_d4rl_raw_file_without_next_observations(tmp_path):
    """D4RL's own files: next observation = following row, time-limit ends dropped as qlearning_dataset does."""
    obs = np.arange(12, dtype=np.float32).reshape(6, 2)
    raw = dict(observations=obs, actions=np.zeros((6, 1)), rewards=np.arange(6.0),
               terminals=np.array([0, 1, 0, 0, 0, 0]), timeouts=np.array([0, 0, 0, 1, 0, 0]))
    np.savez(tmp_path / "raw.npz", **raw)
    data = load_dataset(tmp_path / "raw.npz")
    np.testing.assert_array_equal(data["rewards"], [0, 1, 2, 4])  # row 3 (timeout) and the last row go
    np.testing.assert_array_equal(data["next_observations"], obs[[1, 2, 3, 5]])


def time_limit_stream(num_episodes=3, length=4):
    """D4RL's raw layout of `num_episodes` time-limit episodes of `length` steps (no next_observations):
    observation rows count up and restart at each episode, reward of step t of episode e is 10·e + t."""
    observations = np.concatenate([np.arange(length, dtype=np.float32) + 100 * e for e in range(num_episodes)])
    rewards = np.concatenate([10.0 * e + np.arange(length) for e in range(num_episodes)])
    timeouts = np.tile(np.eye(length)[-1], num_episodes)
    return dict(observations=observations[:, None], actions=np.zeros((len(rewards), 1)), rewards=rewards,
                terminals=np.zeros(len(rewards)), timeouts=timeouts)


def test_episode_returns_split_time_limit_episodes_whose_timeout_rows_were_dropped(tmp_path):
    """D4RL's qlearning_dataset (and drop_timeout_transitions) removes each time-limit episode's last row,
    so no flag is left: the episodes must still end where the next row starts another one."""
    np.savez(tmp_path / "raw.npz", **time_limit_stream())
    data = load_dataset(tmp_path / "raw.npz")
    assert data["timeouts"].sum() == 0 and data["terminals"].sum() == 0 and len(data["rewards"]) == 9
    # each episode keeps steps 0..2 (step 3 had the timeout); the last one also loses its last row (no next obs)
    np.testing.assert_allclose(episode_returns(data), [0 + 1 + 2, 10 + 11 + 12, 20 + 21 + 22])
    np.testing.assert_array_equal(np.flatnonzero(episode_ends(data)), [2, 5, 8])


def test_episode_ends_cut_at_the_time_limit_when_nothing_else_tells():
    """CORL's return_reward_range rule: without flags or a break in the observations, an episode ends
    after max_episode_steps rows."""
    stream = np.arange(8, dtype=np.float32)[:, None]
    data = dict(observations=stream[:-1], next_observations=stream[1:], rewards=np.arange(7.0),
                terminals=np.zeros(7), timeouts=np.zeros(7))
    np.testing.assert_array_equal(np.flatnonzero(episode_ends(data, max_episode_steps=3)), [2, 5, 6])
    np.testing.assert_allclose(episode_returns(data, episode_ends(data, 3)), [3.0, 12.0, 6.0])
    np.testing.assert_allclose(episode_returns(data), [21.0])  # one unbroken stream without a limit


def test_reward_normalisation_of_time_limit_data_with_timeout_rows_dropped(tmp_path):
    """All-timeout data used to become one episode (normalisation refused); now scale = 1000 / (max − min)."""
    from keelrl.buffers.offline import normalize_rewards

    np.savez(tmp_path / "raw.npz", **time_limit_stream())
    data = load_dataset(tmp_path / "raw.npz")
    scaled, scale = normalize_rewards(data, episode_ends(data))
    assert scale == pytest.approx(1000 / (63 - 3))
    np.testing.assert_allclose(scaled["rewards"], data["rewards"] * 1000 / 60, rtol=1e-6)


def test_normalised_score_formula_and_d4rl_fallback():
    info = DatasetInfo("file.npz", None, None, None)
    assert reference_scores(info) is None
    refs = reference_scores(info, "Hopper-v5")
    assert refs == (-20.272305, 3234.3)
    np.testing.assert_allclose(normalized_score([-20.272305, 3234.3, (3234.3 - 20.272305) / 2], *refs), [0, 100, 50])
    assert reference_scores(DatasetInfo("x", "Walker2d-v4", None, None)) == (1.629008, 4592.3)


def test_dataset_buffer_samples_like_the_replay_buffer(pendulum_data):
    buffer = DatasetBuffer(pendulum_data, gamma=0.9, seed=3)
    batch = buffer.sample(64)
    assert batch.obs.shape == (64, 4) and batch.actions.shape == (64, 1) and batch.rewards.shape == (64,)
    assert torch.all(batch.discounts == 0.9) and set(batch.terminated.unique().tolist()) <= {0.0, 1.0}
    again = DatasetBuffer(pendulum_data, gamma=0.9, seed=3).sample(64)
    assert torch.equal(batch.obs, again.obs)
    # every sampled row is a stored transition, whole: its reward, next observation and terminal flag (the
    # timeouts do not stop bootstrapping) are those of the row its observation and action come from
    rows = {tuple(row): i for i, row in
            enumerate(np.concatenate([pendulum_data["observations"], pendulum_data["actions"]], 1))}
    assert len(rows) == 300  # (observation, action) identifies a row
    index = np.array([rows[tuple(row)] for row in torch.cat([batch.obs, batch.actions], 1).numpy()])
    np.testing.assert_array_equal(batch.rewards.numpy(), pendulum_data["rewards"][index])
    np.testing.assert_array_equal(batch.next_obs.numpy(), pendulum_data["next_observations"][index])
    np.testing.assert_array_equal(batch.terminated.numpy(), pendulum_data["terminals"][index])
    assert len(set(index.tolist())) > 50  # spread over the dataset, not a few rows


def test_returns_to_go_by_hand_stop_at_every_episode_end_and_ride_in_the_batches(pendulum_data):
    # episodes end at row 1 (a terminal), row 4 (a timeout: nothing is bootstrapped past it) and row 5 (the last)
    rewards, ends = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), np.array([0, 1, 0, 0, 1, 1], bool)
    expected = [1 + 0.5 * 2, 2, 3 + 0.5 * 4 + 0.25 * 5, 4 + 0.5 * 5, 5, 6]
    np.testing.assert_allclose(returns_to_go(rewards, ends, gamma=0.5), expected, rtol=1e-7)
    # the buffer samples each row's return-to-go with its transition, and samples the same rows as without it
    data = {**pendulum_data, "mc_returns": np.arange(300, dtype=np.float32)}  # a row's number as its "return"
    batch = DatasetBuffer(data, gamma=0.9, seed=3).sample(64)
    plain = DatasetBuffer(pendulum_data, gamma=0.9, seed=3).sample(64)
    assert plain.mc_returns is None and torch.equal(batch.obs, plain.obs)
    rows = batch.mc_returns.long().numpy()
    np.testing.assert_array_equal(batch.obs.numpy(), pendulum_data["observations"][rows])
    np.testing.assert_array_equal(batch.rewards.numpy(), pendulum_data["rewards"][rows])


def test_replay_buffer_becomes_medium_replay(tmp_path):
    """A SAC buffer with an episode cut by a resume: the cut is marked a timeout, terminals kept."""
    buffer = ReplayBuffer(100, (1,), (1,))
    obs = np.arange(11, dtype=np.float32)
    for t in range(10):
        next_obs = obs[t + 1] if t != 4 else 99.0  # the episode in progress at step 4 was abandoned
        buffer.add(obs[t:t + 1, None], [[0.0]], [1.0], [[next_obs]], [t == 7], [False])
    buffer.save(tmp_path / "buffer.pt")
    data = replay_buffer_dataset(tmp_path / "buffer.pt")
    np.testing.assert_array_equal(np.flatnonzero(data["terminals"]), [7])
    np.testing.assert_array_equal(np.flatnonzero(data["timeouts"]), [4, 9])


def test_bad_input_gives_clear_errors(tmp_path, pendulum_data):
    with pytest.raises(FileNotFoundError, match=r"(?s)keelrl/hopper-medium-v0.*make_datasets --env-id Hopper-v5"):
        load_dataset("keelrl/hopper-medium-v0", data_path=tmp_path)
    np.savez(tmp_path / "missing.npz", observations=np.zeros((3, 2)), actions=np.zeros((3, 1)))
    with pytest.raises(ValueError, match="rewards, terminals, timeouts"):
        load_dataset(tmp_path / "missing.npz")
    bad = {**pendulum_data, "rewards": pendulum_data["rewards"].copy()}
    bad["rewards"][7] = np.nan
    np.savez(tmp_path / "nan.npz", **bad)
    with pytest.raises(ValueError, match=r"'rewards' has NaN.*row 7"):
        load_dataset(tmp_path / "nan.npz")
    np.savez(tmp_path / "short.npz", **{**pendulum_data, "actions": pendulum_data["actions"][:-1]})
    with pytest.raises(ValueError, match="different lengths"):
        load_dataset(tmp_path / "short.npz")
    hopper = gym.make("Hopper-v5")
    with pytest.raises(ValueError, match="Hopper-v5 has \\(11,\\)"):
        check_env_matches(pendulum_data, "Hopper-v5", (hopper.observation_space, hopper.action_space))


def test_make_datasets_tiny_scale(tmp_path, capsys):
    """The whole recipe at a tiny scale: SAC trained in chunks, five datasets written and loadable, rerun resumes."""
    args = ["--env-id", "InvertedPendulum-v5", "--steps", "200", "--sac-steps", "300", "--eval-every", "150",
            "--learning-starts", "100", "--medium-return", "1e9", "--ref-episodes", "3", "--num-envs", "2",
            "--data-path", str(tmp_path / "data"), "--work-dir", str(tmp_path / "work"), "--quiet"]
    assert main(args) == 0
    ids = capsys.readouterr().out.split()[-5:]
    assert ids == [f"keelrl/invertedpendulum-{kind}-v0" for kind in
                   ("random", "medium", "medium-replay", "expert", "medium-expert")]
    sizes = {i: len(load_dataset(i, data_path=tmp_path / "data")["rewards"]) for i in ids}
    assert sizes[ids[0]] == sizes[ids[1]] == sizes[ids[3]] == 200 and sizes[ids[4]] == 400
    assert sizes[ids[2]] == 300  # the replay buffer of the medium run (stopped at the budget)
    info = load_dataset_with_info(ids[1], data_path=tmp_path / "data")[1]
    assert info.ref_min_score is not None and info.ref_max_score is not None
    data = {kind: load_dataset(i, data_path=tmp_path / "data") for kind, i in
            zip(("random", "medium", "medium-replay", "expert", "medium-expert"), ids)}
    # random: uniform actions in [−3, 3] from a generator seeded 1, collected by envs seeded 1 + 5000
    rng = np.random.default_rng(1)
    by_hand = collect_by_hand("InvertedPendulum-v5", lambda obs: rng.uniform(-3.0, 3.0, (len(obs), 1)).astype(
        np.float32), 100, num_envs=2, seed=1 + 5000)
    for key in D4RL_KEYS:
        np.testing.assert_array_equal(data["random"][key], by_hand[key], err_msg=key)
    # medium-expert is medium followed by expert, each half from initial states of its own (envs seeded apart)
    assert not np.array_equal(data["medium"]["observations"][0], data["expert"]["observations"][0])
    for key in D4RL_KEYS:
        np.testing.assert_array_equal(data["medium-expert"][key],
                                      np.concatenate([data["medium"][key], data["expert"][key]]), err_msg=key)
    # medium-replay: the medium run's 300 stored transitions in order (the buffer never wrapped)
    buffer = torch.load(tmp_path / "work" / "medium_buffer.pt", weights_only=True)
    np.testing.assert_array_equal(data["medium-replay"]["observations"], buffer["obs"].numpy())
    np.testing.assert_array_equal(data["medium-replay"]["rewards"], buffer["rewards"].numpy())
    np.testing.assert_array_equal(data["medium-replay"]["terminals"], buffer["terminated"].numpy())
    # every dataset carries the same reference returns; the random one is the mean return of 3 uniform-policy
    # episodes (generator seeded 1, envs seeded 1 + 20000 + i, stepped together), by hand here
    for kind, i in zip(data, ids):
        refs = load_dataset_with_info(i, data_path=tmp_path / "data")[1]
        assert (refs.ref_min_score, refs.ref_max_score) == (info.ref_min_score, info.ref_max_score), kind
    rng, envs = np.random.default_rng(1), [gym.make("InvertedPendulum-v5") for _ in range(3)]
    obs = [env.reset(seed=1 + 20_000 + i)[0] for i, env in enumerate(envs)]
    returns, done = [0.0] * 3, [False] * 3
    while not all(done):
        actions = rng.uniform(-3.0, 3.0, (3, 1)).astype(np.float32)
        for i, env in enumerate(envs):
            if not done[i]:
                obs[i], reward, terminated, truncated, _ = env.step(actions[i])
                returns[i] += reward
                done[i] = terminated or truncated
    assert info.ref_min_score == pytest.approx(np.mean(returns), rel=1e-12)
    assert main(args) == 0 and "exists" in capsys.readouterr().err  # a rerun keeps what exists


def test_make_datasets_quick_path_takes_sac_at_its_budget_and_says_so_in_the_metadata(tmp_path, capsys):
    # (InvertedPendulum has no D4RL expert return: an expert, here the same SAC run, gives the reference)
    args = ["--env-id", "InvertedPendulum-v5", "--quick", "--datasets", "random", "medium", "medium-replay", "expert",
            "--steps", "200", "--sac-steps", "300", "--eval-every", "150", "--learning-starts", "100", "--ref-episodes",
            "3", "--num-envs", "2", "--data-path", str(tmp_path / "data"), "--work-dir", str(tmp_path / "work"),
            "--quiet"]
    assert main(args) == 0
    ids = capsys.readouterr().out.split()[-4:-1]
    assert ids == [f"keelrl/invertedpendulum-{kind}-quick-v0" for kind in ("random", "medium", "medium-replay")]
    assert len(load_dataset(ids[2], data_path=tmp_path / "data")["rewards"]) == 300  # medium at the budget, not before
    with open(tmp_path / "work" / "sac" / next(p.name for p in (tmp_path / "work" / "sac").iterdir()) / "eval.csv") as f:
        last = list(csv.DictReader(f))[-1]
    described = {kind: json.loads((tmp_path / "data" / i / "data" / "metadata.json").read_text())["description"]
                 for kind, i in zip(("random", "medium", "medium-replay"), ids)}
    refs = load_dataset_with_info(ids[0], data_path=tmp_path / "data")[1]
    references = (f"; normalised-score references: random policy {refs.ref_min_score:.1f}, expert "
                  f"{refs.ref_max_score:.1f}")
    assert described["random"].endswith("policy: uniform random actions" + references)
    made = (f"keelrl SAC (CleanRL defaults, seed 1) after 300 environment steps, deterministic evaluation return "
            f"{float(last['mean_return']):.1f} over 10 episodes")
    assert described["medium"].endswith(f"policy: {made}; actions sampled from it" + references)
    assert described["medium-replay"].endswith(f"policy: every transition in the replay buffer of the run of {made}"
                                               + references)
    assert "make_datasets --quick" in described["medium"]


def test_datasets_made_later_in_a_work_directory_keep_its_references_and_say_which(tmp_path, capsys):
    """A random dataset made first has no expert to measure: D4RL's expert return scores it. An expert made later in
    the same work directory keeps that reference (the family's datasets must score alike); its ref_scores.json once
    claimed "no expert made here" beside the expert, and no description said where the reference came from."""
    common = ["--env-id", "Hopper-v5", "--steps", "100", "--sac-steps", "300", "--eval-every", "300",
              "--learning-starts", "100", "--medium-return", "1e9", "--ref-episodes", "2", "--num-envs", "2",
              "--data-path", str(tmp_path / "data"), "--work-dir", str(tmp_path / "work")]
    assert main([*common, "--datasets", "random"]) == 0
    assert main([*common, "--datasets", "expert"]) == 0
    assert "reference returns kept from the datasets made before in " in capsys.readouterr().err
    for kind in ("random", "expert"):
        refs = load_dataset_with_info(f"keelrl/hopper-{kind}-v0", data_path=tmp_path / "data")[1]
        assert refs.ref_max_score == 3234.3
        description = json.loads((tmp_path / "data" / "keelrl" / f"hopper-{kind}-v0" / "data" /
                                   "metadata.json").read_text())["description"]
        assert description.endswith(f"normalised-score references: random policy {refs.ref_min_score:.1f}, D4RL's "
                                    f"expert reference return 3234.3")
