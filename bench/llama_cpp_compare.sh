#!/usr/bin/env bash
# Offline throughput of blend vs llama.cpp on the very same weights.
#
#   LLAMA_CPP_BIN=/path/to/llama.cpp/build/bin bench/llama_cpp_compare.sh smollm-135m|llama-3.2-1b
#
# This script never fetches or builds llama.cpp: LLAMA_CPP_BIN must hold an existing build with
# llama-batched-bench. It
#   1. generates the model with `blend model init --preset P` unless MODELS_DIR/P exists,
#   2. exports it with `blend model export-gguf` as bf16 and f16 GGUF (unless already there),
#   3. runs llama-batched-bench (prompt PP=128, TG=128 generated tokens per sequence, prompts not
#      shared, every parallel setting in NPL) for each dtype and keeps the best total throughput,
#   4. when `blend batch` exists, runs the same work through it: N_REQ requests, each a distinct
#      128-token prompt given as token ids, max_tokens 128, ignore_eos, greedy; and prints
#      blend's throughput_tokens_per_s (prompt + generated tokens / wall time, the same measure as
#      batched-bench's S) and the ratio.
# Knobs (environment): BLEND (default build/blend), MODELS_DIR (models), OUT_DIR
# (build/llama_cpp_compare/P), THREADS (2), PP (128), TG (128), N_REQ (256), NPL (default per
# preset), DTYPES ("bf16 f16"; q8_0 and q4_k_m add `blend model quantize --type Q8_0|Q4_K_M`'s
# file, which both engines then run), CTX (batched-bench -c; default max(NPL) * (PP + TG) + 512),
# BLEND_BATCH_ARGS (extra flags for blend batch).
# Only bash and python3 (standard library) are used; bench/lib.sh has the shared parts.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ $# -eq 1 ]] || die "usage: LLAMA_CPP_BIN=/path/to/llama.cpp/build/bin $0 smollm-135m|llama-3.2-1b"
PRESET=$1
case "$PRESET" in
  smollm-135m) DEFAULT_NPL="1,8,16,32,64,128,256" ;;
  llama-3.2-1b) DEFAULT_NPL="1,8,32" ;;
  *) die "unknown preset '$PRESET' (smollm-135m | llama-3.2-1b)" ;;
esac

BLEND=${BLEND:-$ROOT/build/blend}
MODELS_DIR=${MODELS_DIR:-$ROOT/models}
OUT_DIR=${OUT_DIR:-$ROOT/build/llama_cpp_compare/$PRESET}
THREADS=${THREADS:-2}
PP=${PP:-128}
TG=${TG:-128}
N_REQ=${N_REQ:-256}
NPL=${NPL:-$DEFAULT_NPL}
DTYPES=${DTYPES:-"bf16 f16"}
[[ -n "${LLAMA_CPP_BIN:-}" ]] || die "set LLAMA_CPP_BIN to the bin/ folder of an existing llama.cpp build"
BENCH_BIN=$LLAMA_CPP_BIN/llama-batched-bench
[[ -x "$BENCH_BIN" ]] || die "$BENCH_BIN not found or not executable"
need_blend_and_python

MAX_NPL=$(tr ',' '\n' <<<"$NPL" | sort -n | tail -1)
CTX=${CTX:-$((MAX_NPL * (PP + TG) + 512))}
MODEL_DIR=$MODELS_DIR/$PRESET
mkdir -p "$OUT_DIR" "$MODELS_DIR"

echo "== machine: $(cpu_model), $(nproc) cores visible, threads=$THREADS"
echo "== llama.cpp: $LLAMA_CPP_BIN ($(git -C "$LLAMA_CPP_BIN/../.." describe --tags --always 2>/dev/null || echo unknown))"

if [[ ! -f "$MODEL_DIR/config.json" ]]; then
  echo "== generating $MODEL_DIR"
  "$BLEND" model init --preset "$PRESET" --out "$MODEL_DIR"
fi

