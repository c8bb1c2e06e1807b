"""Offline datasets in the D4RL layout: load Minari datasets or D4RL-style files, write Minari datasets,
sample batches like the replay buffer, normalise scores, and prepare a dataset for an offline agent's run
(`DatasetOptions`, `prepare_dataset`: corruption, reward normalisation, the evaluation environment's check).

The D4RL layout is a dict of float32 arrays with N rows:
`observations (N, obs_dim), actions (N, action_dim), rewards (N,), next_observations (N, obs_dim),
terminals (N,), timeouts (N,)`. `terminals` marks true episode ends (no bootstrap); `timeouts` marks
the last transition of an episode cut by a time limit (or by the end of collection).

Time limits: D4RL's `qlearning_dataset` drops the last transition of every time-limit episode, because
D4RL files did not store the true final observation. Minari episodes keep it (`observations` has one
more row than `actions`), so keelrl keeps those transitions by default (`drop_timeout_transitions=False`),
as it bootstraps through time limits everywhere; pass `True` to reproduce D4RL's `qlearning_dataset`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import os
import re
import warnings
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch

from keelrl.buffers.corruption import Policy, QFunction, corrupt_dataset
from keelrl.buffers.replay import Batch
from keelrl.envs import make_vec_env

D4RL_KEYS = ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts")
# D4RL's reference returns (random policy, expert policy), used when a dataset's metadata has none
D4RL_REF_SCORES = {
    "hopper": (-20.272305, 3234.3),
    "halfcheetah": (-280.178953, 12135.0),
    "walker2d": (1.629008, 4592.3),
}
MAKE_DATASETS = "python -m keelrl.benchmarks.make_datasets"


@dataclasses.dataclass
class DatasetInfo:
    """Where a dataset came from and what its scores are measured against."""

    source: str
    """the Minari id or file path it was loaded from"""
    env_id: str | None
    """the environment it was collected in (None for a D4RL-style file, which does not record it)"""
    ref_min_score: float | None
    """return of a random policy (0 on the normalised scale)"""
    ref_max_score: float | None
    """return of an expert policy (100 on the normalised scale)"""


def env_family(env_id: str) -> str:
    """'Hopper-v5' -> 'hopper', 'HalfCheetah-v4' -> 'halfcheetah' (the name D4RL datasets use)."""
    return re.sub(r"-v\d+$", "", env_id.split("/")[-1]).lower()


def default_data_path() -> Path:
    """Minari's datasets root: $MINARI_DATASETS_PATH, else ~/.minari/datasets (a leading ~ expanded)."""
    return Path(os.environ.get("MINARI_DATASETS_PATH", Path.home() / ".minari" / "datasets")).expanduser()


@contextlib.contextmanager
def minari_root(data_path: str | os.PathLike | None) -> Iterator[Path]:
    """Point Minari at `data_path` (Minari reads MINARI_DATASETS_PATH at each call) for the duration, made absolute:
    Minari joins a relative root onto itself when it writes a dataset (rel/keelrl/x/data/rel/keelrl/x/data/...)."""
    previous = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(data_root(data_path).absolute())
    try:
        yield default_data_path()
    finally:
        if previous is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = previous


def _import_minari():
    try:
        import minari
    except ImportError:
        raise ImportError('Minari datasets need the offline extra: pip install "keelrl[offline]"') from None
    return minari


def load_dataset(
    source: str | os.PathLike, data_path: str | os.PathLike | None = None, drop_timeout_transitions: bool = False
) -> dict[str, np.ndarray]:
    """The dataset in the D4RL layout, from a Minari id, a Minari dataset directory, or a .hdf5/.npz file.

    `data_path` is the Minari datasets root to look ids up in (default $MINARI_DATASETS_PATH or
    ~/.minari/datasets). See the module docstring for `drop_timeout_transitions`.
    """
    return load_dataset_with_info(source, data_path, drop_timeout_transitions)[0]


