#!/usr/bin/env bash
# One run on the lent GPU machine that compares the decode attention's variants (issue 28):
# the KV layout (BLEND_CUDA_KV_LAYOUT page | layer), the decode kernel's pipeline depth
# (BLEND_CUDA_ATTENTION default = 2 buffers | pipelined3 | warps | warps8), its key splits
# (BLEND_CUDA_DECODE_SPLITS fill | waves), its grid order (BLEND_CUDA_DECODE_GRID tokens |
# heads), the prefill kernel (BLEND_CUDA_PREFILL mma | wmma) and the gate/up GEMM's output
# (BLEND_CUDA_GATE_UP f32 | bf16), first per step and then on the whole engine path.
# From the repository root, with .gpu/ (bench/gpu/bundle.sh's archive) carried:
#   1. bench/gpu/unpack.sh into /tmp/blend
#   2. blend_cuda_tests (every variant's logits against the cpu backend; CUDA_TESTS_TIMEOUT)
#   3. the llama-3-8b folder (throughput.py's init, reused when present)
#   4. cuda_forward_bench per variant: decode steps of 1, 64, 256 sequences at 1,024 cached
#      tokens and a 4 x 512 prefill (FORWARD_ARGS replaces these) -> $OUT/forward_bench.jsonl,
#      with the GEMM peak and copy bandwidth it measures first
#   5. blend batch --backend cuda at --max-batch-tokens 4096 on each ENGINE_WORK (default
#      512:128:1024:2 = 1,024 x (512 + 128), twice), for the page/default/fill variant and the
#      one with the fastest 256-sequence decode step in 4 (or ENGINE_VARIANTS), interleaved
#      (A B A B ...) while time is left -> $OUT/engine-<prompt>-<output>-<variant>-<i>/
#   6. the transformers peer at batch PEER_BATCHES (default 512; 512-token prompts + 128), when
#      PEER=1 (the default) and time is left
# A failing step is reported and the next one runs; the log is $OUT/decode_run.log. TOTAL
# (default 520 s) bounds the whole run. Without a GPU nothing here can run.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/run_lib.sh"
TOTAL="${TOTAL:-520}"
run_start decode_run
run_cuda_tests
make_8b_folder

# Variants: layout/attention/splits[/grid[/prefill[/gate_up[/graphs]]]] (BLEND_CUDA_DECODE_GRID,
# default tokens; BLEND_CUDA_PREFILL, default mma; BLEND_CUDA_GATE_UP, default f32;
# BLEND_CUDA_GRAPHS, default off: decode replays each decode step's CUDA graph), e.g.
# VARIANTS="page/default/fill page/default/fill/tokens/mma/f32/decode".
VARIANTS="${VARIANTS:-page/default/fill layer/default/fill page/pipelined3/fill page/default/waves layer/pipelined3/waves layer/default/waves}"
run_variant() {  # variant, then the command
  local v="$1"
  shift
  IFS=/ read -r layout attention splits grid prefill gate_up graphs <<<"$v"
  BLEND_CUDA_KV_LAYOUT=$layout BLEND_CUDA_ATTENTION=$attention BLEND_CUDA_DECODE_SPLITS=$splits \
    BLEND_CUDA_DECODE_GRID=${grid:-tokens} BLEND_CUDA_PREFILL=${prefill:-mma} \
    BLEND_CUDA_GATE_UP=${gate_up:-f32} BLEND_CUDA_GRAPHS=${graphs:-off} "$@"
}
if [ -x /tmp/blend/bin/cuda_forward_bench ] && [ -f "$model/config.json" ]; then
  for v in $VARIANTS; do
    [ "$(left)" -lt 200 ] && { echo "forward bench: skipping $v, $(left) s left"; continue; }
    step "cuda_forward_bench $v (timeout 75 s)"
    run_variant "$v" timeout -k 5 75 /tmp/blend/bin/cuda_forward_bench --model "$model" \
      ${FORWARD_ARGS:---decode 1,64,256 --context 1024 --prefill 4x512} --reps 5 \
      | sed "s|^{|{\"variant\":\"$v\",|" | tee -a "$OUT/forward_bench.jsonl"
    echo "cuda_forward_bench: exit ${PIPESTATUS[0]}"
  done
fi

# The variant with the fastest 256-sequence decode step.
best=$(python3 - "$OUT/forward_bench.jsonl" <<'EOF'
import json, sys
best = None
try:
    for line in open(sys.argv[1]):
        try:
            j = json.loads(line)
        except ValueError:
            continue
        if j.get("kind") == "decode" and j.get("batch") == 256:
            t = j.get("step_ms") or j.get("ops", {}).get("total_ms")
            if t and (best is None or t < best[0]):
                best = (t, j["variant"])
except OSError:
    pass
print(best[1] if best else "page/default/fill")
EOF
)
step "engine runs: page/default/fill against $best"
engine_variants="page/default/fill"
[ "$best" != "page/default/fill" ] && engine_variants="$engine_variants $best"
engine_variants="${ENGINE_VARIANTS:-$engine_variants}"
# ENGINE_WORK: prompt:output:requests:repetitions per work, each repetition both variants.
for work in ${ENGINE_WORK:-512:128:1024:2}; do
  IFS=: read -r prompt output requests reps <<<"$work"
  for i in $(seq "$reps"); do
    for v in $engine_variants; do
      [ "$(left)" -lt 75 ] && { echo "engine: skipping $v $work run $i, $(left) s left"; continue; }
      step "blend batch $v, $requests x ($prompt + $output), run $i"
      tag=$(echo "$v" | tr / -)
      run_variant "$v" timeout -k 5 150 python3 "$here/throughput.py" "$BLEND" \
        "$OUT/engine-$prompt-$output-$tag-$i" --no-torch --budgets 4096 --requests "$requests" \
        --min-requests "$requests" --prompt "$prompt" --output "$output" --max-running 512 \
        --run-cap 90 2>&1 | grep -E "tokens/s|error|Error" | head -2
    done
  done
done

if [ "${PEER:-1}" = 1 ] && [ "$(left)" -gt 90 ]; then
  step "transformers peer, batch ${PEER_BATCHES:-512}"
  timeout -k 5 "$(($(left) - 5))" python3 "$here/throughput.py" "$BLEND" "$OUT/peer" --no-blend \
    --hf-batches "${PEER_BATCHES:-512}" --hf-prompt 512 --hf-new 128 2>&1 | tail -15
fi

step "done"
# Few files come back from the device: the engine runs' results go into one file.
for f in "$OUT"/engine-*/throughput.json "$OUT"/peer/throughput.json; do
  [ -f "$f" ] && python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); j["run"]=sys.argv[2]; print(json.dumps(j))' \
    "$f" "$(basename "$(dirname "$f")")" >> "$OUT/engine.jsonl"
done
cat "$OUT"/peer/throughput.md > "$OUT/peer.md" 2>/dev/null
rm -rf "$OUT"/engine-* "$OUT"/init "$OUT"/peer
ls "$OUT"
