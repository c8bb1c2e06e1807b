"""Same numbers: a short training case of every agent, and a refactoring tool that runs the cases under two
versions of keelrl on this machine and compares their logs bit for bit.

A refactor must not change the numbers. Before committing one, run this on one machine, against the commit
before it:

    python -m tests.same_numbers --against COMMIT [CASE ...]

It exports COMMIT (`git archive`) into a temporary directory and trains each case (default: all of CASES)
twice on this machine, each time in its own subprocess of this interpreter: once with `keelrl` imported from
the export, once from the repository this tests/ folder lies in (uncommitted changes included). Both use this
module's case definitions; only the imported keelrl differs. It compares episodes.csv, eval.csv and the
weight digest weights.txt bit for bit, prints one line per case (identical, or the files that differ with
their first differing line), and exits 0 if every case is identical, 1 otherwise, 2 on bad usage.

Never compare with runs made on another machine: float results differ in the last bits from one CPU kind to
another. tests/test_determinism.py checks on the machine at hand that each case gives the same numbers twice
with one seed.

One case into a directory, for debugging (keelrl imported from KEELRL_ROOT, by default this repository):

    python -m tests.same_numbers --run CASE DIRECTORY [KEELRL_ROOT]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import types
from itertools import zip_longest
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
LOGS = ("episodes.csv", "eval.csv", "weights.txt")
OFF_POLICY = dict(env_id="InvertedPendulum-v5", total_timesteps=600, learning_starts=200, batch_size=32,
                  hidden_sizes=(32, 32), buffer_size=10_000, eval_freq=300, eval_episodes=2, checkpoint_freq=300,
                  log_freq=100, threads=1, quiet=True)
MRQ = dict(env_id="InvertedPendulum-v5", total_timesteps=600, learning_starts=200, batch_size=32, buffer_size=10_000,
           zs_dim=32, zsa_dim=32, za_dim=16, enc_hidden_dim=32, value_hidden_dim=32, policy_hidden_dim=32,
           target_update_freq=50, eval_freq=300, eval_episodes=2, checkpoint_freq=300, log_freq=100, threads=1,
           quiet=True)
SAFE = dict(OFF_POLICY, env_id="keelrl/SafeHopperVelocity-v1", cost_limit=1.0, lambda_lr=0.05)
OFFLINE = dict(env_id="InvertedPendulum-v5", total_updates=120, batch_size=32, hidden_sizes=(32, 32), eval_freq=60,
               eval_episodes=2, checkpoint_freq=60, log_freq=30, threads=1, quiet=True)
ON_POLICY = dict(env_id="InvertedPendulum-v5", total_timesteps=512, num_steps=64, num_minibatches=4, update_epochs=2,
                 hidden_sizes=(16, 16), eval_freq=256, eval_episodes=2, checkpoint_freq=256, log_freq=64, threads=1,
                 quiet=True)
STREAM = dict(env_id="CartPole-v1", total_timesteps=1500, hidden_sizes=(16, 16), eval_freq=500, eval_episodes=2,
              checkpoint_freq=500, log_freq=100, threads=1, quiet=True)
USAGE = "usage: python -m tests.same_numbers --against COMMIT [CASE ...] | --run CASE DIRECTORY [KEELRL_ROOT]"


def offline_dataset(directory: Path) -> Path:
    """600 transitions of InvertedPendulum-v5 under uniform random actions in [−3, 3], two envs, seed 0."""
    from keelrl.benchmarks.make_datasets import collect

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "pendulum.npz"
    if not path.exists():
        rng = np.random.default_rng(0)
        np.savez(path, **collect("InvertedPendulum-v5", lambda obs: rng.uniform(-3, 3, (len(obs), 1)), 600, 2, seed=0))
    return path


def run(case: str, runs_dir: Path, seed: int = 1) -> Path:
    """Train the case's agent with `seed` into runs_dir and return its run directory."""
    from keelrl.agents import (
        cql,
        grpo,
        iql,
        mrq,
        ppo,
        ppo_lag,
        riql,
        sac,
        sac_lag,
        stream_ac,
        stream_q,
        stream_td,
        td3,
        td3_lag,
        wsrl,
    )

    common = dict(runs_dir=str(runs_dir), seed=seed)
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
        "mrq": lambda: mrq.train(mrq.MRQConfig(**MRQ, **common)),
        "sac_lag": lambda: sac_lag.train(sac_lag.SACLagConfig(**SAFE, **common)),
        "td3_lag": lambda: td3_lag.train(td3_lag.TD3LagConfig(**SAFE, **common)),
        "cql": lambda: cql.train(cql.CQLConfig(**OFFLINE, cql_n_actions=4, **data)),
        "iql": lambda: iql.train(iql.IQLConfig(**OFFLINE, **data)),
        "wsrl": lambda: wsrl.train(wsrl.WSRLConfig(
            pretrained=str(cql.train(cql.CQLConfig(
                **OFFLINE, cql_n_actions=4, num_critics=4, critic_subset_size=2, layer_norm=True, max_target_backup=True,
                **data)).run_dir),
            total_timesteps=300, warmup_steps=100, batch_size=32, utd=4, buffer_size=1000, eval_freq=150,
            eval_episodes=2, checkpoint_freq=150, log_freq=50, threads=1, quiet=True, **common)),
        "riql": lambda: riql.train(riql.RIQLConfig(**OFFLINE, corruption="dynamics", corruption_rate=0.3, **data)),
        "ppo": lambda: ppo.train(ppo.PPOConfig(**ON_POLICY, **common)),
        "ppo_lag": lambda: ppo_lag.train(ppo_lag.PPOLagConfig(
            **{**ON_POLICY, "env_id": "keelrl/SafeHopperVelocity-v1"}, cost_limit=1.0, **common)),
        "stream_td": lambda: stream_td.train(stream_td.StreamTDConfig(**STREAM, **common)),
        "stream_q": lambda: stream_q.train(stream_q.StreamQConfig(**STREAM, **common)),
        "stream_ac": lambda: stream_ac.train(stream_ac.StreamACConfig(
            **{**STREAM, "env_id": "InvertedPendulum-v5"}, **common)),
        "grpo": lambda: grpo.train(grpo.GRPOConfig(
            n_embd=32, n_head=2, context_length=16, max_new_tokens=4, num_prompts=4, group_size=4, iterations=4,
            warmup_steps=5, warmup_batch_size=16, eval_freq=2, eval_episodes=8, eval_samples=4, pass_k=2,
            checkpoint_freq=2, threads=1, quiet=True, **common)),
    }
    if case in ("cql", "iql", "riql", "wsrl"):
        offline_dataset(runs_dir)
    return configs[case]().run_dir


