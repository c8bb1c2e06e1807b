"""Seeing what an agent learned: --capture-video, --track (W&B, offline), and the evaluation command."""

from __future__ import annotations

import csv
import dataclasses
import json
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest

from keelrl.agents import iql, sac, stream_q
from keelrl.agents.harness import logs
from keelrl.evaluate import main as evaluate_main
from keelrl.agents.harness.options import run_cli
from keelrl.benchmarks.make_datasets import collect
from keelrl.envs.video import VideoUnavailable, offscreen_gl_backend

TINY_SAC = dict(env_id="InvertedPendulum-v5", total_timesteps=300, learning_starts=200, batch_size=16,
                hidden_sizes=(16, 16), eval_freq=150, eval_episodes=2, quiet=True)


def rendering_or_skip() -> None:
    pytest.importorskip("imageio_ffmpeg", reason="MP4 writing needs keelrl[video]: pip install 'keelrl[video]'")
    try:
        offscreen_gl_backend()
    except VideoUnavailable as err:
        pytest.skip(f"no offscreen rendering on this machine: {err}")


def test_capture_video_films_the_first_evaluation_episode_of_every_evaluation(tmp_path):
    rendering_or_skip()
    import imageio.v2 as imageio

    result = sac.train(sac.SACConfig(**TINY_SAC, capture_video=True, runs_dir=str(tmp_path)))
    with open(result.run_dir / "videos" / "videos.csv") as f:
        rows = list(csv.DictReader(f))
    with open(result.run_dir / "eval.csv") as f:
        evaluations = list(csv.DictReader(f))
    assert [int(row["global_step"]) for row in rows] == [150, 300]
    for row in rows:
        frames = imageio.mimread(result.run_dir / "videos" / row["file"], memtest=False)
        assert len(frames) == int(row["length"]) > 0  # a frame per step of the filmed episode
        assert frames[0].shape == (480, 480, 3) and np.asarray(frames[0]).std() > 0  # not a blank picture
    # the film is evaluation episode 0 (same seed, deterministic policy): its return is the last evaluation's
    assert float(rows[-1]["return"]) == pytest.approx(result.final_eval_returns[0])
    assert float(evaluations[-1]["mean_return"]) == pytest.approx(result.final_eval_returns.mean())


def test_capture_video_is_refused_for_an_agent_without_an_environment(tmp_path, capsys):
    pytest.importorskip("transformers")
    from keelrl.agents import grpo

    args = ["--iterations", "1", "--warmup-steps", "0", "--runs-dir", str(tmp_path), "--capture-video", "--quiet"]
    assert run_cli(grpo.train, grpo.GRPOConfig, args=args) == 2
    assert capsys.readouterr().err.strip() == "error: --capture-video films an environment, and grpo has none to film."
    assert not list(tmp_path.iterdir())  # refused before a run directory was made


def wandb_records(path: Path):
    """The records of an offline W&B run file (LevelDB log blocks of 32 KiB after a 7-byte header)."""
    from wandb.proto import wandb_internal_pb2

    data, position, chunks = path.read_bytes(), 7, []
    while position + 7 <= len(data):
        if 32768 - position % 32768 < 7:  # a block's tail too short for a record header is padding
            position += 32768 - position % 32768
            continue
        length, kind = int.from_bytes(data[position + 4:position + 6], "little"), data[position + 6]
        if length == 0 and kind == 0:
            break
        chunks.append(data[position + 7:position + 7 + length])
        position += 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            yield wandb_internal_pb2.Record.FromString(b"".join(chunks))
            chunks = []


