#!/usr/bin/env bash
# Prepares .gpu/ (git-ignored) for the GPU check on a lent machine (docs/CUDA.md). One call of the
# device tool carries at most 64 MiB and the bundled model is 94 MiB, so it travels in two parts:
# .gpu/a (first half) in a first call, .gpu/b (second half, its sha256, the gguf wheel the GPU image
# lacks) in the second, which reassembles, checks and runs benchmarks/cuda_run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
model=$(.venv/bin/python -c "from inferledger.engine.loader import default_model_path as d; print(d())")
rm -rf .gpu && mkdir -p .gpu/a .gpu/b
split -n 2 -d "$model" .gpu/model.part
mv .gpu/model.part00 .gpu/a/ && mv .gpu/model.part01 .gpu/b/
sha256sum "$model" | cut -d' ' -f1 > .gpu/b/model.sha256
gguf_version=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('gguf'))")
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation py \
  --platform any -d .gpu/b "gguf==$gguf_version"
du -sh .gpu/a .gpu/b
