"""What a run writes down and shows while it trains: TensorBoard scalars with CleanRL's names, episodes.csv and
eval.csv, videos of the policy (--capture-video), W&B (--track), the progress a person watching sees (a bar on a
terminal, plain lines elsewhere), and the speeds it logs and reports."""

from __future__ import annotations

import csv
import dataclasses
import math
import re
import shlex
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from keelrl.agents.harness.checkpoints import one_line
from keelrl.buffers.offline import normalized_score
from keelrl.envs.video import VideoSource, VideoUnavailable, film_episode, offscreen_gl_backend, write_mp4

EPISODES_FILE = "episodes.csv"
"""a run directory's row per training episode"""
EVAL_FILE = "eval.csv"
"""a run directory's row per evaluation"""
VIDEO_INDEX = Path("videos") / "videos.csv"
"""a run's videos (--capture-video), a row each, relative to its directory"""


class RunLogger:
    """TensorBoard scalars (CleanRL names) plus episodes.csv and eval.csv in the run directory; each evaluation
    also logs the D4RL-normalised score against `reference_returns` (random, expert), and with `filming`
    (--capture-video) films an episode.

    On resume from step S, rows and events after S (written before the interruption but not
    covered by the checkpoint) are dropped, so the logs have no gap and no duplicate. Resuming a run
    whose checkpoint is its last (killed before model.pt was written) finishes it again: its final
    evaluation, at S, is dropped too (`refinish`), since it is made again.
    """

    EPISODE_FIELDS = ["global_step", "return", "length", "cost"]
    EVAL_FIELDS = ["global_step", "mean_return", "std_return", "mean_cost", "episodes"]
    VIDEO_FIELDS = ["global_step", "file", "return", "cost", "length"]
    """videos/videos.csv's (`Filming`)"""

    def __init__(self, run_dir: Path, resume_step: int | None = None, refinish: bool = False,
                 reference_returns: tuple[float, float] | None = None, filming: Filming | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.run_dir, self.reference_returns, self.filming = run_dir, reference_returns, filming
        # TensorBoard drops the earlier events at or after purge_step: those after S, or from S on when refinishing
        purge_step = None if resume_step is None else resume_step + (0 if refinish else 1)
        self.writer = SummaryWriter(str(run_dir), purge_step=purge_step)
        self._episodes, _ = self._open_csv(EPISODES_FILE, self.EPISODE_FIELDS, resume_step)
        self._evals, kept = self._open_csv(EVAL_FILE, self.EVAL_FIELDS, None if purge_step is None else purge_step - 1)
        self.last_evaluation = float(kept[-1]["mean_return"]) if kept else float("nan")
        """the mean return of the latest evaluation kept from before a resume (NaN: none)"""
        if purge_step is not None and (run_dir / VIDEO_INDEX).is_file():  # the dropped evaluations' videos come again
            self._open_csv(VIDEO_INDEX, self.VIDEO_FIELDS, purge_step - 1)[0][0].close()

    def _open_csv(self, name: str | Path, fields: list[str], last_step: int | None):
        """The CSV rewritten with its rows up to `last_step` (a new file when None), open for more rows:
        ((handle, writer), the rows kept)."""
        path = self.run_dir / name
        rows = []
        if last_step is not None and path.exists():
            with path.open() as f:
                rows = [r for r in csv.DictReader(f) if int(r["global_step"]) <= last_step]
        handle = path.open("w", newline="")
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
        handle.flush()
        return (handle, writer), rows

    def scalars(self, values: dict[str, float], step: int) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, float(value), step)

    def episode(self, step: int, episode_return: float, length: int, cost: float) -> None:
        handle, writer = self._episodes
        writer.writerow({"global_step": step, "return": episode_return, "length": length, "cost": cost})
        handle.flush()
        self.scalars(
            {"charts/episodic_return": episode_return, "charts/episodic_length": length, "charts/episodic_cost": cost},
            step,
        )

    def evaluation(self, step: int, returns: np.ndarray, costs: np.ndarray) -> None:
        handle, writer = self._evals
        writer.writerow({
            "global_step": step,
            "mean_return": float(returns.mean()),
            "std_return": float(returns.std()),
            "mean_cost": float(costs.mean()),
            "episodes": len(returns),
        })
        handle.flush()
        self.scalars({"eval/episodic_return": returns.mean(), "eval/episodic_cost": costs.mean()}, step)
        if self.reference_returns is not None:
            self.scalars({"eval/normalized_score": self.score(returns)}, step)
        self.writer.flush()  # on disk now, as in eval.csv, not when the writer's queue or 2-minute timer next flushes
        if self.filming is not None:
            self.filming.film(self.run_dir, step, self.writer)

    def score(self, returns: np.ndarray) -> float | None:
        """The D4RL-normalised score of an evaluation's mean return (None: no reference returns)."""
        return None if self.reference_returns is None else normalized_score(returns, *self.reference_returns).mean()

    def close(self) -> None:
        self.writer.close()
        for handle, _ in (self._episodes, self._evals):
            handle.close()


