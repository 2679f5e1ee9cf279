#!/usr/bin/env bash
# The README's first command: set up a fresh machine, build blend, make a small model with
# random weights and the real Llama-3 tokenizer, and run the main job on it: an offline batch
# of OpenAI Batch API requests (examples/requests.jsonl) -> results.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."

# Build only what this runs (the `blend` executable, not the tests); the compiler's and
# ninja's output goes to a log that is shown only when something fails.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
quiet() {
  "$@" >"$log" 2>&1 || {
    cat "$log" >&2
    echo "quickstart: failed: $*" >&2
    exit 1
  }
}
echo "== installing what blend needs (Debian packages, the Llama-3 tokenizer data)"
quiet bash scripts/setup.sh
echo "== building blend (build/blend; a few minutes the first time)"
quiet cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
quiet cmake --build build -j "$(nproc)" --target blend

model=models/smollm-135m
[ -f "$model/config.json" ] || quiet build/blend model init --preset smollm-135m --out "$model" --seed 0

echo "== chat template and tokenizer on the first request's messages"
head -n 1 examples/requests.jsonl | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["body"]["messages"]))' |
  build/blend template --model "$model" | tee /tmp/blend-prompt.txt
echo
build/blend tokenize --model "$model" </tmp/blend-prompt.txt

echo "== blend batch (BlendServe order): examples/requests.jsonl -> results.jsonl (random weights: the text is noise)"
rm -f results.jsonl
build/blend batch --model "$model" --input examples/requests.jsonl --output results.jsonl \
  --stats results.stats.json --policy blend
echo "== the first result (custom_id, finish reason, tokens, the start of the text)"
python3 - <<'PY'
import json
with open("results.jsonl") as f:
    first = json.loads(f.readline())
body = first["response"]["body"]
choice = body["choices"][0]
text = choice["message"]["content"] if "message" in choice else choice.get("text", "")
usage = body["usage"]
print(f'{first["custom_id"]}: HTTP {first["response"]["status_code"]}, finish_reason '
      f'{choice["finish_reason"]}, {usage["prompt_tokens"]} prompt + '
      f'{usage["completion_tokens"]} completion tokens')
print("text:", repr((text or "")[:200]))
with open("results.stats.json") as f:
    stats = json.load(f)
keys = ("requests", "completed", "failed", "input_tokens", "output_tokens", "wall_seconds",
        "throughput_tokens_per_s", "sharing_ratio")
print("stats:", ", ".join(f"{k} {stats[k]:.4g}" if isinstance(stats[k], float) else f"{k} {stats[k]}"
                          for k in keys if k in stats))
PY
cat <<EOF

== next: the same model as a quantized GGUF file (llama.cpp's format, the bytes llama-quantize
   writes; --type Q4_K_M too), run from the file
  build/blend model quantize --model $model --out $model-Q8_0.gguf --type Q8_0
  build/blend batch --model $model-Q8_0.gguf --input examples/requests.jsonl --output q8.jsonl

== or serve the same model over the OpenAI API
  build/blend serve --model $model --port 8000 &
  curl -s localhost:8000/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "smollm-135m", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 16}'
(docs/CLI.md lists every command; results.jsonl and results.stats.json hold this run's output)
EOF