CASES = ("sac", "sac_simbav2_hlgauss", "td3", "td3_simba_c51", "mrq", "sac_lag", "td3_lag", "cql", "iql", "riql",
         "wsrl", "ppo", "ppo_lag", "stream_td", "stream_q", "stream_ac", "grpo")


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


def differences(run_a: Path, run_b: Path) -> dict[str, str]:
    """The logs (of LOGS) whose bytes differ between two run directories, each with its first differing line."""
    return {name: first_difference(run_a / name, run_b / name)
            for name in LOGS if (run_a / name).read_bytes() != (run_b / name).read_bytes()}


def first_difference(file_a: Path, file_b: Path) -> str:
    """'line N: <line of a> vs <line of b>' for the first line where two files differ."""
    pairs = zip_longest(file_a.read_bytes().splitlines(True), file_b.read_bytes().splitlines(True), fillvalue=b"")
    number, (line_a, line_b) = next((n, pair) for n, pair in enumerate(pairs, 1) if pair[0] != pair[1])
    return f"line {number}: {line_a.decode()!r} vs {line_b.decode()!r}"


def import_keelrl_from(root: Path) -> None:
    """Make `import keelrl.<folder>` load <folder> from under root: a bare `keelrl` package whose path is root, so
    the normal PathFinder finds its folders before the installed keelrl's finder (appended after it) is asked.
    Call before anything imports keelrl."""
    package = types.ModuleType("keelrl")
    package.__path__ = [str(root)]
    sys.modules["keelrl"] = package


def check_imported_from(root: Path) -> None:
    """Raise unless keelrl.agents, and every other keelrl module imported so far, came from under root."""
    outside = sorted(name for name, module in sys.modules.items() if name.startswith("keelrl.") and not Path(
        getattr(module, "__file__", None) or list(module.__path__)[0]).resolve().is_relative_to(root.resolve()))
    if outside or "keelrl.agents" not in sys.modules:
        raise RuntimeError(f"keelrl was to be imported from {root}, but these modules were not: "
                           f"{', '.join(outside or ['keelrl.agents'])}")


