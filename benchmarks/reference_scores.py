"""Published figures keelrl is compared against, and the score ranges used to normalise returns.

Every figure is copied from ../shared/REFERENCES.md (the project's record of published results), or where it
has none (CleanRL's PPO) from the benchmark page named beside it, with its source, the environment version and
the budget it was measured at, so the leaderboard can put it beside a keelrl run and say when the two are not
comparable (a 1M-step figure beside a 50k-step run).

Tasks are matched by `task_key`: the id without its namespace and version, lower-cased
("Hopper-v5" and "Hopper-v4" are both "hopper"; "keelrl/hopper-medium-v0" is "hopper-medium").
"""

from __future__ import annotations

import dataclasses
import re

from keelrl.envs import dmc
from keelrl.envs.dmc import anchor_id


@dataclasses.dataclass(frozen=True)
class PublishedScore:
    """One published result: an algorithm's score on a task at a stated budget."""

    family: str
    """leaderboard family: online, offline, safe, streaming or rlvr"""
    task: str
    """task key (see `task_key`) the figure is matched on"""
    agent: str
    """keelrl agent module the figure belongs beside (sac, td3, cql, iql, sac_lag, stream_ac, ...)"""
    published_agent: str
    """the algorithm's name in the source"""
    published_task: str
    """the task id in the source (its environment version may differ from keelrl's)"""
    mean: float
    """published mean (return, or normalised score for offline datasets)"""
    std: float | None
    """published std over seeds (None where the source gives none)"""
    cost: float | None
    """published mean episode cost (safe tasks)"""
    budget: str
    """the budget in words, as the source states it"""
    budget_steps: int | None
    """the budget in environment steps (offline: gradient updates); None where the source does not state it"""
    seeds: int | None
    """seeds behind the figure (None where not stated)"""
    metric: str
    """what the figure measures"""
    source: str
    """where it was published"""
    base_env: str | None = None
    """the environment the source's task is built on, where that is another (Safety-Gymnasium's velocity tasks:
    a MuJoCo v4 env); compared with the one under keelrl's task"""


@dataclasses.dataclass(frozen=True)
class ScoreRange:
    """Normalised score = 100 · (return − low) / (high − low)."""

    task: str
    low: float
    high: float
    source: str


CLEANRL = "CleanRL benchmark (docs/benchmark/sac.md, td3.md)"
LAST_EPISODES = 100
"""the training episodes each run's figure in CleanRL's published tables averages, and so the leaderboard's
`last_train_return`: openrlbenchmark's rlops.py makes those tables from each run's last 100 `charts/episodic_return`
values (`metric_last_n_average_window`, 100 from its 7aa03c7 of 2023-05 to d67da55), then mean ± std (ddof 0) over
runs; CleanRL's pr-424 tables (2023-11) name no other window (benchmark/ppo_plot.sh, sac_plot.sh)"""
CLEANRL_METRIC = f"mean return of each run's last {LAST_EPISODES} training episodes"
CORL = "CORL, D4RL v2 'last' normalised scores"
OMNISAFE = "OmniSafe benchmark (cost limit 25)"
STREAM_X = "stream-x paper, final average episodic return"

_CLEANRL_ROWS = {  # task: (env id, SAC mean, SAC std, TD3 mean, TD3 std)
    "halfcheetah": ("HalfCheetah-v4", 9634.89, 1423.73, 9583.22, 126.09),
    "walker2d": ("Walker2d-v4", 3591.45, 911.33, 4057.59, 658.78),
    "hopper": ("Hopper-v4", 2310.46, 342.82, 3134.61, 360.18),
    "humanoid": ("Humanoid-v4", 4996.29, 686.40, 5035.36, 21.67),
    "invertedpendulum": ("InvertedPendulum-v4", 909.37, 55.66, 968.99, 25.80),
    "pusher": ("Pusher-v4", -22.45, 0.51, -30.92, 1.05),
}

CLEANRL_PPO = ("CleanRL benchmark, tag pr-424 (docs/benchmark/ppo_continuous_action.md and ppo.md of "
               "vwxyzjn/cleanrl, read at fe8d8a0)")
