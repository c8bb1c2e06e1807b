"""Same seed, same numbers: a short CPU run of every agent writes exactly the episodes.csv, eval.csv and
weight digest recorded in tests/golden/<machine kind>/<case>/ (first written by this module's code before
the agents were restructured).

A refactoring must leave these bit-identical. The runs are one thread each, but CPUs with other vector
extensions (or another torch) round differently, so each machine kind has its own records and a case is
compared only where its kind has one (elsewhere the test skips and says which kinds have it). Two ways to
write them, in the commit that needs it, saying why in its message:

    python -m tests.test_same_numbers --write [CASE ...]        # the numbers changed on purpose (a fix, a new
                                                                # default): record them on this machine kind
                                                                # and drop the other kinds' records of those
                                                                # cases, which no longer hold
    python -m tests.test_same_numbers --add-machine [CASE ...]  # numbers unchanged since the other kinds'
                                                                # records passed: record this kind beside them
"""

from __future__ import annotations

import platform
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

GOLDEN = Path(__file__).parent / "golden"
LOGS = ("episodes.csv", "eval.csv", "weights.txt")
OFF_POLICY = dict(env_id="InvertedPendulum-v5", total_timesteps=600, learning_starts=200, batch_size=32,
                  hidden_sizes=(32, 32), buffer_size=10_000, eval_freq=300, eval_episodes=2, checkpoint_freq=300,
                  log_freq=100, threads=1, quiet=True)
SAFE = dict(OFF_POLICY, env_id="keelrl/SafeHopperVelocity-v1", cost_limit=1.0, lambda_lr=0.05)
OFFLINE = dict(env_id="InvertedPendulum-v5", total_updates=120, batch_size=32, hidden_sizes=(32, 32), eval_freq=60,
               eval_episodes=2, checkpoint_freq=60, log_freq=30, threads=1, quiet=True)
STREAM = dict(env_id="CartPole-v1", total_timesteps=1500, hidden_sizes=(16, 16), eval_freq=500, eval_episodes=2,
              checkpoint_freq=500, log_freq=100, threads=1, quiet=True)


def offline_dataset(directory: Path) -> Path:
    """600 transitions of InvertedPendulum-v5 under uniform random actions in [−3, 3], two envs, seed 0."""
    from keelrl.benchmarks.make_datasets import collect

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "pendulum.npz"
    if not path.exists():
        rng = np.random.default_rng(0)
        np.savez(path, **collect("InvertedPendulum-v5", lambda obs: rng.uniform(-3, 3, (len(obs), 1)), 600, 2, seed=0))
    return path


def run(case: str, runs_dir: Path) -> Path:
    """Train the case's agent into runs_dir and return its run directory."""
    from keelrl.agents import cql, grpo, iql, riql, sac, sac_lag, stream_ac, stream_q, stream_td, td3, td3_lag

    common = dict(runs_dir=str(runs_dir))
    data = dict(dataset=str(runs_dir / "pendulum.npz"), **common)
    configs = {
        "sac": lambda: sac.train(sac.SACConfig(**OFF_POLICY, **common)),
        "sac_simbav2_hlgauss": lambda: sac.train(sac.SACConfig(
            **{**OFF_POLICY, "hidden_sizes": (256, 256)}, network="simbav2", critic_head="hlgauss", scale_rewards=True,
            normalize_obs=True, obs_clip=None, actor_hidden_dim=16, critic_hidden_dim=32, critic_num_blocks=1,
            num_bins=21, n_step=3, **common)),
        "td3": lambda: td3.train(td3.TD3Config(**OFF_POLICY, **common)),
        "td3_simba_c51": lambda: td3.train(td3.TD3Config(
            **OFF_POLICY, network="simba", critic_head="c51", scale_rewards=True, actor_hidden_dim=16,
            critic_hidden_dim=32, critic_num_blocks=1, num_bins=21, **common)),
        "sac_lag": lambda: sac_lag.train(sac_lag.SACLagConfig(**SAFE, **common)),
        "td3_lag": lambda: td3_lag.train(td3_lag.TD3LagConfig(**SAFE, **common)),
        "cql": lambda: cql.train(cql.CQLConfig(**OFFLINE, cql_n_actions=4, **data)),
        "iql": lambda: iql.train(iql.IQLConfig(**OFFLINE, **data)),
        "riql": lambda: riql.train(riql.RIQLConfig(**OFFLINE, corruption="dynamics", corruption_rate=0.3, **data)),
        "stream_td": lambda: stream_td.train(stream_td.StreamTDConfig(**STREAM, **common)),
        "stream_q": lambda: stream_q.train(stream_q.StreamQConfig(**STREAM, **common)),
        "stream_ac": lambda: stream_ac.train(stream_ac.StreamACConfig(
            **{**STREAM, "env_id": "InvertedPendulum-v5"}, **common)),
        "grpo": lambda: grpo.train(grpo.GRPOConfig(
            n_embd=32, n_head=2, context_length=16, max_new_tokens=4, num_prompts=4, group_size=4, iterations=4,
            warmup_steps=5, warmup_batch_size=16, eval_freq=2, eval_episodes=8, eval_samples=4, pass_k=2,
            checkpoint_freq=2, threads=1, quiet=True, **common)),
    }
    if case in ("cql", "iql", "riql"):
        offline_dataset(runs_dir)
    return configs[case]().run_dir


