"""keelrl.benchmarks.checks: learning checks outside the leaderboard (the RLVR learning check, run summaries beside
CleanRL's); their results are committed under benchmarks/results/."""
