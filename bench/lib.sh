# Shared by the bench scripts that drive `blend batch` (contention.sh, deterministic_cost.sh,
# llama_cpp_compare.sh, overlap_schedule.sh). Sourced, not run:
#
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# It sets ROOT (the repository root) and BENCH_NAME (the script's name without .sh) and defines
#   die MSG...                      "BENCH_NAME: MSG" on stderr, exit 1
#   need_blend_and_python           $BLEND must be executable and python3 present (else die)
#   check_reps                      $REPS must be a positive integer (else die)
#   cpu_model                       the CPU's model name, as lscpu says it
#   write_requests FILE N PP TG [MAX_ID]
#                                   N Batch API /v1/completions lines: each a distinct PP-token
#                                   prompt of token ids (first token 1000 + i, the rest drawn
#                                   from [100, MAX_ID), MAX_ID 4000 by default: random.Random(0)),
#                                   max_tokens TG, ignore_eos, greedy; the first tokens differ,
#                                   so no request gets its prompt from the prefix cache
#   stats_field FILE FIELD [FORMAT] a field of a `blend batch --stats` file (printf-style FORMAT)
#   run_batch MODEL TAG FIELD [FLAGS...]
#                                   one quiet `blend batch` run of $req into $OUT_DIR/out-TAG.jsonl
#                                   (stats-TAG.json, log-TAG.txt), with FLAGS and the environment
#                                   in the array BATCH_ENV (NAME=VALUE words; a caller may declare
#                                   it local); prints the stats file's FIELD; dies when it fails
# Only bash and python3 (standard library) are used.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH_NAME=$(basename "$0" .sh)
BATCH_ENV=()

die() {
  echo "$BENCH_NAME: $*" >&2
  exit 1
}

need_blend_and_python() {
  [[ -x "$BLEND" ]] || die "$BLEND not found; build blend first (or set BLEND)"
  command -v python3 >/dev/null || die "python3 is required"
}

check_reps() {
  [[ "$REPS" =~ ^[1-9][0-9]*$ ]] || die "REPS must be a positive integer, got '$REPS'"
}

cpu_model() {
  lscpu | sed -n 's/^Model name: *//p' | head -1
}

write_requests() {
  python3 - "$1" "$2" "$3" "$4" "${5:-4000}" <<'PY'
import json, random, sys
path, n, pp, tg, max_id = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rng = random.Random(0)
with open(path, "w") as f:
    for i in range(n):
        prompt = [1000 + i] + [rng.randrange(100, max_id) for _ in range(pp - 1)]
        body = {"model": "bench", "prompt": prompt, "max_tokens": tg, "ignore_eos": True,
                "temperature": 0}
        f.write(json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": "/v1/completions",
                            "body": body}) + "\n")
PY
}

stats_field() {
  python3 -c 'import json, sys; print(sys.argv[3] % json.load(open(sys.argv[1]))[sys.argv[2]])' \
    "$1" "$2" "${3:-%s}"
}

run_batch() {
  local model=$1 tag=$2 field=$3
  shift 3
  rm -f "$OUT_DIR/out-$tag.jsonl" "$OUT_DIR/stats-$tag.json"
  ${BATCH_PREFIX[@]+"${BATCH_PREFIX[@]}"} env ${BATCH_ENV[@]+"${BATCH_ENV[@]}"} "$BLEND" batch --model "$model" --input "$req" \
    --output "$OUT_DIR/out-$tag.jsonl" --stats "$OUT_DIR/stats-$tag.json" --quiet "$@" \
    >"$OUT_DIR/log-$tag.txt" 2>&1 || die "blend batch failed; see $OUT_DIR/log-$tag.txt"
  stats_field "$OUT_DIR/stats-$tag.json" "$field"
}

# Tenants of one base (BlockLLM, issue 30): makes ZOO/base (`blend model init --preset PRESET
# --dtype DTYPE`, kept when there) and ZOO/t1..tTENANTS with `blend model derive` (KIND=full: the
# layers in LAYERS perturbed, every other tensor the base's; KIND=lora: a PEFT adapter of rank
# RANK on TARGETS; KIND=mix: odd tenants LoRA, even ones full), after removing any other
# subfolder of ZOO. Sets the arrays models (base t1 ...), full_models and ps_models (base and
# the LoRA tenants). Usage: make_tenants ZOO (with BLEND PRESET DTYPE KIND TENANTS LAYERS RANK
# TARGETS set; optional INIT_ARGS, more `model init` flags, and SCALE, the full fine-tunes'
# `derive --scale`, default 1).
make_tenants() {
  local zoo=$1 t how layers
  mkdir -p "$zoo"
  if [[ ! -f "$zoo/base/config.json" ]]; then
    # shellcheck disable=SC2086  # INIT_ARGS: extra flags, split on spaces
    "$BLEND" model init --preset "$PRESET" --dtype "$DTYPE" ${INIT_ARGS:-} --out "$zoo/base" >/dev/null ||
      die "blend model init --preset $PRESET --dtype $DTYPE failed"
  fi
  read -r -a layers <<<"$LAYERS"
  [[ $KIND == full || $KIND == lora || $KIND == mix ]] || die "KIND must be full, lora or mix"
  find "$zoo" -mindepth 1 -maxdepth 1 ! -name base -exec rm -rf {} +
  models=(base)
  full_models=() ps_models=(base)
  for ((t = 1; t <= TENANTS; t++)); do
    if [[ $KIND == full || ($KIND == mix && $((t % 2)) == 0) ]]; then
      how=(--full --layers "${layers[@]}" --scale "${SCALE:-1}")
    else
      how=(--lora --rank "$RANK" --targets "$TARGETS")
    fi
    "$BLEND" model derive --base "$zoo/base" --out "$zoo/t$t" "${how[@]}" --seed "$t" >/dev/null ||
      die "blend model derive failed"
    models+=("t$t")
    if [[ ${how[0]} == --full ]]; then full_models+=("t$t"); else ps_models+=("t$t"); fi
  done
}

# Starts `blend serve ARGS... --port 0` in the background, its stderr in LOG, and waits until it
# listens (at most 120 s). Sets server_pid and server_port. Usage: start_server LOG ARGS...
start_server() {
  local log=$1
  shift
  "$BLEND" serve "$@" --port 0 2>"$log" &
  server_pid=$!
  server_port=""
  for _ in $(seq 1 1200); do
    server_port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$log")
    [[ -n $server_port ]] && return 0
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  kill "$server_pid" 2>/dev/null
  die "blend serve $* did not start; see $log"
}
