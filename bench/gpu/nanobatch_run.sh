#!/usr/bin/env bash
# One run on the lent GPU machine that measures NanoFlow's nano-batch overlap (issue 29) in the
# cuda backend: BLEND_CUDA_NANO_BATCHES off (the sequential engine), auto (two overlapped
# nano-batches where nano_split.h's cost model predicts a gain) and always (wherever a step
# has two chunks: the ablation without the model's judgement), first per step and then on the
# whole engine path. From the repository root, with .gpu/ (bench/gpu/bundle.sh's archive) carried:
#   1. bench/gpu/unpack.sh into /tmp/blend
#   2. blend_cuda_tests (the nano-batch cases' logits against the cpu backend among them)
#   3. the llama-3-8b folder (throughput.py's init, reused when present)
#   4. cuda_forward_bench per mode: decode steps of 64 and 256 sequences at 1,024 cached tokens,
#      a 4 x 512 prefill and MIXED steps (D decodes + a P-token prompt chunk)
#      -> $OUT/forward_bench.jsonl
#   5. blend batch --backend cuda at --max-batch-tokens 4096 on each ENGINE_WORK
#      (prompt:output:requests:repetitions), each repetition every ENGINE_MODES mode, interleaved,
#      while time is left -> $OUT/engine.jsonl
# A failing step is reported and the next one runs; the log is $OUT/nanobatch_run.log. TOTAL
# (default 480 s) bounds the whole run.
set -u
OUT="${OUT:-$PWD/device-out}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/nanobatch_run.log") 2>&1
TOTAL="${TOTAL:-480}"
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }
left() { echo $((TOTAL - $(elapsed))); }
step() { echo; echo "=== [$(elapsed) s] $*"; }
here="$(cd "$(dirname "$0")" && pwd)"

step "unpack"
bash "$here/unpack.sh" .gpu/blend-bundle.tar.xz /tmp/blend || echo "nanobatch_run: unpack FAILED"
BLEND=/tmp/blend/bin/blend
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv | tee "$OUT/gpu.txt"
cp /tmp/blend/BUILD_INFO "$OUT/BUILD_INFO" 2>/dev/null

if [ -x /tmp/blend/bin/blend_cuda_tests ] && [ "${CUDA_TESTS:-1}" = 1 ]; then
  step "blend_cuda_tests (timeout ${CUDA_TESTS_TIMEOUT:-90} s)"
  (cd /tmp && timeout -k 5 "${CUDA_TESTS_TIMEOUT:-90}" /tmp/blend/bin/blend_cuda_tests \
    ${CUDA_TESTS_FILTER:+--gtest_filter=$CUDA_TESTS_FILTER} > "$OUT/blend_cuda_tests.log" 2>&1)
  echo "blend_cuda_tests: exit $?"
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]|FAILED TEST|Failure' \
    "$OUT/blend_cuda_tests.log" | grep -v SKIPPED | tail -25
fi

step "llama-3-8b folder"
timeout -k 5 300 python3 "$here/throughput.py" "$BLEND" "$OUT/init" --no-torch --no-blend
model=/tmp/blend-throughput/model

MODES="${MODES:-off auto always}"
MIXED="${MIXED:-256:512,256:1024,128:1024,64:1024}"
if [ -x /tmp/blend/bin/cuda_forward_bench ] && [ -f "$model/config.json" ]; then
  for mode in $MODES; do
    [ "$(left)" -lt 200 ] && { echo "forward bench: skipping $mode, $(left) s left"; continue; }
    step "cuda_forward_bench nano $mode (timeout 90 s)"
    BLEND_CUDA_NANO_BATCHES=$mode timeout -k 5 90 /tmp/blend/bin/cuda_forward_bench \
      --model "$model" --decode 64,256 --context 1024 --prefill 4x512 --mixed "$MIXED" --reps 5 \
      | sed "s|^{|{\"nano\":\"$mode\",|" | tee -a "$OUT/forward_bench.jsonl"
    echo "cuda_forward_bench: exit ${PIPESTATUS[0]}"
  done
fi

# ENGINE_WORK: prompt:output:requests:repetitions per work, each repetition every mode.
for work in ${ENGINE_WORK:-512:128:1024:2 1024:512:512:1}; do
  IFS=: read -r prompt output requests reps <<<"$work"
  for i in $(seq "$reps"); do
    for mode in ${ENGINE_MODES:-off auto}; do
      [ "$(left)" -lt 75 ] && { echo "engine: skipping $mode $work run $i, $(left) s left"; continue; }
      step "blend batch nano $mode, $requests x ($prompt + $output), run $i"
      BLEND_CUDA_NANO_BATCHES=$mode timeout -k 5 150 python3 "$here/throughput.py" "$BLEND" \
        "$OUT/engine-$prompt-$output-$mode-$i" --no-torch --budgets 4096 --requests "$requests" \
        --min-requests "$requests" --prompt "$prompt" --output "$output" --max-running 512 \
        --run-cap 90 2>&1 | grep -E "tokens/s|error|Error" | head -2
    done
  done
done

step "done"
# Few files come back from the device: the engine runs' results go into one file.
for f in "$OUT"/engine-*/throughput.json; do
  [ -f "$f" ] && python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); j["run"]=sys.argv[2]; print(json.dumps(j))' \
    "$f" "$(basename "$(dirname "$f")")" >> "$OUT/engine.jsonl"
done
rm -rf "$OUT"/engine-* "$OUT"/init
ls "$OUT"
