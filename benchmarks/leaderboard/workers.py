"""Workers that run the cells' agent processes: `LocalWorkers` (threads of this process, at most --workers
processes at once) and `RayWorkers` (Ray tasks), both around `run_agent_process`."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from keelrl.benchmarks.leaderboard.cells import LOG_FILE, Cell


def run_agent_process(command: list[str], log_path: str, mode: str,
                      running: set[subprocess.Popen] | None = None) -> dict[str, Any]:
    """Run `python <command>` with its output appended to log_path; its exit code, wall time and host. The process
    is in `running` while it runs (a local worker's, which stops it when the leaderboard is stopped).

    The same function runs in a local worker thread and inside a Ray task.
    """
    start_time, start = time.time(), time.perf_counter()
    with open(log_path, "a") as log:
        log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} on {socket.gethostname()}: {mode} run: "
                  f"python {' '.join(command)}\n")
        log.flush()
        process = subprocess.Popen([sys.executable, *command], stdout=log, stderr=subprocess.STDOUT)
        if running is not None:
            running.add(process)
        try:
            returncode = process.wait()
        finally:
            if process.poll() is None:  # this task was cancelled: let the agent stop as on Ctrl-C
                process.send_signal(signal.SIGINT)
                process.wait()
            if running is not None:
                running.discard(process)
    usable_cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"returncode": returncode, "start_time": start_time, "wall_s": time.perf_counter() - start,
            "host": socket.gethostname(), "usable_cpus": usable_cpus, "worker_pid": os.getpid()}


Job = tuple[Cell, str, list[str]]  # (cell, "new" | "resume", command)


class LocalWorkers:
    """At most `workers` agent processes at once, each watched by a thread of this process."""

    def __init__(self, workers: int):
        self.capacity = workers
        self.running: dict[concurrent.futures.Future, Job] = {}
        self.processes: set[subprocess.Popen] = set()
        """the agent processes running now"""

    def __enter__(self) -> LocalWorkers:
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.capacity)
        return self

    def start(self, job: Job) -> None:
        cell, mode, command = job
        self.running[self.pool.submit(run_agent_process, command, str(cell.cell_dir / LOG_FILE), mode,
                                      self.processes)] = job

    def next_finished(self) -> tuple[Job, dict[str, Any]]:
        done, _ = concurrent.futures.wait(self.running, return_when=concurrent.futures.FIRST_COMPLETED)
        future = next(iter(done))
        return self.running.pop(future), future.result()

    def finish(self) -> list[tuple[Job, dict[str, Any]]]:
        """After a Ctrl-C or SIGTERM: every running job with its outcome, once its agent has checkpointed and
        stopped. The agents are sent SIGTERM (a Ctrl-C at a terminal reached them already, and they ignore the
        second signal; a signal sent to the leaderboard's process alone did not)."""
        signalled: set[subprocess.Popen] = set()
        while True:  # (an agent whose process was starting as the stop came is signalled once it is there)
            for process in list(self.processes):
                if process not in signalled and process.poll() is None:
                    process.send_signal(signal.SIGTERM)
                    signalled.add(process)
            done, pending = concurrent.futures.wait(self.running, timeout=0.5)
            if not pending:
                return [(self.running.pop(future), future.result()) for future in done]

    def __exit__(self, *_: Any) -> None:
        self.pool.shutdown(wait=True)  # on Ctrl-C the running agents got it too: wait for their checkpoints


class RayWorkers:
    """Agent processes as Ray tasks of one CPU each (agents use one torch thread); Ray queues what does not fit, so
    every job is started at once."""

    capacity = sys.maxsize

    def __init__(self, address: str, workers: int):
        try:
            import ray
        except ImportError:
            raise ValueError("--ray needs Ray: pip install 'keelrl[ray]' (or pip install ray).") from None
        self.ray, self.address, self.workers = ray, address, workers
        self.running: dict[Any, Job] = {}

    def __enter__(self) -> RayWorkers:
        self.started_here = not self.ray.is_initialized()
        handler = signal.getsignal(signal.SIGTERM)  # ray.init installs its own (sys.exit); the leaderboard's stays
        if self.started_here:
            if self.address == "local":
                self.ray.init(num_cpus=self.workers, include_dashboard=False, log_to_driver=False)
            else:
                try:
                    self.ray.init(address=self.address, log_to_driver=False)
                except ConnectionError as err:
                    raise ValueError(f"--ray {self.address}: no Ray cluster answers there ({str(err).splitlines()[0]}); "
                                     f"start one (ray start --head) or use --ray local.") from None
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, handler)
        self.remote_run = self.ray.remote(num_cpus=1)(run_agent_process)
        return self

    def start(self, job: Job) -> None:
        cell, mode, command = job
        self.running[self.remote_run.remote(command, str(cell.cell_dir.resolve() / LOG_FILE), mode)] = job

    def next_finished(self) -> tuple[Job, dict[str, Any]]:
        (ready,), _ = self.ray.wait(list(self.running), num_returns=1)
        return self.running.pop(ready), self.ray.get(ready)

    def finish(self) -> list[tuple[Job, dict[str, Any]]]:
        """After a Ctrl-C: nothing (leaving cancels the Ray tasks, whose outcomes are lost: their attempts stay
        recorded as started, their wall time not measured)."""
        return []

    def __exit__(self, *_: Any) -> None:
        for task in self.running:
            self.ray.cancel(task)
        if self.started_here:
            self.ray.shutdown()

