"""Plausible user mistakes with the benchmark tools (leaderboard, make_datasets): one line, no traceback, exit
code 2, before any directory is made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from keelrl.agents import sac
from keelrl.benchmarks import leaderboard, make_datasets

TASK = "InvertedPendulum-v5"
AGENTS = "sac, td3, mrq, sac_lag, td3_lag, ppo, ppo_lag, cql, iql, riql, wsrl, stream_td, stream_q, stream_ac, grpo"
"""keelrl.agents.registry's agents, as the refusal of an unknown one lists them"""


def one_line_error(capsys) -> str:
    """The single `error: ...` line the command printed on stderr."""
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


# ---------------------------------------------------------------------------------------------------
# python -m keelrl.benchmarks.leaderboard


def leaderboard_args(tmp_path: Path, *args: str) -> list[str]:
    """The leaderboard's arguments with its run and output directories under tmp_path (neither exists yet)."""
    return [*args, "--runs-dir", str(tmp_path / "runs"), "--out-dir", str(tmp_path / "out"), "--bootstrap-reps", "10"]


def nothing_made(tmp_path: Path) -> bool:
    return not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()


def grid_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "grid.toml"
    path.write_text('seeds = [1]\nsteps = 300\n' + text)
    return path


@pytest.mark.parametrize("tables, expected", [
    (f'[[tasks]]\nid = "{TASK}"\n[[agents]]\nmodule = "sac"\n', "grid grid: agent 1 of [[agents]] has no name"),
    (f'[[tasks]]\nid = "{TASK}"\n[[tasks]]\nsteps = 300\n[[agents]]\nname = "sac"\n',
     "grid grid: task 2 of [[tasks]] has no id"),
])
def test_a_grid_table_without_its_key_is_refused_naming_the_file_the_table_and_the_key(tables, expected, tmp_path,
                                                                                     capsys):
    path = grid_file(tmp_path, tables)
    assert leaderboard.main(leaderboard_args(tmp_path, "--grid", str(path))) == 2
    err = one_line_error(capsys)
    assert err.startswith(f"error: {path}: {expected}: write it as a table with ")
    assert nothing_made(tmp_path)


@pytest.mark.parametrize("how", ["grid", "flags"])
def test_an_unknown_agent_module_is_refused_with_close_and_known_names(how, tmp_path, capsys):
    # it ran nothing and exited 0, its cells reported "unavailable" as if a dependency were missing
    if how == "grid":
        path = grid_file(tmp_path, f'[[tasks]]\nid = "{TASK}"\n[[agents]]\nname = "fast"\nmodule = "saq"\n')
        args, where = ["--grid", str(path)], f"{path}: grid grid, agent fast"
    else:
        args, where = ["--agents", "sac", "saq", "--tasks", TASK, "--seeds", "1"], "--agents saq"
    assert leaderboard.main(leaderboard_args(tmp_path, *args)) == 2
    assert one_line_error(capsys) == (f"error: {where}: keelrl has no agent module 'saq'. Did you mean 'sac'? "
                                      f"Its agents: {AGENTS}.")
    assert nothing_made(tmp_path)


def test_a_known_agent_whose_dependency_is_missing_is_still_unavailable(tmp_path, monkeypatch):
    def without_transformers(name):
        raise ModuleNotFoundError("No module named 'transformers'", name="transformers")

    monkeypatch.setattr(leaderboard.checks, "agent_module", without_transformers)
    grid = leaderboard.grid_from_dict({"family": "rlvr", "seeds": [1], "steps": 2, "task_flag": "task",
                                       "steps_flag": "iterations", "tasks": ["add"], "agents": ["grpo"]}, "rlvr")
    messages = []
    results = leaderboard.run_grids([grid], tmp_path / "runs", log=messages.append)
    assert [(r.label, r.status) for r in results] == [("grpo", "unavailable")]
    assert messages[0] == ("unavailable: agent 'grpo' (keelrl.agents.grpo needs 'transformers', which is not "
                           "installed (No module named 'transformers')); its cells are skipped")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("how", ["grid", "flags"])
def test_a_misspelled_env_id_is_refused_before_any_cell_is_made(how, tmp_path, capsys):
    # each cell's agent process was started and failed (exit 1), the reason only in its log.txt
    if how == "grid":
        path = grid_file(tmp_path, '[[tasks]]\nid = "InvertedPendulm-v5"\n[[agents]]\nname = "sac"\n')
        args, grid = ["--grid", str(path)], "grid"
    else:
        args, grid = ["--agents", "sac", "--tasks", "InvertedPendulm-v5", "--seeds", "1", "--steps", "300"], "custom"
    assert leaderboard.main(leaderboard_args(tmp_path, *args)) == 2
    assert one_line_error(capsys) == (f"error: grid {grid}, agent sac, task InvertedPendulm-v5: unknown gymnasium "
                                      f"environment id 'InvertedPendulm-v5'. Did you mean 'InvertedPendulum-v5', "
                                      f"'InvertedPendulum-v4', 'InvertedPendulum-v2'?")
    assert nothing_made(tmp_path)


