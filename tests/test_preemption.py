"""Runs that survive being stopped: SIGTERM or Ctrl-C mid-run writes a checkpoint and exits with 128 + the signal
number, `--resume` continues to the budget with continuous logs; checkpoints also come every --checkpoint-minutes;
the replay buffer and the checkpoint are one stamped pair, whatever moment a kill comes at; and the logs of a
resumed run keep what the checkpoint covers (TensorBoard included) and no more."""

from __future__ import annotations

import csv
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from keelrl.agents import sac
from keelrl.agents.harness import checkpoints, loop, run_directory
from keelrl.agents.harness.checkpoints import BUFFER_FILE, CHECKPOINT_FILE, NEXT_BUFFER_FILE, NEXT_CHECKPOINT_FILE
from keelrl.agents.harness.options import run_cli
from keelrl.agents.harness.run_directory import RunDirLock
from keelrl.buffers import ReplayBuffer
from keelrl.envs import VecEnv

REPO = Path(__file__).resolve().parents[1]
SAC_ARGS = ["--env-id", "InvertedPendulum-v5", "--learning-starts", "200", "--batch-size", "32",
            "--hidden-sizes", "32", "32", "--eval-episodes", "2"]
"""A small SAC on InvertedPendulum (whose random episodes last a few steps)."""


def episodes(run_dir: Path) -> list[tuple[int, int]]:
    """(global step, length) of every row of episodes.csv."""
    with open(run_dir / "episodes.csv") as f:
        return [(int(row["global_step"]), int(row["length"])) for row in csv.DictReader(f)]


def evaluation_steps(run_dir: Path) -> list[int]:
    with open(run_dir / "eval.csv") as f:
        return [int(row["global_step"]) for row in csv.DictReader(f)]


def assert_continuous(rows: list[tuple[int, int]], resumed_at: int) -> None:
    """Every episode ends its length after the previous one, but the first after the resume, which began at the
    checkpoint (the episode in progress there was lost): no gap, no duplicate, nothing else lost."""
    previous = 0
    for step, length in rows:
        start = resumed_at if previous <= resumed_at < step else previous
        assert step - start == length, (previous, step, length, resumed_at)
        previous = step


