"""keelrl's vector envs hand agents the same transitions as a single env stepped by hand."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from keelrl.buffers import ReplayBuffer
from keelrl.envs import ObsNormalizer, RewardNormalizer, RunningStats, make_vec_env

ENV_ID = "InvertedPendulum-v5"
# A short time limit so a few dozen random steps contain both truncations and terminations.
ENV_KWARGS = {"max_episode_steps": 12}
NUM_ENVS, SEED, STEPS = 3, 7, 60

try:
    import envpool  # noqa: F401

    BACKENDS = ["gymnasium", "envpool"]
except ImportError:
    NO_ENVPOOL = "envpool is not installed (make install printed why): pip install 'keelrl[envpool]'"
    BACKENDS = ["gymnasium", pytest.param("envpool", marks=pytest.mark.skip(reason=NO_ENVPOOL))]


def random_actions(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-3, 3, (STEPS, NUM_ENVS, 1)).astype(np.float32)


def transitions_by_hand(backend: str, env_seed: int, actions: np.ndarray, env_kwargs=ENV_KWARGS) -> list[tuple]:
    """(obs, action, reward, next_obs, terminated, truncated) of one env, each backend's native way."""
    out = []
    if backend == "gymnasium":
        env = gym.make(ENV_ID, **env_kwargs)
        obs, _ = env.reset(seed=env_seed)
        for action in actions:
            next_obs, reward, terminated, truncated, _ = env.step(action)
            out.append((obs, action, reward, next_obs, terminated, truncated))
            obs = env.reset()[0] if terminated or truncated else next_obs
        return out
    import envpool

    env = envpool.make_gymnasium(ENV_ID, num_envs=1, seed=env_seed, **env_kwargs)
    obs = env.reset()[0][0]
    for action in actions:
        next_obs, reward, terminated, truncated, _ = env.step(action[None])
        out.append((obs, action, reward[0], next_obs[0], terminated[0], truncated[0]))
        obs = next_obs[0]
        if terminated[0] or truncated[0]:  # envpool's own autoreset: the next step returns the reset obs
            obs = env.step(np.zeros((1, 1), np.float32))[0][0]
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_stored_transitions_equal_single_env_by_hand(backend):
    actions = random_actions(0)
    env = make_vec_env(ENV_ID, NUM_ENVS, seed=SEED, backend=backend, env_kwargs=ENV_KWARGS)
    buffer = ReplayBuffer(1000, (4,), (1,), num_envs=NUM_ENVS)
    obs, _ = env.reset()
    episode_returns = [[] for _ in range(NUM_ENVS)]
    for step_actions in actions:
        next_obs, rewards, terminated, truncated, info = env.step(step_actions)
        buffer.add(obs, step_actions, rewards, info["final_obs"], terminated, truncated)
        if "_episode" in info:
            for i in np.flatnonzero(info["_episode"]):
                episode_returns[i].append((info["episode"]["return"][i], info["episode"]["length"][i]))
        obs = next_obs
    env.close()

    saw_termination = saw_truncation = False
    for i in range(NUM_ENVS):
        expected = transitions_by_hand(backend, SEED + i, actions[:, i])
        rows = slice(i, STEPS * NUM_ENVS, NUM_ENVS)  # env i's transitions, in time order
        np.testing.assert_allclose(buffer.obs[rows].numpy(), np.stack([t[0] for t in expected]), rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(buffer.actions[rows].numpy(), np.stack([t[1] for t in expected]))
        np.testing.assert_allclose(buffer.rewards[rows].numpy(), [t[2] for t in expected])
        np.testing.assert_allclose(buffer.next_obs[rows].numpy(), np.stack([t[3] for t in expected]), rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(buffer.terminated[rows].numpy(), [t[4] for t in expected])
        np.testing.assert_array_equal(buffer.truncated[rows].numpy(), [t[5] for t in expected])
        saw_termination |= any(t[4] for t in expected)
        saw_truncation |= any(t[5] and not t[4] for t in expected)
        # episode statistics: raw return and length of each finished episode
        ends = [k for k, t in enumerate(expected) if t[4] or t[5]]
        starts = [0] + [k + 1 for k in ends[:-1]]
        by_hand = [(sum(t[2] for t in expected[s : e + 1]), e - s + 1) for s, e in zip(starts, ends)]
        np.testing.assert_allclose(np.array(episode_returns[i], float), np.array(by_hand, float))
    assert saw_termination and saw_truncation, "the test sequence must cover both episode endings"


@pytest.mark.parametrize("backend", BACKENDS)
def test_truncated_transition_keeps_true_final_observation(backend):
    env = make_vec_env(ENV_ID, 1, seed=0, backend=backend, env_kwargs={"max_episode_steps": 3})
    obs, _ = env.reset()
    for _ in range(3):
        next_obs, _, terminated, truncated, info = env.step(np.zeros((1, 1), np.float32))
    assert truncated[0] and not terminated[0]
    # the final observation continues the episode; next_obs starts a new one near the origin
    assert not np.allclose(info["final_obs"], next_obs)
    assert info["episode"]["length"][0] == 3 and info["episode"]["return"][0] == 3.0
    # both against one env stepped by hand: the third step's own next observation, then the reset's
    by_hand = transitions_by_hand(backend, 0, np.zeros((4, 1), np.float32), env_kwargs={"max_episode_steps": 3})
    assert by_hand[2][5] and not by_hand[2][4]
    np.testing.assert_allclose(info["final_obs"][0], by_hand[2][3], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(next_obs[0], by_hand[3][0], rtol=1e-6, atol=1e-6)
    env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_episode_that_ends_on_its_time_limit_step_is_terminated_and_truncated(backend):
    """Hopper falling on the very step its time limit ends: a termination (never bootstrapped through) that is also
    a truncation, as gymnasium's TimeLimit says, on both backends (envpool's own flags say truncated only)."""
    def episode_end(**env_kwargs) -> tuple[int, bool, bool]:
        with make_vec_env("Hopper-v5", 1, seed=3, backend=backend, env_kwargs=env_kwargs) as env:
            env.reset()
            for step in range(1, 1001):
                _, _, terminated, truncated, _ = env.step(np.ones((1, 3), np.float32))
                if terminated[0] or truncated[0]:
                    return step, bool(terminated[0]), bool(truncated[0])
        raise AssertionError("no episode end in 1000 steps")

    end, terminated, truncated = episode_end()
    assert terminated and not truncated and end < 100  # it falls by itself, early
    assert episode_end(max_episode_steps=end) == (end, True, True)
    assert episode_end(max_episode_steps=end - 1) == (end - 1, False, True)


def test_unknown_env_id_suggests_close_ids():
    with pytest.raises(ValueError, match="Hopper-v5"):
        make_vec_env("Hoper-v5")


@pytest.mark.parametrize("backend", BACKENDS[1:])
def test_a_gymnasium_only_env_asked_of_envpool_says_which_backend_has_it(backend):
    with pytest.raises(ValueError, match=r"^envpool has no environment 'keelrl/SafeHopperVelocity-v1'; gymnasium has "
                                         r"it: use --env-backend gymnasium\.$"):
        make_vec_env("keelrl/SafeHopperVelocity-v1", 1, 0, backend)


def test_an_env_that_cannot_be_made_here_says_why_in_one_line(monkeypatch):
    """MUJOCO_GL naming a backend whose library is missing ended in PyOpenGL's traceback (AttributeError: 'NoneType'
    object has no attribute 'glGetError'); a missing package was called an unknown environment id."""
    import gymnasium as gym

    pyopengl = {}  # a stand-in raising from PyOpenGL's file, as the real import does
    exec(compile("def opengl_missing(env_id, **kwargs):\n"
                 "    raise AttributeError(\"'NoneType' object has no attribute 'glGetError'\")\n",
                 "site-packages/OpenGL/raw/GL/_errors.py", "exec"), pyopengl)
    monkeypatch.setattr(gym, "make", pyopengl["opengl_missing"])
    monkeypatch.setenv("MUJOCO_GL", "osmesa")
    with pytest.raises(ValueError, match=r"^Hopper-v5: MUJOCO_GL=osmesa, and that OpenGL backend does not load here "
                                         r"\(AttributeError: 'NoneType' object has no attribute 'glGetError'\)"):
        make_vec_env("Hopper-v5")
    monkeypatch.delenv("MUJOCO_GL")
    with pytest.raises(AttributeError):  # without MUJOCO_GL: not a backend's doing, so its own traceback
        make_vec_env("Hopper-v5")

    def a_bug(env_id, **kwargs):
        raise AttributeError("'Env' object has no attribute 'foo'")

    monkeypatch.setattr(gym, "make", a_bug)
    monkeypatch.setenv("MUJOCO_GL", "egl")
    with pytest.raises(AttributeError, match="foo"):  # not from OpenGL or MuJoCo: its own traceback too
        make_vec_env("Hopper-v5")

    def mujoco_missing(env_id, **kwargs):
        raise gym.error.DependencyNotInstalled("MuJoCo is not installed, run `pip install \"gymnasium[mujoco]\"`")

    monkeypatch.setattr(gym, "make", mujoco_missing)
    with pytest.raises(ValueError, match=r"^Hopper-v5 needs a package that is not installed here: MuJoCo is not"):
        make_vec_env("Hopper-v5")


def test_unknown_backend_and_bad_num_envs():
    with pytest.raises(ValueError, match="backend"):
        make_vec_env(ENV_ID, backend="ray")
    with pytest.raises(ValueError, match="num_envs"):
        make_vec_env(ENV_ID, num_envs=0)


def test_non_finite_reward_names_the_step():
    env = make_vec_env("keelrl_test/NanReward-v0", 2)
    env.reset()
    for _ in range(4):
        env.step(np.zeros((2, 1), np.float32))
    with pytest.raises(FloatingPointError, match="non-finite reward .* vector step 5"):
        env.step(np.zeros((2, 1), np.float32))


def test_running_stats_merged_batch_by_batch_match_numpy_on_a_stream():
    rng = np.random.default_rng(0)
    stream = [rng.normal(3.0, 2.0, (int(n), 4)) for n in rng.integers(1, 20, 30)]
    rms = RunningStats((4,))
    np.testing.assert_array_equal(rms.var, np.ones(4))  # nothing seen yet
    for batch in stream:
        rms.update(batch)
    everything = np.concatenate(stream)
    np.testing.assert_allclose(rms.mean, everything.mean(0), rtol=1e-10)
    np.testing.assert_allclose(rms.var, everything.var(0), rtol=1e-10)
    np.testing.assert_allclose(rms.sample_var, everything.var(0, ddof=1), rtol=1e-10)
    assert rms.count == len(everything)


def test_reward_normalizer_divides_by_discounted_return_std():
    normalizer = RewardNormalizer(num_envs=1, gamma=0.5)
    returns = []
    trace = 0.0
    for reward in [1.0, 2.0, 3.0]:
        trace = 0.5 * trace + reward
        returns.append(trace)
        scaled = normalizer(np.array([reward]), np.array([False]))
    np.testing.assert_allclose(scaled, [3.0 / np.sqrt(np.var(returns) + 1e-8)], rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_normalizer_state_saves_and_restores(backend, tmp_path):
    kwargs = dict(num_envs=2, seed=3, backend=backend, normalize_obs=True, normalize_reward=True)
    env = make_vec_env(ENV_ID, **kwargs)
    raw_env = make_vec_env(ENV_ID, num_envs=2, seed=3, backend=backend)  # the same stream, unnormalised
    env.reset()
    seen, traces, dones_seen = [raw_env.reset()[0]], [], []
    trace = np.zeros(2)
    for _ in range(20):
        actions = np.full((2, 1), 0.5, np.float32)
        env.step(actions)
        next_obs, rewards, terminated, truncated, _ = raw_env.step(actions)
        seen.append(next_obs)
        trace = 0.99 * trace + rewards  # the discounted return, restarted after an episode's last step
        traces.append(trace.copy())
        trace[terminated | truncated] = 0.0
        dones_seen.append(terminated | truncated)
    raw_env.close()
    assert np.any(dones_seen)  # episodes ended (and restarted) inside the 20 steps
    # the statistics by numpy: every observation handed out (reset and after each step), every return trace
    seen, traces = np.concatenate(seen).astype(np.float64), np.concatenate(traces)
    np.testing.assert_allclose(env.obs_normalizer.rms.mean, seen.mean(0), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(env.obs_normalizer.rms.var, seen.var(0), rtol=1e-9)
    np.testing.assert_allclose(env.reward_normalizer.rms.var, traces.var(), rtol=1e-9)
    np.testing.assert_allclose(env.reward_normalizer.returns, trace, rtol=1e-12)
    raw_probe = np.random.default_rng(1).normal(size=(5, 4))
    expected = np.clip((raw_probe - seen.mean(0)) / np.sqrt(seen.var(0) + 1e-8), -10, 10)
    np.testing.assert_allclose(env.normalize_obs(raw_probe), expected, rtol=1e-6, atol=1e-6)  # float32 output
    torch.save(env.state_dict(), tmp_path / "env.pt")
    restored = make_vec_env(ENV_ID, **kwargs)
    restored.load_state_dict(torch.load(tmp_path / "env.pt", weights_only=True))
    raw = np.random.default_rng(0).normal(size=(5, 4))
    np.testing.assert_array_equal(restored.normalize_obs(raw), env.normalize_obs(raw))
    assert not np.allclose(env.normalize_obs(raw), ObsNormalizer((4,))(raw))  # statistics moved
    np.testing.assert_array_equal(restored.reward_normalizer.returns, env.reward_normalizer.returns)
    with pytest.raises(ValueError, match="normalisation flags"):
        make_vec_env(ENV_ID, num_envs=2, backend=backend).load_state_dict(env.state_dict())


def test_frozen_normalizer_does_not_update():
    env = make_vec_env(ENV_ID, 1, seed=0, normalize_obs=True)
    env.reset()
    env.training = False
    count = env.obs_normalizer.rms.count
    mean, var = env.obs_normalizer.rms.mean.copy(), env.obs_normalizer.rms.var.copy()
    next_obs, *_ = env.step(np.zeros((1, 1), np.float32))
    assert env.obs_normalizer.rms.count == count == 1  # the reset observation only
    np.testing.assert_array_equal(env.obs_normalizer.rms.mean, mean)
    np.testing.assert_array_equal(env.obs_normalizer.rms.var, var)
    # a frozen normaliser still normalises, with the old statistics: one observation, variance 0
    raw = gym.make(ENV_ID)
    first, _ = raw.reset(seed=0)
    stepped = raw.step(np.zeros(1, np.float32))[0]
    np.testing.assert_allclose(mean, first, rtol=1e-12)
    np.testing.assert_allclose(next_obs[0], np.clip((stepped - first) / np.sqrt(0.0 + 1e-8), -10, 10),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("env_id", ["Hopper-v5", "Ant-v5", "Humanoid-v5"])
def test_an_episode_restored_mid_way_goes_on_bit_for_bit(env_id):
    """A resumed run continues its envs' episodes: the restored env's next steps equal the uninterrupted one's.
    Ant and Humanoid read body positions MuJoCo derived before its last integration (in no saved state)."""
    straight = make_vec_env(env_id, 1, seed=1)
    straight.reset()
    rng = np.random.default_rng(0)
    low, high = straight.single_action_space.low, straight.single_action_space.high
    for _ in range(20):
        straight.step(rng.uniform(low, high, (1, *low.shape)).astype(np.float32))
    state = straight.episode_state()
    actions = [rng.uniform(low, high, (1, *low.shape)).astype(np.float32) for _ in range(3)]
    restored = make_vec_env(env_id, 1, seed=21)
    restored.reset()
    assert restored.load_episode_state(state)
    for action in actions:
        expected, got = straight.step(action), restored.step(action)
        np.testing.assert_array_equal(got[0], expected[0])  # observation
        np.testing.assert_array_equal(got[1], expected[1])  # reward


def test_playing_no_episode_is_refused_as_such():
    from keelrl.envs import play_episodes

    with pytest.raises(ValueError, match=r"^episodes must be at least 1, got 0\.$"):
        play_episodes(lambda obs: obs[:, :1], "InvertedPendulum-v5", 0, 0)
