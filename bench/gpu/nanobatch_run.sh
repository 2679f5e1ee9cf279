#!/usr/bin/env bash
# One run on the lent GPU machine that measures NanoFlow's nano-batch overlap (issue 29) in the
# cuda backend: BLEND_CUDA_NANO_BATCHES off (the sequential engine), auto (two overlapped
# nano-batches where nano_split.h's cost model predicts a gain) and always (wherever a step
# has two chunks: the ablation without the model's judgement), with the attention kernel
# (BLEND_CUDA_ATTENTION) and the pipelined GEMMs' SM count (BLEND_CUDA_NANO_GEMM_SMS) as the
# other two parts of a combination, first per step and then on the whole engine path. From the repository root, with .gpu/ (bench/gpu/bundle.sh's archive) carried:
#   1. bench/gpu/unpack.sh into /tmp/blend
#   2. blend_cuda_tests (the nano-batch cases' logits against the cpu backend among them)
#   3. the llama-3-8b folder (throughput.py's init, reused when present)
#   4. with a profile combination, blend profile --backend cuda --nano -> $OUT/nano_profile.json
#      cuda_forward_bench per COMBOS combination: decode steps of DECODE sequences at 1,024
#      cached tokens, a 4 x 512 prefill and MIXED steps (D decodes + a P-token prompt chunk)
#      -> $OUT/forward_bench.jsonl, and nanobatch_report.py's table of each combination's steps
#      against the sequential one, with the interference each implies -> $OUT/nanobatch.md;
#      the first combination also times sampling on the GPU (DRAW rows, default 256: draw.cu's
#      argmax, temperature, cut and logprob rows against the read bandwidth and the host sampler)
#   5. blend batch --backend cuda at --max-batch-tokens 4096 on each ENGINE_WORK
#      (prompt:output:requests:repetitions), each repetition the first combination and the one
#      with the fastest BEST_BY mixed step (or ENGINE_COMBOS), interleaved, while time is left
#      -> $OUT/engine.jsonl
# A failing step is reported and the next one runs; the log is $OUT/nanobatch_run.log. TOTAL
# (default 480 s) bounds the whole run.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/run_lib.sh"
run_start nanobatch_run
run_cuda_tests
make_8b_folder

# A combination is nano/attention/gemm_sms[/split] (run_lib.sh's run_combo), e.g.
# COMBOS="off/default/0 always/default/0 always/default/96/green auto/default/0/profile".
COMBOS="${COMBOS:-off/default/0 auto/default/0 always/default/0}"
MIXED="${MIXED:-256:512,256:1024,128:1024,64:1024}"
DECODE="${DECODE:-64,256}"
nano_profile_for "$COMBOS ${ENGINE_COMBOS:-}"
if [ -x /tmp/blend/bin/cuda_forward_bench ] && [ -f "$model/config.json" ]; then
  # The first combination also times sampling on the GPU (DRAW rows of each kind; empty: none),
  # with the cut kernel on (BLEND_CUDA_DRAW only gates the engine's use of it).
  draw_arg=(--draw "${DRAW-256}")
  [ -z "${DRAW-256}" ] && draw_arg=()
  for c in $COMBOS; do
    [ "$(left)" -lt 150 ] && { echo "forward bench: skipping $c, $(left) s left"; continue; }
    step "cuda_forward_bench $c (timeout 90 s)"
    run_combo "$c" timeout -k 5 90 /tmp/blend/bin/cuda_forward_bench \
      --model "$model" --decode "$DECODE" --context 1024 --prefill 4x512 --mixed "$MIXED" --reps 5 \
      "${draw_arg[@]}" \
      | sed "s|^{|{\"combo\":\"$c\",|" | tee -a "$OUT/forward_bench.jsonl"
    echo "cuda_forward_bench: exit ${PIPESTATUS[0]}"
    draw_arg=()
  done
fi

step "nano-batch steps against the sequential step"
python3 "$here/nanobatch_report.py" "$OUT/forward_bench.jsonl" "$OUT/nanobatch.md"

# The combination with the fastest step of the mixed kind BEST_BY (decodes:prompt), for the
# engine runs beside the first combination.
BEST_BY="${BEST_BY:-256:1024}"
best=$(python3 - "$OUT/forward_bench.jsonl" "$BEST_BY" <<'EOF2'
import json, sys
d, p = (int(x) for x in sys.argv[2].split(":"))
best = None
try:
    for line in open(sys.argv[1]):
        try:
            j = json.loads(line)
        except ValueError:
            continue
        if j.get("kind") == "mixed" and j.get("decodes") == d and j.get("prompt_tokens") == p:
            if best is None or j["step_ms"] < best[0]:
                best = (j["step_ms"], j["combo"])
except OSError:
    pass
print(best[1] if best else "")
EOF2
)
first="${COMBOS%% *}"
ENGINE_COMBOS="${ENGINE_COMBOS:-$first${best:+ $best}}"
[ "$best" = "$first" ] && ENGINE_COMBOS="$first auto/default/0"
echo "engine combinations: $ENGINE_COMBOS (fastest mixed $BEST_BY step: ${best:-none})"

# ENGINE_WORK: prompt:output:requests:repetitions per work, each repetition every combination.
for work in ${ENGINE_WORK:-512:128:1024:2 1024:512:512:1}; do
  IFS=: read -r prompt output requests reps <<<"$work"
  for i in $(seq "$reps"); do
    for c in $ENGINE_COMBOS; do
      [ "$(left)" -lt 75 ] && { echo "engine: skipping $c $work run $i, $(left) s left"; continue; }
      step "blend batch $c, $requests x ($prompt + $output), run $i"
      tag=$(echo "$c" | tr / -)
      run_combo "$c" timeout -k 5 150 python3 "$here/throughput.py" "$BLEND" \
        "$OUT/engine-$prompt-$output-$tag-$i" --no-torch --budgets 4096 --requests "$requests" \
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
