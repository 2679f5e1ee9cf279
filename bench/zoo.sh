#!/usr/bin/env bash
# Several models in one engine (`blend batch --zoo`, BlockLLM, issues 24 and 30) against the same
# work run per model, one engine after the other, on this machine.
#
#   bench/zoo.sh                          # smollm-135m bf16 base + a full fine-tune of layers 0-3
#   KIND=lora TENANTS=4 bench/zoo.sh      # the base + 4 LoRA adapters (r 8 on q_proj,v_proj)
#
# Makes the base with `blend model init` and TENANTS tenants with `blend model derive` (KIND=full:
# the listed layers perturbed, every other tensor the base's; KIND=lora: a PEFT adapter; KIND=mix:
# odd tenants LoRA, even ones full), then
# runs REPS times, alternating:
#   zoo        one `blend batch --zoo` over N_REQ lines naming the base and the tenants in turn:
#              shared blocks run once over the rows of every model using them, the rest per model;
#   per-model  each model's lines in its own `blend batch --model` run (per-model provisioning,
#              time-sliced: the figure is total tokens / summed wall);
#   ps         parameter sharing as S-LoRA does it (BlockLLM's PS baseline), with KIND=mix or
#              lora: one `--zoo` run over the lines of the base and its LoRA tenants (one base
#              GEMM, each adapter's delta on its rows), and each full fine-tune in its own run
#              (the per-model runs' figures): PS shares no block between full fine-tunes;
#   one-model  all N_REQ lines on the base alone: what the zoo would reach if nothing differed.
# Prints per run tokens/s, then medians and the ratios zoo / per-model and zoo / one-model, and
# the zoo's weight memory against loading every model apart.
# Knobs (environment): BLEND (build/blend), MODELS_DIR (build/bench_models), OUT_DIR
# (build/zoo), PRESET (smollm-135m), DTYPE (bf16), KIND (full | lora | mix), TENANTS (1), LAYERS
# ("0 1 2 3", KIND=full), RANK (8) and TARGETS (q_proj,v_proj) for KIND=lora, N_REQ (256), PP
# (128), TG (128), REPS (3), THREADS (0: all cores), BLEND_BATCH_ARGS (extra flags for every run,
# e.g. --deterministic).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BLEND=${BLEND:-$ROOT/build/blend}
MODELS_DIR=${MODELS_DIR:-$ROOT/build/bench_models}
OUT_DIR=${OUT_DIR:-$ROOT/build/zoo}
PRESET=${PRESET:-smollm-135m}
DTYPE=${DTYPE:-bf16}
KIND=${KIND:-full}
TENANTS=${TENANTS:-1}
LAYERS=${LAYERS:-0 1 2 3}
RANK=${RANK:-8}
TARGETS=${TARGETS:-q_proj,v_proj}
N_REQ=${N_REQ:-256}
PP=${PP:-128}
TG=${TG:-128}
REPS=${REPS:-3}
THREADS=${THREADS:-0}
need_blend_and_python
check_reps
mkdir -p "$OUT_DIR" "$MODELS_DIR"
zoo=$OUT_DIR/zoo
make_tenants "$zoo"
# PS's engine: the base and its adapters (links into the zoo).
rm -rf "$OUT_DIR/zoo-ps"
mkdir -p "$OUT_DIR/zoo-ps"
for m in "${ps_models[@]}"; do ln -s "$(realpath "$zoo/$m")" "$OUT_DIR/zoo-ps/$m"; done

what="$TENANTS tenant(s) of kind $KIND"
case $KIND in
  full) what+=" (layers $LAYERS)" ;;
  lora) what+=" (r $RANK on $TARGETS)" ;;
  mix) what+=" (odd: LoRA r $RANK on $TARGETS; even: full, layers $LAYERS)" ;;
esac
echo "== machine: $(cpu_model), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg);" \
  "$PRESET $DTYPE, $what, N_REQ=$N_REQ PP=$PP TG=$TG"
write_requests "$OUT_DIR/all.jsonl" "$N_REQ" "$PP" "$TG"
# The same lines naming the models in turn (zoo), and each model's lines apart (per-model).
python3 - "$OUT_DIR" "${ps_models[*]}" "${models[@]}" <<'PY'
import json, sys
out, ps, models = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
lines = [json.loads(l) for l in open(f"{out}/all.jsonl")]
apart = {m: open(f"{out}/model-{m}.jsonl", "w") for m in models}
with open(f"{out}/mixed.jsonl", "w") as mixed, open(f"{out}/ps.jsonl", "w") as ps_lines:
    for i, line in enumerate(lines):
        m = models[i % len(models)]
        line["body"]["model"] = m
        text = json.dumps(line) + "\n"
        mixed.write(text)
        apart[m].write(text)
        if m in ps:
            ps_lines.write(text)
