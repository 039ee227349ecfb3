#!/usr/bin/env bash
# The GPU check from any folder (--out and its default stay relative to where you are).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" exec python -m benchmarks.gpu_check "$@"
