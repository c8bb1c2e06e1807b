"""Step 1 of the GPU run: SAC and TD3 steps/s beside CleanRL and LeanRL, every agent on the device, seeds at once.

    python -m keelrl.benchmarks.gpu.speed --out RESULTS                     # on the GPU machine (about 8 minutes)
    python -m keelrl.benchmarks.gpu.speed --out RESULTS --tiny --device cpu # here: the same steps, a few hundred each

Three parts, written into RESULTS as they finish (a time-out keeps what is done):
1. speed.csv: environment steps per second of SAC and TD3 on `--env-id`, one run at a time on a quiet device:
   CleanRL's script, LeanRL's with torch.compile and with CUDA graphs too, and keelrl eager, --compile,
   --cudagraphs and bf16 with --cudagraphs. Every run takes `--learning-starts` random steps, then updates
   once per step; the figure is the rate over the last `--timed-steps`, after `--burn-in` update steps that
   compilation and graph capture may use: for CleanRL and keelrl from the wall times of the charts/SPS points
   they write to TensorBoard, for LeanRL its own measure (--measure-burnin; the last 'sps' of its progress
   bar). The compiled settings run once beforehand, all at once, so that the timed runs find their
   compiled code in torch's cache; every agent's smoke run (part 2) runs beside that warm-up.
2. smoke.csv: every keelrl agent that has a --device option, a few hundred steps on the device, with the host
   synchronisations CUDA's sync debug mode reports per loop step and where the most of them come from.
3. seeds.md: --num-seeds 10 in one process beside 10 processes (benchmarks/perf/seeds_speed.py).
The reference scripts are copies outside the repository (`--references`, see README.md here); a missing one
leaves its row "not measured". Measurements still waiting when `--deadline-minutes` have passed are skipped
and written as not measured, so the command ends within the machine's 10-minute limit.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from keelrl.agents.harness.options import parse_command_line
from keelrl.benchmarks.gpu.syncs import SMOKE_TASKS, smoke_command
from keelrl.benchmarks.perf.rates import tensorboard_points, window_rate


@dataclasses.dataclass
class Args:
    out: Path
    """folder the results are written into"""
    device: str = "cuda"
    """where keelrl and the reference scripts train (cpu: only to try the steps here)"""
    references: Path = Path(".gpu/ref")
    """folder holding cleanrl/{sac,td3}_continuous_action.py and leanrl/{sac,td3}_continuous_action_torchcompile.py"""
    algos: tuple[str, ...] = ("sac", "td3")
    only: tuple[str, ...] = ()
    """time only these settings, named IMPLEMENTATION:SETTING as the table shows them (e.g. keelrl:--cudagraphs
    leanrl:"torch.compile + CUDA graphs"); the others are written as not measured. Empty: every setting"""
    env_id: str = "Hopper-v5"
    learning_starts: int = 1_000
    """random steps before updates begin (not timed)"""
    burn_in: int = 300
    """update steps before the timing starts (compilation, CUDA-graph capture)"""
    timed_steps: int = 2_000
    """update steps timed after the burn-in"""
    repeats: int = 1
    """runs of every setting, taken in turn (each repeat runs every setting once before the next repeat begins), so
    that a drift of the machine's speed falls on every setting alike"""
    smoke_steps: int = 300
    """loop steps of every agent's smoke run"""
    smoke_agents: tuple[str, ...] = tuple(SMOKE_TASKS)
    """the agents of part 2 (WSRL needs CQL's run)"""
    seeds: int = 10
    """S of the --num-seeds measurement (0: skip it)"""
    deadline_minutes: float = 7.5
    """measurements not started by then are written as not measured; one still running a minute later is
    stopped (the machine's commands end at 10 minutes, and step 2 starts after this one)"""
    tiny: bool = False
    """a few hundred steps per run: to try every step here, on the CPU"""
    datasets: Path = Path(".gpu/minari")
    """MINARI_DATASETS_PATH of the offline agents' smoke runs"""


@dataclasses.dataclass(frozen=True)
class Setting:
    implementation: str
    """keelrl, cleanrl or leanrl"""
    name: str
    """how the table names it"""
    flags: tuple[str, ...]
    """command-line flags of this setting"""
    needs_cuda: bool = False
    compiled: bool = False