def signal_once_running(command: list[str], runs_dir: Path, signum: int, after_step: int,
                        second_signal: int | None = None) -> tuple[int, str, Path]:
    """Start `python -m <command>`, send `signum` once its progress lines pass `after_step` (and `second_signal`
    right after); its exit code, stderr and run directory."""
    process = subprocess.Popen([sys.executable, "-m", *command, "--runs-dir", str(runs_dir), "--progress-seconds", "0"],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in process.stdout:  # a plain progress line per step: stdout is a pipe
        if line.startswith("[") and int(line.split()[2].split("/")[0]) >= after_step:
            process.send_signal(signum)
            if second_signal is not None:
                process.send_signal(second_signal)
            break
    process.stdout.read()
    code = process.wait(timeout=60)
    (run_dir,) = runs_dir.iterdir()
    return code, process.stderr.read(), run_dir


@pytest.mark.parametrize("module, args, signum", [
    ("sac", [*SAC_ARGS, "--total-timesteps", "1000"], signal.SIGTERM),
    ("stream_q", ["--env-id", "CartPole-v1", "--hidden-sizes", "8", "8", "--eval-episodes", "1",
                  "--total-timesteps", "3000"], signal.SIGINT),
])
def test_a_signal_mid_run_checkpoints_and_resume_reaches_the_budget(module, args, signum, tmp_path, capsys):
    code, err, run_dir = signal_once_running([f"keelrl.agents.{module}", *args], tmp_path, signum, after_step=300)
    assert code == 128 + signum, err
    checkpoint = torch.load(run_dir / CHECKPOINT_FILE, weights_only=True)
    stopped_at = checkpoint["global_step"]
    assert 300 <= stopped_at < int(args[-1])  # the step in progress: no checkpoint_freq (50,000) nor the end
    name = signal.Signals(signum).name
    stopped, printed = err.strip().splitlines()[-1].split("; continue with: ")
    assert stopped == f"{name}: stopped at step {stopped_at} of {args[-1]} with a checkpoint"
    assert printed == f"python -m keelrl.agents.{module} --resume {run_dir}"
    assert "Traceback" not in err
    if module == "sac":  # the replay buffer holds every step up to the checkpoint, and no more
        assert torch.load(run_dir / BUFFER_FILE, weights_only=True)["rewards"].shape == (stopped_at,)
    # the printed command, run as printed (its python this interpreter), resumes the run to its budget
    command = shlex.split(printed)
    assert command[0] == "python"
    resumed = subprocess.run([sys.executable, *command[1:], "--quiet"], cwd=REPO, capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert list(tmp_path.iterdir()) == [run_dir]  # continued in its directory, no new run begun
    assert torch.load(run_dir / CHECKPOINT_FILE, weights_only=True)["global_step"] == int(args[-1])
    rows = episodes(run_dir)
    assert rows[0][0] < stopped_at < rows[-1][0]
    assert_continuous(rows, stopped_at)
    assert (run_dir / "model.pt").is_file()


def test_a_second_signal_while_stopping_is_ignored(tmp_path):
    code, err, run_dir = signal_once_running(["keelrl.agents.sac", *SAC_ARGS, "--total-timesteps", "1500"], tmp_path,
                                             signal.SIGTERM, after_step=300, second_signal=signal.SIGINT)
    # both are pending at once, and Python takes them in signal-number order: the first one taken decides (its
    # line may come second: the second handler can run inside the first, before the first has printed)
    (first,) = (line.split(":")[0] for line in err.splitlines() if "finishing this step" in line)
    (second,) = (line.split()[0] for line in err.splitlines() if "while stopping: ignored" in line)
    assert {first, second} == {"SIGTERM", "SIGINT"}, err
    assert code == 128 + signal.Signals[first] and "Traceback" not in err, err
    checkpoint = torch.load(run_dir / CHECKPOINT_FILE, weights_only=True)  # whole, and paired with its buffer
    buffer = torch.load(run_dir / BUFFER_FILE, weights_only=True)
    assert buffer["stamp"] == checkpoint["stamp"] and not (run_dir / NEXT_BUFFER_FILE).exists()


def written_checkpoints(monkeypatch) -> list[int]:
    """The global step of every checkpoint.pt written from now on."""
    steps, real_write = [], loop.write_checkpoint

    def write(run_dir, state, replay):
        steps.append(state["global_step"])
        real_write(run_dir, state, replay)

    monkeypatch.setattr(loop, "write_checkpoint", write)
    return steps


def test_checkpoints_come_every_checkpoint_minutes_without_a_step_based_one_due(tmp_path, monkeypatch):
    steps = written_checkpoints(monkeypatch)
    args = [*SAC_ARGS, "--total-timesteps", "600", "--checkpoint-freq", "100000", "--eval-freq", "0", "--quiet"]
    assert run_cli(sac.train, sac.SACConfig, args=[*args, "--runs-dir", str(tmp_path / "off"),
                                                   "--checkpoint-minutes", "0"]) == 0
    assert steps == [600]  # the last one only
    steps.clear()
    assert run_cli(sac.train, sac.SACConfig, args=[*args, "--runs-dir", str(tmp_path / "timed"),
                                                   "--checkpoint-minutes", "0.003"]) == 0  # every 0.18 s
    assert len(steps) > 3 and steps[-1] == 600 and all(0 < step < 600 for step in steps[:-1])
    assert steps == sorted(steps)


class Killed(Exception):
    """Stands in for a SIGKILL of the training process."""


def killed_run(tmp_path: Path, monkeypatch, kill_at_step: int, name: str = "run", **options) -> Path:
    """A SAC run of 600 steps with checkpoints every 200 steps (and `options`), killed (no signal handling: an
    exception from the loop) when it reaches `kill_at_step`; its run directory."""
    real_record = loop.Run.record_episodes

    def record_episodes(run, info):  # every step of the loop calls it, once the step is done
        if run.step == kill_at_step:
            raise Killed
        return real_record(run, info)

    monkeypatch.setattr(loop.Run, "record_episodes", record_episodes)
    with pytest.raises(Killed):
        sac.train(sac.SACConfig(**{**dict(env_id="InvertedPendulum-v5", total_timesteps=600, learning_starts=100,
                                          batch_size=16, hidden_sizes=(16, 16), checkpoint_freq=200, eval_freq=0,
                                          eval_episodes=1, quiet=True, runs_dir=str(tmp_path / name)), **options}))
    monkeypatch.setattr(loop.Run, "record_episodes", real_record)
    (run_dir,) = (tmp_path / name).iterdir()
    return run_dir


def resume(run_dir: Path) -> int:
    """--resume, in a later second than the run's TensorBoard files were opened: TensorBoard reads a run's files in
    name order, the second a writer opened first, then a counter of this process's writers (…9 sorts after …10), so a
    resume within the same second, which only a test makes, could be read before the run it continues."""
    time.sleep(1.01 - time.time() % 1.0)
    return run_cli(sac.train, sac.SACConfig, args=["--resume", str(run_dir), "--quiet"])


def buffer_sizes_at_restore(monkeypatch) -> list[int]:
    """The size of every replay buffer a resumed run restores from now on."""
    sizes, real_end = [], ReplayBuffer.end_episodes

    def end_episodes(buffer):
        sizes.append(buffer.size)
        real_end(buffer)

    monkeypatch.setattr(ReplayBuffer, "end_episodes", end_episodes)
    return sizes


def run_killed_in(tmp_path: Path, monkeypatch, target: Any, name: str, kill_when: Callable[..., bool]) -> Path:
    """A SAC run of 600 steps with checkpoints every 200 steps, killed inside `target.name` (an exception instead of
    the call) at the first call whose arguments `kill_when` picks; its run directory."""
    real = getattr(target, name)

    def killing(*args):
        if kill_when(*args):
            raise Killed
        return real(*args)

    monkeypatch.setattr(target, name, killing)
    with pytest.raises(Killed):
        sac.train(sac.SACConfig(env_id="InvertedPendulum-v5", total_timesteps=600, learning_starts=100, batch_size=16,
                                hidden_sizes=(16, 16), checkpoint_freq=200, eval_freq=0, quiet=True,
                                runs_dir=str(tmp_path)))
    monkeypatch.setattr(target, name, real)
    (run_dir,) = tmp_path.iterdir()
    return run_dir


def test_a_kill_between_the_buffer_and_the_checkpoint_resumes_from_the_previous_pair(tmp_path, monkeypatch):
    """The issue's repro: the newer buffer on disk beside the older checkpoint used to be trained on silently."""
    # the buffer of step 400 is on disk; its checkpoint never comes
    run_dir = run_killed_in(tmp_path, monkeypatch, checkpoints, "write_atomically", lambda path, state: (
        Path(path).name == NEXT_CHECKPOINT_FILE and state["global_step"] == 400))
    assert torch.load(run_dir / CHECKPOINT_FILE, weights_only=True)["global_step"] == 200
    assert torch.load(run_dir / NEXT_BUFFER_FILE, weights_only=True)["rewards"].shape == (400,)
    buffers = buffer_sizes_at_restore(monkeypatch)
    assert resume(run_dir) == 0
    assert buffers == [200]  # the buffer saved with the checkpoint resumed from, not the newer one
    assert torch.load(run_dir / BUFFER_FILE, weights_only=True)["rewards"].shape == (600,)


def test_a_kill_before_the_checkpoint_is_put_in_place_resumes_from_it(tmp_path, monkeypatch):
    """checkpoint.next.pt and buffer.next.pt of step 400 are whole on disk; the renames never came."""
    run_dir = run_killed_in(tmp_path, monkeypatch, loop, "commit_checkpoint", lambda run_dir: (
        checkpoints.saved_step(run_dir / NEXT_CHECKPOINT_FILE) == 400))
    assert checkpoints.saved_step(run_dir / CHECKPOINT_FILE) == 200
    buffers = buffer_sizes_at_restore(monkeypatch)
    assert resume(run_dir) == 0
    assert buffers == [400] and not (run_dir / NEXT_CHECKPOINT_FILE).exists()


def test_a_kill_before_the_last_rename_resumes_with_the_new_buffer(tmp_path, monkeypatch):
    run_dir = killed_run(tmp_path, monkeypatch, kill_at_step=450)
    old_pair = killed_run(tmp_path, monkeypatch, kill_at_step=250, name="older")
    # as if killed between writing checkpoint.pt (step 400) and renaming buffer.next.pt over the older buffer.pt
    (run_dir / BUFFER_FILE).rename(run_dir / NEXT_BUFFER_FILE)
    shutil.copy(old_pair / BUFFER_FILE, run_dir / BUFFER_FILE)
    buffers = buffer_sizes_at_restore(monkeypatch)
    assert resume(run_dir) == 0
    assert buffers == [400] and not (run_dir / NEXT_BUFFER_FILE).exists()


def test_a_buffer_not_written_with_the_checkpoint_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    run_dir = killed_run(tmp_path, monkeypatch, kill_at_step=450)
    old_pair = killed_run(tmp_path, monkeypatch, kill_at_step=250, name="older")
    shutil.copy(old_pair / BUFFER_FILE, run_dir / BUFFER_FILE)  # saved at step 200, by another save
    capsys.readouterr()
    assert resume(run_dir) == 2
    err = capsys.readouterr().err
    assert err == (f"error: --resume {run_dir}: {BUFFER_FILE} (saved at step 200) was not written with "
                   f"{CHECKPOINT_FILE} (saved at step 400); the run cannot go on with a replay buffer that does not "
                   f"match its checkpoint: put back the pair saved together, or start a new run.\n")


def tensorboard_steps(run_dir: Path, tag: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir))
    events.Reload()
    return [event.step for event in events.Scalars(tag)]


def test_resume_keeps_the_tensorboard_events_at_the_checkpoint_step(tmp_path, monkeypatch):
    """The evaluation at the checkpoint's step, which eval.csv keeps, stays in TensorBoard too, once."""
    run_dir = killed_run(tmp_path, monkeypatch, kill_at_step=350, eval_freq=200, log_freq=100)
    assert evaluation_steps(run_dir) == [200]
    assert resume(run_dir) == 0
    assert evaluation_steps(run_dir) == [200, 400, 600] == tensorboard_steps(run_dir, "eval/episodic_return")
    assert tensorboard_steps(run_dir, "charts/SPS") == [100, 200, 300, 400, 500, 600]  # each once
    # a finished run trained on keeps its final evaluation
    assert sac.train(sac.SACConfig(resume=str(run_dir), extend_to=700, quiet=True)).global_step == 700
    assert evaluation_steps(run_dir) == [200, 400, 600, 700] == tensorboard_steps(run_dir, "eval/episodic_return")


def test_a_run_killed_between_its_last_checkpoint_and_model_pt_is_finished_once(tmp_path, monkeypatch):
    def killed_on_save(agent, path):
        raise Killed

    monkeypatch.setattr(sac.SAC, "save", killed_on_save)
    with pytest.raises(Killed):
        sac.train(sac.SACConfig(env_id="InvertedPendulum-v5", total_timesteps=300, learning_starts=100, batch_size=16,
                                hidden_sizes=(16, 16), eval_freq=100, eval_episodes=1, quiet=True,
                                runs_dir=str(tmp_path)))
    monkeypatch.undo()
    (run_dir,) = tmp_path.iterdir()
    assert evaluation_steps(run_dir) == [100, 200, 300] and not (run_dir / "model.pt").exists()
    before = (run_dir / "eval.csv").read_text()
    assert resume(run_dir) == 0
    assert (run_dir / "eval.csv").read_text() == before  # the final evaluation made again, the same, once
    assert tensorboard_steps(run_dir, "eval/episodic_return") == [100, 200, 300]
    assert (run_dir / "model.pt").is_file()


def test_threads_and_device_given_with_resume_are_applied(tmp_path, monkeypatch):
    """They do not change the algorithm, so --resume takes them from its command line (they were ignored)."""
    run_dir = killed_run(tmp_path, monkeypatch, kill_at_step=450)  # 1 thread, on "cpu"; resumes at step 400
    threads, real_update = [], sac.SAC.update

    def update(agent, batch):
        threads.append(torch.get_num_threads())
        return real_update(agent, batch)

    monkeypatch.setattr(sac.SAC, "update", update)
    torch.set_num_threads(3)  # the caller's own setting, given back when the run ends
    try:
        result = sac.train(sac.SACConfig(resume=str(run_dir), threads=2, device="cpu:0", quiet=True))
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(1)
    assert set(threads) == {2} and len(threads) == 200
    assert (result.config.threads, result.config.device) == (2, "cpu:0")


def test_a_checkpoint_that_cannot_be_written_is_one_line_and_leaves_no_partial_file(tmp_path, monkeypatch, capsys):
    """A full disk while a checkpoint is written (torch reports it as RuntimeError 'unexpected pos 64 vs 0') ended in
    a traceback and left checkpoint.next.pt.tmp behind."""
    def full_disk(state, path):
        Path(path).write_bytes(b"")  # what torch had begun
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    monkeypatch.setattr(checkpoints.torch, "save", full_disk)
    args = [*SAC_ARGS, "--total-timesteps", "600", "--checkpoint-freq", "300", "--runs-dir", str(tmp_path), "--quiet"]
    assert run_cli(sac.train, sac.SACConfig, args=args) == 2
    err = capsys.readouterr().err
    (run_dir,) = tmp_path.iterdir()
    assert err.startswith(f"error: Cannot write {run_dir / NEXT_BUFFER_FILE} (") and "is the disk full?" in err
    assert len(err.strip().splitlines()) == 1 and not list(run_dir.glob("*.tmp"))


def test_the_commands_a_run_prints_are_quoted_for_the_shell(tmp_path, capsys):
    """A --runs-dir with a space and a semicolon: the printed command, pasted, ran `$x/...` as a second command."""
    runs_dir = tmp_path / "r 14;$x"
    sac.train(sac.SACConfig(**{"env_id": "InvertedPendulum-v5", "total_timesteps": 300, "learning_starts": 200,
                               "hidden_sizes": (8,), "eval_episodes": 1, "runs_dir": str(runs_dir)}))
    assert f"tensorboard --logdir '{runs_dir}'" in capsys.readouterr().out


def test_a_run_another_process_trains_in_is_neither_resumed_nor_touched(tmp_path, monkeypatch, capsys):
    """Two processes resuming one run (or one resuming a run still training) were both accepted and wrote over each
    other's checkpoints and logs; worse, the second settled the first's checkpoint while it was being written."""
    run_dir = killed_run(tmp_path, monkeypatch, kill_at_step=350)  # its checkpoint of step 200
    (run_dir / NEXT_CHECKPOINT_FILE).write_bytes(b"the first half of step 400's")  # the other process writes it
    other_process = RunDirLock([run_dir])  # a second open file: locked as if by another process
    capsys.readouterr()
    assert resume(run_dir) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {run_dir} is in use: process {os.getpid()} on ") and len(err.splitlines()) == 1
    assert err.endswith(" trains in it now. Let that run end, or stop it (kill -TERM checkpoints it) and then resume "
                        "it.\n")
    assert (run_dir / NEXT_CHECKPOINT_FILE).read_bytes() == b"the first half of step 400's"  # left alone
    other_process.release()
    assert resume(run_dir) == 0  # the half-written checkpoint dropped, the run resumed from step 200
    assert torch.load(run_dir / CHECKPOINT_FILE, weights_only=True)["global_step"] == 600
    assert not (run_dir / NEXT_CHECKPOINT_FILE).exists()


def test_a_resume_that_fails_lets_the_run_be_resumed_again(tmp_path, monkeypatch):
    """In one Python session: the failed run is kept alive by its error (pytest.raises holds it, as a notebook's
    traceback would), so its lock must be released when it fails, not when it is collected."""
    run_dir = killed_run(tmp_path, monkeypatch, kill_at_step=350)
    with pytest.raises(ValueError, match="gives others: --seed 5"):  # refused before the run starts
        sac.train(sac.SACConfig(resume=str(run_dir), seed=5, quiet=True))

    def damaged(run):
        raise ValueError("damaged")

    monkeypatch.setattr(loop.Run, "_restore", damaged)
    with pytest.raises(ValueError, match="damaged"):  # failed while starting
        sac.train(sac.SACConfig(resume=str(run_dir), quiet=True))
    monkeypatch.undo()

    def no_env(*args, **kwargs):
        raise ValueError("no env")

    monkeypatch.setattr(sac, "make_vec_env", no_env)
    torch.set_num_threads(3)
    with pytest.raises(ValueError, match="no env"):  # failed between the run's making and its start
        sac.train(sac.SACConfig(resume=str(run_dir), quiet=True))
    assert torch.get_num_threads() == 3  # the caller's, given back
    monkeypatch.undo()
    torch.set_num_threads(1)

    def reset_fails(env, *args, **kwargs):
        raise ValueError("reset failed")

    monkeypatch.setattr(VecEnv, "reset", reset_fails)
    with pytest.raises(ValueError, match="reset failed"):  # failed between the start and the loop
        sac.train(sac.SACConfig(resume=str(run_dir), quiet=True))
    monkeypatch.undo()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C works again in this process
    assert resume(run_dir) == 0


def test_resume_of_a_directory_that_is_not_a_run_leaves_it_as_it_was(tmp_path, capsys):
    """It made run.lock there before saying the directory was not a run."""
    assert run_cli(sac.train, sac.SACConfig, ["--resume", str(tmp_path), "--quiet"]) == 2
    assert "not a keelrl run directory with a checkpoint" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_a_signal_while_the_run_starts_stops_it_after_its_first_step_with_a_checkpoint(tmp_path, monkeypatch, capsys):
    """A SIGTERM between the run directory's making and the loop (its handler came with `with run:`) ended the
    process at once: a directory with config.json only, which --resume called not a run."""
    real_save_config = run_directory.save_config

    def save_config_and_signal(run_dir, algo, config):
        real_save_config(run_dir, algo, config)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(run_directory, "save_config", save_config_and_signal)
    args = [*SAC_ARGS, "--total-timesteps", "300", "--runs-dir", str(tmp_path), "--quiet"]
    assert run_cli(sac.train, sac.SACConfig, args=args) == 128 + signal.SIGTERM
    (run_dir,) = tmp_path.iterdir()
    assert torch.load(run_dir / CHECKPOINT_FILE, weights_only=True)["global_step"] == 1
    assert f"SIGTERM: stopped at step 1 of 300 with a checkpoint; continue with: python -m keelrl.agents.sac " \
           f"--resume {run_dir}" in capsys.readouterr().err
    monkeypatch.undo()
    assert resume(run_dir) == 0
    assert torch.load(run_dir / CHECKPOINT_FILE, weights_only=True)["global_step"] == 300
