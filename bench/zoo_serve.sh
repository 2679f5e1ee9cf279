#!/usr/bin/env bash
# BlockLLM's online experiment (issue 30, BlockLLM §6) on this machine: TENANTS fine-tunes of one
# base under Poisson arrivals with skewed popularity, served three ways within the same machine:
#   zoo        one `blend serve --zoo`: shared blocks run once over every tenant's rows
#              (BlockLLM's per-block batching);
#   ps         parameter sharing as S-LoRA does it (BlockLLM's PS baseline): one server for the
#              base and its LoRA tenants (one base GEMM, each adapter's delta on its rows), and
#              one server per full fine-tune;
#   per-model  one server per tenant (per-model provisioning: nothing shared between tenants);
#   zoo-adaptive  the zoo with BlockLLM's adaptive serving for every request (`--adaptive-blocks`
#              from `blend zoo analyze --threshold THRESHOLD`, `--adaptive-serving all`): outputs
#              change (bench/zoo_adaptive.sh measures how much).
# Each server gets THREADS compute threads (the machine's cores are shared by all of a
# deployment's servers, as a GPU is shared by its tenants' instances) and the KV memory is split
# evenly: KV_GB in all per deployment. For each RATE the load is `blend bench serve --url ...
# --models t1,...,tN --zipf ZIPF --model-port ...` (tenant i asked with probability ~ 1/i^ZIPF;
# ShareGPT lengths times LENGTH_SCALE; streamed, ignore_eos), DURATION seconds, the same seed for
# every deployment. Prints per deployment and rate: finished / issued requests, output tokens/s,
# end-to-end p50 / p95, TTFT p95, and the servers' anonymous resident memory (RssAnon summed at
# the end: packed weights, KV pool and the rest; the checkpoints' mapped file pages, which the
# content hashing touches, are left out).
#
#   bench/zoo_serve.sh                      # 20 tenants, odd LoRA, even full (layers 0-3)
#   TENANTS=4 RATES="1 2" DURATION=20 bench/zoo_serve.sh
#
# Knobs (environment): BLEND (build/blend), OUT_DIR (build/zoo_serve), PRESET (smollm-135m),
# DTYPE (bf16), KIND (mix | full | lora), TENANTS (20), LAYERS ("0 1 2 3"), RANK (8), TARGETS
# (q_proj,v_proj), RATES ("0.5 1 2"), DURATION (60), LENGTH_SCALE (0.25), ZIPF (1), THREADS (2),
# KV_GB (2), DEPLOYMENTS ("zoo ps per-model"), SERVE_ARGS (more flags for every server, e.g.
# "--scheduler fcfs"; the default scheduler is hybrid), THRESHOLD (0.98, zoo-adaptive), SCALE (1: the
# full fine-tunes' `derive --scale`), INIT_ARGS (more `model init` flags for the base, e.g.
# --untie-embeddings, which zoo-adaptive needs: a random tied head makes every block equivalent).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BLEND=${BLEND:-$ROOT/build/blend}
OUT_DIR=${OUT_DIR:-$ROOT/build/zoo_serve}
PRESET=${PRESET:-smollm-135m}
DTYPE=${DTYPE:-bf16}
KIND=${KIND:-mix}
TENANTS=${TENANTS:-20}
LAYERS=${LAYERS:-0 1 2 3}
RANK=${RANK:-8}
TARGETS=${TARGETS:-q_proj,v_proj}
RATES=${RATES:-0.5 1 2}
DURATION=${DURATION:-60}
LENGTH_SCALE=${LENGTH_SCALE:-0.25}
ZIPF=${ZIPF:-1}
THREADS=${THREADS:-2}
KV_GB=${KV_GB:-2}
DEPLOYMENTS=${DEPLOYMENTS:-zoo ps per-model}
read -r -a serve_args <<<"${SERVE_ARGS:-}"
need_blend_and_python
mkdir -p "$OUT_DIR"
zoo=$OUT_DIR/zoo
make_tenants "$zoo"
tenants=("${models[@]:1}")
rm -rf "$OUT_DIR/zoo-ps"
mkdir -p "$OUT_DIR/zoo-ps"
for m in "${ps_models[@]}"; do ln -s "$(realpath "$zoo/$m")" "$OUT_DIR/zoo-ps/$m"; done
results=$OUT_DIR/results.jsonl
: >"$results"
echo "== machine: $(cpu_model), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg);" \
  "$PRESET $DTYPE, ${#tenants[@]} tenants ($KIND: ${#full_models[@]} full, layers $LAYERS;" \
  "$((${#ps_models[@]} - 1)) LoRA r $RANK on $TARGETS), zipf $ZIPF, lengths x$LENGTH_SCALE," \
  "$DURATION s per rate, $THREADS threads and $KV_GB GB of KV per deployment"