def run_with_keelrl_from(root: Path, case: str, runs_dir: Path) -> Path:
    """Train the case into runs_dir with keelrl imported from root, write its weight digest, and check that no
    keelrl module came from elsewhere; returns the run directory."""
    import_keelrl_from(root)
    run_dir = run(case, runs_dir)
    write_weight_digest(run_dir)
    check_imported_from(root)
    return run_dir


class RunFailed(Exception):
    """A case's run in a subprocess exited with an error."""


def run_in_subprocesses(case: str, keelrl_roots: list[Path], scratch: Path) -> list[Path]:
    """Train the case once with keelrl imported from each root, each in its own subprocess of this interpreter,
    all at once (each run uses one thread), into scratch/<case>-<i>/; returns their run directories in the
    order of the roots, or raises RunFailed with the last line a failed run wrote."""
    out_dirs = [scratch / f"{case}-{i}" for i in range(len(keelrl_roots))]
    processes = [start_run(case, root, out_dir) for root, out_dir in zip(keelrl_roots, out_dirs)]
    exit_codes = [process.wait() for process in processes]
    for code, root, out_dir in zip(exit_codes, keelrl_roots, out_dirs):
        if code != 0:
            last_line = ((out_dir / "output.txt").read_text().strip().splitlines() or ["(no output)"])[-1]
            raise RunFailed(f"the run with keelrl from {root} failed: {last_line}")
    return [next(out_dir.glob("*/weights.txt")).parent for out_dir in out_dirs]


def start_run(case: str, keelrl_root: Path, out_dir: Path) -> subprocess.Popen:
    """Start `--run case out_dir keelrl_root` of this module in a subprocess, its output going to
    out_dir/output.txt."""
    out_dir.mkdir(parents=True)
    with open(out_dir / "output.txt", "w") as output:
        return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--run", case, str(out_dir),
                                 str(keelrl_root)], stdout=output, stderr=subprocess.STDOUT, cwd=out_dir)


def export_commit(commit: str, directory: Path) -> Path:
    """Extract `git archive commit` of this repository into directory (created); returns directory."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit], check=True,
                             capture_output=True).stdout
    directory.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(directory)], input=archive, check=True)
    return directory


def what_differs(case: str, commit: str, commit_root: Path, scratch: Path) -> str | None:
    """What differs between the case's runs with keelrl at `commit` and from this repository; None if nothing."""
    try:
        at_commit, here = run_in_subprocesses(case, [commit_root, REPO], scratch)
    except RunFailed as error:
        return str(error)
    found = differences(at_commit, here)
    details = "; ".join(f"{name} {where}" for name, where in found.items())
    return f"differs ({commit} vs working tree): {details}" if found else None


def compare_with_commit(commit: str, cases: list[str]) -> int:
    """Run each case with keelrl at `commit` and from this repository, print a line per case; the exit status."""
    with tempfile.TemporaryDirectory(prefix="same-numbers-") as scratch:
        commit_root = export_commit(commit, Path(scratch) / "export")
        differing = 0
        for case in cases:
            difference = what_differs(case, commit, commit_root, Path(scratch))
            print(f"{case}: {difference or 'identical'}", flush=True)
            differing += difference is not None
    return 1 if differing else 0


def is_commit(name: str) -> bool:
    """Whether name names a commit of this repository."""
    command = ["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}"]
    return subprocess.run(command, capture_output=True).returncode == 0


def usage_problem(argv: list[str]) -> str | None:
    """What is wrong with the command line, in one line; None if nothing."""
    if argv[:1] == ["--against"] and len(argv) >= 2:
        commit, cases = argv[1], argv[2:]
    elif argv[:1] == ["--run"] and len(argv) in (3, 4):
        commit, cases = None, argv[1:2]
    else:
        return USAGE
    unknown = [case for case in cases if case not in CASES]
    if unknown:
        return f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}"
    if commit is not None and not is_commit(commit):
        return f"{commit!r} is not a commit of the repository at {REPO}"
    return None


def main(argv: list[str]) -> int:
    """The command line (see the module's docstring); returns the exit status."""
    problem = usage_problem(argv)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    if argv[0] == "--run":
        run_with_keelrl_from(Path(argv[3]) if len(argv) == 4 else REPO, argv[1], Path(argv[2]))
        return 0
    return compare_with_commit(argv[1], list(dict.fromkeys(argv[2:])) or list(CASES))  # each case once


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
