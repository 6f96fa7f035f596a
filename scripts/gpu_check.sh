#!/usr/bin/env bash
# Checks that need a CUDA GPU: run on a machine with one (the project's lent device), from the repo root.
# Installs the package, runs the gpu-marked tests, then a short bf16 training run on the synthetic task.
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total --format=csv
python -m pip install --quiet -e ".[dev]"
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
WANDB_MODE=disabled python -m pytest -m gpu -q -p no:cacheprovider
WANDB_MODE=disabled ATTNLAB_LOG_DIR="${OUT:-/tmp}/logs" \
  python -m attnlab.cli.train experiment=synthetic_pe trainer=gpu trainer.max_epochs=3 trainer.enable_progress_bar=false
# Decoding speed on the GPU (random model=small: outputs run to the length limit, a worst case).
if [ -d ../shared/data/multi30k ]; then
  python scripts/bench_decode.py --root ../shared/data/multi30k --device cuda --batch-sizes 64 --sweep-sentences 200
fi
