#!/usr/bin/env bash
# The cost model's data from the lent GPU machine (issue 28: the profile must predict a real run
# within 5%): `blend profile --backend cuda` (the isolated points and their fit) and two real
# `blend batch --backend cuda` runs with --step-timings, 1,024 x (512 + 128) and 512 x (1,024 +
# 512) requests (throughput.py's random-id Batch files, temperature 0, ignore_eos), at
# --max-batch-tokens 4096 --max-running 512 --kv-memory 59.6. Everything lands in $OUT;
# bench/gpu/sim_cross_check.sh then refits the profile on each run's steps and predicts the other
# run on the simulator, on any machine. Run from the repository root with .gpu/ carried
# (bench/gpu/bundle.sh); about 100 s on an H100.
set -u
here=bench/gpu
OUT="${OUT:-$PWD/device-out}"
mkdir -p "$OUT"
bash $here/unpack.sh .gpu/blend-bundle.tar.xz /tmp/blend > "$OUT/unpack.log" 2>&1
B=/tmp/blend/bin/blend
timeout 100 python3 $here/throughput.py $B "$OUT/init" --no-torch --no-blend > /dev/null 2>&1
rm -rf "$OUT/init"
M=/tmp/blend-throughput/model
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv > "$OUT/gpu.txt"
(time timeout 100 $B profile --backend cuda --model $M --out "$OUT/profile.json") \
  > "$OUT/profile.log" 2>&1
tail -3 "$OUT/profile.log"
for w in 1024:512:128 512:1024:512; do
  IFS=: read -r n p o <<<"$w"
  python3 -c "import sys; sys.path.insert(0,'$here'); import throughput as t; \
t.write_workload('/tmp/w-$p-$o.jsonl', $n, $p, $o, 0, 'llama-3-8b')"
  rm -f /tmp/o.jsonl
  timeout 90 $B batch --backend cuda --model $M --input /tmp/w-$p-$o.jsonl --output /tmp/o.jsonl \
    --max-batch-tokens 4096 --max-running 512 --kv-memory 59.6 --quiet \
    --stats "$OUT/stats-$p-$o.json" --step-timings "$OUT/steps-$p-$o.jsonl"
  echo "batch $w exit $?"
  python3 -c "import json; s=json.load(open('$OUT/stats-$p-$o.json')); \
print({k: s[k] for k in s if 'per_s' in k or 'seconds' in k or k == 'steps'})"
done
nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv >> "$OUT/gpu.txt"