class Filming:
    """--capture-video: after each evaluation, an episode of the current policy replayed with the evaluation's
    seed, written as RUN_DIR/videos/step{N}.mp4 with a row of videos/videos.csv (return, cost, length) and a
    frame in TensorBoard. A machine that cannot render offscreen, or a failure later, is said in one line and
    training goes on without video."""

    def __init__(self, video: VideoSource):
        self.video: VideoSource | None = video
        try:
            offscreen_gl_backend()
        except VideoUnavailable as err:
            print(f"--capture-video: {err}; training goes on without video.", file=sys.stderr)
            self.video = None

    def film(self, run_dir: Path, step: int, writer: Any) -> None:
        """Film one episode at `step`; `writer`: the run's TensorBoard SummaryWriter."""
        if self.video is None:
            return
        try:
            episode = film_episode(self.video)
            path = run_dir / "videos" / f"step{step:09d}.mp4"
            write_mp4(path, episode.frames, episode.fps)
        except Exception as err:  # VideoUnavailable, or one of the many types rendering raises without GL
            print(f"--capture-video: no video ({one_line(err)}); training goes on without video.", file=sys.stderr)
            self.video = None
            return
        index = run_dir / VIDEO_INDEX
        new_index = not index.is_file()
        with index.open("a", newline="") as f:
            rows = csv.DictWriter(f, fieldnames=RunLogger.VIDEO_FIELDS)
            if new_index:
                rows.writeheader()
            rows.writerow({"global_step": step, "file": path.name, "return": episode.episode_return,
                           "cost": episode.cost, "length": len(episode.frames)})
        writer.add_image("eval/video_frame", episode.frames[len(episode.frames) // 2], step, dataformats="HWC")


def progress_bar(total: int, initial: int, quiet: bool):
    """A tqdm bar that turns itself off under --quiet or when stderr is not a terminal."""
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True,
                disable=quiet or not sys.stderr.isatty(), smoothing=0.05)


class Progress:
    """The progress bar (on stderr, when it is a terminal) and, wherever the bar does not reach a terminal beside
    stdout, a plain line on stdout every `seconds`: steps, speed since the last line, the latest training return
    (not for offline agents, which have no training episodes) and evaluation ("–" until there is one), and the
    time left at that speed. Nothing under --quiet."""

    def __init__(self, algo: str, unit: str, total: int, initial: int, quiet: bool, seconds: float):
        self.algo, self.unit, self.total, self.seconds = algo, unit, total, seconds
        self.bar = progress_bar(total, initial, quiet)
        self.plain_lines = not quiet and not (sys.stdout.isatty() and sys.stderr.isatty())
        self._last_line = (time.perf_counter(), initial)  # (time, step) of the last plain line, or of the start
        self._lines_printed = 0

    def advance(self, step: int, steps: int, recent_return: float, recent_evaluation: float) -> None:
        """`steps` more loop steps, `step` in all; a plain line when one is due."""
        self.bar.update(steps)
        now, (last_time, last_step) = time.perf_counter(), self._last_line
        if self.plain_lines and (self._lines_printed == 0 or now - last_time >= self.seconds):
            self._last_line, self._lines_printed = (now, step), self._lines_printed + 1
            self._print_line(step, (step - last_step) / max(now - last_time, 1e-9), recent_return, recent_evaluation)

    def _print_line(self, step: int, sps: float, recent_return: float, recent_evaluation: float) -> None:
        fields = [f"[{self.algo}] {self.unit} {step}/{self.total} ({100 * step / self.total:.0f}%)",
                  f"{sps:.1f} {self.unit}s/s"]
        if self.unit != "update":
            fields.append(f"last return {_shown(recent_return)}")
        fields.append(f"last evaluation {_shown(recent_evaluation)}")
        fields.append(f"ETA {duration((self.total - step) / sps) if sps > 0 else '?'}")
        print(" | ".join(fields), flush=True)

    def show(self, **fields: str) -> None:
        """Figures beside the bar (ret=..., sps=...)."""
        self.bar.set_postfix(**fields, refresh=False)

    def close(self) -> None:
        self.bar.close()


class Speeds:
    """A run's loop steps per second, counted from `start_step`: while it trains (charts/SPS, evaluations and
    checkpoints left out), over its whole loop, and from its first update on."""

    def __init__(self, start_step: int):
        self.start_step = start_step
        self.busy = 0.0
        """seconds spent evaluating and checkpointing, left out of the logged speed"""
        self.update_start: tuple[float, int] | None = None
        """(time, step) of the first logged update"""
        self._start_time = self._loop_end = float("nan")

    def start(self) -> None:
        self._start_time = time.perf_counter()

    def updated(self, step: int) -> None:
        """An update's losses were logged at `step`; the first call marks when updates began."""
        if self.update_start is None:
            self.update_start = (time.perf_counter(), step)

    def end_loop(self) -> None:
        self._loop_end = time.perf_counter()

    def training(self, step: int) -> float:
        """Since `start`, evaluations and checkpoints left out."""
        elapsed = time.perf_counter() - self._start_time - self.busy
        return (step - self.start_step) / max(elapsed, 1e-9)

    def loop(self, step: int) -> float:
        """Of this process's loop, evaluations and checkpoints in it included."""
        return (step - self.start_step) / max(self._loop_end - self._start_time, 1e-9)

    def updating(self, step: int) -> float:
        """Of this process's loop from the first logged update on (NaN if none)."""
        if self.update_start is None:
            return float("nan")
        start_time, start_step = self.update_start
        return (step - start_step) / max(self._loop_end - start_time, 1e-9)

    def summary(self, unit: str, step: int, last_advance: int) -> str:
        """The speeds line a finished run prints: overall, and while updating where updates began after the first
        iteration and before the last (`last_advance`: the steps of one)."""
        line = f"{unit}s/s: {self.loop(step):.1f} overall"
        if self.update_start is not None and self.start_step + last_advance < self.update_start[1] < step:
            line += f", {self.updating(step):.1f} while updating"
        return line


def print_result(returns: np.ndarray, score: float | None, lines: tuple[str, ...], run_dir: Path,
                 runs_dir: str) -> None:
    """What a finished run prints: its final evaluation (and normalised score), `lines` (its speeds, the agent's own)
    and where the run is."""
    print(f"final evaluation return over {len(returns)} episodes: {returns.mean():.1f} ± {returns.std():.1f}")
    if score is not None:
        print(f"normalised score {score:.1f}")
    for line in lines:
        print(line)
    print(f"run saved in {run_dir}; open the curves with: tensorboard --logdir {shlex.quote(str(Path(runs_dir)))}")


def duration(seconds: float) -> str:
    """H:MM:SS with as many hours as it takes (never wrapping at a day): 24 h 6 min 8 s is '24:06:08'."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}"


def _shown(value: float) -> str:
    """A logged figure for a progress line: '–' while nothing is known yet."""
    return "–" if math.isnan(value) else f"{value:.1f}"


def import_wandb() -> ModuleType:
    try:
        import wandb
    except ImportError:
        raise ValueError("--track logs to Weights & Biases, which is not installed: pip install 'keelrl[wandb]'.") \
            from None
    return wandb


def start_wandb(config: Any, algo: str, run_dir: Path) -> Any:
    """A W&B run following the TensorBoard logs of `run_dir`, with the config; a resumed run continues its W&B run.
    W&B failing to start (not logged in, no network) is one line."""
    wandb = import_wandb()
    try:
        return wandb.init(project=config.wandb_project, entity=config.wandb_entity, group=config.wandb_group,
                          name=run_dir.name, id=re.sub(r"[^\w-]", "-", run_dir.name)[:64], resume="allow",
                          config={"algo": algo, **dataclasses.asdict(config)}, dir=str(run_dir), sync_tensorboard=True)
    except Exception as err:  # wandb raises its own types (UsageError, CommError) and others
        raise ValueError(f"--track: W&B did not start ({one_line(err)}): log in with `wandb login`, or set "
                         f"WANDB_MODE=offline to keep the run on this machine; {run_dir} holds only its "
                         f"config.") from None