def load_dataset_with_info(
    source: str | os.PathLike, data_path: str | os.PathLike | None = None, drop_timeout_transitions: bool = False
) -> tuple[dict[str, np.ndarray], DatasetInfo]:
    """`load_dataset` plus the dataset's environment and reference scores."""
    path = Path(source)
    if path.suffix in (".hdf5", ".h5", ".npz"):
        data, info = _read_d4rl_file(path), DatasetInfo(str(path), None, None, None)
    else:
        data, info = _read_minari(minari_data_dir(str(source), data_path), str(source))
    data = validate_d4rl(data, str(source))
    if drop_timeout_transitions:
        keep = data["timeouts"] == 0
        data = {key: value[keep] for key, value in data.items()}
    return data, info


def data_root(data_path: str | os.PathLike | None) -> Path:
    """The Minari datasets root `data_path` names (a leading ~ expanded), else `default_data_path()`."""
    return Path(data_path).expanduser() if data_path is not None else default_data_path()


def minari_data_dir(source: str, data_path: str | os.PathLike | None) -> Path:
    """The `data` directory of a Minari dataset given by directory or by id (looked up under the data path).
    FileNotFoundError for a path that is there but holds no dataset, and for an id not found, suggesting the ids
    there close to it, else how to make it."""
    path, root = Path(source), data_root(data_path)
    for candidate in (path / "data", path, root / source / "data"):
        if (candidate / "metadata.json").is_file():
            return candidate
    if path.exists():
        raise FileNotFoundError(f"{source} is a {'directory' if path.is_dir() else 'file'} but not a dataset: give a "
                                f"Minari dataset id, a Minari dataset directory (holding data/metadata.json) or a "
                                f".hdf5/.npz file in the D4RL layout.")
    # ids share their namespace, kind and version: only a near-identical one is a likely typo
    close = difflib.get_close_matches(source, dataset_ids(root), n=3, cutoff=0.85)
    what_to_do = _how_to_make(source)
    if close:  # a typo, or an id keelrl makes that is near one made already (hopper-medium-v0 beside its -quick)
        what_to_do = f"Did you mean {', '.join(map(repr, close))}?" + (
            f" Or: {what_to_do}" if _latest_env_of_family(_family_of(source)) else "")
    raise FileNotFoundError(f"No dataset {source!r}: looked for a Minari dataset in {root / source} "
                            f"(set --data-path or MINARI_DATASETS_PATH to look elsewhere). {what_to_do}")


def dataset_ids(root: Path) -> list[str]:
    """The ids of the Minari datasets under `root` ('keelrl/hopper-medium-v0', ...)."""
    return sorted(str(found.parent.parent.relative_to(root)) for found in root.glob("**/data/metadata.json"))


def _how_to_make(dataset_id: str) -> str:
    """The make_datasets command that makes exactly `dataset_id` (keelrl/{family}-{kind}[-quick]-v{version})."""
    match = re.fullmatch(r"keelrl/(.+?)-(random|medium-replay|medium-expert|medium|expert)(-quick)?-v(\d+)", dataset_id)
    if match is None:
        return (f"Make keelrl's D4RL-style datasets with: {MAKE_DATASETS} --env-id Hopper-v5 "
                f"(ids keelrl/hopper-medium-v0 and so on), or pass a .hdf5/.npz file in the D4RL layout.")
    family, kind, quick, version = match.groups()
    env_id = _latest_env_of_family(family)
    where = "" if env_id else f" (ENV_ID: the gymnasium environment named {family!r})"
    options = f" --env-id {env_id or 'ENV_ID'} --datasets {kind}" + " --quick" * bool(quick)
    return f"Create it{where} with: {MAKE_DATASETS}{options}" + f" --version {version}" * (version != "0")


def _family_of(dataset_id: str) -> str:
    """The env family a keelrl dataset id names ('keelrl/hopper-medium-v0' -> 'hopper'; '' for another id)."""
    match = re.fullmatch(r"keelrl/(.+?)-(random|medium-replay|medium-expert|medium|expert)(-quick)?-v(\d+)", dataset_id)
    return "" if match is None else match.group(1)


