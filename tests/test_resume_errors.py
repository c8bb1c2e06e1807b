"""`--resume` of a damaged, truncated or foreign run directory: one line naming the file, exit code 2.

One tiny finished run per training loop (off-policy, offline, streaming, GRPO) is copied and damaged in
each of the ways a user can damage it; resuming the copy must fail cleanly, never with a traceback.
"""

import json
import shutil

import numpy as np
import pytest
import torch

from keelrl.agents import grpo, iql, sac, stream_q
from keelrl.agents.harness.checkpoints import BUFFER_FILE, CHECKPOINT_FILE
from keelrl.agents.harness.options import run_cli
from keelrl.agents.harness.run_directory import CONFIG_FILE
from keelrl.benchmarks.make_datasets import collect


def random_policy(obs):
    return np.random.default_rng(len(obs)).uniform(-1, 1, (len(obs), 1)).astype(np.float32)


def finished_run(algo, root):
    """Train a tiny run of `algo` under `root`; its run directory."""
    common = dict(runs_dir=str(root / "runs"), quiet=True)
    if algo == "sac":
        config = sac.SACConfig(env_id="InvertedPendulum-v5", total_timesteps=300, learning_starts=200, batch_size=16,
                               hidden_sizes=(16, 16), eval_freq=0, eval_episodes=1, checkpoint_freq=300, **common)
        return sac.train(config).run_dir
    if algo == "iql":
        np.savez(root / "data.npz", **collect("InvertedPendulum-v5", random_policy, 200, num_envs=2, seed=0))
        config = iql.IQLConfig(dataset=str(root / "data.npz"), env_id="InvertedPendulum-v5", total_updates=20,
                               batch_size=16, hidden_sizes=(16, 16), eval_freq=0, eval_episodes=1, **common)
        return iql.train(config).run_dir
    if algo == "stream_q":
        config = stream_q.StreamQConfig(env_id="CartPole-v1", total_timesteps=300, hidden_sizes=(8, 8),
                                        eval_freq=0, eval_episodes=1, checkpoint_freq=300, **common)
        return stream_q.train(config).run_dir
    config = grpo.GRPOConfig(n_embd=16, n_head=2, context_length=16, max_new_tokens=4, num_prompts=2, group_size=2,
                             iterations=2, warmup_steps=1, warmup_batch_size=4, eval_freq=0, eval_episodes=2,
                             eval_samples=2, pass_k=1, checkpoint_freq=1, **common)
    return grpo.train(config).run_dir


MODULES = {"sac": sac, "iql": iql, "stream_q": stream_q, "grpo": grpo}
CONFIGS = {"sac": sac.SACConfig, "iql": iql.IQLConfig, "stream_q": stream_q.StreamQConfig, "grpo": grpo.GRPOConfig}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {algo: finished_run(algo, tmp_path_factory.mktemp(algo)) for algo in MODULES}


def unfinished_copy(run_dir, tmp_path):
    """A copy of a finished run as if stopped between its last checkpoint and its model.pt: --resume finishes it
    (a run with its model.pt is finished, and --resume refuses it before reading anything else)."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    (copy / "model.pt").unlink()
    return copy


def damage_config_empty(run_dir, algo, other):
    (run_dir / CONFIG_FILE).write_text("")
    return CONFIG_FILE


def damage_config_no_config(run_dir, algo, other):
    """The issue's case: {"algo": ...} beside a garbage checkpoint."""
    (run_dir / CONFIG_FILE).write_text(json.dumps({"algo": algo}))
    (run_dir / CHECKPOINT_FILE).write_bytes(b"not a checkpoint at all")
    return CONFIG_FILE


def damage_config_wrong_type(run_dir, algo, other):
    payload = json.loads((run_dir / CONFIG_FILE).read_text())
    payload["config"]["seed"] = "one"
    (run_dir / CONFIG_FILE).write_text(json.dumps(payload))
    return CONFIG_FILE


def damage_config_other_algo(run_dir, algo, other):
    shutil.copy(other / CONFIG_FILE, run_dir / CONFIG_FILE)
    return "that run is"


def damage_checkpoint_garbage(run_dir, algo, other):
    (run_dir / CHECKPOINT_FILE).write_bytes(bytes(range(256)) * 4)
    return CHECKPOINT_FILE


def damage_checkpoint_empty(run_dir, algo, other):
    (run_dir / CHECKPOINT_FILE).write_bytes(b"")
    return CHECKPOINT_FILE


