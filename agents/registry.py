"""Every keelrl agent by name: what the leaderboard, the evaluation command and the benchmarks look agents up in.

It imports an agent's module only when asked for it (the LLM agent needs transformers), and no agent imports it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

ALGORITHMS = {"sac": "SAC", "td3": "TD3", "mrq": "MRQ", "sac_lag": "SACLag", "td3_lag": "TD3Lag", "ppo": "PPO",
              "ppo_lag": "PPOLag", "cql": "CQL", "iql": "IQL", "riql": "RIQL", "wsrl": "WSRL", "stream_td": "StreamTD",
              "stream_q": "StreamQ", "stream_ac": "StreamAC", "grpo": "GRPO"}
"""Every agent: the name its runs record and its module under keelrl.agents carries -> its agent class."""


def agent_module(algo: str) -> ModuleType:
    """keelrl.agents.<algo>: its config class, `train` and agent class; an unknown name is refused."""
    if algo not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algo!r}; keelrl has {', '.join(ALGORITHMS)}.")
    return importlib.import_module(f"keelrl.agents.{algo}")


def agent_class(algo: str) -> type:
    """The agent class of keelrl.agents.<algo> (its `load` reads that algorithm's model.pt)."""
    return getattr(agent_module(algo), ALGORITHMS[algo])