def _latest_env_of_family(family: str) -> str | None:
    """The newest registered gymnasium id whose `env_family` is `family` ('hopper' -> 'Hopper-v5'), if any."""
    ids = [env_id for env_id in gym.registry if env_family(env_id) == family]
    return max(ids, key=lambda env_id: (_env_version(env_id), "/" not in env_id), default=None)


def _env_version(env_id: str) -> int:
    match = re.search(r"-v(\d+)$", env_id)
    return int(match.group(1)) if match else -1


def _read_minari(data_dir: Path, source: str) -> tuple[dict[str, np.ndarray], DatasetInfo]:
    minari = _import_minari()
    dataset = minari.MinariDataset(data_dir)
    if not isinstance(dataset.observation_space, gym.spaces.Box):
        raise ValueError(f"Dataset {source!r} has {dataset.observation_space} observations; the D4RL layout "
                         f"needs flat Box observations.")
    columns: dict[str, list[np.ndarray]] = {key: [] for key in D4RL_KEYS}
    for episode in dataset.iterate_episodes():
        observations = np.asarray(episode.observations)  # (T + 1, obs_dim): the final observation included
        terminals = np.asarray(episode.terminations, dtype=bool)
        timeouts = np.asarray(episode.truncations, dtype=bool)
        # an episode that ends neither way was cut by the end of collection: a time limit, not a terminal
        timeouts[-1] |= not terminals[-1]
        columns["observations"].append(observations[:-1])
        columns["next_observations"].append(observations[1:])
        columns["actions"].append(np.asarray(episode.actions).reshape(len(episode), -1))
        columns["rewards"].append(np.asarray(episode.rewards))
        columns["terminals"].append(terminals)
        columns["timeouts"].append(timeouts & ~terminals)
    if not columns["rewards"]:
        raise ValueError(f"Dataset {source!r} has no episodes.")
    data = {key: np.concatenate(parts).astype(np.float32) for key, parts in columns.items()}
    metadata = dataset.storage.metadata
    env_spec = dataset.env_spec
    info = DatasetInfo(source, None if env_spec is None else env_spec.id,
                       metadata.get("ref_min_score"), metadata.get("ref_max_score"))
    return data, info


