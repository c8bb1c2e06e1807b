"""CUDA's Multi-Process Service (MPS) for the learning cells that share a lease's one GPU.

Without it, the cells' processes take turns on the GPU (time-slicing): each process's kernels run only in its own
slice, and every host synchronisation (an online agent has at least one per step: the action going to the
environment) waits for its process's next turn. Four seed groups with --cudagraphs ran about 40 loop steps/s each on
an H200 where one SAC process alone ran 470.8 (benchmarks/results/gpu.md). Under MPS the processes are clients of one
server whose context runs their kernels side by side. Starting it changes no device setting (the compute mode stays
as it is); the daemon lives until it is told to quit or the machine goes back.

    python -m keelrl.benchmarks.gpu.evidence start --mps ...      # evidence.py starts it through `start` below

`start` runs the control daemon (`nvidia-cuda-mps-control -d`, its logs beside the record), then a probe: a CUDA
client that must finish within PROBE_SECONDS. If the daemon is missing, fails or the probe does, the daemon is told
to quit and the cells share the GPU as before. Either way the record (a JSON file) says which, for machine.json and
the results page.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"
SEARCHED = (Path("/usr/local/nvidia/bin"), Path("/usr/bin"), Path("/usr/local/cuda/bin"))
"""where the control program is looked for when it is not on the PATH (the device machine mounts its driver under
/usr/local/nvidia)"""
PROBE = [sys.executable, "-c", "import torch; x = torch.ones(8, device='cuda'); assert x.sum().item() == 8"]
PROBE_SECONDS = 60
"""a client imports torch and makes its CUDA context through the server (seconds); every second past that is the
lease's: a probe that outlasts it leaves the cells to share the GPU without MPS"""
CONTROL_SECONDS = 60
ON = "on"


def find_control() -> Path | None:
    on_path = shutil.which(CONTROL)
    if on_path:
        return Path(on_path)
    return next((folder / CONTROL for folder in SEARCHED if (folder / CONTROL).is_file()), None)


def recorded(record: Path) -> dict:
    """{'mps': 'on' | 'off: why'} from a record `start` wrote; {} where none was (MPS not asked for)."""
    return json.loads(record.read_text()) if record.is_file() else {}


def start(record: Path, control: Path | None = None) -> dict:
    """Start the MPS control daemon and check that a CUDA client runs through it; quit it if not. Writes and
    returns the record. Where a record exists (a later `evidence start` of the lease, a retry say), it is returned
    and nothing is started or tried again."""
    if record.is_file():
        return recorded(record)
    control = control or find_control()
    if control is None:
        return write(record, f"off: {CONTROL} not found on the PATH or in {', '.join(map(str, SEARCHED))}")
    logs = record.parent / "mps-logs"  # run_control makes it
    # the daemon starts nvidia-cuda-mps-server from its PATH: the control program's folder holds it
    path = f"{control.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    failure = run_control(control, ["-d"], "", logs, os.environ | {"CUDA_MPS_LOG_DIRECTORY": str(logs), "PATH": path})
    if failure:
        return write(record, f"off: {failure}")
    write(record, ON)
    failure = probe_failure()
    return quit_daemon(record, failure, control) if failure else recorded(record)


def quit_daemon(record: Path, why: str, control: Path | None = None) -> dict:
    """Tell a daemon `start` left running to quit (its server, and any client still using it, end with it) and
    record it off with `why`; a record not saying 'on' is returned as it is."""
    if recorded(record).get("mps") != ON:
        return recorded(record)
    control = control or find_control()
    failure = run_control(control, [], "quit\n", record.parent / "mps-logs") if control else None
    return write(record, f"off: {why}" + (f" (and {failure})" if failure else ""))


def run_control(control: Path, arguments: list[str], commands: str, logs: Path, env: dict | None = None) -> str | None:
    """Run the control program with `commands` on its standard input; None if it exited 0 within CONTROL_SECONDS,
    else why. Its output goes to logs/control.txt, not to a pipe: the daemon that `-d` forks may keep the streams it
    was given, and reading a pipe would wait for the daemon to end. It runs in a session of its own, as the cells do:
    the device machine ends what a command leaves running in its session when the command returns."""
    said = f"{CONTROL} {' '.join(arguments)}".strip()
    logs.mkdir(parents=True, exist_ok=True)
    with (logs / "control.txt").open("a") as output:
        try:
            result = subprocess.run([str(control), *arguments], input=commands, stdout=output,
                                    stderr=subprocess.STDOUT, text=True, env=env, timeout=CONTROL_SECONDS,
                                    start_new_session=True)
        except subprocess.TimeoutExpired:
            return f"{said} did not return within {CONTROL_SECONDS} s"
    if result.returncode == 0:
        return None
    lines = (logs / "control.txt").read_text().strip().splitlines()
    return f"{said} exited {result.returncode}: {lines[-1] if lines else 'no output'}"


def probe_failure() -> str | None:
    """Why the probe (PROBE, a CUDA client) failed through MPS, or None if it exited 0 within PROBE_SECONDS."""
    try:
        result = subprocess.run(PROBE, capture_output=True, text=True, timeout=PROBE_SECONDS)
    except subprocess.TimeoutExpired:
        return f"a CUDA client did not finish within {PROBE_SECONDS} s through MPS"
    return None if result.returncode == 0 else f"a CUDA client failed through MPS: {tail(result)}"


def write(record: Path, state: str) -> dict:
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"mps": state}))
    return {"mps": state}


def tail(result: subprocess.CompletedProcess) -> str:
    """The last line a process wrote (stderr first), for a record's one line."""
    lines = (result.stderr or result.stdout or "").strip().splitlines()
    return lines[-1] if lines else "no output"