is_quantized() { [[ $1 == q8_0 || $1 == q4_k_m ]]; }
declare -A BEST_S BEST_LINE
for dtype in $DTYPES; do
  gguf=$OUT_DIR/$PRESET-$dtype.gguf
  if [[ ! -f "$gguf" || "$MODEL_DIR/config.json" -nt "$gguf" ]]; then
    echo "== exporting $gguf"
    if is_quantized "$dtype"; then
      "$BLEND" model quantize --model "$MODEL_DIR" --out "$gguf" --type "${dtype^^}"
    else
      "$BLEND" model export-gguf --model "$MODEL_DIR" --out "$gguf" --dtype "$dtype"
    fi
  fi
  jsonl=$OUT_DIR/batched-bench-$dtype.jsonl
  cmd=("$BENCH_BIN" -m "$gguf" -c "$CTX" -b 2048 -ub 512 -npp "$PP" -ntg "$TG" -npl "$NPL"
    -t "$THREADS" -tb "$THREADS" --output-format jsonl)
  echo "== ${cmd[*]}"
  "${cmd[@]}" >"$jsonl" 2>"$OUT_DIR/batched-bench-$dtype.log" ||
    die "llama-batched-bench failed; see $OUT_DIR/batched-bench-$dtype.log"
  summary=$(python3 - "$jsonl" "$dtype" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
if not rows:
    sys.exit("no results in " + sys.argv[1])
print(f"{'dtype':>5} {'npl':>5} {'S_PP t/s':>10} {'S_TG t/s':>10} {'S t/s':>10} {'T s':>9}", file=sys.stderr)
for r in rows:
    print(f"{sys.argv[2]:>5} {r['pl']:>5} {r['speed_pp']:>10.2f} {r['speed_tg']:>10.2f} "
          f"{r['speed']:>10.2f} {r['t']:>9.2f}", file=sys.stderr)
best = max(rows, key=lambda r: r["speed"])
print(f"{best['speed']:.2f} npl={best['pl']} S_PP={best['speed_pp']:.2f} S_TG={best['speed_tg']:.2f}")
EOF
  )
  BEST_S[$dtype]=${summary%% *}
  BEST_LINE[$dtype]=$summary
done

# blend runs the model folder (its bf16 weights, what bf16 and f16 are compared with) and, for
# each quantized type in DTYPES, the very file llama.cpp ran.
declare -A BLEND_TPS
run_blend() {  # run_blend KEY MODEL
  local req=$OUT_DIR/requests-$N_REQ-$PP-$TG.jsonl  # named by its shape: a stale file never stands in
  [[ -f $req ]] || write_requests "$req" "$N_REQ" "$PP" "$TG" 120000
  rm -f "$OUT_DIR/out.jsonl" "$OUT_DIR/stats.json"
  read -r -a extra <<<"${BLEND_BATCH_ARGS:-}"
  cmd=("$BLEND" batch --model "$2" --input "$req" --output "$OUT_DIR/out.jsonl"
    --stats "$OUT_DIR/stats.json" --threads "$THREADS" "${extra[@]}")
  echo "== ${cmd[*]}"
  "${cmd[@]}"
  BLEND_TPS[$1]=$(stats_field "$OUT_DIR/stats.json" throughput_tokens_per_s %.2f)
}
if "$BLEND" batch --help >/dev/null 2>&1; then
  for dtype in $DTYPES; do
    if is_quantized "$dtype"; then
      run_blend "$dtype" "$OUT_DIR/$PRESET-$dtype.gguf"
    elif [[ -z ${BLEND_TPS[folder]:-} ]]; then
      run_blend folder "$MODEL_DIR"
    fi
  done
else
  echo "== '$BLEND batch' is not available: llama.cpp numbers only"
fi

echo
echo "== $PRESET, PP=$PP TG=$TG, $THREADS threads (total tokens/s = (prompt + generated) / time)"
for dtype in $DTYPES; do
  echo "llama.cpp $dtype: best S = ${BEST_LINE[$dtype]}"
done
for key in "${!BLEND_TPS[@]}"; do
  what="the model folder"
  is_quantized "$key" && what="the ${key^^} file"
  echo "blend batch ($N_REQ requests, $what): ${BLEND_TPS[$key]} tokens/s"
done
for dtype in $DTYPES; do
  key=folder
  is_quantized "$dtype" && key=$dtype
  [[ -n ${BLEND_TPS[$key]:-} ]] || continue
  python3 -c 'import sys; print("blend / llama.cpp %s = %.3f" % (sys.argv[1], float(sys.argv[2]) / float(sys.argv[3])))' \
    "$dtype" "${BLEND_TPS[$key]}" "${BEST_S[$dtype]}"
done
