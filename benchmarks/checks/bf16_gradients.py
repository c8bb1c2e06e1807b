"""How far bf16 matrix products move SAC's or TD3's losses and gradients from fp32's, at a finished run's weights on
batches of its own replay buffer, beside how far minibatch sampling alone moves them.

    python -m keelrl.benchmarks.checks.bf16_gradients --runs RUN_DIR [RUN_DIR ...] [--batches 20]

RUN_DIR: a finished SAC or TD3 run directory (model.pt and buffer.pt). On each of `--batches` batches (the run's
batch size, drawn from its buffer with seed 0) both precisions take the same batch and the same noise draw (TD3's
target smoothing, SAC's policy samples): the cosine between the bf16 and the fp32 gradient of the critic loss and
of the actor loss, the mean |Q_bf16 − Q_fp32| over the critics' values of the batch beside the mean |Q_fp32|; then,
for scale, the cosine between the fp32 gradients of two different batches. Prints a Markdown table of means over
the batches. Written for issue 57: are TD3's Hopper-v4 seeds that stay low bf16's doing?
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch
from torch import nn

from keelrl.agents.harness.checkpoints import BUFFER_FILE, MODEL_FILE
from keelrl.agents.harness.options import parse_command_line
from keelrl.agents.harness.run_directory import CONFIG_FILE
from keelrl.agents.registry import agent_class
from keelrl.buffers import Batch, ReplayBuffer
from keelrl.networks.training import matmul_precision

ALGOS = ("sac", "td3")
COLUMNS = ("critic grad cos bf16/fp32", "actor grad cos bf16/fp32", "mean abs(Q bf16 − Q fp32)", "mean abs(Q)",
           "critic grad cos, 2 batches", "actor grad cos, 2 batches")


@dataclasses.dataclass
class Args:
    runs: tuple[Path, ...] = ()
    """finished SAC or TD3 run directories (model.pt and buffer.pt)"""
    batches: int = 20
    """batches to average over"""


def load_run(run_dir: Path) -> tuple[nn.Module, ReplayBuffer]:
    """The run's final agent (fp32 weights) and its replay buffer as the run left it."""
    algo = json.loads((run_dir / CONFIG_FILE).read_text())["algo"]
    if algo not in ALGOS or not (run_dir / MODEL_FILE).is_file():
        raise ValueError(f"{run_dir}: not a finished {' or '.join(ALGOS)} run (algo {algo!r}; model.pt is written "
                         f"when a run finishes)")
    agent = agent_class(algo).load(run_dir)
    state = torch.load(run_dir / BUFFER_FILE, weights_only=False)
    buffer = ReplayBuffer(int(state["capacity"]), state["obs"].shape[1:], state["actions"].shape[1:],
                          int(state["num_envs"]), "cpu", agent.config.n_step, agent.config.gamma)
    buffer.load_state_dict(state)
    return agent, buffer


def gradients(agent: nn.Module, batch: Batch, noise: torch.Tensor, precision: str) -> tuple[torch.Tensor, ...]:
    """The critic loss's gradient over the critic's weights, the actor loss's over the actor's (each flattened to one
    vector) and the critics' values (E, B), with products in `precision`."""
    with matmul_precision(precision, "cpu"):
        critic_loss, values = agent.critic_loss(batch, noise, slice(None))
        actor_loss = agent.actor_loss(batch.obs, noise)[0] if agent.algo == "sac" else agent.actor_loss(batch.obs)
    critic_grad = torch.autograd.grad(critic_loss, list(agent.critic.parameters()))
    actor_grad = torch.autograd.grad(actor_loss, list(agent.actor.parameters()))
    return torch.cat([g.flatten() for g in critic_grad]), torch.cat([g.flatten() for g in actor_grad]), values


def agreement(agent: nn.Module, buffer: ReplayBuffer, batches: int,
              precisions: tuple[str, str] = ("bf16", "fp32")) -> dict[str, float]:
    """COLUMNS' figures, each the mean over `batches` batches; the first two and the Q difference compare
    `precisions` on one batch and noise draw, the last two the second precision on two batches."""
    torch.manual_seed(0)
    buffer.generator.manual_seed(0)
    cosine = nn.functional.cosine_similarity
    rows = []
    for _ in range(batches):
        pair = [buffer.sample(agent.config.batch_size) for _ in range(2)]
        noise = torch.randn(*pair[0].actions.shape)  # (B, A)
        (critic_a, actor_a, q_a), (critic_b, actor_b, q_b) = (gradients(agent, pair[0], noise, p) for p in precisions)
        critic_c, actor_c, _ = gradients(agent, pair[1], noise, precisions[1])
        rows.append([cosine(critic_a, critic_b, dim=0), cosine(actor_a, actor_b, dim=0), (q_a - q_b).abs().mean(),
                     q_b.abs().mean(), cosine(critic_b, critic_c, dim=0), cosine(actor_b, actor_c, dim=0)])
    means = torch.tensor(rows).mean(0)
    return dict(zip(COLUMNS, means.tolist()))


def table(results: dict[str, dict[str, float]]) -> str:
    lines = ["| run | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    lines += [f"| {name} | " + " | ".join(f"{v:.4f}" for v in row.values()) + " |" for name, row in results.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_command_line(Args, args=argv)
    try:
        if not args.runs:
            raise ValueError("no runs: give --runs RUN_DIR [RUN_DIR ...]")
        results = {}
        for run_dir in args.runs:
            agent, buffer = load_run(run_dir)
            results[f"{agent.algo} {run_dir.name}"] = agreement(agent, buffer, args.batches)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
