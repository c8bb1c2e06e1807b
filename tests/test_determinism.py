"""Same seed, same numbers, on the machine at hand: each agent's short training case (tests/same_numbers.py), run
twice in this process with one seed, writes the same episodes.csv, eval.csv and weight digest, bit for bit;
another seed writes other numbers; and the refactoring tool (python -m tests.same_numbers --against COMMIT)
tells a tree with one number changed from an unchanged one. Nothing here is compared with runs made on another
machine: float results differ in the last bits from one CPU kind to another."""

import re
import shutil
from pathlib import Path

import pytest

from same_numbers import CASES, LOGS, differences, export_commit, main, run, run_in_subprocesses, write_weight_digest

NO_TRAINING_EPISODES = ("cql", "iql", "riql", "grpo")  # offline agents and GRPO log no training episodes


def trained(case: str, runs_dir: Path, seed: int = 1) -> Path:
    """The run directory of the case trained with `seed` into runs_dir, with its weight digest written."""
    run_dir = run(case, runs_dir, seed)
    write_weight_digest(run_dir)
    return run_dir


def rows(csv_file: Path) -> int:
    """How many lines a CSV file holds below its header."""
    return len(csv_file.read_text().splitlines()) - 1


@pytest.mark.parametrize("case", CASES)
def test_the_same_seed_gives_the_same_numbers(case, tmp_path):
    if case == "grpo":
        pytest.importorskip("transformers")
    first, second = (trained(case, tmp_path / name) for name in ("first", "second"))
    assert rows(first / "eval.csv") > 0, f"{case}: eval.csv holds no rows"
    assert case in NO_TRAINING_EPISODES or rows(first / "episodes.csv") > 0, f"{case}: episodes.csv holds no rows"
    assert (first / "weights.txt").read_text().strip(), f"{case}: the weight digest is empty"
    assert differences(first, second) == {}


def test_another_seed_gives_other_numbers(tmp_path):
    """Keeps the check above honest: every log it compares depends on the seed, and `differences` sees that."""
    seed_1, seed_2 = (trained("stream_td", tmp_path / f"seed_{seed}", seed) for seed in (1, 2))
    assert differences(seed_1, seed_2).keys() == set(LOGS)


def raise_default_expectile(iql_file: Path) -> None:
    """Add 0.01 to the default expectile of IQLConfig in that copy of agents/iql.py."""
    source, count = re.subn(r"(expectile: float = )([0-9.]+)", lambda m: f"{m[1]}{float(m[2]) + 0.01!r}",
                            iql_file.read_text())
    assert count == 1, f"no single default expectile in {iql_file}"
    iql_file.write_text(source)


def test_the_refactoring_tool_tells_a_changed_number_from_an_unchanged_tree(tmp_path):
    """HEAD exported, copied unchanged and copied with IQL's default expectile raised by 0.01; the iql case run in
    the tool's subprocesses with keelrl imported from each tree."""
    head = export_commit("HEAD", tmp_path / "head")
    unchanged, changed = (shutil.copytree(head, tmp_path / name) for name in ("unchanged", "changed"))
    raise_default_expectile(changed / "agents" / "iql.py")
    at_head, at_unchanged, at_changed = run_in_subprocesses("iql", [head, unchanged, changed], tmp_path / "runs")
    assert differences(at_head, at_unchanged) == {}
    assert "weights.txt" in differences(at_head, at_changed)


@pytest.mark.parametrize("argv", [["--against", "HEAD", "no_such_case"], ["--against", "no-such-commit"],
                                  ["--run", "iql"], ["--write"], []])
def test_the_refactoring_tool_refuses_bad_usage_in_one_line(argv, capsys):
    assert main(argv) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1