def whole_wandb_run(path: Path, seconds: float = 30.0) -> list:
    """The run file's records once W&B's service has written its exit record, waiting at most `seconds` (on a loaded
    machine this test has found the run's last records missing; whether the file was read before they were in is
    not known)."""
    deadline = time.monotonic() + seconds
    while True:
        records = list(wandb_records(path))
        if any(record.WhichOneof("record_type") == "exit" for record in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def test_track_writes_an_offline_wandb_run_with_the_config_and_the_scalars(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="W&B tracking needs keelrl[wandb]: pip install 'keelrl[wandb]'")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    result = sac.train(sac.SACConfig(**TINY_SAC, track=True, wandb_group="tests", runs_dir=str(tmp_path)))
    (run_file,) = result.run_dir.glob("wandb/offline-run-*/run-*.wandb")
    config, keys, returns = {}, set(), []
    for record in whole_wandb_run(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
            assert record.run.run_group == "tests"
        elif kind == "history":
            items = {item.key or "/".join(item.nested_key): item.value_json for item in record.history.item}
            keys |= set(items)
            if "charts/episodic_return" in items:
                returns.append((int(items["global_step"]), float(items["charts/episodic_return"])))
    assert config["algo"] == "sac" and config["env_id"] == "InvertedPendulum-v5" and config["total_timesteps"] == 300
    assert {"charts/episodic_return", "eval/episodic_return"} <= keys
    # W&B follows the TensorBoard file (sync_tensorboard) and, on a busy machine, has been seen to write one of
    # its rows twice (a suite run on two loaded cores gave 42 rows for 41 episodes): the same (step, return) pair
    # is counted once. With one env every episode ends at its own step, so no episode can hide behind another.
    unique = list(dict.fromkeys(returns))
    with open(result.run_dir / "episodes.csv") as f:
        assert unique == [(int(row["global_step"]), float(row["return"])) for row in csv.DictReader(f)]


def test_track_without_wandb_installed_is_one_line_before_any_run_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if keelrl[wandb] were not installed
    args = ["--env-id", "InvertedPendulum-v5", "--total-timesteps", "300", "--learning-starts", "100", "--track",
            "--runs-dir", str(tmp_path)]
    assert run_cli(sac.train, sac.SACConfig, args=args) == 2
    assert capsys.readouterr().err.strip() == ("error: --track logs to Weights & Biases, which is not installed: "
                                               "pip install 'keelrl[wandb]'.")
    assert not list(tmp_path.iterdir())


def test_the_evaluation_command_gives_what_evaluate_gives(tmp_path, capsys):
    result = sac.train(sac.SACConfig(**TINY_SAC, runs_dir=str(tmp_path)))
    capsys.readouterr()
    assert evaluate_main([str(result.run_dir), "--episodes", "3", "--seed", "7"]) == 0
    out = capsys.readouterr().out
    agent = sac.SAC.load(result.run_dir / "model.pt")
    returns, costs = sac.evaluate(agent, "InvertedPendulum-v5", episodes=3, seed=7)
    assert f"return {returns.mean():.1f} ± {returns.std():.1f}\n" in out and "cost" not in out  # no cost to report
    with open(result.run_dir / "evaluation.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["episode", "seed", "return"]
    assert [int(row["seed"]) for row in rows] == [7, 8, 9]
    assert [float(row["return"]) for row in rows] == pytest.approx(returns.tolist())
    # stochastic actions differ from the deterministic ones (a Gaussian policy, fresh samples)
    assert evaluate_main([str(result.run_dir / "model.pt"), "--episodes", "3", "--seed", "7", "--stochastic",
                          "--csv", str(tmp_path / "stochastic.csv")]) == 0
    assert "stochastic policy" in capsys.readouterr().out


def test_the_evaluation_command_reports_costs_only_where_the_env_has_them(tmp_path, capsys):
    """A SafeHopperVelocity agent evaluated on its task reports its costs; on Hopper-v5 (the same dynamics, no
    cost) the same episodes' cost is not reported as 0, which would read as a perfectly safe agent."""
    result = sac.train(sac.SACConfig(**{**TINY_SAC, "env_id": "keelrl/SafeHopperVelocity-v1"}, runs_dir=str(tmp_path)))
    agent = sac.SAC.load(result.run_dir / "model.pt")
    returns, costs = sac.evaluate(agent, "keelrl/SafeHopperVelocity-v1", episodes=2, seed=7)
    capsys.readouterr()
    assert evaluate_main([str(result.run_dir), "--episodes", "2", "--seed", "7"]) == 0
    assert f"return {returns.mean():.1f} ± {returns.std():.1f}, cost {costs.mean():.1f} ± {costs.std():.1f}" in (
        capsys.readouterr().out)
    with open(result.run_dir / "evaluation.csv") as f:
        assert [float(row["cost"]) for row in csv.DictReader(f)] == pytest.approx(costs.tolist())
    assert evaluate_main([str(result.run_dir), "--episodes", "2", "--seed", "7", "--env-id", "Hopper-v5"]) == 0
    out = capsys.readouterr().out
    assert f"return {returns.mean():.1f} ± {returns.std():.1f}\n" in out and "cost" not in out


def test_the_evaluation_command_finds_an_offline_agents_environment_and_a_streaming_agents_statistics(tmp_path,
                                                                                                      capsys):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "data.npz", **collect("InvertedPendulum-v5", lambda obs: rng.uniform(-3, 3, (len(obs), 1)),
                                              200, 2, seed=0))
    offline = iql.train(iql.IQLConfig(dataset=str(tmp_path / "data.npz"), env_id="InvertedPendulum-v5",
                                      total_updates=20, batch_size=16, hidden_sizes=(16, 16), eval_freq=0,
                                      eval_episodes=2, runs_dir=str(tmp_path), quiet=True))
    capsys.readouterr()
    assert evaluate_main([str(offline.run_dir), "--episodes", "2"]) == 0
    assert capsys.readouterr().out.startswith("iql on InvertedPendulum-v5, 2 episodes")  # the dataset's env
    streaming = stream_q.train(stream_q.StreamQConfig(env_id="CartPole-v1", total_timesteps=300, hidden_sizes=(8, 8),
                                                      eval_freq=0, eval_episodes=2, runs_dir=str(tmp_path),
                                                      quiet=True))
    capsys.readouterr()
    assert evaluate_main([str(streaming.run_dir), "--episodes", "2", "--seed", "10002"]) == 0
    out = capsys.readouterr().out  # the final evaluation of seed 1 used 10000 + 1 * 2 + i: the same episodes
    assert f"return {streaming.final_eval_returns.mean():.1f} ± {streaming.final_eval_returns.std():.1f}" in out


def test_the_evaluation_command_runs_as_a_module(tmp_path):
    done = subprocess.run([sys.executable, "-m", "keelrl.evaluate", str(tmp_path / "nothing")], capture_output=True,
                          text=True)
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: No run directory or model file at {tmp_path / 'nothing'}."


@pytest.mark.parametrize("case", ["missing", "corrupt", "unfinished", "wrong_env", "no_env"])
def test_the_evaluation_command_refuses_bad_input_in_one_line(case, tmp_path, capsys):
    args = {"missing": [str(tmp_path / "nothing")]}.get(case)
    if case == "corrupt":
        (tmp_path / "model.pt").write_bytes(b"not a model")
        args = [str(tmp_path / "model.pt")]
    elif case == "unfinished":
        (tmp_path / "run").mkdir()
        args = [str(tmp_path / "run")]
    elif case in ("wrong_env", "no_env"):
        result = sac.train(sac.SACConfig(**TINY_SAC, runs_dir=str(tmp_path)))
        if case == "wrong_env":
            args = [str(result.run_dir), "--env-id", "Hopper-v5"]
        else:  # a model.pt moved away from its run, whose config lost its env
            import torch

            state = torch.load(result.run_dir / "model.pt", weights_only=True)
            state["config"]["env_id"] = None
            torch.save(state, tmp_path / "moved.pt")
            args = [str(tmp_path / "moved.pt")]
    capsys.readouterr()
    assert evaluate_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ")
    expected = {"missing": "No run directory or model file", "corrupt": "not a readable keelrl checkpoint",
                "unfinished": "has no model.pt", "wrong_env": "Hopper-v5 gives 11-dimensional observations, but the "
                "saved sac agent takes 4", "no_env": "give --env-id"}[case]
    assert expected in err


class Killed(Exception):
    """Stands in for a SIGKILL: nothing after it runs."""


def test_a_resumed_run_films_the_evaluations_after_its_checkpoint_again_without_duplicate_rows(tmp_path,
                                                                                              monkeypatch):
    """Killed after the evaluation at step 300 (its checkpoint at 200), the run evaluates and films 300 again on
    resume: videos.csv keeps one row per evaluation, as eval.csv does. Rendering is stood in for (no GL needed)."""
    monkeypatch.setattr(logs, "offscreen_gl_backend", lambda: None)
    monkeypatch.setattr(logs, "film_episode", lambda video: types.SimpleNamespace(
        frames=[np.zeros((8, 8, 3), np.uint8)] * 3, fps=30, episode_return=1.0, cost=0.0))
    monkeypatch.setattr(logs, "write_mp4", lambda path, frames, fps: (path.parent.mkdir(exist_ok=True),
                                                                      path.write_bytes(b"mp4")))
    real_film = logs.Filming.film

    def film_then_die_at_300(self, run_dir, step, writer):
        real_film(self, run_dir, step, writer)
        if step == 300:
            raise Killed
    monkeypatch.setattr(logs.Filming, "film", film_then_die_at_300)
    config = sac.SACConfig(**{**TINY_SAC, "total_timesteps": 400, "eval_freq": 100}, checkpoint_freq=200,
                           capture_video=True, runs_dir=str(tmp_path))
    with pytest.raises(Killed):
        sac.train(config)
    monkeypatch.setattr(logs.Filming, "film", real_film)
    (run_dir,) = tmp_path.iterdir()
    sac.train(dataclasses.replace(config, resume=str(run_dir)))
    with open(run_dir / "videos" / "videos.csv") as f:
        videos = [row["global_step"] for row in csv.DictReader(f)]
    with open(run_dir / "eval.csv") as f:
        evaluations = [row["global_step"] for row in csv.DictReader(f)]
    assert videos == evaluations == ["100", "200", "300", "400"]
