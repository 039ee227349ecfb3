#!/usr/bin/env bash
# The GPU check from any folder (--out and its default stay relative to where you are).
# The interpreter: $PYTHON when set, else the project's .venv (make setup), else python3.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-}"
if [ -z "$python" ]; then
  if [ -x "$repo/.venv/bin/python" ]; then python="$repo/.venv/bin/python"; else python=python3; fi
fi
PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" exec "$python" -m benchmarks.gpu_check "$@"