def minari_data_path(tmp_path: Path) -> Path:
    """A Minari datasets root holding keelrl/hopper-medium-v0 (its metadata only: what the look-up needs)."""
    data_dir = tmp_path / "datasets" / "keelrl" / "hopper-medium-v0" / "data"
    data_dir.mkdir(parents=True)
    (data_dir / "metadata.json").write_text(json.dumps({"env_spec": None}))
    return tmp_path / "datasets"


def offline_args(tmp_path: Path, dataset: str, *extra: str) -> list[str]:
    return leaderboard_args(tmp_path, "--agents", "iql", "--tasks", dataset, "--family", "offline", "--seeds", "1",
                            "--steps", "10", "--option", "task-flag=dataset", "--option", "steps-flag=total-updates",
                            "--option", f"data-path={minari_data_path(tmp_path)}", *extra)


@pytest.mark.parametrize("dataset, expected", [
    ("keelrl/hoper-medium-v0", "No dataset 'keelrl/hoper-medium-v0': looked for a Minari dataset in "
                               "{root}/keelrl/hoper-medium-v0"),
    ("keelrl/walker2d-medium-v0", "No dataset 'keelrl/walker2d-medium-v0': looked for a Minari dataset in "
                                  "{root}/keelrl/walker2d-medium-v0"),
    ("{tmp}/hopper.npz", "no dataset file at {tmp}/hopper.npz."),
])
def test_a_missing_offline_dataset_is_refused_before_any_cell_is_made(dataset, expected, tmp_path, capsys):
    root = tmp_path / "datasets"
    dataset, expected = (text.format(tmp=tmp_path, root=root) for text in (dataset, expected))
    assert leaderboard.main(offline_args(tmp_path, dataset)) == 2
    err = one_line_error(capsys)
    assert err.startswith(f"error: grid custom, agent iql, task {dataset}: {expected}")
    if dataset.startswith("keelrl/hoper"):  # a typo: the close id there
        assert err.endswith("Did you mean 'keelrl/hopper-medium-v0'?")
    if dataset.startswith("keelrl/walker2d"):  # no typo: it says how to make the dataset
        assert err.endswith("Create it with: python -m keelrl.benchmarks.make_datasets --env-id Walker2d-v5 "
                            "--datasets medium")
    assert nothing_made(tmp_path)


def test_a_dataset_that_is_there_is_found_and_a_report_does_not_look_for_datasets(tmp_path):
    grid = leaderboard.grids_from_args(leaderboard.Args(
        agents=("iql",), tasks=("keelrl/hopper-medium-v0", "keelrl/nowhere-medium-v0"), family="offline", seeds=(1,),
        steps=10, option=("task-flag=dataset", "steps-flag=total-updates",
                          f"data-path={minari_data_path(tmp_path)}")))
    present, absent = leaderboard.expand(grid[0], tmp_path / "runs")
    leaderboard.check_tasks([present], datasets=True)
    leaderboard.check_tasks([absent], datasets=False)  # --report-only / --dry-run: a report may be made elsewhere
    with pytest.raises(FileNotFoundError, match="No dataset 'keelrl/nowhere-medium-v0'"):
        leaderboard.check_tasks([absent], datasets=True)


# ---------------------------------------------------------------------------------------------------
# python -m keelrl.benchmarks.make_datasets


@pytest.fixture(scope="module")
def sac_run(tmp_path_factory) -> Path:
    """A finished tiny single-env SAC run on InvertedPendulum-v5 (model.pt, checkpoint.pt, buffer.pt)."""
    return sac.train(sac.SACConfig(env_id=TASK, total_timesteps=300, learning_starts=100, batch_size=32,
                                   hidden_sizes=(32, 32), eval_episodes=1, quiet=True,
                                   runs_dir=str(tmp_path_factory.mktemp("sac")))).run_dir


def make_datasets_args(tmp_path: Path, *args: str) -> list[str]:
    """make_datasets' arguments with a tiny budget, its work and data directories under tmp_path (neither exists)."""
    return [*args, "--steps", "50", "--sac-steps", "200", "--eval-every", "200", "--learning-starts", "100",
            "--ref-episodes", "1", "--num-envs", "1", "--work-dir", str(tmp_path / "work"),
            "--data-path", str(tmp_path / "data"), "--quiet"]


def nothing_made_by_make_datasets(tmp_path: Path) -> bool:
    return not (tmp_path / "work").exists() and not (tmp_path / "data").exists()


@pytest.mark.parametrize("env_id, expected", [
    ("Hoper-v5", "error: Unknown gymnasium environment id 'Hoper-v5' ("),
    ("CartPole-v1", "error: --env-id CartPole-v1 has Discrete(2) actions: make_datasets collects with SAC and uniform "
                    "random actions, which need continuous (Box) actions; give an environment with Box actions"),
])
def test_make_datasets_refuses_an_unknown_or_discrete_action_env_before_making_its_work_dir(env_id, expected, tmp_path,
                                                                                           capsys):
    # Hoper-v5 asked for --medium-return after making the work dir; CartPole-v1 raised an AttributeError
    args = make_datasets_args(tmp_path, "--env-id", env_id, "--medium-return", "10", "--datasets", "random", "expert")
    assert make_datasets.main(args) == 2
    err = one_line_error(capsys)
    assert err.startswith(expected)
    if env_id == "Hoper-v5":
        assert err.endswith("Did you mean 'Hopper-v5', 'Hopper-v4', 'Hopper-v3'?")
    assert nothing_made_by_make_datasets(tmp_path)


