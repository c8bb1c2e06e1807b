"""keelrl.buffers: replay storage shared by the agents, offline datasets (D4RL layout, Minari) and their corruption."""

from keelrl.buffers.corruption import corrupt_dataset
from keelrl.buffers.offline import (
    DatasetBuffer,
    DatasetOptions,
    load_dataset,
    normalized_score,
    prepare_dataset,
    write_minari_dataset,
)
from keelrl.buffers.replay import Batch, ReplayBuffer

__all__ = ["Batch", "ReplayBuffer", "DatasetBuffer", "DatasetOptions", "load_dataset", "prepare_dataset",
           "write_minari_dataset", "normalized_score", "corrupt_dataset"]
