#!/usr/bin/env python3
"""NanoFlow's online experiment (§6.4, Fig. 11/12) and per-step resource usage (Fig. 14) on
blend's engine, for one nano-batch combination at a time (bench/gpu/online_run.sh sets each
combination's BLEND_CUDA_* environment and calls this once per combination, then --report).

One call (a combination, its label given by --combo):
 1. `blend serve --backend B --scheduler fcfs` on the model folder, on a free port.
 2. Per --rates rate: `blend bench serve --url` with Poisson arrivals of ShareGPT-like requests
    (the repository's data/traces lengths, prompts longer than --max-context skipped) for
    --duration seconds and no best-effort jobs; its JSON (normalized latency = a request's
    end-to-end latency over its output tokens, averaged; TTFT and TPOT percentiles) and the
    latency CDF plot (--plot) go to OUT.
 3. The server is stopped, and `blend batch --step-timings` runs --timeline-work
    (requests:prompt:output) at --budget tokens a step: each step's shape and time for the
    resource-usage timeline.

--report: OUT/online.md, normalized latency against rate per combination, and per combination
the steps' compute and memory use: compute = the step's FLOPs (2 x matmul parameters per token,
plus attention's 4 x layers x q_dim per query-key pair) over the step time at the GPU's measured
bf16 GEMM peak; memory = the bytes it must read (the weights once, the KV cache of every decode's
context) over the step time at the measured copy bandwidth. Both peaks are measured by torch in
the same run (--no-torch: give --peak-flops and --bandwidth, or the columns are left out).

  python3 bench/gpu/online.py BLEND OUT --model DIR --combo off/default/0 [--backend cuda] ...
  python3 bench/gpu/online.py BLEND OUT --model DIR --report
"""

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from steplog import StepLog  # noqa: E402
from throughput import gemm_peak, last_json, write_workload  # noqa: E402

STEPS = StepLog("online")
log, attempt = STEPS.log, STEPS.attempt


def tag_of(combo):
    return combo.replace("/", "-")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port, proc, timeout):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return time.time() - t0
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server was not healthy after {timeout} s")


def serve_and_bench(a, out):
    tag = tag_of(a.combo)
    port = free_port()
    data_dir = os.path.join(out, f"serve-data-{tag}")
    cmd = [a.blend, "serve", "--backend", a.backend, "--model", a.model, "--port", str(port),
           "--scheduler", "fcfs", "--max-batch-tokens", str(a.budget), "--max-running",
           str(a.max_running), "--data-dir", data_dir, "--quiet"]
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    log("$ " + " ".join(cmd))
    with open(os.path.join(out, f"serve-{tag}.log"), "w") as server_log:
        proc = subprocess.Popen(cmd, stdout=server_log, stderr=subprocess.STDOUT)
        try:
            log(f"  healthy after {wait_healthy(port, proc, a.load_timeout):.1f} s")
            for rate in a.rates:
                def bench(rate=rate):
                    c = [a.blend, "bench", "serve", "--url", f"http://127.0.0.1:{port}",
                         "--scheduler", "fcfs", "--duration", str(a.duration), "--rt-rate",
                         str(rate), "--be-batch", "0", "--json", "--max-in-flight",
                         str(a.max_in_flight), "--max-context", str(a.max_context), "--seed",
                         str(a.seed), "--drain-timeout", str(a.drain_timeout), "--plot",
                         os.path.join(out, f"cdf-{tag}-{rate:g}.png")]
                    if a.traces:
                        c += ["--traces", a.traces]
                    p = subprocess.run(c, capture_output=True, text=True,
                                       timeout=a.duration + a.drain_timeout + 120)
                    if p.returncode != 0:
                        raise RuntimeError(p.stderr.strip()[-400:])
                    j = last_json(p.stdout)
                    j.update({"combo": a.combo, "rate": rate})
                    with open(os.path.join(out, "online.jsonl"), "a") as f:
                        f.write(json.dumps(j) + "\n")
                    log(f"  rate {rate:g}/s: normalized latency "
                        f"{j['rt_normalized_latency_s'] * 1e3:.1f} ms/token, TTFT p50 "
                        f"{j['ttft_p50_s'] * 1e3:.0f} ms, {j['rt_output_tokens_per_s']:.0f} "
                        f"output tokens/s, {j['rt_failed']} failed")
                attempt(f"{a.combo}: rate {rate:g}/s for {a.duration:g} s", bench)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def timeline_run(a, out):
    n, prompt, output = (int(x) for x in a.timeline_work.split(":"))
    tag = tag_of(a.combo)
    work = os.path.join(out, f"timeline-{tag}")
    os.makedirs(work, exist_ok=True)
    inp = os.path.join(work, "in.jsonl")
    write_workload(inp, n, prompt, output, a.seed, os.path.basename(a.model.rstrip("/")))
    cmd = [a.blend, "batch", "--backend", a.backend, "--model", a.model, "--input", inp,
           "--output", os.path.join(work, "out.jsonl"), "--policy", "fcfs",
           "--max-batch-tokens", str(a.budget), "--max-running", str(a.max_running),
           "--step-timings", os.path.join(out, f"steps-{tag}.jsonl"), "--quiet"]
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    log("$ " + " ".join(cmd))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeline_timeout)
    if p.returncode != 0:
        raise RuntimeError(p.stderr.strip()[-400:])


