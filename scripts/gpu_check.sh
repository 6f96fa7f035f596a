#!/usr/bin/env bash
# The checks that need a CUDA GPU, one JSON summary and one table: see scripts/gpu_check.py (the options,
# what each check measures) and docs/benchmarks.md (what each number means).
#
#   bash scripts/gpu_check.sh [--device cuda|cpu] [--data DIR] [--wheels DIR] [--out DIR] [--skip ...]
#
# --device cpu is the dry run of every check on the CPU, up to the first CUDA call.
set -euo pipefail
exec python "$(dirname "$0")/gpu_check.py" "$@"