pids=() ports=()
stop_servers() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=() ports=()
}
trap stop_servers EXIT
# serve NAME KV_GB ARGS...: one server of the deployment; records its pid and port.
serve() {
  local name=$1 kv=$2
  shift 2
  start_server "$OUT_DIR/serve-$name.log" "$@" --threads "$THREADS" --kv-memory "$kv" \
    --threads-http 32 --data-dir "$OUT_DIR/data-$name" --quiet ${serve_args[@]+"${serve_args[@]}"}
  pids+=("$server_pid")
  ports+=("$name=$server_port")
}
rss_mib() {
  local sum=0 kb
  for p in "${pids[@]}"; do
    kb=$(awk '/^RssAnon:/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)
    sum=$((sum + ${kb:-0}))
  done
  echo $((sum / 1024))
}

for deployment in $DEPLOYMENTS; do
  rm -rf "$OUT_DIR"/data-*
  case $deployment in
    zoo) serve zoo "$KV_GB" --zoo "$zoo" ;;
    zoo-adaptive)
      "$BLEND" zoo analyze --zoo "$zoo" --threads "$THREADS" --threshold "${THRESHOLD:-0.98}" \
        --out "$OUT_DIR/eq.json" >"$OUT_DIR/analyze.txt" 2>&1 ||
        die "blend zoo analyze failed; see $OUT_DIR/analyze.txt"
      serve zoo-adaptive "$KV_GB" --zoo "$zoo" --adaptive-blocks "$OUT_DIR/eq.json" \
        --adaptive-serving all
      ;;
    ps)
      servers=$((1 + ${#full_models[@]}))
      kv=$(python3 -c "print($KV_GB / $servers)")
      serve ps-shared "$kv" --zoo "$OUT_DIR/zoo-ps"
      for m in "${full_models[@]}"; do serve "$m" "$kv" --model "$zoo/$m"; done
      ;;
    per-model)
      kv=$(python3 -c "print($KV_GB / ${#tenants[@]})")
      for m in "${tenants[@]}"; do serve "$m" "$kv" --model "$zoo/$m"; done
      ;;
    *) die "unknown deployment $deployment (zoo, ps, per-model, zoo-adaptive)" ;;
  esac
  main_port=${ports[0]#*=}
  route=()
  for entry in "${ports[@]:1}"; do route+=(--model-port "$entry"); done
  for rate in $RATES; do
    "$BLEND" bench serve --url "http://127.0.0.1:$main_port" --scheduler "$deployment" \
      --models "$(IFS=,; echo "${tenants[*]}")" --zipf "$ZIPF" ${route[@]+"${route[@]}"} \
      --rt-rate "$rate" --duration "$DURATION" --be-batch 0 --length-scale "$LENGTH_SCALE" \
      --max-in-flight 256 --seed 1 --json >"$OUT_DIR/load.json" 2>"$OUT_DIR/load-$deployment-$rate.log" ||
      die "blend bench serve failed; see $OUT_DIR/load-$deployment-$rate.log"
    python3 - "$OUT_DIR/load.json" "$(rss_mib)" "${#pids[@]}" >>"$results" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
j["rss_mib"], j["servers"] = int(sys.argv[2]), int(sys.argv[3])
print(json.dumps(j))
PY
    tail -1 "$results" | python3 -c '
import json, sys
j = json.loads(sys.stdin.read())
done = j["rt_requests"] - j["rt_failed"]
print("%-10s rate %4s: %d/%d finished, %.1f output tok/s, e2e p50 %.2f p95 %.2f s, TTFT p95 %.2f s;"
      " %d server(s), %d MiB resident" % (j["policy"], j["rt_rate"], done, j["rt_requests"],
      j["rt_output_tokens_per_s"], j["e2e_p50_s"], j["e2e_p95_s"], j["ttft_p95_s"], j["servers"],
      j["rss_mib"]))'
  done
  stop_servers
done

python3 - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {(r["policy"], r["rt_rate"]): r for r in rows}
rates = sorted({r["rt_rate"] for r in rows})
print("\nrate | deployment | finished | output tok/s | e2e p95 s | TTFT p95 s | resident MiB")
for rate in rates:
    for d in ("zoo", "ps", "per-model"):
        r = by.get((d, rate))
        if r:
            print(f"{rate} | {d} | {r['rt_requests'] - r['rt_failed']}/{r['rt_requests']} | "
                  f"{r['rt_output_tokens_per_s']:.1f} | {r['e2e_p95_s']:.2f} | {r['ttft_p95_s']:.2f} | {r['rss_mib']}")
    z = by.get(("zoo", rate))
    for d in ("ps", "per-model"):
        o = by.get((d, rate))
        if z and o and o["rt_output_tokens_per_s"] > 0 and o["e2e_p95_s"] > 0:
            print(f"{rate} | zoo / {d}: throughput {z['rt_output_tokens_per_s'] / o['rt_output_tokens_per_s']:.2f}x, "
                  f"p95 {100 * (1 - z['e2e_p95_s'] / o['e2e_p95_s']):.0f}% lower")
PY
