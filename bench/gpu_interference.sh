#!/usr/bin/env bash
# Measures the GEMM-attention interference term on the NVIDIA GPU of this machine
# (bench/gpu/overlap_interference.cu says how) for a few GEMM sizes. Needs nvcc, cuBLASLt and a
# GPU; CI has no GPU and does not run it. Usage:
#   [MODES="streams green"] [GEMM_TOKENS="512 1024 2048"] [REPEAT=1]
#   [KERNELS=decode_attention,decode_attention_tc,kv_stream] bench/gpu_interference.sh [OUT_DIR]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-bench-results/gpu-interference}"
mkdir -p "$out"
arch="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)"
[ "$arch" = 90 ] && arch=90a
nvcc -O3 -std=c++17 -arch="sm_$arch" "$here/gpu/overlap_interference.cu" -lcublasLt -lcuda \
  -o "$out/overlap_interference"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv \
  > "$out/gpu.csv"
# streams: both kernels on plain CUDA streams, the memory part's grid sized to its SM share;
# green: the SMs split by CUDA green contexts (a hard partition, as NanoFlow's execution-unit
# scheduling intends). A failure of one mode does not stop the other.
for mode in ${MODES:-streams green}; do
  for tokens in ${GEMM_TOKENS:-512 1024 2048}; do
    for run in $(seq "${REPEAT:-1}"); do
      "$out/overlap_interference" "$tokens" "${REQUESTS:-256}" "$mode" "${KERNELS:-}" \
        | tee "$out/$mode-$tokens-$run.jsonl" || echo "mode $mode, $tokens tokens: failed" >&2
    done
  done
done