SETTINGS = (
    Setting("cleanrl", "eager", ()),
    Setting("leanrl", "torch.compile", ("--compile",), compiled=True),
    Setting("leanrl", "torch.compile + CUDA graphs", ("--compile", "--cudagraphs"), needs_cuda=True, compiled=True),
    Setting("keelrl", "eager", ()),
    Setting("keelrl", "--compile", ("--compile",), needs_cuda=True, compiled=True),
    Setting("keelrl", "--cudagraphs", ("--cudagraphs",), needs_cuda=True, compiled=True),
    Setting("keelrl", "bf16 --cudagraphs", ("--precision", "bf16", "--cudagraphs"), needs_cuda=True, compiled=True),
)
REFERENCE_SCRIPTS = {"cleanrl": "cleanrl/{algo}_continuous_action.py",
                     "leanrl": "leanrl/{algo}_continuous_action_torchcompile.py"}
SPEED_FIELDS = ("algo", "implementation", "setting", "repeat", "steps_per_s", "note", "command")
WARM_UP_SECONDS, SMOKE_SECONDS = 180, 150
"""how long the compile warm-up runs and the smoke runs may take (they run at the same time, before the timed runs)"""
SEEDS_MINUTES = 1.5
"""what part 3 may take: it starts only this long before the deadline"""
SMOKE_FIELDS = ("agent", "returncode", "steps", "syncs", "syncs_per_step", "top_locations", "error")


def apply_tiny(args: Args) -> Args:
    """A few hundred steps per run (smoke runs 160: more than one PPO rollout of the smoke tasks, 4 × 32)."""
    if not args.tiny:
        return args
    return dataclasses.replace(args, learning_starts=100, burn_in=50, timed_steps=200, smoke_steps=160,
                               seeds=min(args.seeds, 2))


def run_command(args: Args, algo: str, setting: Setting, total: int, runs_dir: Path) -> list[str]:
    """The command of one run of `setting`; reference scripts run through benchmarks/gpu/reference.py."""
    common = ["--env-id", args.env_id, "--total-timesteps", str(total), "--learning-starts", str(args.learning_starts),
              "--seed", "1"]
    if setting.implementation == "keelrl":
        return [sys.executable, "-m", f"keelrl.agents.{algo}", *common, "--device", args.device, "--threads", "1",
                "--eval-freq", "0", "--eval-episodes", "1", "--checkpoint-freq", str(total), "--checkpoint-minutes",
                "0", "--log-freq", "100", "--runs-dir", str(runs_dir), "--quiet", *setting.flags]
    script = (args.references / REFERENCE_SCRIPTS[setting.implementation].format(algo=algo)).resolve()
    burn_in = ["--measure-burnin", str(args.burn_in)] if setting.implementation == "leanrl" else []
    no_cuda = [] if args.device.startswith("cuda") else ["--no-cuda"]
    return [sys.executable, "-m", "keelrl.benchmarks.gpu.reference", str(script), *common, *no_cuda, *burn_in,
            *setting.flags]


def shown(command: list[str], folder: str) -> str:
    """A command as the results show it: python for the interpreter, RUNS for the temporary run folder, paths
    relative to the repository's root (where the command runs from)."""
    return " ".join(["python", *command[1:]]).replace(folder, "RUNS").replace(f"{Path.cwd()}{os.sep}", "")


def unavailable(args: Args, algo: str, setting: Setting) -> str:
    """Why `setting` cannot run here ('' if it can)."""
    if args.only and f"{setting.implementation}:{setting.name}" not in args.only:
        return "not measured: not among --only"
    if setting.needs_cuda and not args.device.startswith("cuda"):
        return "not measured: needs CUDA"
    if setting.implementation != "keelrl":
        script = args.references / REFERENCE_SCRIPTS[setting.implementation].format(algo=algo)
        if not script.is_file():
            return f"not measured: no copy of {setting.implementation}'s script (prepare.sh makes it)"
    return ""


