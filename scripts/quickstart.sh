#!/usr/bin/env bash
# The README's first command: set up a fresh machine, build blend, make a small model with
# random weights and the real Llama-3 tokenizer, and run the main job on it.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)"

model=models/smollm-135m
build/blend model init --preset smollm-135m --out "$model" --seed 0
build/blend model info --model "$model" | head -n 8

echo "== chat template: render a conversation"
prompt=$(echo '[{"role":"system","content":"You are terse."},{"role":"user","content":"Name a prime."}]' |
  build/blend template --model "$model")
printf '%s\n' "$prompt"
echo "== tokenizer: encode the rendered prompt, then decode it back"
ids=$(printf '%s' "$prompt" | build/blend tokenize --model "$model")
echo "$ids"
printf '%s' "$ids" | build/blend tokenize --model "$model" --decode
echo