_CLEANRL_PPO_ROWS = {  # task: (env id, PPO mean, PPO std, budget in steps): ppo_continuous_action.py; CartPole ppo.py
    "halfcheetah": ("HalfCheetah-v4", 1442.64, 46.03, 1_000_000),
    "walker2d": ("Walker2d-v4", 2287.95, 571.78, 1_000_000),
    "hopper": ("Hopper-v4", 2382.86, 271.74, 1_000_000),
    "invertedpendulum": ("InvertedPendulum-v4", 963.09, 22.20, 1_000_000),
    "humanoid": ("Humanoid-v4", 716.11, 49.08, 1_000_000),
    "pusher": ("Pusher-v4", -40.38, 7.15, 1_000_000),
    "cartpole": ("CartPole-v1", 490.04, 6.12, 500_000),
}

_CORL_ROWS = {  # dataset: (CQL mean, CQL std, IQL mean, IQL std)
    "halfcheetah-medium": (47.04, 0.22, 48.31, 0.22),
    "halfcheetah-medium-replay": (45.04, 0.27, 44.46, 0.22),
    "halfcheetah-medium-expert": (95.63, 0.42, 94.74, 0.52),
    "hopper-medium": (59.08, 3.77, 67.53, 3.78),
    "hopper-medium-replay": (95.11, 5.27, 97.43, 6.39),
    "hopper-medium-expert": (99.26, 10.91, 107.42, 7.80),
    "walker2d-medium": (80.75, 3.28, 80.91, 3.17),
    "walker2d-medium-replay": (73.09, 13.22, 82.15, 3.03),
    "walker2d-medium-expert": (109.56, 0.39, 111.72, 0.86),
}

# keelrl task key: (OmniSafe id, {algorithm: (reward, cost)}). Safety-Gymnasium builds each velocity task on the
# MuJoCo v4 env (safety_gymnasium/tasks/safe_velocity/safety_hopper_velocity_v0.py:17 and its siblings), keelrl's
# on v5: `SAFETY_GYMNASIUM_BASE`.
_OMNISAFE_ROWS = {
    "safehoppervelocity": ("SafetyHopperVelocity-v1", {
        "PPOLag": (961.92, 13.96), "CPO": (1713.71, 13.40), "SACLag": (963.49, 20.23), "TD3Lag": (928.79, 40.67),
        "SAC": (3537.70, 975.0)}),
    "safehalfcheetahvelocity": ("SafetyHalfCheetahVelocity-v1", {
        "PPOLag": (2946.15, 3.44), "CPO": (2786.48, 4.70), "SACLag": (2833.72, 0.00), "TD3Lag": (2741.08, 10.47)}),
    "safewalker2dvelocity": ("SafetyWalker2dVelocity-v1", {"PPOLag": (2982.27, 13.49)}),
    "safeantvelocity": ("SafetyAntVelocity-v1", {
        "PPOLag": (3261.87, 12.05), "CPO": (3098.54, 14.12), "SACLag": (1897.32, 5.73), "TD3Lag": (1944.38, 63.27)}),
}
SAFETY_GYMNASIUM_BASE = {"safehoppervelocity": "Hopper-v4", "safehalfcheetahvelocity": "HalfCheetah-v4",
                         "safewalker2dvelocity": "Walker2d-v4", "safeantvelocity": "Ant-v4"}
_OMNISAFE_AGENTS = {"PPOLag": "ppo_lag", "CPO": "cpo", "SACLag": "sac_lag", "TD3Lag": "td3_lag", "SAC": "sac"}
_ON_POLICY = {"PPOLag", "CPO"}

_STREAM_X_ROWS = [  # (keelrl agent, published agent, task key, published task, mean)
    ("stream_ac", "Stream AC(λ)", "hopper", "Hopper-v4", 2173.0),
    ("stream_ac", "Stream AC(λ)", "walker2d", "Walker2d-v4", 4335.0),
    ("stream_q", "Stream Q(λ)", "breakout", "Breakout (Atari)", 225.0),
    ("stream_q", "Stream Q(λ)", "enduro", "Enduro (Atari)", 1156.0),
]


