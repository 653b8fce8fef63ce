#!/usr/bin/env bash
# A venv of its own for the RLlib 2.8.1 reference (bench/rllib_apex.py), outside the repo; safe to rerun.
#   bash bench/rllib_venv.sh && "${RLLIB_VENV:-/tmp/rllib-venv}/bin/python" bench/rllib_apex.py --seconds 120
set -euo pipefail
venv="${RLLIB_VENV:-/tmp/rllib-venv}"
py="$venv/bin/python"
[ -x "$py" ] || python3 -m venv "$venv"
"$py" -m pip install -q --upgrade pip

# CPU torch: the PyTorch CPU index where it answers, else a local +cpu wheel on pip's find-links, else plain PyPI torch
cpu_index=https://download.pytorch.org/whl/cpu
if "$py" -c "import urllib.request, sys; urllib.request.urlopen(sys.argv[1], timeout=10)" "$cpu_index/" 2>/dev/null; then
  torch_spec=(torch --index-url "$cpu_index")
else
  local_cpu=""
  for dir in ${PIP_FIND_LINKS:-} /opt/wheels; do
    for whl in "$dir"/torch-*+cpu-cp311-*.whl; do [ -f "$whl" ] && local_cpu="$whl"; done
  done
  if [ -n "$local_cpu" ]; then torch_spec=("$local_cpu"); else torch_spec=(torch); fi
fi
echo "torch from: ${torch_spec[*]}"
"$py" -m pip install -q "${torch_spec[@]}"

# setuptools<81: ray 2.8.1 imports pkg_resources, which setuptools 81 removed (torch pulls the newest)
"$py" -m pip install -q "ray[rllib]==2.8.1" "gymnasium==0.28.1" "numpy<2" "pydantic<2" "pyarrow<16" "typer<0.13" \
  "setuptools<81"
"$py" -c "import ray, ray.rllib, torch, gymnasium, numpy; print('ray', ray.__version__, 'torch', torch.__version__, \
'gymnasium', gymnasium.__version__, 'numpy', numpy.__version__)"
echo "$py"
