"""Progress where no progress bar is seen: plain lines on stdout every --progress-seconds whenever stdout or
stderr (where the bar goes) is not a terminal, none under --quiet; each line says what is known for the agent's
kind ("–" until it is known) and a time left that does not wrap at a day."""

import re
import sys

import numpy as np
import pytest

from keelrl.agents import iql, stream_q
from keelrl.agents.harness.logs import duration
from keelrl.benchmarks.make_datasets import collect

ETA = r"ETA (\d\d+:\d\d:\d\d|\?)"
ONLINE_LINE = re.compile(r"^\[stream_q\] step (\d+)/400 \((\d+)%\) \| [\d.]+ steps/s \| last return (\S+) \| "
                         rf"last evaluation (\S+) \| {ETA}$")
OFFLINE_LINE = re.compile(rf"^\[iql\] update (\d+)/60 \((\d+)%\) \| [\d.]+ updates/s \| last evaluation (\S+) \| {ETA}$")


def tiny_run(tmp_path, **options):
    config = stream_q.StreamQConfig(env_id="CartPole-v1", total_timesteps=400, hidden_sizes=(8, 8), eval_freq=200,
                                    eval_episodes=1, runs_dir=str(tmp_path), **options)
    return stream_q.train(config)


def matching(pattern: re.Pattern, text: str) -> list[re.Match]:
    return [m for m in map(pattern.match, text.splitlines()) if m]


def test_a_run_whose_stdout_is_not_a_terminal_prints_plain_progress_lines(tmp_path, capsys):
    tiny_run(tmp_path, progress_seconds=0.0)  # pytest's captured stdout is not a terminal
    lines = matching(ONLINE_LINE, capsys.readouterr().out)
    assert [int(m[1]) for m in lines] == list(range(1, 401))  # every step, with no interval
    assert int(lines[199][2]) == 50 and lines[-1][5] == "00:00:00"
    assert lines[0][3] == "–" and lines[0][4] == "–"  # no episode has ended and nothing was evaluated yet
    assert lines[198][4] == "–" and lines[-1][4] != "–"  # the evaluation at step 200 shows from then on
    float(lines[-1][4])
    assert any(m[3] != "–" for m in lines)  # CartPole episodes end within 400 steps
    assert "nan" not in " ".join(m[0] for m in lines)


def test_with_stdout_on_a_terminal_and_stderr_redirected_the_lines_replace_the_hidden_bar(tmp_path, capsys,
                                                                                          monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)  # the bar, on stderr, is off
    tiny_run(tmp_path / "redirected", progress_seconds=0.0)
    assert len(matching(ONLINE_LINE, capsys.readouterr().out)) == 400
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # both terminals: the bar is seen, no lines
    tiny_run(tmp_path / "terminal", progress_seconds=0.0)
    assert not matching(ONLINE_LINE, capsys.readouterr().out)


def test_quiet_prints_no_progress_and_the_interval_spaces_the_lines(tmp_path, capsys):
    tiny_run(tmp_path / "quiet", quiet=True, progress_seconds=0.0)
    assert not matching(ONLINE_LINE, capsys.readouterr().out)
    tiny_run(tmp_path / "spaced", progress_seconds=3600.0)
    assert len(matching(ONLINE_LINE, capsys.readouterr().out)) == 1  # the first step only


def test_an_offline_agent_counts_updates_and_shows_no_training_return(tmp_path, capsys):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "pendulum.npz",
             **collect("InvertedPendulum-v5", lambda obs: rng.uniform(-3, 3, (len(obs), 1)), 300, 1, seed=0))
    iql.train(iql.IQLConfig(dataset=str(tmp_path / "pendulum.npz"), env_id="InvertedPendulum-v5", total_updates=60,
                            batch_size=16, hidden_sizes=(8, 8), eval_freq=30, eval_episodes=1, progress_seconds=0.0,
                            runs_dir=str(tmp_path / "runs")))
    out = capsys.readouterr().out
    lines = matching(OFFLINE_LINE, out)
    assert [int(m[1]) for m in lines] == list(range(1, 61))
    assert lines[29][3] == "–" and lines[30][3] != "–"  # the evaluation after update 30 shows from update 31
    assert "last return" not in out


@pytest.mark.parametrize("seconds, shown", [(0, "00:00:00"), (59.6, "00:01:00"), (3 * 3600 + 7, "03:00:07"),
                                            (24 * 3600 + 6 * 60 + 8, "24:06:08"), (250 * 3600, "250:00:00")])
def test_the_time_left_counts_hours_past_a_day(seconds, shown):
    assert duration(seconds) == shown


def test_a_resumed_run_shows_its_last_evaluation_and_a_speed_only_of_what_it_measured(tmp_path, capsys):
    """The first progress lines after --resume said "last evaluation –" although eval.csv had one; and a run whose
    only update came at its last step printed "0.0 while updating"."""
    first = tiny_run(tmp_path)
    capsys.readouterr()
    stream_q.train(stream_q.StreamQConfig(resume=str(first.run_dir), extend_to=410, progress_seconds=0.0))
    lines = matching(re.compile(ONLINE_LINE.pattern.replace("/400", "/410")), capsys.readouterr().out)
    with open(first.run_dir / "eval.csv") as f:
        last = f.read().splitlines()[-2].split(",")  # the evaluation at step 400 (the last row is step 410's)
    assert int(last[0]) == 400 and float(lines[0][4]) == pytest.approx(float(last[1]), abs=0.05)

    from keelrl.agents import sac

    sac.train(sac.SACConfig(env_id="InvertedPendulum-v5", total_timesteps=60, learning_starts=59, batch_size=8,
                            hidden_sizes=(8,), eval_episodes=1, quiet=True, runs_dir=str(tmp_path / "sac")))
    (speeds,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("steps/s")]
    assert "overall" in speeds and "while updating" not in speeds  # one update, at the last step: no speed of its own
