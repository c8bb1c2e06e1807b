#!/usr/bin/env bash
# Prepare the GPU run on a machine with registry access, from the repository's root (see README.md here):
#   MINARI_DATASETS_PATH=DATA bash benchmarks/gpu/prepare.sh CLEANRL LEANRL [SHARED_GPU]
# (without DATA holding keelrl/hopper-medium-v0 it says so and prepares what the online cells and speed need)
# CLEANRL and LEANRL: checkouts (or bare git directories) of github.com/vwxyzjn/cleanrl and
# github.com/pytorch-labs/LeanRL; SHARED_GPU: the project's gpu folder (default ../shared/gpu).
# It fills two git-ignored folders that travel with the tree (name both in `carry`, 64 MiB in all):
#   .gpu/  prefix.sh (installs the wheels on the GPU machine), commit.txt (this tree's commit), minari/ (the
#          keelrl/hopper-medium-v0 dataset of the offline cells), ref/ (the reference scripts:
#          cleanrl/{sac,td3}_continuous_action.py with the cleanrl_utils replay buffer they import, and
#          leanrl/{sac,td3}_continuous_action_torchcompile.py; one line of LeanRL's SAC adapted, see below)
#   .whl/  the Python 3.12 wheels the GPU machine lacks: the shared list, plus what LeanRL imports (torchrl and
#          tensordict of torch 2.11's generation; wandb is not needed: benchmarks/gpu/reference.py stands in), and
#          pytest for the CUDA-graph tests
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
bash .gpu/fetch-wheels.sh torchrl==0.12.0 tensordict==0.12.4 orjson importlib_metadata zipp \
  pytest==9.2.0 pluggy iniconfig packaging pygments
find .whl -name 'tensordict-*.whl' ! -name 'tensordict-0.12.4-*' -delete

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
