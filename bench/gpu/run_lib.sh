# What the device runs share (decode_run.sh, nanobatch_run.sh, step_noise_run.sh); sourced, with
# `here` set to bench/gpu. run_start NAME logs everything to $OUT/NAME.log (OUT default
# ./device-out), starts the clock for step/elapsed/left (TOTAL seconds, default 480), unpacks
# .gpu/blend-bundle.tar.xz into /tmp/blend (BLEND is its wrapper; a BLEND already set is used
# instead, for dry runs without a bundle) and records the GPU and the build. run_cuda_tests runs blend_cuda_tests (CUDA_TESTS=0 skips; CUDA_TESTS_TIMEOUT, default 90
# s; CUDA_TESTS_FILTER). make_8b_folder makes throughput.py's llama-3-8b folder (reused when
# present) and sets `model`. run_combo runs a command under one nano-batch combination, and
# nano_profile_for writes the phase profile the combinations of a list need.
run_start() {
  OUT="${OUT:-$PWD/device-out}"
  mkdir -p "$OUT"
  exec > >(tee -a "$OUT/$1.log") 2>&1
  TOTAL="${TOTAL:-480}"
  start=$(date +%s)
  if [ -n "${BLEND:-}" ]; then  # a dry run here with a binary of this tree
    step "BLEND=$BLEND (no bundle unpacked)"
  else
    step "unpack"
    bash "$here/unpack.sh" .gpu/blend-bundle.tar.xz /tmp/blend || echo "$1: unpack FAILED"
    BLEND=/tmp/blend/bin/blend
  fi
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv |
    tee "$OUT/gpu.txt"
  cp /tmp/blend/BUILD_INFO "$OUT/BUILD_INFO" 2>/dev/null
}
elapsed() { echo $(($(date +%s) - start)); }
left() { echo $((TOTAL - $(elapsed))); }
step() { echo; echo "=== [$(elapsed) s] $*"; }

run_cuda_tests() {
  [ -x /tmp/blend/bin/blend_cuda_tests ] && [ "${CUDA_TESTS:-1}" = 1 ] || return 0
  step "blend_cuda_tests (timeout ${CUDA_TESTS_TIMEOUT:-90} s)"
  (cd /tmp && timeout -k 5 "${CUDA_TESTS_TIMEOUT:-90}" /tmp/blend/bin/blend_cuda_tests \
    ${CUDA_TESTS_FILTER:+--gtest_filter=$CUDA_TESTS_FILTER} > "$OUT/blend_cuda_tests.log" 2>&1)
  echo "blend_cuda_tests: exit $?"
  grep -E '^\[  (PASSED|FAILED) |^\[==========\]|FAILED TEST|Failure' \
    "$OUT/blend_cuda_tests.log" | tail -25
}

make_8b_folder() {
  step "llama-3-8b folder"
  timeout -k 5 300 python3 "$here/throughput.py" "$BLEND" "$OUT/init" --no-torch --no-blend
  model=/tmp/blend-throughput/model
}

# A combination is nano/attention/gemm_sms[/split[/graphs]]: BLEND_CUDA_NANO_BATCHES (off,
# auto, always), BLEND_CUDA_ATTENTION, BLEND_CUDA_NANO_GEMM_SMS (the pipelined step's GEMMs on
# at most that many SMs; 0 = all), BLEND_CUDA_NANO_SM_SPLIT (cublas, the default: cuBLAS's SM
# target on the GEMMs alone; green: green contexts, GEMM phases on gemm_sms SMs and attention
# on the rest; profile: each step's cut and green split from NanoFlow §5.5's autosearch on the
# phase profile nano_profile_for wrote, BLEND_CUDA_NANO_PROFILE) and BLEND_CUDA_GRAPHS (off, or
# decode: decode steps replay CUDA graphs), e.g. off/default/0/cublas/decode.
run_combo() {  # combination, then the command
  local c="$1" nano attention sms split graphs
  shift
  IFS=/ read -r nano attention sms split graphs <<<"$c"
  if [ "${split:-}" = profile ]; then
    BLEND_CUDA_NANO_BATCHES=$nano BLEND_CUDA_ATTENTION=$attention \
      BLEND_CUDA_NANO_PROFILE="$OUT/nano_profile.json" BLEND_CUDA_GRAPHS=${graphs:-off} "$@"
  else
    BLEND_CUDA_NANO_BATCHES=$nano BLEND_CUDA_ATTENTION=$attention \
      BLEND_CUDA_NANO_GEMM_SMS=${sms:-0} BLEND_CUDA_NANO_SM_SPLIT=${split:-cublas} \
      BLEND_CUDA_GRAPHS=${graphs:-off} "$@"
  fi
}
# `blend profile --backend cuda --nano` into $OUT/nano_profile.json (what run_combo's profile
# split reads) when a combination of the list ($1) plans by profile (needs `model`).
nano_profile_for() {
  [[ " $1 " == */profile[[:space:]]* ]] && [ -f "$model/config.json" ] || return 0
  step "blend profile --backend cuda --nano (timeout 120 s)"
  timeout -k 5 120 "$BLEND" profile --backend cuda --model "$model" \
    --nano "$OUT/nano_profile.json" 2>&1 | tail -3
  [ -f "$OUT/nano_profile.json" ] || echo "no nano-batch profile: the profile combinations will fail"
}
