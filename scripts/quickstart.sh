#!/usr/bin/env bash
# The README's first command: set up a fresh machine, build blend, make a small model with
# random weights and the real Llama-3 tokenizer, and run the main job on it: an offline batch
# of OpenAI Batch API requests (examples/requests.jsonl) -> results.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)"

model=models/smollm-135m
[ -f "$model/config.json" ] || build/blend model init --preset smollm-135m --out "$model" --seed 0

echo "== chat template and tokenizer on the first request's messages"
head -n 1 examples/requests.jsonl | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["body"]["messages"]))' |
  build/blend template --model "$model" | tee /tmp/blend-prompt.txt
echo
build/blend tokenize --model "$model" </tmp/blend-prompt.txt

echo "== blend batch (BlendServe order): examples/requests.jsonl -> results.jsonl (random weights: the text is noise)"
rm -f results.jsonl
build/blend batch --model "$model" --input examples/requests.jsonl --output results.jsonl \
  --stats results.stats.json --policy blend
head -c 600 results.jsonl
echo
cat results.stats.json
