#!/usr/bin/env bash
# Runs ON a pod worker (launch/copy_code.sh starts it on each): a Python $PYTHON_VERSION venv at
# ~/avalon/.venv (uv fetches the interpreter: stock TPU VM images have Python 3.10) with avalon
# and its `pod` extra (jax 0.10.2 + libtpu 0.0.42.1, gcsfs, jinja2, safetensors, tokenizers),
# then a check that jax imports at the pinned version. DRY_RUN=1 prints the commands instead.
. "$(dirname "$0")/lib.sh"
home="${AVALON_HOME:-$HOME/avalon}"
uv="$HOME/.local/bin/uv"
cloud python3 -m pip install --user --quiet --upgrade uv
cloud "$uv" venv --python "$PYTHON_VERSION" --seed --allow-existing "$home/.venv"
cloud "$uv" pip install --python "$home/.venv/bin/python" --quiet -e "$home[pod]"
cloud "$home/.venv/bin/python" -c "import jax, jinja2, libtpu; assert jax.__version__ == '0.10.2', jax.__version__"
