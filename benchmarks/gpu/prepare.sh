#!/usr/bin/env bash
# Prepare the GPU run on a machine with registry access, from the repository's root (see README.md here):
#   MINARI_DATASETS_PATH=DATA bash benchmarks/gpu/prepare.sh CLEANRL LEANRL [SHARED_GPU]
# (without DATA holding keelrl/hopper-medium-v0 it says so and prepares what the online cells and speed need;
# DMC=1 adds the DeepMind Control suite's wheels, see below)
# CLEANRL and LEANRL: checkouts (or bare git directories) of github.com/vwxyzjn/cleanrl and
# github.com/pytorch-labs/LeanRL; SHARED_GPU: the project's gpu folder (default ../shared/gpu).
# It fills two git-ignored folders that travel with the tree (name both in `carry`, 64 MiB in all):
#   .gpu/  prefix.sh (installs the wheels on the GPU machine), commit.txt (this tree's commit), minari/ (the
#          keelrl/hopper-medium-v0 dataset of the offline cells), ref/ (the reference scripts:
#          cleanrl/{sac,td3}_continuous_action.py with the cleanrl_utils replay buffer they import, and
#          leanrl/{sac,td3}_continuous_action_torchcompile.py; one line of LeanRL's SAC adapted, see below)
#   .whl/  the Python 3.12 wheels the GPU machine lacks: the shared list with keelrl's mujoco (3.17.0) for its 4.0.0,
#          plus what LeanRL imports (torchrl and tensordict of torch 2.11's generation; wandb is not needed:
#          benchmarks/gpu/reference.py stands in), pytest for the CUDA-graph tests, and with DMC=1 dm-control
set -euo pipefail
cleanrl=${1:?give a CleanRL checkout} leanrl=${2:?give a LeanRL checkout} shared=${3:-../shared/gpu}
dataset=keelrl/hopper-medium-v0
source_dataset="${MINARI_DATASETS_PATH:-}/$dataset"
if [ ! -d "$source_dataset" ]; then
  # a lease that runs the online cells alone (--agents sac-...) needs no dataset: say so, and go on without it
  echo "no $dataset under MINARI_DATASETS_PATH (python -m keelrl.benchmarks.make_datasets makes it): the offline" \
    "cells (cql, iql) and the offline agents' smoke runs cannot run on the GPU machine; the online cells can"
  source_dataset=""
fi

exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")" .gpu/ref/cleanrl .gpu/ref/cleanrl_utils .gpu/ref/leanrl .gpu/minari/keelrl
for ignored in /.gpu/ /.whl/; do grep -qx "$ignored" "$exclude" 2>/dev/null || echo "$ignored" >> "$exclude"; done
cp "$shared"/prefix.sh "$shared"/fetch-wheels.sh .gpu/
# the GPU machine has no libEGL: with MUJOCO_GL=egl `import mujoco` fails (AttributeError, not ImportError);
# no GPU step renders, so rendering is switched off
sed -i 's/MUJOCO_GL=egl/MUJOCO_GL=disable/' .gpu/prefix.sh
# keelrl is installed into /tmp/site on every command; without --upgrade pip keeps the copy a previous command left
# on a warm machine, so a fix made between two commands would not run (seen on an H100, 2026-11-26)
sed -i 's/--no-build-isolation --no-cache-dir --target/--no-build-isolation --no-cache-dir --upgrade --target/' .gpu/prefix.sh
grep -q -- '--no-cache-dir --upgrade --target /tmp/site \. ' .gpu/prefix.sh \
  || { echo "the shared prefix.sh changed: make its keelrl install replace the previous copy (--upgrade) by hand"; exit 1; }

