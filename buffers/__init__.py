"""keelrl.buffers: replay storage shared by the agents (uniform, or LAP-prioritised with sequences), on-policy rollouts, offline datasets (D4RL layout, Minari) and their corruption."""

from keelrl.buffers.corruption import corrupt_dataset
from keelrl.buffers.offline import (
    DatasetBuffer,
    DatasetOptions,
    load_dataset,
    normalized_score,
    prepare_dataset,
    write_minari_dataset,
)
from keelrl.buffers.replay import Batch, ReplayBuffer, SeedReplay
from keelrl.buffers.lap import LAPReplayBuffer, SequenceBatch
from keelrl.buffers.rollout import RolloutBuffer, SeedRollouts, as_flat_tensors, gae

__all__ = ["Batch", "ReplayBuffer", "SeedReplay", "LAPReplayBuffer", "SequenceBatch", "RolloutBuffer", "SeedRollouts", "gae", "as_flat_tensors", "DatasetBuffer", "DatasetOptions", "load_dataset", "prepare_dataset",
           "write_minari_dataset", "normalized_score", "corrupt_dataset"]