def child_peaks():
    """The GPU's bf16 GEMM peak (throughput.py's) and copy bandwidth (1 GiB device to device,
    bytes read + written per second, 10 timed copies after 3 warm-ups)."""
    import torch
    flops, _ = gemm_peak()
    src = torch.empty(1 << 29, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(10):
        dst.copy_(src)
    e.record()
    torch.cuda.synchronize()
    bandwidth = 2.0 * src.numel() * 2 * 10 / (s.elapsed_time(e) / 1000.0)
    print(json.dumps({"device": torch.cuda.get_device_name(0), "peak_flops": flops,
                      "bandwidth": bandwidth}))


def model_costs(model_dir):
    """Matmul parameters, bytes of the weights (bf16), attention FLOPs per query-key pair and
    KV bytes per cached token, from config.json."""
    c = json.load(open(os.path.join(model_dir, "config.json")))
    h, f, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    heads = c["num_attention_heads"]
    head_dim = c.get("head_dim") or h // heads
    kv_heads = c.get("num_key_value_heads", heads)
    q, kv = heads * head_dim, kv_heads * head_dim
    params = layers * (h * (q + 2 * kv) + q * h + 3 * h * f) + c["vocab_size"] * h
    return {"params": params, "weight_bytes": 2 * params, "attention_flops_per_pair":
            4 * layers * q, "kv_bytes_per_token": 2 * layers * kv * 2}


def step_usage(step, costs, peak_flops, bandwidth):
    tokens = step["prefill_tokens"] + step["decode_tokens"]
    flops = 2 * costs["params"] * tokens + costs["attention_flops_per_pair"] * (
        step.get("prefill_attention_pairs", 0) + step["decode_context_tokens"])
    reads = costs["weight_bytes"] + costs["kv_bytes_per_token"] * step["decode_context_tokens"]
    s = step["seconds"]
    return flops / (peak_flops * s), reads / (bandwidth * s)


def report(a, out):
    runs = []
    path = os.path.join(out, "online.jsonl")
    if os.path.exists(path):
        runs = [json.loads(line) for line in open(path) if line.strip()]
    peaks = {}
    peaks_path = os.path.join(out, "peaks.json")
    if os.path.exists(peaks_path):
        peaks = json.load(open(peaks_path))
    peak_flops = a.peak_flops or peaks.get("peak_flops")
    bandwidth = a.bandwidth or peaks.get("bandwidth")
    lines = [f"# Online latency and per-step resource use ({peaks.get('device', a.backend)})", "",
             "Normalized latency: a request's end-to-end latency over its output tokens, "
             "mean over the requests (NanoFlow Fig. 11).", ""]
    combos = list(dict.fromkeys(r["combo"] for r in runs))
    rates = sorted({r["rate"] for r in runs})
    if runs:
        lines += ["| rate (req/s) | " + " | ".join(combos) + " |",
                  "| --- |" + " --- |" * len(combos)]
        for rate in rates:
            cells = []
            for c in combos:
                r = [x for x in runs if x["combo"] == c and x["rate"] == rate]
                cells.append(f"{r[0]['rt_normalized_latency_s'] * 1e3:.1f} ms/token "
                             f"(TTFT p50 {r[0]['ttft_p50_s'] * 1e3:.0f} ms, p99 "
                             f"{r[0]['ttft_p99_s'] * 1e3:.0f}; {r[0]['rt_output_tokens_per_s']:.0f}"
                             f" tok/s; {r[0]['rt_failed']} failed)" if r else "-")
            lines.append(f"| {rate:g} | " + " | ".join(cells) + " |")
        lines.append("")
    costs = model_costs(a.model)
    lines += ["Per-step resource use of `blend batch --step-timings` on "
              f"{a.timeline_work} (requests:prompt:output), {a.budget} tokens a step "
              "(NanoFlow Fig. 14's compute and memory use, per step): medians.", "",
              "| combination | steps | step ms | tokens | compute use | memory use | sum |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for name in sorted(os.listdir(out)):
        if not (name.startswith("steps-") and name.endswith(".jsonl")):
            continue
        steps = [json.loads(line) for line in open(os.path.join(out, name)) if line.strip()]
        steps = steps[1:] or steps  # the first carries the backend's start-up
        if not steps:
            continue
        tag = name[len("steps-"):-len(".jsonl")]
        tsv = os.path.join(out, f"timeline-{tag}.tsv")
        use = []
        with open(tsv, "w") as f:
            f.write("step\tseconds\tprefill_tokens\tdecode_tokens\tdecode_context\tcompute\tmemory\n")
            for i, s in enumerate(steps):
                cu, mu = step_usage(s, costs, peak_flops, bandwidth) if peak_flops and bandwidth \
                    else (float("nan"), float("nan"))
                use.append((cu, mu))
                f.write(f"{i}\t{s['seconds']:.6f}\t{s['prefill_tokens']}\t{s['decode_tokens']}\t"
                        f"{s['decode_context_tokens']}\t{cu:.4f}\t{mu:.4f}\n")
        med = statistics.median
        cu, mu = med(u[0] for u in use), med(u[1] for u in use)
        tokens = med(s["prefill_tokens"] + s["decode_tokens"] for s in steps)
        lines.append(f"| {tag} | {len(steps)} | {med(s['seconds'] for s in steps) * 1e3:.2f} | "
                     f"{tokens:.0f} | {cu:.2f} | {mu:.2f} | {cu + mu:.2f} |")
    if not (peak_flops and bandwidth):
        lines += ["", "No peaks measured (--no-torch without --peak-flops/--bandwidth): the use "
                  "columns are empty."]
    else:
        source = ("given (--peak-flops, --bandwidth), not measured" if a.peak_flops or a.bandwidth
                  else "measured by torch in this run")
        lines += ["", f"Peaks {source}: {peak_flops / 1e12:.3g} TFLOP/s bf16 GEMM, "
                  f"{bandwidth / 1e9:.3g} GB/s copy; {costs['params'] / 1e9:.3g}B matmul "
                  "parameters. A sum above 1 is compute and memory overlapped (or a peak "
                  "below the step's own rate)."]
    with open(os.path.join(out, "online.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child-peaks":
        return child_peaks()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("blend")
    ap.add_argument("out")
    ap.add_argument("--model", required=True)
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--combo", default="", help="this call's combination label")
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--rates", default="4,8,16,32")
    ap.add_argument("--duration", type=float, default=30)
    ap.add_argument("--drain-timeout", type=float, default=60)
    ap.add_argument("--max-in-flight", type=int, default=1024)
    ap.add_argument("--max-context", type=int, default=2048)
    ap.add_argument("--budget", type=int, default=2048, help="--max-batch-tokens")
    ap.add_argument("--max-running", type=int, default=512)
    ap.add_argument("--threads", type=int, default=0, help="cpu backend threads")
    ap.add_argument("--traces", default="", help="trace folder (default: the repository's)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--load-timeout", type=float, default=300)
    ap.add_argument("--timeline-work", default="512:512:256")
    ap.add_argument("--timeline-timeout", type=float, default=180)
    ap.add_argument("--no-timeline", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--peak-flops", type=float, default=0)
    ap.add_argument("--bandwidth", type=float, default=0)
    a = ap.parse_args()
    a.rates = [float(x) for x in a.rates.split(",") if x]
    os.makedirs(a.out, exist_ok=True)
    STEPS.file = os.path.join(a.out, "online.log")
    if a.report:
        return report(a, a.out)
    if not a.combo:
        ap.error("--combo names this call's combination (or --report)")
    peaks_path = os.path.join(a.out, "peaks.json")
    if not a.no_torch and not os.path.exists(peaks_path):
        def peaks():
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child-peaks"],
                               capture_output=True, text=True, timeout=300)
            if p.returncode != 0:
                raise RuntimeError(p.stderr.strip()[-400:])
            j = last_json(p.stdout)
            json.dump(j, open(peaks_path, "w"))
            log(f"  {j['device']}: {j['peak_flops'] / 1e12:.0f} TFLOP/s, "
                f"{j['bandwidth'] / 1e9:.0f} GB/s")
        attempt("torch: GEMM peak and copy bandwidth", peaks)
    attempt(f"{a.combo}: online runs", serve_and_bench, a, a.out)
    if not a.no_timeline:
        attempt(f"{a.combo}: step timeline", timeline_run, a, a.out)


if __name__ == "__main__":
    main()
