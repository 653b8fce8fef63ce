#!/usr/bin/env bash
# A venv of its own for the RLlib PPO reference (bench/rllib_ppo.py), outside the repo; safe to rerun.
#   bash bench/rllib_ppo_venv.sh && "${RLLIB_PPO_VENV:-/tmp/rllib-ppo-venv}/bin/python" bench/rllib_ppo.py --env-steps 200000
# --system-site-packages reuses the system python's torch, gymnasium and ray core; pip adds only what
# ray[rllib] at the system's own ray version still lacks (the ray[tune] and rllib extras).
set -euo pipefail
venv="${RLLIB_PPO_VENV:-/tmp/rllib-ppo-venv}"
sys_py="${PYTHON:-python3}"
ray_version="$("$sys_py" -c 'import ray; print(ray.__version__)')"
py="$venv/bin/python"
[ -x "$py" ] || "$sys_py" -m venv --system-site-packages "$venv"
"$py" -m pip install -q "ray[rllib]==$ray_version"
"$py" -c "import ray, ray.rllib, torch, gymnasium, numpy; from ray.rllib.algorithms.ppo import PPOConfig; \
print('ray', ray.__version__, 'torch', torch.__version__, 'gymnasium', gymnasium.__version__, 'numpy', numpy.__version__)"
echo "$py"
