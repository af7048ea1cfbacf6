#!/usr/bin/env bash
# Runs on the lent GPU machine, in the second call (docs/CUDA.md): reassemble the model from
# /tmp/gpu (first call) and .gpu/b, install the gguf wheel, import inferledger from this tree without
# installing it, run benchmarks/cuda_check.py and put its JSON, log and run directory under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
cat /tmp/gpu/model.part00 .gpu/b/model.part01 > /tmp/gpu/model.gguf || exit 1
echo "$(cat .gpu/b/model.sha256)  /tmp/gpu/model.gguf" | sha256sum -c - || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/b/*.whl || exit 1
mkdir -p /tmp/il/inferledger
for d in engine probes collectors ledger cli; do ln -sfn "$PWD/$d" "/tmp/il/inferledger/$d"; done
cp inferledger/__init__.py /tmp/il/inferledger/
export PYTHONPATH=/tmp/il:/tmp/site INFERLEDGER_MODEL=/tmp/gpu/model.gguf
# at most 8 files come back: the JSON, this log and six of the run directory
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; \
  python3 benchmarks/cuda_check.py --out /tmp/cuda_out "$@"; } 2>&1 | tee "$OUT/cuda_check.log"
rc=${PIPESTATUS[0]}
cp /tmp/cuda_out/cuda_check.json "$OUT/" 2>/dev/null
# the run directory, at most two folders down: manifest, clocks, gaps, events and samples parts
mkdir -p "$OUT/run/events" "$OUT/run/samples"
cp /tmp/cuda_out/run/*.json /tmp/cuda_out/run/*.parquet "$OUT/run/" 2>/dev/null
cp /tmp/cuda_out/run/events/*.parquet "$OUT/run/events/" 2>/dev/null
cp /tmp/cuda_out/run/samples/*.parquet "$OUT/run/samples/" 2>/dev/null
ls -laR "$OUT"
exit "$rc"
