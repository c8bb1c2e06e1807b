"""keelrl.benchmarks.perf: speed measurements (update time, steps/s beside CleanRL, buffers, envs, threads, rollouts);
their results are committed under benchmarks/results/."""
