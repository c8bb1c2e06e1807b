"""keelrl.buffers: replay storage shared by the agents."""

from keelrl.buffers.replay import Batch, ReplayBuffer

__all__ = ["Batch", "ReplayBuffer"]
