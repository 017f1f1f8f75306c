# Two commands work from a fresh clone on a fresh machine:
#   make demo   set up .venv, warm-start the tiny model and train it (writes runs/demo/)
#   make test   set up .venv and run the tests (what CI runs)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
TORCH  ?= 2.13.0
export TORCH_EXTENSIONS_DIR := $(CURDIR)/.cache/torch_extensions
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test install clean

install: $(STAMP)

# torch goes in first, then the project under a constraint that keeps it: left to itself pip
# would resolve plain `torch` to a multi-GB CUDA build on a CPU-only machine.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q torch==$(TORCH)
	echo "torch==$(TORCH)" > $(VENV)/constraints.txt
	$(BIN)/pip install -q -c $(VENV)/constraints.txt -e ".[test]"
	touch $@

demo: $(STAMP)
	rm -rf runs/demo
	$(BIN)/rlvr train configs/tiny-cpu.yaml run.name=demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .cache runs
