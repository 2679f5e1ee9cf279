#!/usr/bin/env bash
# Does the cost model predict a real GPU run? On any machine, from bench/gpu/profile_points_run.sh's
# files in DIR: refits the device's profile on each run's engine steps (`blend profile --refit`,
# no GPU needed), simulates both workloads with each refitted profile (`blend simulate`,
# fcfs@sequential: the cuda engine runs steps one after another) and with the isolated profile,
# and prints each prediction against the real run's tokens/s. The workloads are rebuilt with
# throughput.py's generator (the same seed as on the device). Needs a model folder with the
# llama-3-8b config.json (MODEL_DIR; weights are not read).
#   BLEND=build/blend MODEL_DIR=DIR bash bench/gpu/sim_cross_check.sh DEVICE_OUT_DIR
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
dir="$1"
B="${BLEND:-build/blend}"
M="${MODEL_DIR:?MODEL_DIR: a folder with the llama-3-8b config.json}"
W="$(mktemp -d)"
trap 'rm -rf "$W"' EXIT
py="${PYTHON:-python3}"
runs="512-128 1024-512"
$py -c "import sys; sys.path.insert(0, '$here'); import throughput as t; \
t.write_workload('$W/w-512-128.jsonl', 1024, 512, 128, 0, 'llama-3-8b'); \
t.write_workload('$W/w-1024-512.jsonl', 512, 1024, 512, 0, 'llama-3-8b')"
simulate() {  # WORKLOAD PROFILE -> tokens/s
  "$B" simulate --workload "$1" --hardware "$2" --model "$M" --policy fcfs@sequential \
    --max-batch-tokens 4096 --max-running 512 --kv-memory 59.6 --json |
    $py -c 'import json, sys; print(json.loads(sys.stdin.readline())["throughput_tokens_per_s"])'
}
real() { $py -c "import json; print(json.load(open('$dir/stats-$1.json'))['throughput_tokens_per_s'])"; }
for k in $runs; do
  "$B" profile --refit "$dir/profile.json" --steps "$dir/steps-$k.jsonl" --model "$M" \
    --out "$W/refit-$k.json" | sed "s/^/refit on $k: /"
done
echo
echo "| profile | workload | real tokens/s | simulated | error |"
echo "| --- | --- | --- | --- | --- |"
for prof in isolated $runs; do
  p="$W/refit-$prof.json"
  [ "$prof" = isolated ] && p="$dir/profile.json"
  for k in $runs; do
    r=$(real "$k")
    s=$(simulate "$W/w-$k.jsonl" "$p")
    $py -c "print('| %s | %s | %.0f | %.0f | %+.1f%% |' % ('$prof', '$k', $r, $s, 100 * ($s / $r - 1)))"
  done
done
