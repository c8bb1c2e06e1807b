"""What a run saves, and when, and reading it back: the checkpoint policy (every `checkpoint_freq` steps, every
`checkpoint_minutes`, after a stop signal), checkpoints (with the replay buffer as a stamped pair), model files,
and random states (what an agent's networks save and load: saved_agent.py).

Files are written atomically (a temporary file, then a rename), so a kill mid-write keeps the previous one,
and read with `torch.load(weights_only=True)`: tensors and plain values only, nothing is unpickled.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from keelrl.buffers import ReplayBuffer

CHECKPOINT_FILE = "checkpoint.pt"
NEXT_CHECKPOINT_FILE = "checkpoint.next.pt"
"""the checkpoint being written, until it is put in place"""
BUFFER_FILE = "buffer.pt"
NEXT_BUFFER_FILE = "buffer.next.pt"
"""the replay buffer of the checkpoint being written, until that checkpoint is in place"""
MODEL_FILE = "model.pt"


def crossed(step: int, freq: int, advance: int) -> bool:
    """Whether the loop's last `advance` steps, up to `step`, crossed a multiple of `freq` (0: never)."""
    return bool(freq) and step % freq < advance


class CheckpointClock:
    """--checkpoint-minutes: whether a checkpoint is due by the clock at a loop step, the minutes counted from the
    last checkpoint. The runs of a seed group share one, so that at each step they all decide alike."""

    def __init__(self):
        self._since = time.perf_counter()
        self._decided = (-1, False)  # (step, due) of the latest decision

    def due(self, step: int, minutes: float) -> bool:
        if self._decided[0] != step:
            self._decided = (step, minutes > 0 and time.perf_counter() - self._since >= 60 * minutes)
        return self._decided[1]

    def restart(self) -> None:
        """A checkpoint was written (or the run started): the minutes count from now."""
        self._since = time.perf_counter()


class CheckpointPolicy:
    """When a run checkpoints: every `freq` loop steps, every `minutes` by `clock` and after a stop signal; and the
    step of the checkpoint on disk (None: none yet), which a run stopped by a non-finite value keeps."""

    def __init__(self, freq: int, minutes: float, clock: CheckpointClock, step_on_disk: int | None):
        self.freq, self.minutes, self.clock, self.step_on_disk = freq, minutes, clock, step_on_disk

    def due(self, step: int, advance: int, stopping: bool) -> bool:
        """Whether to checkpoint after the iteration of `advance` steps that reached `step`."""
        return crossed(step, self.freq, advance) or stopping or self.clock.due(step, self.minutes)

    def written(self, step: int) -> None:
        """A checkpoint of `step` was written: the minutes count from now."""
        self.step_on_disk = step
        self.clock.restart()

    def kept(self, unit: str, run_dir: Path) -> str:
        """What a run stopped by a non-finite value keeps."""
        if self.step_on_disk is None:
            return "Training stopped before its first checkpoint."
        return (f"Training stopped; the checkpoint of {unit} {self.step_on_disk} in {run_dir} is kept "
                f"(--resume {run_dir} continues from it).")


def write_atomically(path: Path, state: dict[str, Any]) -> None:
    """torch.save to a temporary file, then rename it over `path`: a run killed mid-write keeps the previous file.
    A write that fails (a full disk) removes the temporary file and raises one OSError naming the file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as err:  # torch reports a full disk as a RuntimeError of its own
        tmp.unlink(missing_ok=True)
        raise OSError(f"Cannot write {path} ({one_line(err)}; is the disk full?): the files written before it are "
                      f"kept, and --resume goes on from the last checkpoint once there is room.") from None


def read_checkpoint(path: str | os.PathLike, algo: str | None) -> dict[str, Any]:
    """A checkpoint or model file's contents (`weights_only=True`: nothing is unpickled); `algo`: the algorithm it
    must belong to (None: any). A damaged or foreign file raises one ValueError naming it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No checkpoint at {path}.")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for a corrupt or foreign file
        raise ValueError(f"{path} is not a readable keelrl checkpoint: it is damaged, truncated or not written by "
                         f"keelrl ({one_line(err)}).") from None
    if not isinstance(state, dict) or "algo" not in state:
        raise ValueError(f"{path} is not a keelrl checkpoint (no 'algo' entry).")
    if algo is not None and state["algo"] != algo:
        raise ValueError(f"{path} is a {state['algo']!r} checkpoint, not {algo!r}: load it with that agent.")
    return state


@contextlib.contextmanager
def restoring(path: Path) -> Iterator[None]:
    """Restore a run's state from the file at `path`; what a damaged file, or one from another run or
    program, raises on the way becomes one ValueError naming it."""
    try:
        yield
    except FileNotFoundError:
        raise
    except Exception as err:  # torch, numpy and the state dicts raise many types for a foreign file
        raise ValueError(f"{path} does not fit this run ({one_line(err)}); it is damaged or comes "
                         f"from another run or program: start a new run.") from None