def _published_scores() -> list[PublishedScore]:
    scores = []
    for task, (env_id, sac_mean, sac_std, td3_mean, td3_std) in _CLEANRL_ROWS.items():
        for agent, mean, std in (("sac", sac_mean, sac_std), ("td3", td3_mean, td3_std)):
            scores.append(PublishedScore("online", task, agent, agent.upper(), env_id, mean, std, None,
                                         "1M env steps", 1_000_000, 3, CLEANRL_METRIC, CLEANRL))
    for task, (env_id, mean, std, steps) in _CLEANRL_PPO_ROWS.items():
        scores.append(PublishedScore("online", task, "ppo", "PPO", env_id, mean, std, None,
                                     f"{steps / 1e6:g}M env steps", steps, 3, CLEANRL_METRIC, CLEANRL_PPO))
    for dataset, (cql_mean, cql_std, iql_mean, iql_std) in _CORL_ROWS.items():
        for agent, mean, std in (("cql", cql_mean, cql_std), ("iql", iql_mean, iql_std)):
            scores.append(PublishedScore("offline", dataset, agent, agent.upper(), f"{dataset}-v2 (D4RL)", mean, std,
                                         None, "1M gradient updates", 1_000_000, 4,
                                         "D4RL normalised score of the final policy", CORL))
    for task, (env_id, rows) in _OMNISAFE_ROWS.items():
        for published_agent, (reward, cost) in rows.items():
            on_policy = published_agent in _ON_POLICY
            scores.append(PublishedScore(
                "safe", task, _OMNISAFE_AGENTS[published_agent], published_agent, env_id, reward, None, cost,
                "1e7 env steps" if on_policy else "1e6 env steps", 10_000_000 if on_policy else 1_000_000, None,
                "mean episode return / episode cost", OMNISAFE, base_env=SAFETY_GYMNASIUM_BASE[task]))
    for agent, published_agent, task, published_task, mean in _STREAM_X_ROWS:
        scores.append(PublishedScore("streaming", task, agent, published_agent, published_task, mean, None, None,
                                     "not stated in REFERENCES.md", None, None, "final average episodic return",
                                     STREAM_X))
    return scores


PUBLISHED: list[PublishedScore] = _published_scores()

# Score ranges: normalised score = 100 · (return − low) / (high − low). `low` is a random policy's return
# (or the lowest return the task allows), `high` a reference agent's return (or the highest the task
# allows). A task is only ever aggregated across tasks (IQM) through this score; a task with no range
# here gets no cross-task aggregate (aggregate.iqm_by_agent says so on the page). Every number below
# is copied from the source named beside it; a range that cannot be sourced is not declared.
D4RL_SOURCE = ("D4RL's reference returns (random policy, expert policy: REF_MIN_SCORE / REF_MAX_SCORE in "
               "d4rl/infos.py of Farama-Foundation/D4RL), measured on gym's v2 MuJoCo envs")
SIMBAV2_SOURCE = ("SimbaV2's TD3 normalisation (random policy, TD3 after 1M steps: MUJOCO_RANDOM_SCORE / "
                  "MUJOCO_TD3_SCORE in scale_rl/envs/mujoco.py of dojeon-ai/SimbaV2), measured on the v4 envs")
RLVR_SOURCE = ("the reward's own bounds: each keelrl.envs.rlvr_tasks verifier scores a completion 1.0 (correct) "
               "or 0.0, so held-out greedy accuracy lies in [0, 1]")
DMC_SOURCE = ("the suite's own bounds: every DeepMind Control task rewards each of its 1000 control steps with a value "
              "in [0, 1] (dm_control suite, Tassa et al. 2018)")
DMC_TASKS = tuple(anchor_id(domain, task) for domain, task in dmc.DMC_TASKS)
"""DMC tasks by the anchors' names (`domain-task`; keelrl's ids dm_control/domain-task-v0 have the same key)"""
SCORE_RANGES: dict[str, ScoreRange] = {
    # D4RL's numbers for the three robots keelrl also makes offline datasets for (buffers/offline.py uses the
    # same ones). Their v2 random returns lie within 40 of the v4 ones SimbaV2 measured (-20.3 / 18.8,
    # -280.2 / -289.4, 1.6 / 2.8); their experts sit 0-16% above SimbaV2's TD3 (3234 / 3226, 12135 / 10574,
    # 4592 / 3946), so 100 means about the same (a strong 1M-step agent) under both.
    "hopper": ScoreRange("hopper", -20.272305, 3234.3, D4RL_SOURCE),
    "halfcheetah": ScoreRange("halfcheetah", -280.178953, 12135.0, D4RL_SOURCE),
    "walker2d": ScoreRange("walker2d", 1.629008, 4592.3, D4RL_SOURCE),
    # Ant: SimbaV2's v4 numbers rather than D4RL's (-325.6 / 3879.7): D4RL's Ant-v2 (contact forces in its
    # observation) has a random return far from v4's (-325.6 / -70.3). Humanoid: D4RL has none.
    "ant": ScoreRange("ant", -70.288, 3942.0, SIMBAV2_SOURCE),
    "humanoid": ScoreRange("humanoid", 120.423, 5165.0, SIMBAV2_SOURCE),
    "invertedpendulum": ScoreRange("invertedpendulum", 0.0, 1000.0,
                                   "the env's own bounds: gymnasium's InvertedPendulum gives +1 per step the pole "
                                   "stays up and ends at 1000 steps, its max_episode_steps"),
    "cartpole": ScoreRange("cartpole", 0.0, 500.0,
                           "the env's own bounds: gymnasium's CartPole-v1 gives +1 per step and ends at 500 steps, "
                           "its max_episode_steps"),
    **{task: ScoreRange(task, 0.0, 1.0, RLVR_SOURCE) for task in ("add", "chain", "sort", "countdown", "word")},
    # listed one by one, so that the robot fallback of `score_range` never gives DMC's hopper-hop Gym Hopper's range
    **{task: ScoreRange(task, 0.0, 1000.0, DMC_SOURCE) for task in DMC_TASKS},
}

