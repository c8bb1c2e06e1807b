"""The results pages a page writer makes from committed files are what that writer makes of those files today.

Each leaderboard page (benchmarks/results/leaderboard/<name>.md, the command that made it on its `- Command:` line) is
made again with that command run `--report-only --from-committed` into a scratch folder, from its committed
<name>_runs.csv and _curves.csv alone, and benchmarks/results/gpu.md with benchmarks/gpu/page.py from the committed
gpu-*/ folders, gpu_leases.md and the CPU leaderboards' tables. The Markdown and every CSV must come out the same, but
for the lines that say who made the page, where and when (its provenance, which a scratch run cannot make again:
command, machines, software, commit, date, the runs' makers, corrections added by hand) and for the figures of a run
that had not finished (they were read from its run directory; --from-committed takes finished runs only); the PNGs are
not compared.
A page that fails here says something its committed data no longer does: make it again with the command it names.

The benchmarks/checks/ writers read run directories, so no page of theirs is made again here, but for mrq_page.py,
which reads committed tables (tests/test_mrq_page.py makes mrq.md again); the hand-written pages name the commands of
their runs themselves.
"""

from __future__ import annotations

import csv
import difflib
import re
import shlex
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
LEADERBOARD = RESULTS / "leaderboard"
COMMAND = "- Command: `"
PROVENANCE = ("Command:", "Execution:", "Runs made by:", "Runs made on ", "Runs whose machine", "Runs taken from ",
              "Agent processes that cell.json does not record", "Correction", "Page regenerated", "Machine:",
              "Software:", "keelrl commit:", "Generated:")
"""header lines (`- ...`) of a leaderboard page that say how, where and when it and its runs were made"""
RUNNING_ONLY = {"--workers": 1, "--runs-dir": 1, "--out-dir": 1, "--ray": 1, "--entries": None, "--report-only": 0,
                "--from-committed": 0, "--batch-seeds": 0, "--track": 0}
"""leaderboard options that change where and how cells run, not what a page made from tables says (the number of
values each takes; None: every value up to the next option)"""


def leaderboard_pages() -> list[Path]:
    return sorted(page for page in LEADERBOARD.glob("*.md") if command_of(page))


def command_of(page: Path) -> list[str]:
    """The leaderboard arguments on a page's Command line ([] for a page no leaderboard wrote)."""
    line = next((line for line in page.read_text().splitlines() if line.startswith(COMMAND)), "")
    words = shlex.split(line[len(COMMAND):-1]) if line.endswith("`") else []
    return words[3:] if words[:3] == ["python", "-m", "keelrl.benchmarks.leaderboard"] else []


def regenerating(arguments: list[str], runs_dir: Path, out_dir: Path) -> list[str]:
    """A page's leaderboard arguments made to write its outputs again from its committed tables, under out_dir."""
    kept, rest = [], list(arguments)
    while rest:
        word = rest.pop(0)
        option, given, _ = word.partition("=")
        if option not in RUNNING_ONLY:
            kept.append(word)
        elif not given and RUNNING_ONLY[option] is None:
            while rest and not rest[0].startswith("--"):
                rest.pop(0)
        elif not given:
            del rest[:RUNNING_ONLY[option]]
    return [*kept, "--report-only", "--from-committed", "--runs-dir", str(runs_dir), "--out-dir", str(out_dir)]


def without_provenance(text: str) -> list[str]:
    """The page's lines but its provenance, its images' links (a page drew the curves of runs not finished yet,
    which --from-committed leaves out; the PNGs are not compared) and blank lines."""
    return [line for line in text.splitlines()
            if line and not (line.startswith("- ") and line[2:].startswith(PROVENANCE)) and not line.startswith("![")]


def same_lines(committed: list[str], made: list[str], name: str) -> None:
    difference = "\n".join(difflib.unified_diff(committed, made, "committed", "made again", lineterm="", n=0))
    assert not difference, f"{name} differs from what its writer makes of its committed files:\n{difference}"


