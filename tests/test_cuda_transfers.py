"""Where torch sees a CUDA GPU: what an environment step sends to the GPU never waits for it. A replay add (one
buffer, and a seed group's, all seeds in one copy) and the observations an agent acts on go through pinned memory
with non-blocking copies (buffers/replay.py: to_device), so torch's sync debug mode, which raises at any call that
synchronises the host with the GPU, lets them through; and the GPU buffer stores what a CPU buffer stores."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from keelrl.buffers import ReplayBuffer, SeedReplay, to_device

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def steps(num_seeds: int, count: int) -> list[tuple[np.ndarray, ...]]:
    """`count` vector steps of 2 envs for `num_seeds` seeds: obs (S, 2, 3), actions (S, 2, 2), rewards, next obs,
    terminated, truncated, costs (S, 2)."""
    rng = np.random.default_rng(0)
    return [(rng.normal(size=(num_seeds, 2, 3)), rng.normal(size=(num_seeds, 2, 2)).astype(np.float32),
             rng.normal(size=(num_seeds, 2)), rng.normal(size=(num_seeds, 2, 3)), rng.random((num_seeds, 2)) < 0.5,
             rng.random((num_seeds, 2)) < 0.5, rng.random((num_seeds, 2))) for _ in range(count)]


def test_a_replay_add_and_an_observation_going_to_the_gpu_do_not_wait_for_it():
    single = ReplayBuffer(16, (3,), (2,), num_envs=2, device="cuda", store_cost=True)
    group = SeedReplay([ReplayBuffer(16, (3,), (2,), num_envs=2, device="cuda", store_cost=True, seed=s)
                        for s in range(3)])
    on_cpu = [ReplayBuffer(16, (3,), (2,), num_envs=2, store_cost=True, seed=s) for s in range(3)]
    recorded = steps(3, 5)
    busy = torch.randn(2048, 2048, device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in recorded:
            busy = busy @ busy / 2048  # queued GPU work a synchronising copy would wait for
            single.add(*(field[0] for field in step))
            group.add(*step)
            obs = to_device(step[0], torch.device("cuda"))
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.testing.assert_close(obs.cpu(), torch.as_tensor(recorded[-1][0], dtype=torch.float32))
    for step in recorded:
        for i, buffer in enumerate(on_cpu):
            buffer.add(*(field[i] for field in step))
    for buffer, expected in zip([single, *group.buffers], [on_cpu[0], *on_cpu], strict=True):
        for name in ReplayBuffer.FIELDS:
            torch.testing.assert_close(getattr(buffer, name).cpu(), getattr(expected, name), rtol=0, atol=0)