def _read_d4rl_file(path: Path) -> dict[str, np.ndarray]:
    """A D4RL-style .hdf5 or .npz; without `next_observations`, it is D4RL's raw format (see below)."""
    if not path.is_file():
        raise FileNotFoundError(f"No dataset file at {path}.")
    data = _read_npz(path) if path.suffix == ".npz" else _read_hdf5(path)
    missing = [key for key in D4RL_KEYS if key not in data and key != "next_observations"]
    if missing:
        raise ValueError(f"{path} is not in the D4RL layout: it has no {', '.join(missing)} "
                         f"(found {', '.join(sorted(data)) or 'nothing'}).")
    if "next_observations" not in data:
        data = _next_from_following(data)
    return {key: data[key] for key in D4RL_KEYS}


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    """Every array of an .npz archive (nothing is unpickled); a damaged or foreign file raises one ValueError."""
    try:
        file = np.load(path)  # allow_pickle stays False
        if not isinstance(file, np.lib.npyio.NpzFile):
            raise ValueError("it holds a single array, as an .npy file does")
        with file:
            return {key: file[key] for key in file.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as err:
        raise _damaged(path, "npz", err) from None


def _read_hdf5(path: Path) -> dict[str, np.ndarray]:
    """Every top-level dataset of an HDF5 file; a damaged or foreign file raises one ValueError."""
    try:
        import h5py
    except ImportError:
        raise ValueError(f"Reading {path} needs h5py: pip install 'keelrl[offline]' (or pip install h5py).") from None
    try:
        with h5py.File(path, "r") as file:
            return {key: file[key][()] for key in file.keys() if isinstance(file[key], h5py.Dataset)}
    except (OSError, ValueError, KeyError) as err:
        raise _damaged(path, "HDF5", err) from None


def _damaged(path: Path, kind: str, err: Exception) -> ValueError:
    """The one-line error for a file that cannot be read as `kind`, with the reader's first line of why."""
    lines = str(err).strip().splitlines()
    reason = lines[0] if lines else type(err).__name__
    return ValueError(f"{path} is damaged or not an {kind} file ({reason}): write it again, or pass another "
                      f"dataset (a Minari id, or a D4RL-layout .npz/.hdf5 file).")


def _next_from_following(data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """D4RL's raw files store no next observation: take the following row's, and drop the rows where
    that is the next episode's first observation (time-limit ends and the very last row), as
    `qlearning_dataset` does."""
    observations = data["observations"]
    keep = np.asarray(data["timeouts"], bool)[:-1] == 0  # (N - 1,)
    rows = np.flatnonzero(keep)
    out = {key: np.asarray(data[key])[rows] for key in ("observations", "actions", "rewards", "terminals", "timeouts")}
    out["next_observations"] = observations[rows + 1]
    return out


def validate_d4rl(data: dict[str, np.ndarray], source: str = "dataset") -> dict[str, np.ndarray]:
    """The arrays as float32 with flat shapes, or a ValueError naming the offending field."""
    missing = [key for key in D4RL_KEYS if key not in data]
    if missing:
        raise ValueError(f"{source}: missing field(s) {', '.join(missing)} "
                         f"(the D4RL layout needs {', '.join(D4RL_KEYS)}).")
    out = {}
    for key in D4RL_KEYS:
        value = np.asarray(data[key], dtype=np.float32)
        if key in ("rewards", "terminals", "timeouts"):
            value = value.reshape(len(value), -1)
            if value.shape[1] != 1:
                raise ValueError(f"{source}: field {key!r} must have one value per transition, "
                                 f"got shape {data[key].shape}.")
            value = value[:, 0]
        elif value.ndim != 2:
            raise ValueError(f"{source}: field {key!r} must be 2-D (transitions, features), got shape {value.shape}.")
        if not np.isfinite(value).all():
            row = int(np.flatnonzero(~np.isfinite(value.reshape(len(value), -1)).all(axis=1))[0])
            raise ValueError(f"{source}: field {key!r} has NaN or infinite values (first at row {row}).")
        out[key] = value
    lengths = {key: len(value) for key, value in out.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"{source}: fields have different lengths: {lengths}.")
    if out["observations"].shape != out["next_observations"].shape:
        raise ValueError(f"{source}: field 'next_observations' has shape {out['next_observations'].shape}, "
                         f"but 'observations' has {out['observations'].shape}.")
    if len(out["rewards"]) == 0:
        raise ValueError(f"{source}: the dataset is empty.")
    return out


def check_env_matches(data: dict[str, np.ndarray], env_id: str, env_spaces) -> None:
    """Refuse to evaluate on an environment whose spaces differ from the dataset's."""
    observation_space, action_space = env_spaces
    if observation_space.shape != data["observations"].shape[1:] or action_space.shape != data["actions"].shape[1:]:
        raise ValueError(f"The dataset has observations {data['observations'].shape[1:]} and actions "
                         f"{data['actions'].shape[1:]}, but {env_id} has {observation_space.shape} and "
                         f"{action_space.shape}: evaluate in the environment the data came from (--env-id).")


def reference_scores(info: DatasetInfo, env_id: str | None = None) -> tuple[float, float] | None:
    """(random, expert) returns: the dataset's own when its metadata has them, else D4RL's for its env family."""
    if info.ref_min_score is not None and info.ref_max_score is not None:
        return float(info.ref_min_score), float(info.ref_max_score)
    env_id = env_id or info.env_id
    return None if env_id is None else D4RL_REF_SCORES.get(env_family(env_id))


def normalized_score(returns, ref_min_score: float, ref_max_score: float) -> np.ndarray:
    """D4RL's normalised score: 100 (R − random) / (expert − random)."""
    return 100.0 * (np.asarray(returns, dtype=np.float64) - ref_min_score) / (ref_max_score - ref_min_score)


def episode_ends(data: dict[str, np.ndarray], max_episode_steps: int | None = None) -> np.ndarray:
    """(N,) bool, True at the last row of each episode.

    An episode ends at a terminal, at a timeout, where the next row does not continue it
    (`next_observations[t] != observations[t + 1]`: the rows of a time-limit end that D4RL's
    `qlearning_dataset` or `drop_timeout_transitions` removed), after `max_episode_steps` rows (CORL's
    rule, for data without flags or observations to tell), and at the last row. Take the ends of
    clean data: corrupted observations would break episodes at every corrupted row.
    """
    ends = (data["terminals"] > 0) | (data["timeouts"] > 0)
    ends[:-1] |= np.any(data["next_observations"][:-1] != data["observations"][1:], axis=1)
    ends[-1] = True
    if max_episode_steps is not None:
        start = 0
        for end in np.flatnonzero(ends):
            ends[start + max_episode_steps - 1:end:max_episode_steps] = True  # cut over-long episodes
            start = end + 1
    return ends


def episode_returns(data: dict[str, np.ndarray], ends: np.ndarray | None = None) -> np.ndarray:
    """Undiscounted return of each episode, episodes ending where `ends` is True (default: `episode_ends(data)`)."""
    last_rows = np.flatnonzero(episode_ends(data) if ends is None else ends)
    cumulative = np.concatenate([[0.0], np.cumsum(data["rewards"], dtype=np.float64)])
    return cumulative[last_rows + 1] - cumulative[np.concatenate([[0], last_rows[:-1] + 1])]


def returns_to_go(rewards: np.ndarray, ends: np.ndarray, gamma: float) -> np.ndarray:
    """(N,) float32 Monte-Carlo return-to-go of every row, G_t = r_t + γ G_{t+1} within an episode and G_t = r_t
    at its last row (`ends` True: a terminal, a timeout or a cut; nothing is bootstrapped past a time limit, as in
    Cal-QL's and WSRL's calculation, wsrl/envs/env_common.py:203-210 at 891ee35)."""
    returns = np.empty(len(rewards), dtype=np.float64)
    following = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        following = float(rewards[t]) + (0.0 if ends[t] else gamma * following)
        returns[t] = following
    return returns.astype(np.float32)


def write_minari_dataset(
    dataset_id: str,
    data: dict[str, np.ndarray],
    env_id: str,
    data_path: str | os.PathLike | None = None,
    ref_min_score: float | None = None,
    ref_max_score: float | None = None,
    description: str | None = None,
    algorithm_name: str | None = None,
) -> Path:
    """Write D4RL-layout transitions as a Minari dataset (HDF5) and return its directory.

    Rows must be contiguous episodes: within an episode, `next_observations[t] == observations[t + 1]`.
    An episode ends at a terminal or a timeout; the last row closes the last episode.
    """
    minari = _import_minari()
    from minari.data_collector import EpisodeBuffer

    data = validate_d4rl(data, dataset_id)
    ends = np.flatnonzero((data["terminals"] > 0) | (data["timeouts"] > 0)) + 1
    if len(ends) == 0 or ends[-1] != len(data["rewards"]):
        ends = np.append(ends, len(data["rewards"]))
    episodes, start = [], 0
    for episode_id, end in enumerate(ends):
        rows = slice(start, end)
        if not np.array_equal(data["next_observations"][start:end - 1], data["observations"][start + 1:end]):
            raise ValueError(f"{dataset_id}: rows {start}..{end - 1} are not one contiguous episode "
                             f"(next_observations[t] != observations[t + 1]); write episodes in order.")
        terminated = data["terminals"][rows] > 0
        episodes.append(EpisodeBuffer(
            id=episode_id,
            observations=np.concatenate([data["observations"][rows], data["next_observations"][end - 1:end]]),
            actions=data["actions"][rows],
            rewards=data["rewards"][rows],
            terminations=terminated,
            truncations=~terminated & (np.arange(start, end) == end - 1),
            infos={},
        ))
        start = end
    with minari_root(data_path) as root, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(author|code_permalink|author_email).*")
        minari.create_dataset_from_buffers(
            dataset_id, episodes, env=env_id, eval_env=env_id, algorithm_name=algorithm_name or "unknown",
            author="keelrl", ref_min_score=ref_min_score, ref_max_score=ref_max_score,
            description=description or f"D4RL-layout dataset of {env_id} written by keelrl",
            data_format="hdf5",
        )
        return root / dataset_id


class DatasetBuffer:
    """A fixed dataset on `device`, sampled uniformly like `ReplayBuffer.sample` (same `Batch`)."""

    def __init__(self, data: dict[str, np.ndarray], gamma: float = 0.99, device: str | torch.device = "cpu",
                 seed: int = 0):
        self.device = torch.device(device)
        # returns-to-go, where prepare_dataset added them (`mc_returns_gamma`), ride along in every batch
        self.mc_returns = torch.as_tensor(data["mc_returns"], device=self.device) if "mc_returns" in data else None
        data = validate_d4rl(data)

        def tensor(key: str) -> torch.Tensor:
            return torch.as_tensor(data[key], device=self.device)

        self.obs, self.actions, self.rewards = tensor("observations"), tensor("actions"), tensor("rewards")
        self.next_obs, self.terminated = tensor("next_observations"), tensor("terminals")
        self.size = len(self.rewards)
        self.gamma = gamma
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self._discounts: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return self.size

    def sample(self, batch_size: int) -> Batch:
        """`batch_size` transitions uniformly with replacement; `discounts` is gamma (1-step targets)."""
        idx = torch.randint(0, self.size, (batch_size,), device=self.device, generator=self.generator)
        if batch_size not in self._discounts:
            self._discounts[batch_size] = torch.full((batch_size,), self.gamma, device=self.device)
        return Batch(obs=self.obs[idx], actions=self.actions[idx], rewards=self.rewards[idx],
                     next_obs=self.next_obs[idx], terminated=self.terminated[idx],
                     discounts=self._discounts[batch_size],
                     mc_returns=None if self.mc_returns is None else self.mc_returns[idx])


# ---------------------------------------------------------------------------------------------------
# preparing a dataset for an offline agent's run


@dataclasses.dataclass
class DatasetOptions:
    """The dataset an offline agent trains on, how it is prepared, and the environment it is evaluated in."""

    dataset: str = "keelrl/hopper-medium-v0"
    """Minari dataset id (made by keelrl.benchmarks.make_datasets), a Minari dataset directory, or a D4RL-layout .hdf5/.npz"""
    data_path: str | None = None
    """Minari datasets root to look ids up in (default: $MINARI_DATASETS_PATH, else ~/.minari/datasets)"""
    env_id: str | None = None
    """evaluation environment (default: the one the dataset records; needed for .hdf5/.npz files)"""
    normalize_reward: bool = False
    """scale rewards by 1000 / (max − min episode return in the dataset), IQL's MuJoCo reward normalisation, episodes
    split as the original IQL code splits them (CORL's return_reward_range splits them otherwise:
    buffers/offline.py normalize_rewards)"""
    drop_timeout_transitions: bool = False
    """drop the last transition of time-limit episodes as D4RL's qlearning_dataset does (keelrl keeps them)"""
    corruption: Literal["obs", "act", "reward", "dynamics"] | None = None
    """corrupt one field of the dataset (RIQL's benchmark): observations, actions, rewards or next observations"""
    corruption_rate: float = 0.3
    """fraction of transitions corrupted"""
    corruption_range: float = 1.0
    """corruption scale: noise in ±range · std (rewards: ±range · 30), or the attack's bound"""
    corruption_mode: Literal["random", "adversarial"] = "random"
    """random noise, or perturbations that minimise the Q-values of --attack-model"""
    attack_model: str | None = None
    """model.pt of a keelrl IQL or RIQL agent trained on the clean data: the critic adversarial mode attacks"""


def validate_dataset_options(options: DatasetOptions) -> None:
    """Reject corruption settings no run can use, with the options' command-line names."""
    if not 0.0 <= options.corruption_rate <= 1.0 or options.corruption_range <= 0:
        raise ValueError(f"--corruption-rate must lie in [0, 1] and --corruption-range be positive, "
                         f"got {options.corruption_rate} and {options.corruption_range}.")
    if options.corruption_mode == "adversarial" and options.corruption in ("obs", "act", "dynamics") \
            and options.attack_model is None:
        raise ValueError(f"--corruption-mode adversarial --corruption {options.corruption} attacks a critic: give "
                         f"--attack-model, the model.pt of a keelrl IQL or RIQL agent trained on the clean dataset.")


def prepare_dataset(options: DatasetOptions, seed: int, q_function: QFunction | None = None,
                    policy: Policy | None = None, mc_returns_gamma: float | None = None,
                    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The training data, corrupted and reward-normalised as `options` ask, and its summary for dataset.json
    (source, evaluation env_id, transitions, episodes, behaviour_return, corruption, reward_scale, ref_scores).

    `seed` seeds the corruption; `q_function` and `policy` are the trained agent an adversarial corruption
    attacks (see `corrupt_dataset`). With `mc_returns_gamma` the data gains "mc_returns", the discounted
    return-to-go of every row (`returns_to_go`, on the rewards as trained on, episodes of the clean data).
    """
    data, info = load_dataset_with_info(options.dataset, options.data_path, options.drop_timeout_transitions)
    env_id = options.env_id or info.env_id
    if env_id is None:
        raise ValueError(f"{options.dataset} does not record its environment: give --env-id to evaluate in.")
    ends = episode_ends(data, time_limit(env_id))  # of the clean data: corruption moves observations
    summary: dict[str, Any] = {
        "source": info.source, "env_id": env_id, "transitions": len(data["rewards"]),
        "episodes": int(ends.sum()), "behaviour_return": float(episode_returns(data, ends).mean()), "corruption": None,
    }
    if options.corruption is not None:
        data, indices = corrupt_dataset(data, options.corruption, options.corruption_rate, options.corruption_range,
                                        options.corruption_mode, seed=seed, q_function=q_function, policy=policy)
        summary["corruption"] = {"kind": options.corruption, "mode": options.corruption_mode,
                                 "rate": options.corruption_rate, "range": options.corruption_range,
                                 "corrupted_transitions": len(indices)}
    if options.normalize_reward:
        data, summary["reward_scale"] = normalize_rewards(data, ends)
    if mc_returns_gamma is not None:
        data = {**data, "mc_returns": returns_to_go(data["rewards"], ends, mc_returns_gamma)}
    summary["ref_scores"] = reference_scores(info, env_id)
    return data, summary


def time_limit(env_id: str) -> int | None:
    """The time limit of a registered environment (None when unknown)."""
    if env_id not in gym.registry:
        return None
    return gym.spec(env_id).max_episode_steps


def normalize_rewards(data: dict[str, np.ndarray], ends: np.ndarray,
                      max_episode_steps: int = 1000) -> tuple[dict[str, np.ndarray], float]:
    """Rewards scaled by max_episode_steps / (max − min episode return), IQL's MuJoCo normalisation (CORL's
    `modify_reward` too); episodes end where `ends` is True (see `episode_ends`), as the original IQL code's
    split_into_trajectories ends them, so the streams data collection cut short count among them (each of keelrl's
    collecting envs leaves one). CORL's return_reward_range ends episodes only at terminals and after 1000 rows:
    on keelrl/hopper-medium-v0 it gives 0.742 where this gives 0.590 (complete episodes alone would give 0.992);
    benchmarks/results/offline.md runs IQL beside CORL with this difference."""
    returns = episode_returns(data, ends)
    spread = float(returns.max() - returns.min())
    if spread <= 0:
        raise ValueError(f"--normalize-reward needs episodes with different returns; this dataset's "
                         f"{len(returns)} episode(s) all return {returns[0]:.6g}.")
    scale = max_episode_steps / spread
    return {**data, "rewards": data["rewards"] * np.float32(scale)}, scale


def evaluation_spaces(data: dict[str, np.ndarray], env_id: str) -> tuple[gym.spaces.Box, gym.spaces.Box]:
    """The observation and action spaces of `env_id`, refused unless they are the dataset's."""
    env = make_vec_env(env_id, num_envs=1, seed=0)
    spaces = env.single_observation_space, env.single_action_space
    env.close()
    check_env_matches(data, env_id, spaces)
    return spaces