def read_rows(path: Path) -> tuple[list[str], list[dict]]:
    with path.open(newline="") as file:
        reader = csv.DictReader(file)
        return list(reader.fieldnames or []), list(reader)


def unfinished_runs(runs_table: Path) -> set[tuple[str, str, str, str]]:
    """(family, entry, task, seed) of the runs the committed runs table lists as not done: the entry's label, which
    the curves table calls its agent (the runs table's agent is the module, which entries may share)."""
    if not runs_table.is_file():
        return set()
    return {(r["family"], r["label"], r["task"], r["seed"]) for r in read_rows(runs_table)[1] if r["status"] != "done"}


def same_table(committed: Path, made: Path, finished_only: bool = False,
               left_out: set[tuple[str, str, str, str]] = frozenset()) -> None:
    """The same columns and rows; with finished_only, of a run that did not finish only its cell and status (its
    figures came from its run directory, which --from-committed cannot read). Committed rows of the runs in
    `left_out` (unfinished: their curves came from their run directories) are not expected again."""
    assert made.is_file(), f"{made.name} is committed but was not made again"
    (columns, rows), (made_columns, made_rows) = read_rows(committed), read_rows(made)
    rows = [r for r in rows if (r.get("family"), r.get("agent"), r.get("task"), r.get("seed")) not in left_out]
    assert made_columns == columns, f"{committed.name}: columns {columns} committed, {made_columns} made again"
    assert len(made_rows) == len(rows), f"{committed.name}: {len(rows)} rows committed, {len(made_rows)} made again"
    identity = ("family", "label", "agent", "task", "seed", "budget", "status")
    for number, (row, made_row) in enumerate(zip(rows, made_rows), start=2):
        keys = identity if finished_only and row.get("status") != "done" else columns
        differing = {key: (row[key], made_row[key]) for key in keys if row[key] != made_row[key]}
        assert not differing, f"{committed.name} line {number} (committed, made again): {differing}"


@pytest.fixture
def no_plots(monkeypatch):
    """The writers' PNGs are not compared: skip drawing them (most of a page's time)."""
    from keelrl.benchmarks import anchors, report
    from keelrl.benchmarks.gpu import page

    monkeypatch.setattr(report, "plot_curves", lambda *args, **kwargs: None)
    monkeypatch.setattr(anchors, "plot_task", lambda *args, **kwargs: None)
    monkeypatch.setattr(page, "plot_curves", lambda *args, **kwargs: None)


def test_every_leaderboard_page_names_the_command_that_made_it():
    """Every page but the hand-written findings pages names the command that made it; a grid's findings page (its
    `findings` key) links that grid's page, and the grid's page links it back."""
    from keelrl.benchmarks.leaderboard import GRIDS_DIR, load_grid

    pages = sorted(LEADERBOARD.glob("*.md"))
    hand_written = [page.name for page in pages if not command_of(page)]
    grids = [grid for grid in map(load_grid, map(str, sorted(GRIDS_DIR.glob("*.toml")))) if grid.findings]
    assert hand_written == sorted(["cpu-evidence-findings.md", *(grid.findings for grid in grids)])
    # its own first lines name the leaderboard command it reads
    assert "python -m keelrl.benchmarks.leaderboard" in (LEADERBOARD / "cpu-evidence-findings.md").read_text()
    for grid in grids:
        assert f"]({grid.name}.md)" in (LEADERBOARD / grid.findings).read_text()
        assert f"]({grid.findings})" in (LEADERBOARD / f"{grid.name}.md").read_text()
    assert len(pages) - len(hand_written) >= 12