def start_run(args: Args, algo: str, setting: Setting, total: int, folder: Path) -> tuple[subprocess.Popen, str]:
    """Start one run of `setting` in `folder` (its output into folder/stdout.txt and stderr.txt); (the process,
    its command as shown)."""
    folder.mkdir(parents=True)
    command = run_command(args, algo, setting, total, folder / "runs")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if setting.implementation == "cleanrl":  # its scripts import cleanrl_utils from the folder above theirs
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(args.references.resolve()), env.get("PYTHONPATH")]))
    with (folder / "stdout.txt").open("w") as stdout, (folder / "stderr.txt").open("w") as stderr:
        process = subprocess.Popen(command, cwd=folder, stdout=stdout, stderr=stderr, env=env)
    return process, shown(command, str(folder))


def stop(process: subprocess.Popen, until: float) -> str:
    """Wait for `process` until `until` (time.monotonic()); kill it if it is still running then. '' if it ended
    by itself."""
    try:
        process.wait(timeout=max(until - time.monotonic(), 0))
        return ""
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return "killed: still running at its time limit"


def last_error(process: subprocess.Popen, stderr: str) -> str:
    """'' when `process` ended well, else the last line it wrote to stderr."""
    return "" if process.returncode == 0 else (stderr.strip().splitlines() or [f"exit {process.returncode}"])[-1]


def measure(args: Args, algo: str, setting: Setting, folder: Path, stop_at: float) -> tuple[float | None, str, str]:
    """(steps/s over the timed window or None, a note, the command) of one run of `setting`, alone; a run still
    going at `stop_at` (time.monotonic()) is stopped and not measured."""
    process, command = start_run(args, algo, setting, args.learning_starts + args.burn_in + args.timed_steps, folder)
    if stop(process, stop_at):
        return None, "not measured: still running a minute after the deadline", command
    stderr = (folder / "stderr.txt").read_text()
    if process.returncode != 0:
        return None, f"failed: {last_error(process, stderr)}", command
    if setting.implementation == "leanrl":
        rates = re.findall(r"([\d.]+) sps", stderr)
        return (float(rates[-1]), "", command) if rates else (None, "failed: no 'sps' in its output", command)
    try:
        return window_rate(tensorboard_points(folder), args.learning_starts + args.burn_in), "", command
    except ValueError as error:
        return None, f"failed: {error}", command


def warm_up_compiled(args: Args, settings: list[tuple[str, Setting]], scratch: Path) -> list[subprocess.Popen]:
    """Start a short run of every compiled setting at once (torch's compile cache keeps their code for the timed
    runs); returns the processes, which the caller waits for."""
    return [start_run(args, algo, setting, args.learning_starts + 50, scratch / f"warm-up-{i}")[0]
            for i, (algo, setting) in enumerate(settings) if setting.compiled]


def write_csv(path: Path, fields: tuple[str, ...], rows: list[dict]) -> None:
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fields)
        writer.writeheader()
        writer.writerows(rows)


def speed_rows(args: Args, deadline: float, scratch: Path) -> list[dict]:
    """Part 1 (with part 2 beside its warm-up): every setting's steps/s, one run at a time, into speed.csv."""
    settings = [(algo, setting) for algo in args.algos for setting in SETTINGS]
    runnable = [(algo, setting) for algo, setting in settings if not unavailable(args, algo, setting)]
    warm_up, until = warm_up_compiled(args, runnable, scratch), time.monotonic() + WARM_UP_SECONDS
    smoke_rows(args, scratch / "smoke")
    for process in warm_up:
        stop(process, until)
    rows = []
    for i, (repeat, (algo, setting)) in enumerate((r, s) for r in range(1, args.repeats + 1) for s in settings):
        row = dict(algo=algo, implementation=setting.implementation, setting=setting.name, repeat=repeat,
                   steps_per_s="", note=unavailable(args, algo, setting), command="")
        if not row["note"] and time.monotonic() > deadline:
            row["note"] = "not measured: the deadline had passed"
        if not row["note"]:
            rate, row["note"], row["command"] = measure(args, algo, setting, scratch / f"timed-{i}", deadline + 60)
            row["steps_per_s"] = "" if rate is None else f"{rate:.1f}"
        print(f"{algo} {setting.implementation} {setting.name} (repeat {repeat}): "
              f"{row['steps_per_s'] or row['note']}", flush=True)
        rows.append(row)
        write_csv(args.out / "speed.csv", SPEED_FIELDS, rows)
    return rows