# the wheels: torchrl 0.12 is the release of torch 2.11's generation and asks for tensordict 0.12 (keelrl needs
# neither), so the shared list's newer tensordict goes
# pytest and its requirements: tests/test_cuda_graphs.py runs there first (it skips on a machine without CUDA)
# mujoco: one version for every task, the one setup.py pins (dm-control 1.0.50 fails on mujoco 4); the shared list's
# 4.0.0 comes as three wheels (mujoco, mujoco-core, mujoco-studio), 3.17.0 as one, and the three go
# DMC=1: the DeepMind Control suite (keelrl.envs.dmc) and what `from dm_control import suite` imports that the GPU
# machine lacks (dm-env, lxml, scipy: quadruped's terrain; absl-py comes with its tensorboard). Measured for Python
# 3.12: mujoco 3.17.0 26.7 MB, dm-control 56.5 MB (16.9 MB without dm_control/locomotion, which the suite never
# imports: cut below), scipy 35.3 MB, lxml 5.2 MB, the rest of the wheels about 9 MB: about 93 MB in all, over the
# 64 MiB a command carries, unless the GPU machine has scipy and lxml (not known: `python3 -c "import scipy, lxml"`
# there tells; if so, leave them out here and it is about 52 MB)
dmc_wheels=""
if [ "${DMC:-}" = 1 ]; then dmc_wheels="dm-control==1.0.50 dm-env==1.6 lxml==6.1.3 scipy==1.17.1"; fi
# $dmc_wheels unquoted: several arguments, or none
bash .gpu/fetch-wheels.sh torchrl==0.12.0 tensordict==0.12.4 orjson importlib_metadata zipp \
  pytest==9.2.0 pluggy iniconfig packaging pygments mujoco==3.17.0 $dmc_wheels
find .whl -name 'tensordict-*.whl' ! -name 'tensordict-0.12.4-*' -delete
find .whl \( -name 'mujoco-*.whl' ! -name 'mujoco-3.17.0-*' -o -name 'mujoco_core-*.whl' -o -name 'mujoco_studio-*.whl' \) \
  -delete
if [ -n "$dmc_wheels" ]; then
  python3 - .whl/dm_control-1.0.50-py3-none-any.whl <<'CUT'
import os, sys, zipfile
path = sys.argv[1]  # rewritten without dm_control/locomotion/, the RECORD's lines of it included
with zipfile.ZipFile(path) as wheel, zipfile.ZipFile(path + ".cut", "w", zipfile.ZIP_DEFLATED) as cut:
    for item in wheel.infolist():
        if not item.filename.startswith("dm_control/locomotion/"):
            data = wheel.read(item)
            if item.filename.endswith(".dist-info/RECORD"):
                data = b"".join(line for line in data.splitlines(keepends=True)
                                if not line.startswith(b"dm_control/locomotion/"))
            cut.writestr(item, data)
os.replace(path + ".cut", path)
CUT
fi

# one reference script: from a checkout's work tree, else from its HEAD (a bare mirror)
copy() {
  if [ -f "$1/$2" ]; then cp "$1/$2" "$3"; else git -C "$1" show "HEAD:$2" > "$3"; fi
}
for algo in sac td3; do
  copy "$cleanrl" "cleanrl/${algo}_continuous_action.py" ".gpu/ref/cleanrl/${algo}_continuous_action.py"
  copy "$leanrl" "leanrl/${algo}_continuous_action_torchcompile.py" \
    ".gpu/ref/leanrl/${algo}_continuous_action_torchcompile.py"
done
for name in __init__ buffers; do copy "$cleanrl" "cleanrl_utils/$name.py" ".gpu/ref/cleanrl_utils/$name.py"; done
# LeanRL's SAC wraps get_action, which returns (action, log-prob, mean), as a module with the one output "action";
# tensordict refuses extra outputs since 0.9, so the copy's module keeps the action alone (what LeanRL used).
sac=.gpu/ref/leanrl/sac_continuous_action_torchcompile.py
sed -i 's/TensorDictModule(actor_detach.get_action, /TensorDictModule(lambda obs: actor_detach.get_action(obs)[0], /' "$sac"
grep -q 'get_action(obs)\[0\]' "$sac" || { echo "LeanRL's SAC changed: adapt the policy module line by hand"; exit 1; }

rm -rf ".gpu/minari/$dataset"
if [ -n "$source_dataset" ]; then cp -r "$source_dataset" ".gpu/minari/$dataset"; fi
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' with uncommitted changes')" > .gpu/commit.txt
du -shc .gpu .whl | tail -1 | awk '{print "carry size: " $1 " (at most 64 MiB)"}'
