#!/usr/bin/env bash
# The GPU check (tools/gpu/check.py): a ~300M-parameter random-init model, a few RL steps through
# the real path on one GPU, in both weight-sync layouts; writes $OUT/gpu_check.json.
# Needs: an NVIDIA GPU, the project's .venv with the GPU builds of torch and vLLM
# (requirements/inference-gpu.txt, requirements/trainer-gpu.txt), bubblewrap and mini-swe-agent
# (`make harnesses`). Nothing is downloaded. Budget: 8 minutes (the limit below).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-.}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
.venv/bin/python -c "import torch, vllm; assert torch.cuda.is_available(), 'torch sees no CUDA device'; print('torch', torch.__version__, 'vllm', vllm.__version__)"
exec timeout --signal=INT --kill-after=30 "${CHECK_LIMIT_S:-480}" .venv/bin/python tools/gpu/check.py --out "$OUT/gpu_check.json" "$@"
