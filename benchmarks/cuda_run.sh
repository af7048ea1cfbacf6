#!/usr/bin/env bash
# Runs on the lent GPU machine (docs/CUDA.md).
#   bash benchmarks/cuda_run.sh stage   call 1 (carry .gpu/a): checks and stages the first half in /tmp/gpu
#   bash benchmarks/cuda_run.sh         call 2 (carry .gpu/b): finds the first half, reassembles and
#                                       checks the model, runs benchmarks/cuda_check.py, returns under
#                                       $OUT cuda_check.json, cuda_check.log, run.tar.gz and
#                                       results/cuda_check-*.json (to commit under benchmarks/results/)
# The machine goes cold ~30 s after a call: a call 2 that finds no first half says so, runs the phases
# that need no model (the GPU is paid for), and exits 3; then make both calls again, back to back.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
STAGE=${INFERLEDGER_GPU_STAGE:-/tmp/gpu}   # where call 1 leaves the first half (tests point it elsewhere)
CARRY=${INFERLEDGER_GPU_CARRY:-.gpu}       # the carried halves
RESULTS=${INFERLEDGER_GPU_RESULTS:-/tmp/cuda_out}
SITE=${INFERLEDGER_GPU_SITE:-/tmp/site}   # the carried wheels, installed
PKG=${INFERLEDGER_GPU_PKG:-/tmp/il}       # inferledger as an importable package of this tree's folders
if [ "${1:-}" = "stage" ]; then
  (cd "$CARRY/a" && sha256sum -c model.part00.sha256) || { echo "first half corrupt in transit"; exit 2; }
  mkdir -p "$STAGE" && cp "$CARRY/a/model.part00" "$CARRY/a/model.part00.sha256" "$STAGE/" && date -u > "$STAGE/staged_at"
  echo "first half staged in $STAGE at $(cat "$STAGE/staged_at"); make call 2 now (warm for ~30 s)"
  exit 0
fi
rm -rf "$RESULTS"  # nothing of an earlier run may come back as this one's
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$CARRY"/b/*.whl || exit 1
mkdir -p "$PKG/inferledger"
for d in engine probes serve collectors ledger report cli; do ln -sfn "$PWD/$d" "$PKG/inferledger/$d"; done
cp inferledger/__init__.py "$PKG/inferledger/"
export PYTHONPATH=$PKG:$SITE INFERLEDGER_MODEL=$STAGE/model.gguf
# the results file comes back under $OUT/results; its commit is the one cuda_prepare.sh recorded
export INFERLEDGER_BENCH_RESULTS=$OUT/results INFERLEDGER_BENCH_GIT=$CARRY/b/git.json
log="$OUT/cuda_check.log"
nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv 2>&1 | tee "$log"
rc=0
if ! [ -f "$STAGE/model.part00" ] || ! (cd "$STAGE" && sha256sum -c --quiet model.part00.sha256); then
  echo "FIRST HALF MISSING: $STAGE/model.part00 is not on this machine (it went cold after call 1, or call 1" \
       "was not made). Running the model-free phases only; then repeat call 1 and call 2 back to back." | tee -a "$log"
  timeout 240 python3 benchmarks/cuda_check.py --out "$RESULTS" --model-free "$@" 2>&1 | tee -a "$log"
  rc=3
else
  (cd "$CARRY/b" && sha256sum -c --quiet model.part01.sha256) || { echo "second half corrupt in transit" | tee -a "$log"; exit 2; }
  cat "$STAGE/model.part00" "$CARRY/b/model.part01" > "$STAGE/model.gguf"
  echo "$(cat "$CARRY/b/model.sha256")  $STAGE/model.gguf" | sha256sum -c - 2>&1 | tee -a "$log"
  [ "${PIPESTATUS[1]}" = 0 ] || exit 2
  # the check starts no phase after 400 s; timeout ends it at 450 s so the copies below still happen
  timeout 450 python3 benchmarks/cuda_check.py --out "$RESULTS" "$@" 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
fi
cp "$RESULTS/cuda_check.json" "$OUT/" 2>/dev/null
[ -d "$RESULTS/run" ] && tar czf "$OUT/run.tar.gz" -C "$RESULTS" run
ls -la "$OUT"
exit "$rc"