def smoke_rows(args: Args, scratch: Path) -> list[dict]:
    """Part 2: every agent with a --device option, `--smoke-steps` on the device, all at once (the WSRL one from
    the CQL one's run), into smoke.csv."""
    scratch.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MINARI_DATASETS_PATH": str(args.datasets.resolve())}

    def run(agent: str, until: float, *extra: str) -> Callable[[], str]:
        """Start `agent`'s smoke run; a function that waits for it until `until` and returns its error line."""
        command = smoke_command(agent, args.smoke_steps, args.device, scratch / agent, scratch / f"{agent}.json",
                                *extra)
        with (scratch / f"{agent}.stderr").open("w") as stderr:
            process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        return lambda: stop(process, until) or last_error(process, (scratch / f"{agent}.stderr").read_text())

    until = time.monotonic() + SMOKE_SECONDS
    waits = {agent: run(agent, until) for agent in args.smoke_agents if agent != "wsrl"}
    errors = {agent: wait() for agent, wait in waits.items()}
    if "wsrl" in args.smoke_agents:
        pretrained = next((scratch / "cql").glob("*/config.json"), None)
        errors["wsrl"] = (run("wsrl", time.monotonic() + SMOKE_SECONDS / 2, "--pretrained", str(pretrained.parent))()
                          if pretrained else "no CQL run")
    rows = []
    for agent in args.smoke_agents:
        report = scratch / f"{agent}.json"
        row = json.loads(report.read_text()) if report.is_file() else dict.fromkeys(SMOKE_FIELDS, "") | {"agent": agent}
        rows.append(row | {"error": errors[agent]})
    write_csv(args.out / "smoke.csv", SMOKE_FIELDS, rows)
    return rows


def machine(device: str, commit_file: Path) -> dict:
    """What a results page names a GPU run by: the device, torch, CUDA, Python, the CPUs, and the commit prepare.sh
    recorded in `commit_file`."""
    cuda = device.startswith("cuda")
    return dict(device=torch.cuda.get_device_name(0) if cuda else f"CPU ({device})",
                torch=torch.__version__, cuda=torch.version.cuda or "", python=sys.version.split()[0],
                cpus=os.cpu_count(), commit=commit_file.read_text().strip() if commit_file.is_file() else "unknown")


def environment(args: Args) -> dict:
    """The machine (the commit from prepare.sh's .gpu/commit.txt, beside the references) and the speed settings."""
    return machine(args.device, args.references.parent / "commit.txt") | dict(
        env_id=args.env_id, learning_starts=args.learning_starts, burn_in=args.burn_in, timed_steps=args.timed_steps,
        repeats=args.repeats, smoke_steps=args.smoke_steps, tiny=args.tiny)


def seeds_table(args: Args) -> None:
    """Part 3: --num-seeds S in one process beside S processes, into seeds.md."""
    from keelrl.benchmarks.perf import seeds_speed

    seeds_speed.main(seeds_speed.Args(sizes=(args.seeds,), env_id=args.env_id, device=args.device,
                                      total_timesteps=args.learning_starts + args.burn_in + args.timed_steps // 2,
                                      learning_starts=args.learning_starts, out=args.out / "seeds.md"))


def main(args: Args) -> None:
    args = apply_tiny(args)
    known = {f"{setting.implementation}:{setting.name}" for setting in SETTINGS}
    if unknown := set(args.only) - known:
        raise SystemExit(f"--only: no setting named {sorted(unknown)}; the settings are {sorted(known)}")
    deadline = time.monotonic() + 60 * args.deadline_minutes
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "environment.json").write_text(json.dumps(environment(args), indent=2))
    with tempfile.TemporaryDirectory() as scratch:
        speed_rows(args, deadline, Path(scratch))
    if args.seeds and time.monotonic() < deadline - SEEDS_MINUTES * 60:
        try:
            seeds_table(args)
        except (subprocess.CalledProcessError, RuntimeError, AssertionError) as error:
            (args.out / "seeds.md").write_text(f"failed: {error}\n")


if __name__ == "__main__":
    main(parse_command_line(Args))