def one_line(err: Exception, limit: int = 160) -> str:
    """An exception as 'Type: first line of its message', cut at `limit` characters."""
    lines = str(err).strip().splitlines()
    text = f"{type(err).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def rng_state(numpy_rng: np.random.Generator) -> dict[str, Any]:
    """Every random state a run uses, in a form `torch.load(weights_only=True)` accepts: on the GPU also CUDA's
    generators, which `torch.randn(..., device="cuda")` draws from (SAC's and TD3's noise)."""
    state = {"python": random.getstate(), "numpy_rng": numpy_rng.bit_generator.state, "torch": torch.get_rng_state()}
    if torch.cuda.is_initialized():
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any], numpy_rng: np.random.Generator) -> None:
    random.setstate(state["python"])
    numpy_rng.bit_generator.state = state["numpy_rng"]
    torch.set_rng_state(state["torch"])
    for device, cuda_state in enumerate(state.get("torch_cuda", [])[: torch.cuda.device_count()]):
        torch.cuda.set_rng_state(cuda_state, device)


def non_finite_entry(state: Any, path: str = "") -> str | None:
    """The path ('networks/critic.0.weight') of the first floating-point tensor in `state` (nested dicts and
    lists) holding a NaN or inf, or None when all are finite."""
    if isinstance(state, torch.Tensor):
        return path if state.is_floating_point() and not bool(torch.isfinite(state).all()) else None
    items = state.items() if isinstance(state, dict) else enumerate(state) if isinstance(state, (list, tuple)) else ()
    for key, value in items:
        found = non_finite_entry(value, f"{path}/{key}" if path else str(key))
        if found is not None:
            return found
    return None


def write_checkpoint(run_dir: Path, state: dict[str, Any], replay: ReplayBuffer | None) -> None:
    """A checkpoint, and with `replay` the replay buffer, as one pair stamped alike, written beside the one in
    place: the buffer to buffer.next.pt, then the checkpoint to checkpoint.next.pt. `commit_checkpoint` puts them in
    place (a run at once; a seed group once every seed has written its own)."""
    stamp = {"global_step": state["global_step"], "id": uuid.uuid4().hex}
    if replay is not None:
        write_atomically(run_dir / NEXT_BUFFER_FILE, {**replay.state_dict(), "stamp": stamp})
    write_atomically(run_dir / NEXT_CHECKPOINT_FILE, {**state, "stamp": stamp})


def commit_checkpoint(run_dir: Path) -> None:
    """Put the checkpoint `write_checkpoint` wrote in place: it replaces checkpoint.pt, then its buffer replaces
    buffer.pt, so a kill at any moment leaves a checkpoint whose buffer is on disk (`read_replay` finishes the
    second rename)."""
    os.replace(run_dir / NEXT_CHECKPOINT_FILE, run_dir / CHECKPOINT_FILE)
    if (run_dir / NEXT_BUFFER_FILE).is_file():
        os.replace(run_dir / NEXT_BUFFER_FILE, run_dir / BUFFER_FILE)


def settle_checkpoints(run_dirs: list[Path]) -> None:
    """Before resuming runs that checkpoint together (one run, or the seeds of a --num-seeds run): a checkpoint that
    was written but not put in place, because the process was killed in between, is put in place where every run
    wrote it whole, so all resume from it; where some run had not, it is dropped, so all resume from the one
    before. Either way every run resumes from the same step."""
    pending = [run_dir for run_dir in run_dirs if (run_dir / NEXT_CHECKPOINT_FILE).is_file()]
    if not pending:
        return
    step = saved_step(pending[0] / NEXT_CHECKPOINT_FILE)
    whole = step is not None and all(
        saved_step(run_dir / (NEXT_CHECKPOINT_FILE if run_dir in pending else CHECKPOINT_FILE)) == step
        for run_dir in run_dirs)
    for run_dir in pending:
        if whole:
            commit_checkpoint(run_dir)
        else:
            (run_dir / NEXT_CHECKPOINT_FILE).unlink()


def saved_step(path: Path) -> int | None:
    """The global step a checkpoint file was written at (None: no readable checkpoint there), read without loading
    its tensors."""
    try:
        return int(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["global_step"])
    except Exception:  # missing, damaged or foreign: `read_checkpoint` says which when the run reads it
        return None


def read_replay(run_dir: Path, checkpoint: dict[str, Any], buffer: ReplayBuffer, unit: str) -> None:
    """Load the buffer saved with `checkpoint`: buffer.pt, or buffer.next.pt when the save that wrote the
    checkpoint was cut before its last rename (which is finished here). A buffer with another stamp is refused
    in one line: it was not written with this checkpoint."""
    stamp, found = checkpoint.get("stamp"), {}
    for name in (BUFFER_FILE, NEXT_BUFFER_FILE):
        if not (run_dir / name).is_file():
            continue
        with restoring(run_dir / name):
            state = torch.load(run_dir / name, map_location="cpu", weights_only=True)
            found[name] = state.get("stamp")
            if found[name] == stamp:
                buffer.load_state_dict(state)
        if found[name] == stamp:
            if name == NEXT_BUFFER_FILE:
                os.replace(run_dir / NEXT_BUFFER_FILE, run_dir / BUFFER_FILE)
            return
    if not found:
        raise FileNotFoundError(f"--resume {run_dir}: {BUFFER_FILE} is missing (it is written with every "
                                f"checkpoint); the run cannot continue without its replay buffer.")
    saved_at = (found.get(BUFFER_FILE) or {}).get("global_step", "an unknown step")
    raise ValueError(f"--resume {run_dir}: {BUFFER_FILE} (saved at {unit} {saved_at}) was not written with "
                     f"{CHECKPOINT_FILE} (saved at {unit} {checkpoint['global_step']}); the run cannot go on with a "
                     f"replay buffer that does not match its checkpoint: put back the pair saved together, or start "
                     f"a new run.")
