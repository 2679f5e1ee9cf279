#!/usr/bin/env bash
# BlendServe and BROS in one process (issue 24): Batch API jobs on `blend serve --scheduler hybrid`
# with real-time traffic beside them, the batch planner on (--batch-policy blend) and off
# (--batch-policy fcfs: every line queued at once in file order, as before the planner).
#
#   bench/planned_batch_serve.sh [BLEND] [WORK_DIR]
#
# Each run starts a fresh server, then for DURATION seconds at once:
#   - real-time load: `blend bench serve --url ... --be-batch 0` (Poisson streamed completions,
#     ShareGPT lengths x LENGTH_SCALE, TTFT/TPOT attainment against its default SLOs);
#   - best-effort load: one Batch API job (DOCS documents x QUESTIONS questions, each line the
#     whole document plus its question; half the lines want 8 tokens, half 96; ignore_eos;
#     the lines in shuffled order), resubmitted as soon as it completes; the job running at the
#     end is cancelled. BE job tokens/s = the job's prompt + output tokens / the time from its
#     creation to its completion (median over its completed jobs per run, then over runs); BE
#     window tokens/s = prompt + output tokens of the BE lines finished in the window (the
#     server's /metrics counters) / the window (partly done lines of the last job not counted).
# Runs alternate between the policies (blend, fcfs, blend, ...), RUNS of each; the summary gives
# the median of each figure. One JSON line per run goes to WORK_DIR/runs.jsonl.
# Knobs (environment): PRESET (smollm-135m), RUNS (3), DURATION (120), RT_RATE (1),
# LENGTH_SCALE (0.1), KV_GB (0.19), THREADS (2), DOCS (12), QUESTIONS (8), DOC_WORDS (200),
# POLICIES ("blend fcfs").
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BLEND=$(realpath "${1:-$ROOT/build/blend}")
WORK=${2:-$(mktemp -d)}
PRESET=${PRESET:-smollm-135m}
RUNS=${RUNS:-3}
DURATION=${DURATION:-120}
RT_RATE=${RT_RATE:-1}
LENGTH_SCALE=${LENGTH_SCALE:-0.1}
KV_GB=${KV_GB:-0.19}
THREADS=${THREADS:-2}
DOCS=${DOCS:-12}
QUESTIONS=${QUESTIONS:-8}
DOC_WORDS=${DOC_WORDS:-200}
POLICIES=${POLICIES:-"blend fcfs"}
mkdir -p "$WORK"
WORK=$(realpath "$WORK")
cd "$WORK"

[[ -d model ]] || "$BLEND" model init --preset "$PRESET" --out model --seed 7 >/dev/null
python3 - "$DOCS" "$QUESTIONS" "$DOC_WORDS" >job.jsonl <<'PY'
import json, random, sys
docs, questions, words = (int(a) for a in sys.argv[1:4])
rng = random.Random(1)
vocab = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
         "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo"]
lines = []
for d in range(docs):
    doc = f"Document {d}: " + " ".join(rng.choice(vocab) + str(rng.randrange(1000))
                                       for _ in range(words))
    for q in range(questions):
        lines.append({"custom_id": f"d{d}-q{q}", "method": "POST", "url": "/v1/completions",
                      "body": {"model": "model",
                               "prompt": f"{doc}\nQuestion {q}: what does part {q} say?\nAnswer:",
                               "max_tokens": 8 if q % 2 == 0 else 96, "temperature": 0,
                               "ignore_eos": True}})
rng.shuffle(lines)
for line in lines:
    print(json.dumps(line))
PY

# One run: POLICY RUN -> one JSON line on stdout.
one_run() {
  local policy=$1 run=$2 data="$WORK/data-$1-$2"
  rm -rf "$data"
  "$BLEND" serve --model model --port 0 --scheduler hybrid --batch-policy "$policy" \
    --kv-memory "$KV_GB" --threads "$THREADS" --quiet --data-dir "$data" 2>"serve-$policy-$run.log" &
  local server=$!
  local port=""
  for _ in $(seq 1 600); do
    port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "serve-$policy-$run.log")
    [[ -n $port ]] && break
    sleep 0.1
  done
  [[ -n $port ]] || { echo "the server did not start" >&2; kill "$server"; exit 1; }
  "$BLEND" bench serve --url "http://127.0.0.1:$port" --scheduler hybrid --rt-rate "$RT_RATE" \
    --duration "$DURATION" --be-batch 0 --length-scale "$LENGTH_SCALE" --seed "$run" --json \
    >"rt-$policy-$run.json" 2>"rt-$policy-$run.log" &
  local rt=$!
  python3 - "$port" "$DURATION" >"be-$policy-$run.json" <<'PY'
import json, re, sys, time, urllib.request, uuid
port, duration = int(sys.argv[1]), float(sys.argv[2])
base = f"http://127.0.0.1:{port}"

def call(method, path, body=None, headers=None):
    req = urllib.request.Request(base + path, data=body, method=method, headers=headers or {})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read()

