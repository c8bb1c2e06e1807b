"""keelrl.agents: one file per algorithm, each runnable (python -m keelrl.agents.NAME) and importable."""