PY

read -r -a extra <<<"${BLEND_BATCH_ARGS:-}"
run() {  # TAG INPUT FLAGS... -> "tokens wall"
  local tag=$1 input=$2
  shift 2
  rm -f "$OUT_DIR/out-$tag.jsonl"
  "$BLEND" batch --input "$input" --output "$OUT_DIR/out-$tag.jsonl" \
    --stats "$OUT_DIR/stats-$tag.json" --threads "$THREADS" --quiet ${extra[@]+"${extra[@]}"} "$@" \
    >"$OUT_DIR/log-$tag.txt" 2>&1 || die "blend batch failed; see $OUT_DIR/log-$tag.txt"
  python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))
print(s["input_tokens"] + s["output_tokens"], s["wall_seconds"])' "$OUT_DIR/stats-$tag.json"
}

printf '%-4s %12s %12s %12s %12s\n' rep zoo per-model ps one-model
results=()
for ((i = 0; i < REPS; i++)); do
  read -r zt zw < <(run "zoo-$i" "$OUT_DIR/mixed.jsonl" --zoo "$zoo")
  sum() { python3 -c "import sys; a,b,c,d=map(float,sys.argv[1:]); print(a+c, b+d)" "$@"; }
  pt=0 pw=0 st=0 sw=0  # per-model; PS's full fine-tunes
  for m in "${models[@]}"; do
    read -r mt mw < <(run "$m-$i" "$OUT_DIR/model-$m.jsonl" --model "$zoo/$m")
    read -r pt pw < <(sum "$pt" "$pw" "$mt" "$mw")
    if [[ " ${full_models[*]} " == *" $m "* ]]; then read -r st sw < <(sum "$st" "$sw" "$mt" "$mw"); fi
  done
  read -r qt qw < <(run "ps-$i" "$OUT_DIR/ps.jsonl" --zoo "$OUT_DIR/zoo-ps")
  read -r st sw < <(sum "$st" "$sw" "$qt" "$qw")
  read -r ot ow < <(run "one-$i" "$OUT_DIR/all.jsonl" --model "$zoo/base")
  row=$(python3 -c "import sys; zt,zw,pt,pw,st,sw,ot,ow=map(float,sys.argv[1:])
print(f'{zt/zw:.1f} {pt/pw:.1f} {st/sw:.1f} {ot/ow:.1f}')" "$zt" "$zw" "$pt" "$pw" "$st" "$sw" \
    "$ot" "$ow")
  results+=("$row")
  read -r a b c d <<<"$row"
  printf '%-4s %12s %12s %12s %12s\n' "$i" "$a" "$b" "$c" "$d"
done
python3 - "$OUT_DIR" "${#full_models[@]}" "${results[@]}" <<'PY'
import json, statistics, sys
out, full = sys.argv[1], int(sys.argv[2])
stats = json.load(open(f"{out}/stats-zoo-0.json"))
ps_stats = json.load(open(f"{out}/stats-ps-0.json"))
one_stats = json.load(open(f"{out}/stats-one-0.json"))
rows = [list(map(float, r.split())) for r in sys.argv[3:]]
zoo, per_model, ps, one = (statistics.median(col) for col in zip(*rows))
print(f"median tokens/s: zoo {zoo:.1f}, per-model {per_model:.1f}, ps {ps:.1f}, one-model {one:.1f}")
print(f"zoo / per-model = {zoo / per_model:.2f}, zoo / ps = {zoo / ps:.2f}, "
      f"zoo / one-model = {zoo / one:.2f}")
mib = 1 << 20
print(f"zoo weights: {stats['weight_bytes'] / mib:.0f} MiB in memory, "
      f"{stats['weight_bytes_unshared'] / mib:.0f} MiB loaded apart "
      f"({stats['blocks_unique']} of {stats['blocks']} blocks distinct); "
      f"ps {(ps_stats['weight_bytes'] + full * one_stats['weight_bytes']) / mib:.0f} MiB")
PY
