"""CUDA MPS for the GPU run's learning cells (benchmarks/gpu/mps.py): started, probed, quit when it fails, and named on
the results page. A stand-in control program records how it was called; the probe is a plain process."""

import dataclasses
import json
import os
import signal
import sys
import time
import textwrap
import types

import pytest

from keelrl.benchmarks.gpu import evidence, mps, page

FAKE_CONTROL = """\
#!{python}
import json, os, sys, time
with open({calls!r}, "a") as calls:
    calls.write(json.dumps(dict(args=sys.argv[1:], stdin="" if sys.argv[1:] else sys.stdin.read(),
                                logs=os.environ.get("CUDA_MPS_LOG_DIRECTORY"),
                                path=os.environ["PATH"].split(os.pathsep)[0])) + "\\n")
if sys.argv[1:] == ["-d"] and {daemon_fails}:
    sys.exit("An instance of this daemon is already running")
if sys.argv[1:] == ["-d"] and os.fork() == 0:  # the daemon, keeping the streams it was given
    with open({daemon_pid!r}, "w") as pid:
        pid.write(f"{{os.getpid()}} {{os.getsid(0)}}")
    time.sleep(60)
"""


@pytest.fixture(autouse=True)
def end_fake_daemons(tmp_path):
    yield
    for pid_file in tmp_path.glob("**/daemon.pid"):
        try:
            os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def fake_control(folder, daemon_fails=False):
    """A stand-in nvidia-cuda-mps-control in `folder`; returns it and a function giving its calls so far."""
    folder.mkdir(parents=True, exist_ok=True)
    control, calls = folder / mps.CONTROL, folder / "calls.jsonl"
    control.write_text(FAKE_CONTROL.format(python=sys.executable, calls=str(calls), daemon_fails=daemon_fails,
                                           daemon_pid=str(folder / "daemon.pid")))
    control.chmod(0o755)
    return control, lambda: [json.loads(line) for line in calls.read_text().splitlines()] if calls.is_file() else []


def probe_that(monkeypatch, code):
    monkeypatch.setattr(mps, "PROBE", [sys.executable, "-c", textwrap.dedent(code)])


def test_the_daemon_starts_logging_beside_the_record_and_is_kept_when_a_client_runs_through_it(tmp_path, monkeypatch):
    control, calls = fake_control(tmp_path / "bin")
    probe_that(monkeypatch, "pass")
    record = tmp_path / "runs" / "mps.json"
    began = time.monotonic()
    assert mps.start(record, control) == {"mps": "on"}
    assert time.monotonic() - began < 30  # the daemon (which sleeps a minute) holds its streams: not waited for
    pid_file, deadline = tmp_path / "bin" / "daemon.pid", time.monotonic() + 10
    while len(pid_file.read_text().split() if pid_file.is_file() else []) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # the daemon writes it after its parent has returned
    _, session = pid_file.read_text().split()
    assert int(session) != os.getsid(0)  # outlives the command that started it, as the cells do
    assert calls() == [dict(args=["-d"], stdin="", logs=str(tmp_path / "runs" / "mps-logs"),
                            path=str(tmp_path / "bin"))]  # its server, beside it, first on its PATH
    assert mps.recorded(record) == {"mps": "on"} and (tmp_path / "runs" / "mps-logs").is_dir()
    assert mps.start(record, control) == {"mps": "on"} and len(calls()) == 1  # a later start leaves it running


def test_the_daemon_is_told_to_quit_when_a_client_fails_through_it(tmp_path, monkeypatch):
    control, calls = fake_control(tmp_path / "bin")
    probe_that(monkeypatch, "import sys; sys.exit('all CUDA-capable devices are busy or unavailable')")
    record = tmp_path / "mps.json"
    assert mps.start(record, control) == {
        "mps": "off: a CUDA client failed through MPS: all CUDA-capable devices are busy or unavailable"}
    assert [call["args"] or call["stdin"] for call in calls()] == [["-d"], "quit\n"]
    assert mps.recorded(record)["mps"].startswith("off: ")
    assert mps.start(record, control)["mps"].startswith("off: ") and len(calls()) == 2  # a retry tries nothing again


