#!/usr/bin/env bash
# blend's next-token log-probabilities against llama.cpp's on the same weights (issue 56): every
# architecture blend serves is checked against an implementation we did not write.
#
#   LLAMA_LOGITS=/path/to/llama-logits bench/llama_cpp_logits.sh [PRESET[:LAYERS] ...]
#
# For each preset (default: tiny, tiny-qwen3, tiny-qwen2, tiny-phi3, smollm-135m:6,
# qwen3-0.6b:4, qwen2.5-0.5b:4, phi4-mini:4, llama-3.2-1b:4):
# `blend model init` writes a folder with random weights (untied heads, so no position's
# logits peak at its own token) in f32 and in bf16, `blend model export-gguf` writes each as
# GGUF, and `blend batch --deterministic` decodes greedily from a few prompts with the top 20
# log-probabilities of every generated token (by token id). llama.cpp then evaluates the same
# token sequences on the GGUF file and gives its log-probabilities of the same ids at the same
# positions. Reported per preset and dtype: positions compared, top-1 agreement (blend's greedy
# token = llama.cpp's argmax), and the max and median |delta logprob| over the top-20 ids. For
# bf16 the yardstick is llama.cpp's own bf16 against its f32 on the same (bf16-valued) weights.
#
# LLAMA_LOGITS is a small program against libllama kept outside this tree (see
# docs/BENCHMARKS.md, "blend against llama.cpp, logits": what it does and how it was built);
# this script neither fetches nor builds llama.cpp. Knobs: BLEND (default build/blend), WORK
# (a scratch dir), THREADS (2), TOKENS (64 generated tokens per prompt), CTX (4096: llama-logits'
# n_ctx, which blend batch gets as --max-model-len, so that both take the same longrope factors),
# DTYPES ("f32 bf16"; q8_0 and q4_k_m add the preset's f32 weights quantized by `blend model
# quantize --type Q8_0|Q4_K_M`, blend running that GGUF file itself, against llama.cpp on the
# same file; llama-logits reads LLAMA_UBATCH as its n_ubatch, which the quantized rows use for
# llama.cpp's own spread).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BLEND=${BLEND:-$ROOT/build/blend}
LLAMA_LOGITS=${LLAMA_LOGITS:?set LLAMA_LOGITS to the llama-logits program (see the header)}
WORK=${WORK:-$(mktemp -d)}
THREADS=${THREADS:-2}
TOKENS=${TOKENS:-64}
CTX=${CTX:-4096}
DTYPES=${DTYPES:-f32 bf16}
PRESETS=("$@")
[[ ${#PRESETS[@]} -gt 0 ]] || PRESETS=(tiny tiny-qwen3 tiny-qwen2 tiny-phi3 smollm-135m:6 qwen3-0.6b:4
  qwen2.5-0.5b:4 phi4-mini:4 llama-3.2-1b:4)
mkdir -p "$WORK"
PROMPTS=("Once upon a time, in a land far away," "def fibonacci(n):" "The capital of France is"
  "1, 2, 3, 4, 5," "東京は日本の首都で、")

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "blend $("$BLEND" --version 2>/dev/null || echo '?'); llama-logits: $LLAMA_LOGITS"

# compare.py BLEND_OUT.jsonl PROMPTS.json GGUF [REF_GGUF]: queries llama.cpp, prints one line.
compare() {
  python3 - "$@" "$LLAMA_LOGITS" "$THREADS" <<'PY'
import json, os, subprocess, sys, statistics
out, prompts_file, gguf, ref_gguf, prog, threads = sys.argv[1:7]
prompts = json.load(open(prompts_file))
queries, blend_lp, blend_top1 = [], [], []
for line in open(out):
    r = json.loads(line)
    i = int(r["custom_id"])
    lp = r["response"]["body"]["choices"][0]["logprobs"]
    gen = [int(t.split(":")[1]) for t in lp["tokens"]]
    tops = [{int(k.split(":")[1]): v for k, v in d.items()} for d in lp["top_logprobs"]]
    prompt = prompts[i]
    tokens = prompt + gen[:-1]
    positions = [len(prompt) - 1 + j for j in range(len(gen))]
    ids = [sorted(t) for t in tops]
    queries.append({"tokens": tokens, "positions": positions, "ids": ids})
    blend_lp.append([[t[k] for k in sorted(t)] for t in tops])
    blend_top1.append(gen)

def ask(model, env=None):
    p = subprocess.run([prog, model, threads], input="\n".join(json.dumps(q) for q in queries),
                       capture_output=True, text=True, check=True,
                       env=dict(os.environ, **(env or {})))
    return [json.loads(l) for l in p.stdout.splitlines() if l.strip()]

def diffs(a_lp, b_lp):
    return [abs(x - y) for qa, qb in zip(a_lp, b_lp) for pa, pb in zip(qa, qb) for x, y in zip(pa, pb)]

ans = ask(gguf)
d = diffs(blend_lp, [a["logprobs"] for a in ans])
n = sum(len(g) for g in blend_top1)
agree = sum(1 for g, a in zip(blend_top1, ans) for x, y in zip(g, a["argmax"]) if x == y)
line = f"positions {n}  top-1 agree {agree}/{n}  |d logprob| max {max(d):.2e} median {statistics.median(d):.2e}"
if ref_gguf != "-":
    ref = ask(ref_gguf)
    dr = diffs([a["logprobs"] for a in ref], [a["logprobs"] for a in ans])
    kind = next((k for k in ("q8_0", "q4_k_m") if f".{k}." in gguf), "bf16")
    line += f"  (llama.cpp {kind} vs its f32: max {max(dr):.2e} median {statistics.median(dr):.2e})"
    if kind != "bf16":
        # llama.cpp against itself: one token a ubatch (how it generates) vs the whole sequence
        # in one; its int8 roundings flip apart as blend's do (docs/BENCHMARKS.md).
        du = diffs([a["logprobs"] for a in ask(gguf, {"LLAMA_UBATCH": "1"})],
                   [a["logprobs"] for a in ans])
        line += f"  (llama.cpp {kind} n_ubatch 1 vs its default: max {max(du):.2e} median {statistics.median(du):.2e})"
print(line)
PY
}

for spec in "${PRESETS[@]}"; do
  preset=${spec%%:*}
  layers=""
  [[ $spec == *:* ]] && layers="--layers ${spec##*:}"
  # llama.cpp's gemma2 has no output head of its own (it always reads token_embd): tied there.
  untie=--untie-embeddings
  [[ $preset == *gemma2* ]] && untie=""
  for dtype in $DTYPES; do
    dir=$WORK/$preset-$dtype
    quantized=false
    [[ $dtype == q8_0 || $dtype == q4_k_m ]] && quantized=true
    $quantized && dir=$WORK/$preset-f32
    init_dtype=$dtype
    $quantized && init_dtype=f32
    [[ -d $dir ]] || "$BLEND" model init --preset "$preset" $layers $untie \
      --dtype "$init_dtype" --seed 5 --out "$dir" >/dev/null
    # (A general.name with "phi3" in it makes llama.cpp look up Phi-3's own "</s>", which the
    # Llama-3 tokenizer the presets carry lacks: the files get a neutral name.)
    ref=-
    model=$dir
    if $quantized; then
      # The very same quantized file for both engines; the yardstick is llama.cpp's quantized
      # file against its own f32 on the unquantized weights.
      gguf=$dir.$dtype.gguf
      "$BLEND" model quantize --model "$dir" --out "$gguf" --type "${dtype^^}" \
        --name blend-parity >/dev/null
      "$BLEND" model export-gguf --model "$dir" --out "$dir.f32.gguf" --dtype f32 \
        --name blend-parity >/dev/null
      ref=$dir.f32.gguf
      model=$gguf
    else
      gguf=$dir.gguf
      "$BLEND" model export-gguf --model "$dir" --out "$gguf" --dtype "$dtype" \
        --name blend-parity >/dev/null
    fi
    if [[ $dtype == bf16 ]]; then
      "$BLEND" model export-gguf --model "$dir" --out "$dir.f32.gguf" --dtype f32 \
        --name blend-parity >/dev/null
      ref=$dir.f32.gguf
    fi
    : >"$WORK/in.jsonl"
    prompts="["
    for i in "${!PROMPTS[@]}"; do
      ids=$(printf '%s' "${PROMPTS[$i]}" | "$BLEND" tokenize --model "$dir" --add-bos)
      prompts+="$ids,"
      printf '{"custom_id":"%d","method":"POST","url":"/v1/completions","body":{"model":"m","prompt":%s,"max_tokens":%d,"temperature":0,"ignore_eos":true,"logprobs":20,"return_tokens_as_token_ids":true}}\n' \
        "$i" "$ids" "$TOKENS" >>"$WORK/in.jsonl"
    done
    printf '%s' "${prompts%,}]" >"$WORK/prompts.json"
    rm -f "$WORK/out.jsonl"
    "$BLEND" batch --model "$model" --input "$WORK/in.jsonl" --output "$WORK/out.jsonl" \
      --deterministic --threads "$THREADS" --max-model-len "$CTX" --quiet
    printf '%-16s %-5s ' "$spec" "$dtype"
    compare "$WORK/out.jsonl" "$WORK/prompts.json" "$gguf" "$ref"
  done
done
