#!/usr/bin/env bash
# Step-time logs of real cuda runs, for the simulator's --step-noise (issue 27: the figure used so
# far, 0.105, was measured on the CPU). On the lent GPU machine, from the repository root with
# .gpu/ carried: unpack, the llama-3-8b folder, then `blend batch --backend cuda --step-timings`
# on each STEP_WORK item (requests:prompt:output:max_running, random prompt ids, ignore_eos) ->
# $OUT/steps-<item>.jsonl and $OUT/stats-<item>.json. bench/step_noise.py reads them here.
set -u
OUT="${OUT:-$PWD/device-out}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/step_noise_run.log") 2>&1
here="$(cd "$(dirname "$0")" && pwd)"
B=/tmp/blend/bin/blend
W=/tmp/blend-step-noise
mkdir -p "$W"
bash "$here/unpack.sh" .gpu/blend-bundle.tar.xz /tmp/blend || echo "step_noise_run: unpack FAILED"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv | tee "$OUT/gpu.txt"
timeout -k 5 300 python3 "$here/throughput.py" "$B" "$W/init" --no-torch --no-blend > /dev/null
M=/tmp/blend-throughput/model
for item in ${STEP_WORK:-64:16:256:64 1024:512:128:512}; do
  IFS=: read -r n prompt output running <<<"$item"
  tag=$(echo "$item" | tr : -)
  python3 -c "import sys; sys.path.insert(0, '$here'); import throughput as t; \
t.write_workload('$W/w-$tag.jsonl', $n, $prompt, $output, 0, 'llama-3-8b')" || continue
  echo "=== blend batch $item"
  timeout -k 5 120 "$B" batch --backend cuda --model "$M" --input "$W/w-$tag.jsonl" \
    --output "$W/o-$tag.jsonl" --max-batch-tokens 4096 --max-running "$running" \
    --kv-memory "${KV_GB:-50}" --quiet --stats "$OUT/stats-$tag.json" \
    --step-timings "$OUT/steps-$tag.jsonl"
  echo "batch $item: exit $?"
done
ls -la "$OUT"
