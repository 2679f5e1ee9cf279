#!/usr/bin/env bash
# BlockLLM's adaptive serving (§5.3, issue 30) on one machine: a zoo served with every model's own
# blocks against the same zoo where requests run through the equivalent blocks of the base that
# `blend zoo analyze` found, and what that costs in accuracy.
#
#   bench/zoo_adaptive.sh                 # smollm-135m bf16 (untied head) + 20 tenants (KIND=mix)
#
# Makes the base with `blend model init --untie-embeddings` (a random tied head makes every
# position's logits peak at its own token, and every block look equivalent) and the tenants with
# `blend model derive` (bench/lib.sh make_tenants: KIND=mix, odd tenants LoRA r RANK on TARGETS,
# even ones full fine-tunes of LAYERS moved by SCALE x a fresh weight), then
#   analyze    `blend zoo analyze --zoo Z --threshold T --out eq.json`: every block against the
#              base's, and each tenant's adaptive chain against its own chain on the calibration
#              set (top-token agreement, KL);
# and REPS times, alternating:
#   zoo        `blend batch --zoo Z` over N_REQ lines naming the base and the tenants in turn;
#   adaptive   the same with `--adaptive-blocks eq.json --adaptive-serving all`;
#   one-model  all lines on the base alone (the bound: nothing differs);
#   TENANCY    optional more columns, e.g. TENANCY="ps per-model": the zoo run with `--tenancy T`
#              (BlockLLM's baselines in one engine: the same tokens with less sharing).
# Prints tokens/s per run, medians, adaptive / zoo and zoo / one-model, and how many of the
# adaptive run's greedy outputs are the zoo run's token for token (and their mean common prefix).
# Knobs: BLEND, OUT_DIR (build/zoo-adaptive), PRESET (smollm-135m), DTYPE (bf16), KIND (mix),
# TENANTS (20), LAYERS ("0 1 2 3"), SCALE (0.5), RANK (8), TARGETS (q_proj,v_proj), THRESHOLD
# (0.98), N_REQ (256), PP (128), TG (128), REPS (3), THREADS (0: all cores), BLEND_BATCH_ARGS,
# TENANCY (none).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BLEND=${BLEND:-$ROOT/build/blend}
OUT_DIR=${OUT_DIR:-$ROOT/build/zoo-adaptive}
PRESET=${PRESET:-smollm-135m}
DTYPE=${DTYPE:-bf16}
KIND=${KIND:-mix}
TENANTS=${TENANTS:-20}
LAYERS=${LAYERS:-0 1 2 3}
SCALE=${SCALE:-0.5}
RANK=${RANK:-8}
TARGETS=${TARGETS:-q_proj,v_proj}
THRESHOLD=${THRESHOLD:-0.98}
N_REQ=${N_REQ:-256}
PP=${PP:-128}
TG=${TG:-128}
REPS=${REPS:-3}
THREADS=${THREADS:-0}
INIT_ARGS=--untie-embeddings
need_blend_and_python
check_reps
mkdir -p "$OUT_DIR"
zoo=$OUT_DIR/zoo
make_tenants "$zoo"
echo "== machine: $(cpu_model), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg);" \
  "$PRESET $DTYPE untied, $TENANTS tenants of kind $KIND (full: layers $LAYERS, scale $SCALE;" \
  "LoRA: r $RANK on $TARGETS), threshold $THRESHOLD, N_REQ=$N_REQ PP=$PP TG=$TG"

"$BLEND" zoo analyze --zoo "$zoo" --threads "$THREADS" --threshold "$THRESHOLD" \
  --out "$OUT_DIR/eq.json" >"$OUT_DIR/analyze.txt" 2>&1 ||
  die "blend zoo analyze failed; see $OUT_DIR/analyze.txt"
sed -n '/^adaptive chains/,$p' "$OUT_DIR/analyze.txt"

write_requests "$OUT_DIR/all.jsonl" "$N_REQ" "$PP" "$TG"
python3 - "$OUT_DIR" "${models[@]}" <<'PY'
import json, sys
out, models = sys.argv[1], sys.argv[2:]
with open(f"{out}/mixed.jsonl", "w") as mixed:
    for i, l in enumerate(open(f"{out}/all.jsonl")):
        line = json.loads(l)
        line["body"]["model"] = models[i % len(models)]
        mixed.write(json.dumps(line) + "\n")
PY

read -r -a extra <<<"${BLEND_BATCH_ARGS:-}"
run() {  # TAG INPUT FLAGS... -> tokens/s
  local tag=$1 input=$2
  shift 2
  rm -f "$OUT_DIR/out-$tag.jsonl"
  "$BLEND" batch --input "$input" --output "$OUT_DIR/out-$tag.jsonl" \
    --stats "$OUT_DIR/stats-$tag.json" --threads "$THREADS" --quiet ${extra[@]+"${extra[@]}"} "$@" \
    >"$OUT_DIR/log-$tag.txt" 2>&1 || die "blend batch failed; see $OUT_DIR/log-$tag.txt"
  python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))
