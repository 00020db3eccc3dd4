#!/usr/bin/env bash
# Multi-process training on one machine: tools/dist_train.sh CONFIG NPROC [train.py args ...]
# Works on CPU too (gloo; see prepare_launch in cpvt_backbones/adapters/runner.py).
set -euo pipefail
CONFIG=$1
NPROC=$2
shift 2
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
exec "$PY" -m torch.distributed.run --nproc_per_node="$NPROC" --master_port="${PORT:-29500}" \
  "$ROOT/tools/train.py" "$CONFIG" --launcher pytorch "$@"