CASES = ("sac", "sac_simbav2_hlgauss", "td3", "td3_simba_c51", "sac_lag", "td3_lag", "cql", "iql", "riql",
         "stream_td", "stream_q", "stream_ac", "grpo")


def write_weight_digest(run_dir: Path) -> None:
    """weights.txt: every tensor of the saved model as its shape, sum and sum of magnitudes (float64 repr),
    sorted, so the check does not depend on what the tensors are called."""
    import torch

    state = torch.load(run_dir / "model.pt", weights_only=True)
    tensors = []

    def collect(value) -> None:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            tensors.append(value.double())
        elif isinstance(value, dict):
            for item in value.values():
                collect(item)

    collect({key: value for key, value in state.items() if key != "config"})
    lines = sorted(f"{tuple(t.shape)} {t.sum().item()!r} {t.abs().sum().item()!r}" for t in tensors)
    (run_dir / "weights.txt").write_text("\n".join(lines) + "\n")


def machine_kind() -> str:
    """The CPU architecture, its widest vector extension and torch's version: what decides the rounding."""
    import torch

    flags = ""
    if Path("/proc/cpuinfo").is_file():
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    simd = next((name for name in ("avx512f", "avx2") if name in flags.split()), "no-avx2")
    return f"{platform.machine()} {simd}, torch {torch.__version__}"


def kind_directory(kind: str) -> str:
    """'x86_64 avx2, torch 2.13.0+cpu' -> 'x86_64-avx2-torch-2.13.0+cpu': the folder of that kind's records."""
    return re.sub(r"[^\w.+]+", "-", kind)


HERE = GOLDEN / kind_directory(machine_kind())


@pytest.mark.parametrize("case", CASES)
def test_a_short_run_writes_the_recorded_logs(case, tmp_path, capsys):
    if not (HERE / case).is_dir():
        kinds = sorted(d.name for d in GOLDEN.iterdir() if (d / case).is_dir())
        pytest.skip(f"no logs of {case} recorded on {HERE.name}, only on: {', '.join(kinds) or 'none'}")
    if case == "grpo":
        pytest.importorskip("transformers")
    run_dir = run(case, tmp_path)
    write_weight_digest(run_dir)
    for name in LOGS:
        recorded_path = HERE / case / name
        recorded = recorded_path.read_text()
        where = recorded_path.relative_to(GOLDEN.parent.parent)
        assert name == "episodes.csv" or recorded.count("\n") > 1, f"{where} holds no rows"
        assert (run_dir / name).read_text() == recorded, f"{case}: {name} differs from {where}"


def write_golden(cases: tuple[str, ...], drop_other_kinds: bool) -> None:
    """Record the cases' logs on this machine kind; with `drop_other_kinds`, delete the other kinds' records of
    them (the numbers changed, and this machine cannot say what those kinds now write)."""
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        for case in cases:
            run_dir = run(case, Path(scratch) / case)
            write_weight_digest(run_dir)
            (HERE / case).mkdir(parents=True, exist_ok=True)
            for name in LOGS:
                shutil.copyfile(run_dir / name, HERE / case / name)
            print(f"wrote tests/golden/{HERE.name}/{case}/")
            others = [d / case for d in GOLDEN.iterdir() if d != HERE and (d / case).is_dir()]
            for record in others if drop_other_kinds else []:
                shutil.rmtree(record)
                print(f"dropped tests/golden/{record.parent.name}/{case}/ (record it again on such a machine)")


if __name__ == "__main__":
    mode, cases = sys.argv[1:2], tuple(sys.argv[2:])
    unknown = sorted(set(cases) - set(CASES))
    if mode not in (["--write"], ["--add-machine"]) or unknown:
        raise SystemExit("usage: python -m tests.test_same_numbers --write|--add-machine [CASE ...]"
                         + (f"; unknown cases {unknown}, known: {', '.join(CASES)}" if unknown else ""))
    write_golden(cases or CASES, drop_other_kinds=mode == ["--write"])
