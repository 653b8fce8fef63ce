#!/usr/bin/env bash
# Wheels for bench/gpu_atari.sh, fetched here (PyPI) for a GPU machine with its own Python 3.12, jax, flax, optax,
# chex and orbax but no network: what `run.py env=atari` imports beyond those, into .whl/ (git-ignored).
#   bash bench/gpu_wheels.sh && ls .whl
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
  platforms+=(--platform "$tag")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d .whl "ale-py==0.12.1" "flashbax==0.1.3" "hydra-core==1.3.2" "omegaconf==2.3.0" \
  "gymnasium==$(python3 -c 'import gymnasium; print(gymnasium.__version__)')" "farama-notifications==0.0.4"
# hydra's parser needs antlr4's 4.9 runtime, published as an sdist only: a pure-Python wheel built here
python3 -m pip wheel -q --no-deps -w .whl "antlr4-python3-runtime==4.9.3"
du -sh .whl && ls .whl
