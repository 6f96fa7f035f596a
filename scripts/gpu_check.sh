#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one script that finishes in under 5 minutes on one modern GPU and
# ends with one summary table. Run from anywhere on a machine with a GPU and no network:
#
#   bash scripts/gpu_check.sh [--data DIR] [--wheels DIR]
#
#   --data DIR    the Multi30k files (default: ../shared/data/multi30k beside the repository)
#   --wheels DIR  install what is missing (hydra-core, omegaconf, wandb, ...) from the wheels in DIR,
#                 without an index (pip download -d DIR ... on a machine with one)
#
# 1. the tests marked `gpu`;
# 2. model=base trained for a fixed number of steps on Multi30k with bf16-mixed, without and with
#    torch.compile: target tokens/s and model FLOPs utilisation against a bf16 matmul rate measured on
#    the same GPU (scripts/bench_gpu_train.py);
# 3. with more than one GPU: a 1-GPU run and a DDP run over all GPUs with matching accumulation, whose
#    training losses must agree;
# 4. beam and greedy decoding speed (scripts/bench_decode.py).
# Not covered: trainer=fsdp and float16 mixed precision (16-mixed, the gradient scaler's path).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=../shared/data/multi30k
WHEELS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --data) DATA="$2"; shift 2 ;;
    --wheels) WHEELS="$2"; shift 2 ;;
    *) echo "gpu_check.sh: unknown option $1 (use --data DIR, --wheels DIR)" >&2; exit 2 ;;
  esac
done
OUT_DIR="${OUT:-/tmp/attnlab-gpu-check}"
mkdir -p "$OUT_DIR"
SUMMARY="$OUT_DIR/summary.md"
: > "$SUMMARY"
export WANDB_MODE=disabled ATTNLAB_LOG_DIR="$OUT_DIR/logs" ATTNLAB_CACHE_DIR="$OUT_DIR/cache"

nvidia-smi --query-gpu=name,memory.total --format=csv
if [ -n "$WHEELS" ]; then
  python -m pip install --quiet --no-index --find-links "$WHEELS" -e ".[dev]"
else
  python -m pip install --quiet -e ".[dev]"
fi
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
GPUS=$(python -c "import torch; print(torch.cuda.device_count())")

start=$(date +%s)
if python -m pytest -m gpu -q -p no:cacheprovider > "$OUT_DIR/gpu_tests.txt" 2>&1; then status=passed; else status=FAILED; fi
echo "| gpu-marked tests | $status ($(tail -1 "$OUT_DIR/gpu_tests.txt")) |" >> "$SUMMARY"

python scripts/bench_gpu_train.py --root "$DATA" --model base --steps 60 --warmup 15 --compile both \
  | tee "$OUT_DIR/train.txt"
grep '^| o' "$OUT_DIR/train.txt" | sed 's/^/| train base bf16, compile /' | cut -c1-200 >> "$SUMMARY" || true

if [ "$GPUS" -gt 1 ]; then
  common=(data.root="$DATA" model=base trainer.max_steps=40 trainer.max_epochs=-1 optim=linear
          optim.total_steps=1000 trainer.log_every_n_steps=1 test=false logger=csv seed=1
          trainer.enable_progress_bar=false +trainer.limit_val_batches=0)
  python -m attnlab.cli.train "${common[@]}" trainer=gpu trainer.accumulate_grad_batches="$GPUS" \
    hydra.run.dir="$OUT_DIR/one_gpu" > "$OUT_DIR/one_gpu.txt" 2>&1
  python -m attnlab.cli.train "${common[@]}" trainer=ddp trainer.devices="$GPUS" \
    hydra.run.dir="$OUT_DIR/ddp" > "$OUT_DIR/ddp.txt" 2>&1
  python - "$OUT_DIR" "$GPUS" >> "$SUMMARY" <<'PY'
import csv, sys
out, gpus = sys.argv[1], sys.argv[2]
def losses(name):
    with open(f"{out}/{name}/csv/metrics.csv") as f:
        return [float(r["train/loss_step"]) for r in csv.DictReader(f) if r.get("train/loss_step")]
one, ddp = losses("one_gpu"), losses("ddp")
a, b = sum(one[-10:]) / 10, sum(ddp[-10:]) / 10
verdict = "agree" if abs(a - b) / a < 0.05 else "DISAGREE"
print(f"| 1 GPU x accumulate {gpus} vs DDP {gpus} GPUs, mean loss of the last 10 steps | {a:.3f} vs {b:.3f}: {verdict} |")
PY
else
  echo "| 1 GPU vs DDP | skipped: one GPU |" >> "$SUMMARY"
fi

if [ -d "$DATA" ]; then
  python scripts/bench_decode.py --root "$DATA" --device cuda --batch-sizes 64 --sweep-sentences 200 \
    > "$OUT_DIR/decode.txt" 2>&1 && dstatus=done || dstatus=FAILED
  echo "| decoding benchmark | $dstatus (see decode.txt) |" >> "$SUMMARY"
fi

echo
echo "## attnlab GPU check: $(python -c 'import torch; print(torch.cuda.get_device_name())'), $GPUS GPU(s), $(( $(date +%s) - start )) s"
echo "| check | result |"
echo "|---|---|"
cat "$SUMMARY"
