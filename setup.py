"""keelrl: classic deep-RL control agents in PyTorch, one readable file per algorithm."""

from setuptools import setup

SUBPACKAGES = ["agents", "agents.harness", "envs", "buffers", "networks", "evaluate", "benchmarks",
               "benchmarks.leaderboard", "benchmarks.perf", "benchmarks.checks", "benchmarks.gpu"]

setup(
    name="keelrl",
    version="0.1.0",
    description="Classic deep-RL control agents (SAC, TD3, offline, safe, streaming) in PyTorch",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    # Each root folder installs inside the keelrl namespace, never as a bare top-level package.
    packages=[f"keelrl.{name}" for name in SUBPACKAGES],
    package_dir={f"keelrl.{name}": name.replace(".", "/") for name in SUBPACKAGES},
    package_data={"keelrl.benchmarks": ["results/*.md", "grids/*.toml", "anchors/*.csv", "anchors/*.md"]},
    install_requires=[
        # A range, not a pin: install the torch build for your machine first (see README).
        "torch>=2.2,<3",
        "gymnasium[mujoco]>=1.0,<2",
        # One MuJoCo for every task: dm-control 1.0.50 (the DMC tasks) fails to build its models with mujoco 4
        # ('MjModel' object has no attribute 'flex_vertedge'); the results pages name this version.
        "mujoco==3.17.0",
        "numpy>=1.24",
        "tensorboard>=2.12",
        "tyro>=0.8",
        "tqdm>=4.64",
        "matplotlib>=3.7",  # the leaderboard's learning-curve plots
        "tomli>=1.1; python_version < '3.11'",
    ],
    extras_require={
        "envpool": ["envpool>=0.8.4"],
        "dmc": ["dm-control==1.0.50"],  # DeepMind Control tasks (keelrl.envs.dmc), on the pinned mujoco
        "offline": ["minari[hdf5]>=0.5", "h5py>=3.8"],
        "llm": ["transformers>=4.40", "gguf>=0.10", "accelerate>=0.26"],  # gguf + accelerate: GGUF files (--model)
        "ray": ["ray>=2.9"],
        "video": ["imageio[ffmpeg]>=2.30", "pygame>=2.1"],  # --capture-video's MP4s; pygame draws classic control
        "wandb": ["wandb>=0.17"],  # --track
        "dev": ["pytest>=7.4", "pytest-timeout>=2.2", "pytest-xdist>=3.5"],
    },
    license="MIT",
)
