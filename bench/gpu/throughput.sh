#!/usr/bin/env bash
# Offline throughput of blend's cuda backend on a generated Llama-3-8B-shaped model: blend batch
# at --max-batch-tokens 512/1024/2048 against the GPU's measured bf16 GEMM peak (NanoFlow eq. 9)
# and transformers' generate on the same folder (bench/gpu/throughput.py says how). Runs on the
# lent GPU machine. Usage:
#   bench/gpu/throughput.sh BLEND [OUT (default $OUT, else bench-results/throughput)] [--quick]
#       [more throughput.py flags: --run-cap S, --requests 128,256,512, --blend-args '...', ...]
here="$(cd "$(dirname "$0")" && pwd)"
if [ $# -lt 1 ]; then
  sed -n '2,7p' "$0" >&2
  exit 2
fi
blend="$1"
shift
out="${OUT:-bench-results/throughput}"
if [ $# -ge 1 ] && [ "${1#-}" = "$1" ]; then
  out="$1"
  shift
fi
exec python3 "$here/throughput.py" "$blend" "$out" "$@"
