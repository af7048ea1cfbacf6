#!/usr/bin/env bash
# Prepares .gpu/ (git-ignored) for the GPU check on a lent machine (docs/CUDA.md). What travels in one
# call of the device tool (working tree + carried paths) is at most 64 MiB and the bundled model is
# 94 MiB, so it travels in two halves, each with its own sha256: .gpu/a (first half) in a first call
# that only stages it in /tmp/gpu, .gpu/b (second half, the whole file's sha256, the gguf wheel the
# GPU image lacks) in the second, which runs benchmarks/cuda_run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
exclude=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
model=$(.venv/bin/python -c "from inferledger.engine.loader import default_model_path as d; print(d())")
rm -rf .gpu && mkdir -p .gpu/a .gpu/b
split -n 2 -d "$model" .gpu/model.part
mv .gpu/model.part00 .gpu/a/ && mv .gpu/model.part01 .gpu/b/
(cd .gpu/a && sha256sum model.part00 > model.part00.sha256)
(cd .gpu/b && sha256sum model.part01 > model.part01.sha256)
sha256sum "$model" | cut -d' ' -f1 > .gpu/b/model.sha256
gguf_version=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('gguf'))")
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation py \
  --platform any -d .gpu/b "gguf==$gguf_version"
# the commit for the results file: the GPU machine's copy of the tree has no .git (benchmarks/results.py)
dirty=$([ -z "$(git status --porcelain -- . ':!benchmarks/results')" ] && echo false || echo true)
printf '{"commit": "%s", "dirty": %s}\n' "$(git rev-parse HEAD)" "$dirty" > .gpu/b/git.json
# each call: its half + the rest of the tree must stay under 64 MiB
tree_kib=$(git ls-files -co --exclude-standard -z | du -c --files0-from=- -k 2>/dev/null | tail -1 | cut -f1)
for half in a b; do
  kib=$(du -sk ".gpu/$half" | cut -f1)
  echo ".gpu/$half: $((kib / 1024)) MiB + working tree $((tree_kib / 1024)) MiB"
  [ $((kib + tree_kib)) -lt $((64 * 1024)) ] || { echo "too big for one call: .gpu/$half + tree" >&2; exit 1; }
done