def be_counters():
    text = call("GET", "/metrics").decode()
    total = {"tokens": 0.0, "requests": 0.0}
    for name in ("prefix_cache_hit_ratio", "num_preemptions_total", "iterations_total"):
        m = re.search(r"^blend:" + name + r" (\S+)$", text, re.M)
        total[name] = float(m.group(1)) if m else 0.0
    for line in text.splitlines():
        m = re.match(r'blend:(prompt_tokens_total|generation_tokens_total|request_success_total)'
                     r'\{class="be"[^}]*\} (\S+)', line)
        if m:
            total["requests" if m.group(1) == "request_success_total" else "tokens"] += float(m.group(2))
    return total

boundary = uuid.uuid4().hex
content = open("job.jsonl", "rb").read()
form = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
        f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"job.jsonl\"\r\n"
        f"Content-Type: application/jsonl\r\n\r\n").encode() + content + f"\r\n--{boundary}--\r\n".encode()
file_id = json.loads(call("POST", "/v1/files", form,
                          {"Content-Type": f"multipart/form-data; boundary={boundary}"}))["id"]
start = time.monotonic()
before = be_counters()
jobs, job_seconds, job_tokens, batch = 0, [], 0, None
while time.monotonic() - start < duration:
    t0 = time.monotonic()
    batch = json.loads(call("POST", "/v1/batches", json.dumps(
        {"input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "24h"}).encode(),
        {"Content-Type": "application/json"}))
    jobs += 1
    while time.monotonic() - start < duration:
        batch = json.loads(call("GET", "/v1/batches/" + batch["id"]))
        if batch["status"] in ("completed", "failed", "cancelled"):
            break
        time.sleep(0.05)
    if batch["status"] == "completed":
        job_seconds.append(time.monotonic() - t0)
        if job_tokens == 0:  # prompt + output tokens of one job, from its results
            for line in call("GET", f"/v1/files/{batch['output_file_id']}/content").splitlines():
                job_tokens += json.loads(line)["response"]["body"]["usage"]["total_tokens"]
        batch = None
window = time.monotonic() - start
after = be_counters()
if batch is not None:
    call("POST", "/v1/batches/" + batch["id"] + "/cancel", b"{}", {"Content-Type": "application/json"})
tokens = after["tokens"] - before["tokens"]
print(json.dumps({"be_jobs": jobs, "be_jobs_completed": len(job_seconds),
                  "be_job_seconds": job_seconds, "be_job_tokens": job_tokens,
                  "be_requests": after["requests"] - before["requests"], "be_tokens": tokens,
                  "be_tokens_per_s": tokens / window, "be_window_s": window,
                  # the server's since its start (RT prompts included), at the window's end
                  "prefix_cache_hit_ratio": after["prefix_cache_hit_ratio"],
                  "preemptions": after["num_preemptions_total"], "steps": after["iterations_total"]}))
PY
  wait "$rt"
  kill "$server"
  wait "$server" || true
  python3 - "$policy" "$run" "rt-$policy-$run.json" "be-$policy-$run.json" <<'PY'
import json, sys
policy, run, rt_file, be_file = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rt = json.loads(open(rt_file).read().strip().splitlines()[-1])
out = {"batch_policy": policy, "run": run}
out.update(json.load(open(be_file)))
for k in ("rt_requests", "rt_failed", "ttft_attainment", "tpot_attainment", "ttft_p50_s",
          "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "rt_normalized_latency_s"):
    out[k] = rt[k]
print(json.dumps(out))
PY
}

: >runs.jsonl
echo "start: $(date -Is); $(uptime)"
for run in $(seq 1 "$RUNS"); do
  for policy in $POLICIES; do
    one_run "$policy" "$run" | tee -a runs.jsonl
  done
done

python3 - <<'PY'
import json, statistics
runs = [json.loads(l) for l in open("runs.jsonl")]
print("\n| --batch-policy | runs | jobs done | BE job s | BE job tokens/s | BE window tokens/s | "
      "TTFT attain | TPOT attain | TTFT p50 / p99 s | RT req | prefix hit | preemptions |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for policy in dict.fromkeys(r["batch_policy"] for r in runs):
    rs = [r for r in runs if r["batch_policy"] == policy]
    med = lambda k: statistics.median(r[k] for r in rs)
    # Per run: its completed jobs' median time; then the median over runs.
    per_run = [statistics.median(r["be_job_seconds"]) for r in rs if r["be_job_seconds"]]
    tokens = max(r["be_job_tokens"] for r in rs)
    job = f"{statistics.median(per_run):.1f}" if per_run else "-"
    rate = f"{tokens / statistics.median(per_run):.0f}" if per_run else "-"
    done = sum(r["be_jobs_completed"] for r in rs)
    print(f"| {policy} | {len(rs)} | {done} | {job} | {rate} | {med('be_tokens_per_s'):.0f} | "
          f"{100 * med('ttft_attainment'):.1f}% | {100 * med('tpot_attainment'):.1f}% | "
          f"{med('ttft_p50_s'):.3f} / {med('ttft_p99_s'):.3f} | {med('rt_requests'):.0f} | "
          f"{med('prefix_cache_hit_ratio'):.3f} | {med('preemptions'):.0f} |")
PY
echo "end: $(date -Is); $(uptime)"
echo "(runs in $WORK/runs.jsonl)"