@pytest.mark.parametrize("page", leaderboard_pages(), ids=lambda page: page.stem)
def test_a_leaderboard_page_is_what_its_command_makes_of_its_committed_tables(page, tmp_path, no_plots, capsys):
    from keelrl.benchmarks import leaderboard

    name = page.stem
    out, runs = tmp_path / "out", tmp_path / "runs"
    out.mkdir()
    runs.mkdir()
    for table in ("runs", "curves"):  # the committed tables the page's runs are read back from
        if (LEADERBOARD / f"{name}_{table}.csv").is_file():
            shutil.copy(LEADERBOARD / f"{name}_{table}.csv", out)
    for linked in re.findall(r"\]\(([^)/]+\.md)\)", page.read_text()):  # a findings page: linked when beside it
        shutil.copy(LEADERBOARD / linked, out)
    code = leaderboard.main(regenerating(command_of(page), runs, out))
    assert code in (0, 1), capsys.readouterr().err  # 1: a page of cells still to finish (cpu-evidence-simba)
    assert (out / page.name).is_file(), f"the command on {page.name} writes another page"
    same_lines(without_provenance(page.read_text()), without_provenance((out / page.name).read_text()), page.name)
    committed_tables = sorted(LEADERBOARD.glob(f"{name}_*.csv"))
    made_tables = sorted(out.glob(f"{name}_*.csv"))
    assert [path.name for path in made_tables] == [path.name for path in committed_tables]
    unfinished = unfinished_runs(LEADERBOARD / f"{name}_runs.csv")
    for table in committed_tables:
        same_table(table, out / table.name, finished_only=table.name == f"{name}_runs.csv",
                   left_out=unfinished if table.name == f"{name}_curves.csv" else set())


def test_the_gpu_page_is_what_page_py_makes_of_the_committed_gpu_files(tmp_path, no_plots):
    """gpu.md, made again with the command it names, its CPU leaderboards' tables copied beside the scratch page so
    that its links come out as committed (leaderboard/<name>.md)."""
    from keelrl.benchmarks.gpu import page

    committed = (RESULTS / "gpu.md").read_text()
    line = next(line for line in committed.splitlines() if line.startswith(page.MADE_BY))
    words = shlex.split(line[len(page.MADE_BY):line.rindex("`")])
    assert words[:3] == ["python", "-m", "keelrl.benchmarks.gpu.page"]
    args = page.parse_command_line(page.Args, args=words[3:])
    assert args.out == Path("benchmarks/results/gpu.md")
    (tmp_path / "leaderboard").mkdir()
    cpu_cells = []
    for cells in args.cpu_cells:
        for table in (REPO / cells, (REPO / cells).with_name(cells.name.replace("_cells.csv", "_curves.csv"))):
            if table.is_file():
                shutil.copy(table, tmp_path / "leaderboard")
        cpu_cells.append(tmp_path / "leaderboard" / cells.name)
    made = page.write_page(page.Args(results=tuple(REPO / folder for folder in args.results), out=tmp_path / "gpu.md",
                                     leases=REPO / args.leases if args.leases else None, cpu_cells=tuple(cpu_cells),
                                     turns=REPO / args.turns if args.turns else None))
    lines = [line for line in made.read_text().splitlines() if not line.startswith(page.MADE_BY)]
    same_lines([line for line in committed.splitlines() if not line.startswith(page.MADE_BY)], lines, "gpu.md")


def test_every_results_page_names_its_command_and_its_std():
    """Every page under benchmarks/results/ names the command that made it or its runs, and, where it gives a mean ±
    std, which std (ddof). The gpu-*/ folders hold what the GPU leases brought back (gpu.md is their page) and
    gpu_leases.md is a part of gpu.md."""
    pages = [page for page in sorted(RESULTS.rglob("*.md")) if page.name != "gpu_leases.md"
             and not page.relative_to(RESULTS).parts[0].startswith("gpu-")]
    for page in pages:
        text = page.read_text()
        assert "python -m keelrl." in text, f"{page.relative_to(REPO)} names no command"
        if "±" in text:
            assert "ddof" in text, f"{page.relative_to(REPO)} gives a mean ± std without saying which std"
