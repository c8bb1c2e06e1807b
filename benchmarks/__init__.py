"""keelrl.benchmarks: speed and learning benchmarks; results are committed under benchmarks/results/."""