@pytest.mark.parametrize("env_id, extra, expected", [
    (TASK, ["--quick"], f"No expert is made here and D4RL has no reference for {TASK}: add expert to --datasets or "
                        f"give --expert-model."),
    (TASK, ["--datasets", "random", "expert"], f"No D4RL expert return is known for {TASK}: give --medium-return."),
    ("Hopper-v5", ["--medium-model", "{model}", "--datasets", "medium-replay"],
     "medium-replay needs the medium run's replay buffer: give --medium-buffer with --medium-model."),
])
def test_make_datasets_refuses_a_recipe_it_cannot_finish_before_making_anything(env_id, extra, expected, sac_run,
                                                                               tmp_path, capsys):
    # each was found out only after the work dir was made, or after SAC had trained
    extra = [arg.format(model=sac_run / "model.pt") for arg in extra]
    assert make_datasets.main(make_datasets_args(tmp_path, "--env-id", env_id, *extra)) == 2
    assert one_line_error(capsys) == f"error: {expected}"
    assert nothing_made_by_make_datasets(tmp_path)


def junk_file(tmp_path: Path) -> Path:
    path = tmp_path / "junk.pt"
    path.write_text("not a model\n")
    return path


@pytest.mark.parametrize("case, env_id, expected", [
    ("missing", TASK, "{path}: no such file; give the model.pt of a keelrl SAC run on InvertedPendulum-v5."),
    ("other env", "Hopper-v5", "{path} takes 4-dimensional observations and actions of shape (1,), but Hopper-v5 has "
                               "11-dimensional observations and actions of shape (3,): give the model.pt of a keelrl "
                               "SAC run on Hopper-v5."),
    ("checkpoint", TASK, "{path} is a training checkpoint (what --resume continues from), not a saved agent: give the "
                         "model.pt of a keelrl SAC run on InvertedPendulum-v5."),
    ("junk", TASK, "{path} is not a readable keelrl checkpoint: "),
])
def test_make_datasets_refuses_a_medium_model_that_is_not_a_sac_model_for_the_env(case, env_id, expected, sac_run,
                                                                                 tmp_path, capsys):
    # another env's model failed with a shape mismatch traceback while collecting
    path = {"missing": tmp_path / "nosuch.pt", "other env": sac_run / "model.pt",
            "checkpoint": sac_run / "checkpoint.pt", "junk": junk_file(tmp_path)}[case]
    args = make_datasets_args(tmp_path, "--env-id", env_id, "--medium-model", str(path), "--datasets", "medium",
                              "--medium-return", "10", "--expert-model", str(sac_run / "model.pt"))
    assert make_datasets.main(args) == 2
    assert one_line_error(capsys).startswith(f"error: --medium-model {expected.format(path=path)}")
    assert nothing_made_by_make_datasets(tmp_path)


def truncated_copy(source: Path, tmp_path: Path) -> Path:
    path = tmp_path / "buffer.pt"
    path.write_bytes(source.read_bytes()[: source.stat().st_size // 2])
    return path


EXPECTED_BUFFER = f"give the buffer.pt of the one-env keelrl SAC run on {TASK} that --medium-model comes from."


@pytest.mark.parametrize("case, expected", [
    ("missing", f"{{path}}: no such file; {EXPECTED_BUFFER}"),
    ("checkpoint", f"{{path}} is not a keelrl replay buffer (it has no obs, next_obs, actions, rewards, terminated, "
                   f"truncated, pos, capacity, num_envs): {EXPECTED_BUFFER}"),
    ("truncated", "{path} is not a readable keelrl replay buffer: it is damaged, truncated or not written by keelrl ("),
])
def test_make_datasets_refuses_a_medium_buffer_that_is_not_the_runs_buffer(case, expected, sac_run, tmp_path, capsys):
    # a checkpoint.pt raised a KeyError, a truncated buffer an OSError, a missing file a bare errno
    path = {"missing": tmp_path / "nosuch.pt", "checkpoint": sac_run / "checkpoint.pt",
            "truncated": truncated_copy(sac_run / "buffer.pt", tmp_path)}[case]
    args = make_datasets_args(tmp_path, "--env-id", TASK, "--medium-model", str(sac_run / "model.pt"),
                              "--medium-buffer", str(path), "--datasets", "medium-replay", "--medium-return", "10",
                              "--expert-model", str(sac_run / "model.pt"))
    assert make_datasets.main(args) == 2
    err = one_line_error(capsys)
    assert err.startswith(f"error: --medium-buffer {expected.format(path=path)}")
    assert err.endswith(EXPECTED_BUFFER)
    assert nothing_made_by_make_datasets(tmp_path)
