"""Progress where there is no terminal: plain lines on stdout every --progress-seconds, none under --quiet."""

import re

from keelrl.agents import stream_q


def tiny_run(tmp_path, **options):
    config = stream_q.StreamQConfig(env_id="CartPole-v1", total_timesteps=400, hidden_sizes=(8, 8), eval_freq=200,
                                    eval_episodes=1, runs_dir=str(tmp_path), **options)
    return stream_q.train(config)


LINE = re.compile(r"^\[stream_q\] step (\d+)/400 \((\d+)%\) \| [\d.]+ steps/s \| last return (\S+) \| "
                  r"last evaluation (\S+) \| ETA (\d\d:\d\d:\d\d|\?)$")


def test_a_run_whose_stdout_is_not_a_terminal_prints_plain_progress_lines(tmp_path, capsys):
    tiny_run(tmp_path, progress_seconds=0.0)  # pytest's captured stdout is not a terminal
    lines = [m for m in map(LINE.match, capsys.readouterr().out.splitlines()) if m]
    assert [int(m[1]) for m in lines] == list(range(1, 401))  # every step, with no interval
    assert int(lines[199][2]) == 50 and lines[-1][5] == "00:00:00"
    assert lines[0][4] == "nan" and lines[-1][4] != "nan"  # the evaluation at step 200 shows from then on
    assert any(m[3] != "nan" for m in lines)  # CartPole episodes end within 400 steps


def test_quiet_prints_no_progress_and_the_interval_spaces_the_lines(tmp_path, capsys):
    tiny_run(tmp_path / "quiet", quiet=True, progress_seconds=0.0)
    assert not any(map(LINE.match, capsys.readouterr().out.splitlines()))
    tiny_run(tmp_path / "spaced", progress_seconds=3600.0)
    assert sum(bool(LINE.match(line)) for line in capsys.readouterr().out.splitlines()) == 1  # the first step only
