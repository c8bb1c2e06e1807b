"""Steps per second of a finished run, from the wall times of the points it wrote to TensorBoard: the window that
benchmarks/gpu/speed.py, gpu/evidence.py and perf/seeds_speed.py time (after compilation or a burn-in)."""

from __future__ import annotations

from pathlib import Path


def window_rate(points: list[tuple[int, float]], from_step: int) -> float:
    """Steps per second between the first (step, seconds) point at or after `from_step` and the last point."""
    timed = [(step, seconds) for step, seconds in points if step >= from_step]
    if len(timed) < 2:
        raise ValueError(f"fewer than two timing points from step {from_step} on: {points[-3:]}")
    (first_step, first_time), (last_step, last_time) = timed[0], timed[-1]
    return (last_step - first_step) / (last_time - first_time)


def tensorboard_points(folder: Path, tag: str | None = "charts/SPS") -> list[tuple[int, float]]:
    """(step, wall time) of every point of `tag` (None: of every scalar) written to TensorBoard under `folder`,
    by step: keelrl writes charts/SPS every --log-freq steps, CleanRL every 100 update steps."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    points = []
    for events in sorted(folder.rglob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
        accumulator.Reload()
        for name in accumulator.Tags()["scalars"] if tag is None else [tag]:
            if name in accumulator.Tags()["scalars"]:
                points += [(event.step, event.wall_time) for event in accumulator.Scalars(name)]
    return sorted(points)
