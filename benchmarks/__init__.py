"""keelrl.benchmarks, in four parts:

- the leaderboard product, here at the top: leaderboard/ runs agent × task × seed grids (presets in grids/),
  aggregate.py, report.py, provenance.py and reference_scores.py turn runs into tables beside published figures, and
  make_datasets.py (its options and their checks in dataset_options.py) makes the offline datasets the offline
  grids train on;
- perf/: speed measurements (update time, steps/s beside CleanRL, buffers, envs, threads, rollouts);
- checks/: learning checks outside the leaderboard;
- results/: the committed figures of all of them, each with its command, machine and commit.
"""