def damage_checkpoint_truncated(run_dir, algo, other):
    data = (run_dir / CHECKPOINT_FILE).read_bytes()
    (run_dir / CHECKPOINT_FILE).write_bytes(data[: len(data) // 2])
    return CHECKPOINT_FILE


def damage_checkpoint_other_algo(run_dir, algo, other):
    shutil.copy(other / CHECKPOINT_FILE, run_dir / CHECKPOINT_FILE)
    return CHECKPOINT_FILE


def damage_checkpoint_missing_entries(run_dir, algo, other):
    torch.save({"algo": algo}, run_dir / CHECKPOINT_FILE)
    return CHECKPOINT_FILE


def damage_checkpoint_foreign_state(run_dir, algo, other):
    """The right entries, but the networks of another shape (as from a run with other hidden sizes)."""
    checkpoint = torch.load(run_dir / CHECKPOINT_FILE, weights_only=True)
    checkpoint["agent"] = {"networks": {"weight": torch.zeros(3)}, "optimizers": {}, "num_updates": 0}
    torch.save(checkpoint, run_dir / CHECKPOINT_FILE)
    return CHECKPOINT_FILE


def damage_checkpoint_removed(run_dir, algo, other):
    (run_dir / CHECKPOINT_FILE).unlink()
    return CHECKPOINT_FILE


DAMAGES = [damage_config_empty, damage_config_no_config, damage_config_wrong_type, damage_config_other_algo,
           damage_checkpoint_garbage, damage_checkpoint_empty, damage_checkpoint_truncated,
           damage_checkpoint_other_algo, damage_checkpoint_missing_entries, damage_checkpoint_foreign_state,
           damage_checkpoint_removed]


def resume_fails_cleanly(algo, run_dir, capsys, named):
    capsys.readouterr()
    code = run_cli(MODULES[algo].train, CONFIGS[algo], args=["--resume", str(run_dir)])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert named in err, err


@pytest.mark.parametrize("algo", list(MODULES))
@pytest.mark.parametrize("damage", DAMAGES, ids=lambda f: f.__name__.removeprefix("damage_"))
def test_resume_of_a_damaged_run_directory_says_which_file(algo, damage, runs, tmp_path, capsys):
    run_dir = unfinished_copy(runs[algo], tmp_path)
    other = runs["iql" if algo == "sac" else "sac"]
    named = damage(run_dir, algo, other)
    resume_fails_cleanly(algo, run_dir, capsys, named)


@pytest.mark.parametrize("damage", ["removed", "truncated"])
def test_resume_of_an_off_policy_run_needs_its_replay_buffer(damage, runs, tmp_path, capsys):
    run_dir = unfinished_copy(runs["sac"], tmp_path)
    if damage == "removed":
        (run_dir / BUFFER_FILE).unlink()
    else:
        data = (run_dir / BUFFER_FILE).read_bytes()
        (run_dir / BUFFER_FILE).write_bytes(data[: len(data) // 3])
    resume_fails_cleanly("sac", run_dir, capsys, BUFFER_FILE)


def test_an_intact_copy_resumes(runs, tmp_path, capsys):
    """The damage, not the copying, is what the tests above see: an intact copy of a run stopped before its
    model.pt resumes and finishes; once finished, a plain --resume says how to train it on."""
    run_dir = unfinished_copy(runs["iql"], tmp_path)
    assert run_cli(iql.train, iql.IQLConfig, args=["--resume", str(run_dir)]) == 0
    assert (run_dir / "model.pt").is_file()
    capsys.readouterr()
    assert run_cli(iql.train, iql.IQLConfig, args=["--resume", str(run_dir)]) == 2
    assert capsys.readouterr().err.strip() == (f"error: --resume {run_dir}: the run is finished (20 of its 20 "
                                               f"--total-updates); train it on with --resume {run_dir} --extend-to N.")


@pytest.mark.parametrize("algo", ["sac", "iql", "stream_q", "grpo"])
def test_every_loop_trains_a_finished_run_on_with_extend_to(algo, runs, tmp_path):
    """--extend-to lies in the run options every agent shares: each kind of loop continues a finished run to the
    new total, evaluates at its end and saves the new total, so a later plain --resume has nothing left to do."""
    run_dir = tmp_path / "run"
    shutil.copytree(runs[algo], run_dir)
    total = {"sac": "total_timesteps", "iql": "total_updates", "stream_q": "total_timesteps", "grpo": "iterations"}[algo]
    saved_total = json.loads((run_dir / CONFIG_FILE).read_text())["config"][total]
    extended = saved_total + {"sac": 50, "iql": 10, "stream_q": 100, "grpo": 1}[algo]
    result = MODULES[algo].train(CONFIGS[algo](resume=str(run_dir), extend_to=extended, quiet=True))
    assert result.global_step == extended and getattr(result.config, total) == extended
    assert json.loads((run_dir / CONFIG_FILE).read_text())["config"][total] == extended
    assert torch.load(run_dir / CHECKPOINT_FILE, weights_only=True)["global_step"] == extended
    with open(run_dir / "eval.csv") as f:
        assert int(f.read().splitlines()[-1].split(",")[0]) == extended