SAFE_VELOCITY_REASON = (
    "a velocity-constrained task: a score from the return alone ignores the cost limit (an agent that ignores the "
    "constraint would rank best), and no published (random, reference) returns of the constrained task are known "
    "to keelrl (REFERENCES.md gives OmniSafe's reward / cost pairs only)")
PUSHER_REASON = (
    "no sourced (random, reference) returns: D4RL and SimbaV2 do not normalise Pusher, and its return (minus "
    "distances and control cost) has no natural bounds to use instead")
NO_RANGE_REASONS: dict[str, str] = {
    **{task: SAFE_VELOCITY_REASON for task in (
        "safehoppervelocity", "safehalfcheetahvelocity", "safewalker2dvelocity", "safeantvelocity",
        "safehumanoidvelocity", "safeswimmervelocity")},
    "pusher": PUSHER_REASON,
}
"""Tasks deliberately left without a score range, and why."""

OFFLINE_SCORE_SOURCE = (
    "the dataset's own reference returns (ref_min_score: a random policy's, ref_max_score: the expert's, recorded "
    "in its metadata by keelrl.benchmarks.make_datasets; D4RL's for hopper, halfcheetah and walker2d when a "
    "dataset records none), as the offline agent logs it (eval/normalized_score)")


def task_key(task_id: str) -> str:
    """The id without namespace and version, lower-cased, '_' written '-': 'Hopper-v5' -> 'hopper',
    'keelrl/SafeHopperVelocity-v1' -> 'safehoppervelocity', 'hopper-medium-v0' -> 'hopper-medium',
    'dm_control/ball_in_cup-catch-v0' -> 'ball-in-cup-catch'."""
    name = task_id.rsplit("/", 1)[-1]
    return re.sub(r"-v\d+$", "", name).lower().replace("_", "-")


def published_for(family: str, agent: str, task_id: str) -> list[PublishedScore]:
    """The published figures for this agent module on this task (any environment version)."""
    key = task_key(task_id)
    return [p for p in PUBLISHED if p.family == family and p.agent == agent and p.task == key]


def score_range(task_id: str) -> ScoreRange | None:
    """The normalisation range of a task: its own entry, else its robot's ('hopper-medium' -> 'hopper')."""
    key = task_key(task_id)
    return SCORE_RANGES.get(key) or SCORE_RANGES.get(key.split("-")[0])


def score_source(family: str, task_id: str) -> str | None:
    """Where a task's normalised score comes from (None: it has none, and gets no cross-task aggregate).
    Offline tasks are scored by the agent with its dataset's reference returns; others with `score_range`."""
    if family == "offline":
        return OFFLINE_SCORE_SOURCE
    bounds = score_range(task_id)
    return None if bounds is None else f"low {bounds.low:g}, high {bounds.high:g} ({bounds.source})"


def no_range_reason(task_id: str) -> str:
    """Why a task has no declared score range."""
    return NO_RANGE_REASONS.get(
        task_key(task_id), "no sourced (random, reference) returns are recorded in keelrl.benchmarks.reference_scores")


def normalized_score(task_id: str, value: float) -> float:
    """100 · (value − low) / (high − low) with the task's range; NaN if it has none."""
    bounds = score_range(task_id)
    if bounds is None:
        return float("nan")
    return 100.0 * (value - bounds.low) / (bounds.high - bounds.low)
