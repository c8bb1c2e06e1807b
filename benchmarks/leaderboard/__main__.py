"""python -m keelrl.benchmarks.leaderboard: see the package docstring, or --help."""

from keelrl.benchmarks.leaderboard.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
