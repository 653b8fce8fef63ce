#!/usr/bin/env bash
# Wheels for bench/gpu_atari.sh, fetched here (PyPI) for a GPU machine with its own Python 3.12, jax, flax, optax,
# chex and orbax but no network: what `run.py env=atari` (and --d4pg's MuJoCo envs) import beyond those, into .whl/
# (git-ignored).
#   bash bench/gpu_wheels.sh && ls .whl
#   bash bench/gpu_wheels.sh --tpu      # for the TPU image (Python 3.11, jax; flax, optax and the rest from its own
#                                       # index, bench/gpu_atari.sh says how): adds chex, cloudpickle and gymnax, which
#                                       # it lacks (gymnax imports seaborn: take that from the image's index)
set -euo pipefail
cd "$(dirname "$0")/.."
python_version=3.12 extra=()
[[ "${1:-}" == "--tpu" ]] && python_version=3.11 extra=(chex cloudpickle gymnax)
rm -rf .whl && mkdir .whl  # one version of each: two stop the install there
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
  platforms+=(--platform "$tag")
done
# the versions installed here, where the tests pass
pinned() { python3 -c "import importlib.metadata as m, sys; print(f'{sys.argv[1]}=={m.version(sys.argv[1])}')" "$1"; }
for i in "${!extra[@]}"; do extra[i]=$(pinned "${extra[i]}"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$python_version" --implementation cp \
  "${platforms[@]}" -d .whl "$(pinned ale-py)" "$(pinned flashbax)" "$(pinned hydra-core)" "$(pinned omegaconf)" \
  "$(pinned gymnasium)" "$(pinned farama-notifications)" "$(pinned mujoco)" "$(pinned glfw)" "$(pinned PyOpenGL)" \
  "$(pinned mujoco-core)" "$(pinned imageio)" "${extra[@]}"  # mujoco 4 keeps its library in mujoco-core; gymnasium's
# MuJoCo envs import imageio
# hydra's parser needs antlr4's 4.9 runtime, published as an sdist only: a pure-Python wheel built here
python3 -m pip wheel -q --no-deps -w .whl "$(pinned antlr4-python3-runtime)"
du -sh .whl && ls .whl
