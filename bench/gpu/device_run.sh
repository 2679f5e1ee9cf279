#!/usr/bin/env bash
# The one run on the lent GPU machine: from the repository root, with .gpu/ (bench/gpu/bundle.sh's
# archive) carried, all output under $OUT. In about TOTAL seconds (default 480):
#   1. bench/gpu/unpack.sh: blend into /tmp/blend (wrappers in /tmp/blend/bin)
#   2. blend_cuda_tests, when bundled (CUDA_TESTS=0 skips; CUDA_TESTS_TIMEOUT, default 90 s)
#   3. bench/gpu/hf_parity.py: blend cpu + cuda against transformers f32/bf16 (PARITY_TIMEOUT,
#      default 210 s) -> $OUT/hf_parity.md
#   4. bench/gpu/throughput.sh: llama-3-8b offline throughput at three step budgets, GEMM peak,
#      transformers peer, sized to the time left less FORWARD_RESERVE (default 100 s) ->
#      $OUT/throughput.md
#   5. cuda_forward_bench on that llama-3-8b folder, when bundled: decode and prefill steps against
#      the GPU's bounds, with the default attention kernels and with BLEND_CUDA_ATTENTION=tiled64
#      -> $OUT/forward_bench.jsonl
# A failing step is reported and the next one runs; the log is $OUT/device_run.log. Usage:
#   OUT=/some/dir bash bench/gpu/device_run.sh
# QUICK=1: throughput --quick; BACKENDS=cpu: parity on the cpu backend only; THROUGHPUT_ARGS:
# more throughput.py flags (here, without a GPU: "--no-torch --backend cpu --preset tiny
# --prompt 64 --output 16 --requests 8,16,32" runs the whole script on the cpu backend).
set -u
OUT="${OUT:-$PWD/device-out}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/device_run.log") 2>&1
TOTAL="${TOTAL:-480}"
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }
step() { echo; echo "=== [$(elapsed) s] $*"; }
here="$(cd "$(dirname "$0")" && pwd)"

step "unpack .gpu/blend-bundle.tar.xz"
bash "$here/unpack.sh" .gpu/blend-bundle.tar.xz /tmp/blend || echo "device_run: unpack FAILED (going on)"
BLEND=/tmp/blend/bin/blend
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
head -20 "$OUT/nvidia-smi.txt"
free -g | head -2; df -h /tmp | tail -1; nproc
python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available(), "transformers", transformers.__version__)' 2>&1 | tail -1
# What this build of blend can do (the scripts need all three).
"$BLEND" model init --help 2>&1 | grep -q -- --allow-large || echo "device_run: WARNING: this blend has no 'model init --allow-large'"
"$BLEND" batch --help 2>&1 | grep -q -- "cuda" || echo "device_run: WARNING: this blend's --backend does not list cuda"
cp /tmp/blend/BUILD_INFO "$OUT/BUILD_INFO" 2>/dev/null

if [ -x /tmp/blend/bin/blend_cuda_tests ] && [ "${CUDA_TESTS:-1}" = 1 ]; then
  step "blend_cuda_tests (timeout ${CUDA_TESTS_TIMEOUT:-90} s)"
  (cd /tmp && timeout -k 5 "${CUDA_TESTS_TIMEOUT:-90}" /tmp/blend/bin/blend_cuda_tests \
    > "$OUT/blend_cuda_tests.log" 2>&1)
  echo "blend_cuda_tests: exit $?"
  grep -E '^\[  (PASSED|FAILED) |^\[==========\]|FAILED TEST' "$OUT/blend_cuda_tests.log" | tail -20
fi

step "hf_parity (timeout ${PARITY_TIMEOUT:-210} s)"
timeout -k 5 "${PARITY_TIMEOUT:-210}" python3 "$here/hf_parity.py" "$BLEND" /tmp/blend-parity \
  --out "$OUT" --backends "${BACKENDS:-cpu,cuda}"
echo "hf_parity: exit $?"

left=$((TOTAL - $(elapsed) - ${FORWARD_RESERVE:-100}))
# Fixed costs of the throughput step (model init, GEMM, transformers peer, three loads) are
# about 150 s; the three blend runs share the rest, each sized to run_cap, at most 60 s.
cap=$(((left - 150) / 4))
[ "$cap" -gt 60 ] && cap=60
[ "$cap" -lt 20 ] && cap=20
step "throughput ($left s left: --run-cap $cap, --deadline $((left - 15)))"
# shellcheck disable=SC2086  # THROUGHPUT_ARGS is a list of flags
timeout -k 5 "$((left > 120 ? left : 120))" bash "$here/throughput.sh" "$BLEND" "$OUT" \
  --run-cap "$cap" --deadline "$((left > 135 ? left - 15 : 120))" ${QUICK:+--quick} \
  ${THROUGHPUT_ARGS:-}
echo "throughput: exit $?"

bench_model=/tmp/blend-throughput/model
if [ -x /tmp/blend/bin/cuda_forward_bench ] && [ -f "$bench_model/config.json" ]; then
  for kernels in default tiled64; do
    step "cuda_forward_bench, attention kernels: $kernels (timeout 60 s)"
    BLEND_CUDA_ATTENTION=$kernels timeout -k 5 60 /tmp/blend/bin/cuda_forward_bench \
      --model "$bench_model" --decode 1,64,256 --context 1024 --prefill 4x512 --reps 5 \
      | sed "s/^{/{\"attention_kernels\":\"$kernels\",/" | tee -a "$OUT/forward_bench.jsonl"
    echo "cuda_forward_bench: exit ${PIPESTATUS[0]}"
  done
fi

step "done"
cat "$OUT/hf_parity.md" "$OUT/throughput.md" 2>/dev/null
ls -la "$OUT"
