"""Host data onto the device without waiting for the GPU: what an environment step sends to the networks, their
observation statistics and the replay buffer."""

from __future__ import annotations

import torch


def to_device(data, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`data` (numpy, a list, a tensor) as `dtype` on `device`, without waiting for the GPU: a host array goes to a
    CUDA device through pinned memory with a non-blocking copy, so the host carries on while the GPU finishes its
    queued work (a copy from pageable memory first waits for that work: one host synchronisation per copy). torch's
    pinned-memory cache keeps the host block until the copy has run."""
    tensor = torch.as_tensor(data, dtype=dtype)
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
