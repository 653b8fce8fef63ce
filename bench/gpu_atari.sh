#!/usr/bin/env bash
# Atari on a GPU machine in one prepared run of ~6 minutes (bench/gpu_atari.py says what each phase measures):
#   here:            bash bench/gpu_wheels.sh          # once: the wheels it lacks, into .whl/
#   on the machine:  bash bench/gpu_atari.sh           # tables into $OUT (else /tmp/gpu_atari), one file a phase
#                    bash bench/gpu_atari.sh --r2d2    # R2D2 instead: bench/gpu_r2d2_atari.py, ~6 minutes
#                    bash bench/gpu_atari.sh --d4pg    # D4PG on MuJoCo instead: bench/gpu_d4pg_mujoco.py, ~6 minutes
# It installs .whl/ (no index, no dependencies: the machine's own jax stays) into /tmp/site, then runs the phases.
set -uo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false  # the engine and actors share the host with the run
if [[ "${1:-}" == "--d4pg" ]]; then
  shift
  exec python3 bench/gpu_d4pg_mujoco.py "$@"
fi
if [[ "${1:-}" == "--r2d2" ]]; then
  shift
  exec python3 bench/gpu_r2d2_atari.py "$@"
fi
exec python3 bench/gpu_atari.py "$@"