def test_a_client_that_hangs_through_the_daemon_is_given_up_on_and_the_daemon_told_to_quit(tmp_path, monkeypatch):
    control, calls = fake_control(tmp_path / "bin")
    probe_that(monkeypatch, "import time; time.sleep(30)")
    monkeypatch.setattr(mps, "PROBE_SECONDS", 1)
    began = time.monotonic()
    assert mps.start(tmp_path / "mps.json", control) == {
        "mps": "off: a CUDA client did not finish within 1 s through MPS"}
    assert time.monotonic() - began < 15 and [call["stdin"] for call in calls()] == ["", "quit\n"]


def test_a_daemon_that_fails_to_start_is_recorded_off_and_no_client_is_tried(tmp_path, monkeypatch):
    control, calls = fake_control(tmp_path / "bin", daemon_fails=True)
    probe_that(monkeypatch, f"open({str(tmp_path / 'probed')!r}, 'w')")
    state = mps.start(tmp_path / "mps.json", control)
    assert state == {"mps": f"off: {mps.CONTROL} -d exited 1: An instance of this daemon is already running"}
    assert not (tmp_path / "probed").exists() and len(calls()) == 1


def test_the_control_program_is_found_on_the_path_or_in_the_driver_folders_else_recorded_missing(tmp_path,
                                                                                                monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(mps, "SEARCHED", (tmp_path / "driver",))
    assert mps.find_control() is None
    assert mps.start(tmp_path / "mps.json") == {
        "mps": f"off: {mps.CONTROL} not found on the PATH or in {tmp_path / 'driver'}"}
    control, _ = fake_control(tmp_path / "driver")
    assert mps.find_control() == control
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    on_path, _ = fake_control(tmp_path / "bin")
    assert mps.find_control() == on_path


def test_evidence_start_with_mps_starts_it_before_the_cells_and_collect_and_page_name_it(tmp_path, monkeypatch):
    _, calls = fake_control(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    probe_that(monkeypatch, "pass")
    launched = []
    monkeypatch.setattr(evidence, "subprocess", types.SimpleNamespace(
        Popen=lambda command, **_: launched.append((command, len(calls()))), STDOUT=None))
    args = evidence.Args("start", runs_dir=tmp_path / "runs", device="cpu", agents=("sac-scalar",), mps=True,
                         commit_file=tmp_path / "commit.txt")
    evidence.start(args)
    [(command, daemon_calls_before)] = launched
    assert daemon_calls_before == 1 and "--mps" not in command  # the daemon first; `run` needs no flag for it
    [cell] = [cell for cell in evidence.cells(args) if cell.seed == 1]
    cell.cell_dir.mkdir(parents=True)
    evidence.collect(dataclasses.replace(args, action="collect", out=tmp_path / "out"))
    machine = json.loads((tmp_path / "out" / "machine.json").read_text())
    assert machine["mps"] == "on"
    [line, _] = page.learning_machines({("gpu-evidence-online", "sac-scalar"): machine})
    assert line.endswith("keelrl at commit unknown, the cells' processes sharing the GPU through CUDA MPS.")


@pytest.mark.parametrize("mps_state, ends", [
    (None, "keelrl at commit abc1234"),
    ("off: a CUDA client did not finish within 60 s through MPS",
     "the cells' processes taking turns on the GPU (MPS was asked for but is off: a CUDA client did not finish "
     "within 60 s through MPS)")])
def test_the_page_says_how_the_cells_shared_the_gpu_only_where_mps_was_asked_for(mps_state, ends):
    machine = dict(device="NVIDIA H200", cpus=16, torch="2.11", commit="abc1234")
    assert page.described(machine | ({"mps": mps_state} if mps_state else {})).endswith(ends)


def test_a_retry_quits_mps_first_once_no_started_cell_runs_under_it(tmp_path, monkeypatch):
    """--cudagraphs on the CPU fails at once, as a seed group that died under MPS would."""
    control, calls = fake_control(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    probe_that(monkeypatch, "pass")
    args = evidence.Args("start", runs_dir=tmp_path / "runs", device="cpu", tiny=True, agents=("sac-scalar",),
                         cudagraphs=True, mps=True)
    assert mps.start(tmp_path / "runs" / evidence.MPS_RECORD) == {"mps": "on"}
    evidence.run(args)
    launched = []
    monkeypatch.setattr(evidence, "subprocess", types.SimpleNamespace(
        Popen=lambda command, **_: launched.append(command), STDOUT=None))
    evidence.start(dataclasses.replace(args, retry_failed=True))
    assert [call["stdin"] for call in calls()] == ["", "quit\n"]
    assert mps.recorded(tmp_path / "runs" / evidence.MPS_RECORD)["mps"].startswith("off: quit before a retry")
    [command] = launched
    assert "--batch-seeds" not in command and command[command.index("--agents") + 1] == "sac-scalar"


def test_a_retry_leaves_mps_running_while_a_started_cell_still_runs_under_it(tmp_path, monkeypatch):
    control, calls = fake_control(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    probe_that(monkeypatch, "pass")
    args = evidence.Args("start", runs_dir=tmp_path / "runs", device="cpu", tiny=True,
                         agents=("sac-scalar", "sac-simba"), cudagraphs=True, mps=True)
    mps.start(tmp_path / "runs" / evidence.MPS_RECORD)
    evidence.run(dataclasses.replace(args, agents=("sac-scalar",)))  # fails at once
    [running] = [cell for cell in evidence.cells(args) if cell.agent.name == "sac-simba" and cell.seed == 1]
    running.cell_dir.mkdir(parents=True)  # started, nothing ended: as a cell still running
    monkeypatch.setattr(evidence, "subprocess", types.SimpleNamespace(Popen=lambda command, **_: None, STDOUT=None))
    evidence.start(dataclasses.replace(args, retry_failed=True))
    assert len(calls()) == 1 and mps.recorded(tmp_path / "runs" / evidence.MPS_RECORD) == {"mps": "on"}


@pytest.mark.parametrize("probe, processes", [("pass", None), ("import sys; sys.exit('no MPS here')", "1")])
def test_serial_without_mps_runs_the_entries_one_after_another_in_the_order_given_where_mps_is_off(
        tmp_path, monkeypatch, probe, processes):
    _, calls = fake_control(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    probe_that(monkeypatch, probe)
    launched = []
    monkeypatch.setattr(evidence, "subprocess", types.SimpleNamespace(
        Popen=lambda command, **_: launched.append(command), STDOUT=None))
    args = evidence.Args("start", runs_dir=tmp_path / "runs", device="cpu", agents=("sac-simbav2", "sac-simba"),
                         cudagraphs=True, batch_seeds=True, mps=True, serial_without_mps=True)
    evidence.start(args)
    [command] = launched
    assert (command[command.index("--processes") + 1] if "--processes" in command else None) == processes
    run = dataclasses.replace(args, action="run", processes=int(processes or 0))
    assert [(cell.agent.name, cell.seed) for cell in evidence.cells(run)] == [
        ("sac-simbav2", 1), ("sac-simbav2", 2), ("sac-simbav2", 3), ("sac-simba", 1), ("sac-simba", 2),
        ("sac-simba", 3)]  # the order their processes start in
    at_once = []
    monkeypatch.setattr(evidence.leaderboard, "run_grids",
                        lambda grids, runs_dir, workers, batch_seeds: at_once.append((workers, batch_seeds)))
    evidence.run(run)
    assert at_once == [(1 if processes else 6, True)]  # with --batch-seeds, a process is an entry's seed group


def test_serial_without_mps_is_refused_without_mps():
    with pytest.raises(SystemExit, match="goes with --mps"):
        evidence.main(evidence.Args("start", serial_without_mps=True))


def test_collect_waits_for_the_cells_queued_behind_finished_ones_and_reports_them_once_started(tmp_path,
                                                                                              monkeypatch):
    args = evidence.Args("collect", runs_dir=tmp_path / "runs", out=tmp_path / "out", device="cpu",
                         agents=("sac-scalar", "sac-simba"), wait_minutes=0.02, commit_file=tmp_path / "commit.txt")
    for cell in evidence.cells(args):
        if cell.agent.name == "sac-scalar":
            cell.cell_dir.mkdir(parents=True)  # started; the seed group of sac-simba waits for a free process
    polls = []

    def write_results(args, started, device):  # every started cell done
        polls.append([cell.agent.name for cell in started])
        return [dict(state="done", last_evaluation=300)] * len(started)

    monkeypatch.setattr(evidence, "write_results", write_results)
    monkeypatch.setattr(evidence, "POLL_SECONDS", 0.1)
    evidence.collect(args)
    assert len(polls) > 2 and polls[-1] == ["sac-scalar"] * 3  # waited to the deadline, not returning at once
    for cell in evidence.cells(args):
        cell.cell_dir.mkdir(parents=True, exist_ok=True)
    polls.clear()
    evidence.collect(args)
    assert polls == [["sac-scalar"] * 3 + ["sac-simba"] * 3]  # every cell started and done: at once
