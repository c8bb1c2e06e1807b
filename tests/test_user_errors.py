"""Plausible user mistakes on the evaluation command and with datasets: one line, no traceback, exit code 2."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from keelrl.agents import iql, ppo, sac, stream_q
from keelrl.agents.harness.options import parse_command_line, run_cli
from keelrl.benchmarks.dataset_options import MakeDatasetsConfig, with_quick
from keelrl.benchmarks.make_datasets import dataset_id
from keelrl.buffers.offline import MAKE_DATASETS, load_dataset
from keelrl.envs.video import VideoUnavailable, offscreen_gl_backend
from keelrl.evaluate import main as evaluate_main


@pytest.fixture(scope="module")
def sac_run(tmp_path_factory) -> Path:
    """A finished tiny SAC run on InvertedPendulum-v5 (4-d observations, 1-d Box actions)."""
    return sac.train(sac.SACConfig(env_id="InvertedPendulum-v5", total_timesteps=300, learning_starts=100,
                                   batch_size=32, hidden_sizes=(32, 32), eval_episodes=1, quiet=True,
                                   runs_dir=str(tmp_path_factory.mktemp("sac")))).run_dir


@pytest.fixture(scope="module")
def stream_run(tmp_path_factory) -> Path:
    """A finished tiny stream Q(λ) run on CartPole-v1 (4-d observations + time feature, 2 discrete actions)."""
    return stream_q.train(stream_q.StreamQConfig(env_id="CartPole-v1", total_timesteps=300, hidden_sizes=(8, 8),
                                                 eval_freq=0, eval_episodes=1, quiet=True,
                                                 runs_dir=str(tmp_path_factory.mktemp("stream")))).run_dir


def one_line_error(capsys) -> str:
    """The single `error: ...` line the command printed on stderr."""
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


# ---------------------------------------------------------------------------------------------------
# python -m keelrl.evaluate


def test_evaluating_a_training_checkpoint_says_to_pass_the_run_directory(sac_run):
    done = subprocess.run([sys.executable, "-m", "keelrl.evaluate", str(sac_run / "checkpoint.pt")],
                          capture_output=True, text=True)
    assert done.returncode == 2
    err = done.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: {sac_run / 'checkpoint.pt'} is a training checkpoint")
    assert "pass the run directory" in err and "model.pt" in err


@pytest.mark.parametrize("run, env_id, suggestion", [("sac", "Hoper-v5", "'Hopper-v5'"),
                                                     ("stream", "CartPol-v1", "'CartPole-v1'")])
def test_evaluating_on_an_unknown_env_id_suggests_close_ids(run, env_id, suggestion, sac_run, stream_run, capsys):
    capsys.readouterr()
    assert evaluate_main([str(sac_run if run == "sac" else stream_run), "--env-id", env_id]) == 2
    err = one_line_error(capsys)
    assert err.startswith(f"error: Unknown gymnasium environment id {env_id!r}")
    assert f"Did you mean {suggestion}" in err


@pytest.mark.parametrize("option, value, expected", [("--seed", "-1", "--seed must be non-negative"),
                                                     ("--episodes", "0", "--episodes must be positive")])
def test_evaluating_with_a_bad_seed_or_episode_count_is_refused(option, value, expected, sac_run, capsys):
    capsys.readouterr()
    assert evaluate_main([str(sac_run), option, value]) == 2
    assert expected in one_line_error(capsys)


@pytest.mark.parametrize("case", ["directory", "missing_directory"])
def test_evaluating_with_a_csv_that_cannot_be_written_is_refused(case, sac_run, tmp_path, capsys):
    target = tmp_path if case == "directory" else tmp_path / "no" / "such" / "episodes.csv"
    capsys.readouterr()
    assert evaluate_main([str(sac_run), "--csv", str(target), "--episodes", "1"]) == 2
    err = one_line_error(capsys)
    assert err.startswith(f"error: --csv {target}")
    assert ("is a directory" if case == "directory" else f"directory {target.parent} does not exist") in err


@pytest.mark.parametrize("run, env_id, expected", [
    ("sac", "CartPole-v1", "CartPole-v1 has Discrete(2) actions, but the saved sac agent acts with Box("),
    ("stream", "InvertedPendulum-v5", "InvertedPendulum-v5 has Box("),
])
def test_evaluating_on_an_env_with_other_actions_is_refused(run, env_id, expected, sac_run, stream_run, capsys):
    # same observation size, other action space: the env would assert (CartPole) or silently clip (stream_q)
    capsys.readouterr()
    assert evaluate_main([str(sac_run if run == "sac" else stream_run), "--env-id", env_id, "--episodes", "1"]) == 2
    err = one_line_error(capsys)
    assert expected in err and "evaluate it on the environment it was trained for" in err


def test_filming_an_env_that_cannot_render_here_is_refused_in_one_line(stream_run, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pygame", None)  # as if keelrl[video] (which brings pygame) were not installed
    try:
        offscreen_gl_backend()
    except VideoUnavailable as err:
        pytest.skip(f"no offscreen rendering on this machine: {err}")
    capsys.readouterr()
    args = [str(stream_run), "--capture-video", "--episodes", "1", "--csv", str(tmp_path / "episodes.csv")]
    assert evaluate_main(args) == 2
    err = one_line_error(capsys)
    assert err.startswith("error: --capture-video: CartPole-v1 cannot render here (DependencyNotInstalled: pygame is "
                          "not installed")
    assert (tmp_path / "episodes.csv").is_file()  # the episodes were played and kept


# ---------------------------------------------------------------------------------------------------
# damaged dataset files


def tiny_d4rl(rows: int = 64) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(rows + 1, 4)).astype(np.float32)
    return {"observations": obs[:-1], "actions": rng.uniform(-3, 3, (rows, 1)).astype(np.float32),
            "rewards": np.ones(rows, np.float32), "next_observations": obs[1:],
            "terminals": np.zeros(rows, np.float32), "timeouts": (np.arange(rows) % 16 == 15).astype(np.float32)}


def damaged_file(tmp_path: Path, suffix: str, how: str) -> Path:
    """A D4RL-layout file cut in half ("truncated"), or a file of text ("garbage")."""
    path = tmp_path / f"data{suffix}"
    if how == "garbage":
        path.write_text("observations,actions\n1,2\n")
        return path
    if suffix == ".npz":
        np.savez(path, **tiny_d4rl())
    else:
        import h5py

        with h5py.File(path, "w") as file:
            for key, value in tiny_d4rl().items():
                file[key] = value
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


@pytest.mark.parametrize("suffix", [".npz", ".hdf5", ".h5"])
@pytest.mark.parametrize("how", ["truncated", "garbage"])
def test_a_damaged_dataset_file_is_refused_in_one_line(suffix, how, tmp_path):
    if suffix != ".npz":
        pytest.importorskip("h5py", reason="HDF5 datasets need keelrl[offline]")
    path = damaged_file(tmp_path, suffix, how)
    kind = "npz" if suffix == ".npz" else "HDF5"
    with pytest.raises(ValueError) as refused:
        load_dataset(path)
    message = str(refused.value)
    assert len(message.splitlines()) == 1
    assert message.startswith(f"{path} is damaged or not an {kind} file")


def test_an_offline_agent_given_a_damaged_dataset_exits_2_in_one_line(tmp_path, capsys):
    path = damaged_file(tmp_path, ".npz", "truncated")
    args = ["--dataset", str(path), "--env-id", "InvertedPendulum-v5", "--runs-dir", str(tmp_path / "runs"),
            "--quiet"]
    assert run_cli(iql.train, iql.IQLConfig, args=args) == 2
    assert one_line_error(capsys).startswith(f"error: {path} is damaged or not an npz file")


# ---------------------------------------------------------------------------------------------------
# the command that makes a missing dataset


@pytest.mark.parametrize("identifier", ["keelrl/hopper-medium-v0", "keelrl/hopper-medium-quick-v0",
                                        "keelrl/walker2d-medium-replay-v1", "keelrl/halfcheetah-expert-v0",
                                        "keelrl/hopper-medium-replay-quick-v0", "keelrl/walker2d-medium-expert-v2",
                                        "keelrl/hopper-random-quick-v3"])
def test_a_missing_dataset_names_the_command_that_makes_exactly_it(identifier, tmp_path):
    with pytest.raises(FileNotFoundError) as missing:
        load_dataset(identifier, data_path=tmp_path)
    message = str(missing.value)
    assert len(message.splitlines()) == 1
    command = message.split("Create it with: ")[1]
    assert command.startswith(MAKE_DATASETS + " ")
    config = parse_command_line(MakeDatasetsConfig, args=shlex.split(command[len(MAKE_DATASETS):]))
    if config.quick:
        config = with_quick(config)  # as make_datasets' main does
    assert [dataset_id(config.env_id, kind, config.version, config.quick) for kind in config.datasets] == [identifier]


def test_an_offline_agent_given_a_misspelled_dataset_id_is_told_the_close_id_there(tmp_path, capsys):
    data_dir = tmp_path / "datasets" / "keelrl" / "hopper-medium-v0" / "data"
    data_dir.mkdir(parents=True)
    (data_dir / "metadata.json").write_text("{}")  # what the look-up needs
    args = ["--dataset", "keelrl/hoper-medium-v0", "--data-path", str(tmp_path / "datasets"), "--runs-dir",
            str(tmp_path / "runs"), "--quiet"]
    assert run_cli(iql.train, iql.IQLConfig, args=args) == 2
    err = one_line_error(capsys)
    assert err.startswith("error: No dataset 'keelrl/hoper-medium-v0': looked for a Minari dataset in ")
    assert err.endswith("Did you mean 'keelrl/hopper-medium-v0'?")


def test_a_missing_dataset_beside_its_quick_version_is_told_both_and_how_to_make_it(tmp_path, capsys):
    """Once keelrl/hopper-medium-quick-v0 existed, asking for keelrl/hopper-medium-v0 only suggested the quick one
    (SAC at 10,000 steps) and no longer said how to make the real one."""
    data_dir = tmp_path / "datasets" / "keelrl" / "hopper-medium-quick-v0" / "data"
    data_dir.mkdir(parents=True)
    (data_dir / "metadata.json").write_text("{}")
    args = ["--dataset", "keelrl/hopper-medium-v0", "--data-path", str(tmp_path / "datasets"), "--runs-dir",
            str(tmp_path / "runs"), "--quiet"]
    assert run_cli(iql.train, iql.IQLConfig, args=args) == 2
    assert one_line_error(capsys).endswith(
        "Did you mean 'keelrl/hopper-medium-quick-v0'? Or: Create it with: python -m keelrl.benchmarks.make_datasets "
        "--env-id Hopper-v5 --datasets medium")


@pytest.mark.parametrize("kind", ["file", "directory"])
def test_an_offline_agent_given_a_path_that_is_not_a_dataset_says_what_a_dataset_is(kind, tmp_path, capsys):
    path = tmp_path / "notes.txt" if kind == "file" else tmp_path / "some_dir"
    path.write_text("not a dataset") if kind == "file" else path.mkdir()
    args = ["--dataset", str(path), "--runs-dir", str(tmp_path / "runs"), "--quiet"]
    assert run_cli(iql.train, iql.IQLConfig, args=args) == 2
    assert one_line_error(capsys) == (f"error: {path} is a {kind} but not a dataset: give a Minari dataset id, a "
                                      "Minari dataset directory (holding data/metadata.json) or a .hdf5/.npz file "
                                      "in the D4RL layout.")


# ---------------------------------------------------------------------------------------------------
# training options that no run can use


SAC_TINY = ["--env-id", "InvertedPendulum-v5", "--total-timesteps", "300", "--learning-starts", "100", "--quiet"]


@pytest.mark.parametrize("train, config_cls, args, message", [
    (ppo.train, ppo.PPOConfig, ["--env-id", "CartPole-v1", "--total-timesteps", "300"],
     "--total-timesteps 300 is less than one rollout of 512 steps"),
    (sac.train, sac.SACConfig, [*SAC_TINY, "--device", "gpu"], "--device 'gpu' is not a torch device"),
    (sac.train, sac.SACConfig, [*SAC_TINY, "--device", "mps"], "keelrl runs on cpu or cuda, not mps"),
    (ppo.train, ppo.PPOConfig, ["--env-id", "CartPole-v1", "--hidden-sizes", "0", "64"],
     "--hidden-sizes needs positive widths, got 0 64"),
    (sac.train, sac.SACConfig, [*SAC_TINY, "--num-seeds", "2", "--runs-dir", "runs/{exp}"],
     "the one field it may hold is {seed}"),
])
def test_options_no_run_can_use_are_refused_in_one_line_before_any_directory(train, config_cls, args, message,
                                                                            tmp_path, monkeypatch, capsys):
    """Once these trained nothing without a word (a budget under one rollout) or ended in a traceback (a device
    torch does not know, a layer of no width, a --runs-dir field other than seed)."""
    monkeypatch.chdir(tmp_path)
    runs_dir = [] if "--runs-dir" in args else ["--runs-dir", str(tmp_path / "runs")]
    assert run_cli(train, config_cls, [*args, *runs_dir]) == 2
    assert message in one_line_error(capsys)
    assert not any(tmp_path.iterdir())


def test_a_runs_dir_that_is_a_file_is_said_in_one_line(tmp_path, capsys):
    (tmp_path / "runs").write_text("a file")
    assert run_cli(sac.train, sac.SACConfig, [*SAC_TINY, "--runs-dir", str(tmp_path / "runs")]) == 2
    assert f"--runs-dir {tmp_path / 'runs'}: cannot make a run directory there" in one_line_error(capsys)


def test_the_evaluation_command_says_in_one_line_when_the_env_cannot_render(sac_run, tmp_path, monkeypatch, capsys):
    """Rendering fails in many ways (MuJoCo's FatalError without a display, a missing GL library): each is one line."""
    import keelrl.evaluate as evaluate_module

    def no_display(source):
        raise RuntimeError("gladLoadGL error\nmore lines")

    monkeypatch.setattr(evaluate_module, "offscreen_gl_backend", lambda: "egl")
    monkeypatch.setattr(evaluate_module, "film_episode", no_display)
    assert evaluate_main([str(sac_run), "--episodes", "1", "--capture-video", "--csv", str(tmp_path / "e.csv")]) == 2
    err = one_line_error(capsys)
    assert "--capture-video: InvertedPendulum-v5 cannot render here (RuntimeError: gladLoadGL error)" in err


def test_options_given_beside_resume_that_would_change_the_run_are_refused(sac_run, capsys):
    """A run resumes with its own options: --total-timesteps or --batch-size beside --resume were dropped without a
    word; the watch options (--quiet here) and --extend-to are this command line's to set."""
    args = ["--resume", str(sac_run), "--total-timesteps", "600", "--batch-size", "64", "--quiet"]
    assert run_cli(sac.train, sac.SACConfig, args) == 2
    err = one_line_error(capsys)
    assert "--total-timesteps 600 (the run's: 300), --batch-size 64 (the run's: 32)" in err
    assert "--extend-to N trains a run further" in err


def test_an_option_given_beside_resume_at_its_default_value_is_refused_too(sac_run, capsys):
    """--batch-size 256 is SAC's default, so it could not be told from no --batch-size and was dropped silently;
    options that agree with the run's are accepted (the run is finished, so --resume says that instead)."""
    assert run_cli(sac.train, sac.SACConfig, ["--resume", str(sac_run), "--batch-size", "256", "--quiet"]) == 2
    assert "gives others: --batch-size 256 (the run's: 32)." in one_line_error(capsys)
    assert run_cli(sac.train, sac.SACConfig, ["--resume", str(sac_run), "--batch-size", "32", "--seed", "1"]) == 2
    assert "the run is finished" in one_line_error(capsys)


def test_a_warning_on_the_command_line_is_one_line(tmp_path):
    """It came as Python prints warnings, file path, line number and code line first."""
    process = subprocess.run([sys.executable, "-m", "keelrl.agents.sac", "--env-id", "InvertedPendulum-v5",
                              "--total-timesteps", "50", "--eval-episodes", "1", "--quiet", "--runs-dir",
                              str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert process.returncode == 0, process.stderr
    assert process.stderr.splitlines() == ["warning: --learning-starts 5000 is not below --total-timesteps 50: the run "
                                           "will end before its first update, untrained; lower --learning-starts or "
                                           "raise --total-timesteps."]


def test_learning_that_starts_after_the_last_step_is_said(tmp_path):
    """SAC with its default 5,000 random steps and a budget of 300 ends untrained: it runs (a smoke run may want
    just that) and says so."""
    with pytest.warns(UserWarning, match="--learning-starts 5000 is not below --total-timesteps 300: the run will end "
                                         "before its first update, untrained"):
        result = sac.train(sac.SACConfig(env_id="InvertedPendulum-v5", total_timesteps=300, eval_episodes=1,
                                         quiet=True, runs_dir=str(tmp_path)))
    assert result.global_step == 300


@pytest.mark.parametrize("args, message", [(["--seed", "-1"], "--seed must lie in [0, 2**32 - 1], got -1"),
                                           (["--q-lr", "-1"], "--policy-lr and --q-lr must be positive")])
def test_a_seed_or_learning_rate_out_of_range_names_its_option(args, message, tmp_path, capsys):
    assert run_cli(sac.train, sac.SACConfig, [*SAC_TINY, *args, "--runs-dir", str(tmp_path / "runs")]) == 2
    assert message in one_line_error(capsys)
    assert not (tmp_path / "runs").exists()


def test_wandb_failing_to_start_is_one_line(tmp_path, monkeypatch, capsys):
    """Not logged in (W&B's UsageError) or no network: one line that says what to do, not W&B's traceback."""
    wandb = pytest.importorskip("wandb", reason="W&B tracking needs keelrl[wandb]")

    def not_logged_in(**kwargs):
        raise wandb.errors.UsageError("api_key not configured (no-tty)")

    monkeypatch.setattr(wandb, "init", not_logged_in)
    assert run_cli(sac.train, sac.SACConfig, [*SAC_TINY, "--track", "--runs-dir", str(tmp_path)]) == 2
    err = one_line_error(capsys)
    assert "--track: W&B did not start (UsageError: api_key not configured (no-tty)): log in with `wandb login`" in err


def test_the_python_api_refuses_what_the_command_line_would(sac_run, tmp_path):
    """A config built in Python skipped the command line's checks of choices (network="resnet": a KeyError deep in
    the network builder); SAC.load of a run directory said "No checkpoint at DIR", and of its checkpoint.pt raised
    KeyError 'networks'."""
    with pytest.raises(ValueError, match=r"^--network must be one of mlp, simba, simbav2, got 'resnet'\.$"):
        sac.train(sac.SACConfig(network="resnet", runs_dir=str(tmp_path)))
    assert not any(tmp_path.iterdir())
    obs = np.zeros((1, 4), np.float32)
    np.testing.assert_array_equal(sac.SAC.load(sac_run).act(obs, deterministic=True),
                                  sac.SAC.load(sac_run / "model.pt").act(obs, deterministic=True))
    with pytest.raises(ValueError, match=r"checkpoint.pt is a run's checkpoint \(its training state\), not a model "
                                         r"file: load the run's model.pt"):
        sac.SAC.load(sac_run / "checkpoint.pt")


@pytest.mark.parametrize("algo", ["sac", "ppo"])
def test_act_takes_any_array_like_batch_and_refuses_another_shape_in_one_line(algo, sac_run, tmp_path):
    """A single observation, or one of another env, met torch's "mat1 and mat2 shapes cannot be multiplied" (or
    numpy's broadcast error in PPO); a list failed in SAC and a torch tensor in PPO."""
    if algo == "sac":
        agent = sac.SAC.load(sac_run)
    else:
        agent = ppo.PPO(4, gym.spaces.Box(-1.0, 1.0, (1,)), ppo.PPOConfig())
    obs = np.full((2, 4), 0.1, np.float32)
    expected = agent.act(obs, deterministic=True)
    for same in (obs.tolist(), obs.astype(np.float64), torch.from_numpy(obs)):
        np.testing.assert_allclose(agent.act(same, deterministic=True), expected, rtol=1e-6)
    bf16 = torch.from_numpy(obs).bfloat16()  # a tensor numpy cannot hold (as a CUDA one): taken as torch takes it
    np.testing.assert_allclose(agent.act(bf16, deterministic=True), expected, atol=0.05)
    for shape in ((4,), (2, 5)):
        with pytest.raises(ValueError, match=rf"^{algo} acts on a batch of observations \(B, obs_dim\): obs\[None\] "
                                             rf"for one observation, obs_dim 4 here; got shape {re.escape(str(shape))}"):
            agent.act(np.zeros(shape, np.float32))