print("%.1f" % ((s["input_tokens"] + s["output_tokens"]) / s["wall_seconds"]))' \
    "$OUT_DIR/stats-$tag.json"
}

printf '%-4s %12s %12s %12s\n' rep zoo adaptive one-model
rows=() tenancy_rows=()
for ((i = 0; i < REPS; i++)); do
  z=$(run "zoo-$i" "$OUT_DIR/mixed.jsonl" --zoo "$zoo")
  a=$(run "adaptive-$i" "$OUT_DIR/mixed.jsonl" --zoo "$zoo" --adaptive-blocks "$OUT_DIR/eq.json" \
    --adaptive-serving all)
  o=$(run "one-$i" "$OUT_DIR/all.jsonl" --model "$zoo/base")
  rows+=("$z $a $o")
  printf '%-4s %12s %12s %12s\n' "$i" "$z" "$a" "$o"
  for t in ${TENANCY:-}; do
    v=$(run "$t-$i" "$OUT_DIR/mixed.jsonl" --zoo "$zoo" --tenancy "$t")
    tenancy_rows+=("$t $z $v")
    printf '%-4s %12s --tenancy %s: %s tok/s\n' "$i" "" "$t" "$v"
  done
done
if [[ -n ${TENANCY:-} ]]; then
  python3 - "$OUT_DIR" "${tenancy_rows[@]}" <<'PY'
import json, statistics, sys
out, rows = sys.argv[1], [r.split() for r in sys.argv[2:]]
for t in dict.fromkeys(r[0] for r in rows):
    zoo = statistics.median(float(r[1]) for r in rows if r[0] == t)
    v = statistics.median(float(r[2]) for r in rows if r[0] == t)
    s = json.load(open(f"{out}/stats-{t}-0.json"))
    print(f"--tenancy {t}: median {v:.1f} tokens/s, zoo / {t} = {zoo / v:.3f}; weights "
          f"{s['weight_bytes'] / (1 << 20):.0f} MiB ({s['blocks_unique']} distinct blocks)")
PY
fi
python3 - "$OUT_DIR" "${rows[@]}" <<'PY'
import json, statistics, sys
out = sys.argv[1]
rows = [list(map(float, r.split())) for r in sys.argv[2:]]
zoo, adaptive, one = (statistics.median(c) for c in zip(*rows))
print(f"median tokens/s: zoo {zoo:.1f}, adaptive {adaptive:.1f}, one-model {one:.1f}; "
      f"adaptive / zoo = {adaptive / zoo:.3f}, zoo / one-model = {zoo / one:.3f}, "
      f"adaptive / one-model = {adaptive / one:.3f}")
stats = json.load(open(f"{out}/stats-adaptive-0.json"))
print(f"adaptive run: {stats['adaptive_requests']} of {stats['requests']} requests on a borrowed "
      f"chain; weights {stats['weight_bytes'] / (1 << 20):.0f} MiB "
      f"({stats['blocks_unique']} distinct blocks)")
def tokens(path):
    t = {}
    for l in open(path):
        r = json.loads(l)
        t[r["custom_id"]] = r["response"]["body"]["choices"][0]["text"]
    return t
own, borrowed = tokens(f"{out}/out-zoo-0.jsonl"), tokens(f"{out}/out-adaptive-0.jsonl")
lines = {json.loads(l)["custom_id"]: json.loads(l)["body"]["model"] for l in open(f"{out}/mixed.jsonl")}
tenant = [k for k in own if lines[k] != "base"]
same = sum(own[k] == borrowed[k] for k in tenant)
def common(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
prefix = statistics.mean(common(own[k], borrowed[k]) / max(1, len(own[k])) for k in tenant)
base_same = sum(own[k] == borrowed[k] for k in own if lines[k] == "base")
print(f"greedy outputs of the tenants' lines: {same} of {len(tenant)} identical to their own "
      f"chain's; mean common prefix {prefix:.1%} of the text; the base's lines: {base_same} of "
      f"{len(own) - len(tenant)} identical")
eq = json.load(open(f"{out}/eq.json"))
ad = [m["adaptive"] for m in eq["models"] if "adaptive" in m]
if ad:
    print(f"calibration set (teacher-forced), over {len(ad)} tenants with a chain: top-token "
          f"agreement {statistics.mean(a['top_token_agreement'] for a in ad):.3f} "
          f"(min {min(a['top_token_agreement'] for a in ad):.3f}), KL "
          f"{statistics.mean(a['kl_nats'] for a in ad):.5f} nats (max "
          f"{max(a['kl_nats'] for a in ad):.5f})")
PY
