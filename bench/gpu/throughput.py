#!/usr/bin/env python3
"""Offline throughput of blend's cuda backend on a Llama-3-8B-shaped model, against the GPU's
dense bf16 GEMM peak (NanoFlow eq. 9) and against transformers on the same folder.

bench/gpu/throughput.sh runs this on the lent GPU machine. Steps (each prints what it does; a
failing step is reported and the next one runs):

 1. `blend model init --preset llama-3-8b --allow-large` into WORK/model (bf16, 16 GB; reused
    when a finished one is there) and `blend model info` for its parameter count P.
 2. Peak dense bf16 GEMM: torch, 8192^3 matmul, 10 timed after 3 warm-ups (a child process, so
    the GPU is free again for blend).
 3. Per --max-batch-tokens budget (512, 1024, 2048): a Batch API file of N requests of 1024
    random prompt token ids and 512 output tokens (ignore_eos, temperature 0), `blend batch
    --backend cuda`, tokens/s from its --stats; fraction of optimal = tokens/s / (peak / 2P).
    N grows with the budget (128, 256, 512) but is cut so that a run is predicted, from the
    previous run's rate, to take at most --run-cap seconds; a run past twice that is stopped
    and its finished requests counted (marked partial).
 4. transformers peer (a child process): the same folder in bf16 with sdpa attention, batched
    generate of 512-token prompts with 128 new tokens at batch 64 and 256 (an OOM is reported),
    tokens/s = batch x (prompt + new tokens) / wall.

Output: OUT/throughput.md (the table), OUT/throughput.json, OUT/throughput/ (logs, stats; the
request and result files stay in WORK/runs).

  python3 bench/gpu/throughput.py BLEND OUT [--quick] [--work DIR] [...]
  python3 bench/gpu/throughput.py BLEND OUT --no-torch --backend cpu --preset tiny \\
      --prompt 64 --output 16 --requests 8,8,8          # here: blend's half on the cpu backend
"""

import argparse
import json
import math
import os
import random
import shlex
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from steplog import StepLog  # noqa: E402

H100_H200_DENSE_BF16 = 989e12  # datasheet, SXM, dense


STEPS = StepLog("throughput")
log, attempt = STEPS.log, STEPS.attempt


def run(cmd, log_path, timeout):
    log("$ " + " ".join(shlex.quote(c) for c in cmd))
    with open(log_path, "w") as f:
        f.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
        f.flush()
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    if p.returncode != 0:
        with open(log_path) as f:
            tail = f.read().strip().splitlines()[-5:]
        raise RuntimeError(f"exit {p.returncode}: " + " | ".join(tail))


def child(mode, args, log_path, timeout):
    """Runs this script as a child (--child MODE): torch in its own process; its last stdout
    line is a JSON object."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode] + args
    log("$ " + " ".join(shlex.quote(c) for c in cmd))
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    with open(log_path, "w") as f:
        f.write(p.stdout)
    for line in p.stdout.strip().splitlines():
        log(f"  {mode}: {line}")
    if p.returncode != 0:
        raise RuntimeError(f"exit {p.returncode}")
    return last_json(p.stdout)


def last_json(text):
    """The last line of `text` that is a JSON object (warnings may follow it)."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    raise RuntimeError("no JSON result line")


# ----------------------------------------------------------------------------------------------
# Children (torch)


def gemm_peak():
    """The GPU's dense bf16 GEMM rate: 10 timed 8192^3 matmuls after 3 warm-ups (in a child:
    torch holds GPU memory). Returns (FLOP/s, seconds of the 10)."""
    import torch
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        torch.matmul(a, b, out=c)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000.0
    return 2.0 * n ** 3 * 10 / seconds, seconds


def child_gemm():
    import torch
    n = 8192
    flops, seconds = gemm_peak()
    name = torch.cuda.get_device_name(0)
    print(f"{name}: 10 x {n}^3 bf16 matmul in {seconds * 1000:.1f} ms = {flops / 1e12:.1f} TFLOP/s")
    print(json.dumps({"device": name, "peak_flops": flops, "seconds": seconds, "torch": torch.__version__}))


def child_hf(model_dir, batches, prompt, new, seed):
    import torch
    import transformers
    t0 = time.time()
    model, last = None, None
    # transformers 5 names the argument dtype; 4 torch_dtype (and keeps an unknown one quietly);
    # device_map="cuda" loads straight to the GPU where it works (4 needs accelerate for it).
    for key in ("dtype", "torch_dtype"):
        for extra in ({"device_map": "cuda"}, {}):
            try:
                m = transformers.AutoModelForCausalLM.from_pretrained(
                    model_dir, attn_implementation="sdpa", **{key: torch.bfloat16}, **extra)
            except Exception as e:  # noqa: BLE001 - the next way may work
                last = e
                print(f"load with {key}, {extra or 'no device_map'}: {type(e).__name__}: {e}",
                      flush=True)
                continue
            if next(m.parameters()).dtype == torch.bfloat16:
                model = m
                break
            del m
        if model is not None:
            break
    if model is None:
        raise RuntimeError(f"could not load {model_dir} in bf16: {last}")
    model = model.to("cuda").eval()
    print(f"transformers {transformers.__version__}: loaded {model_dir} "
          f"({next(model.parameters()).dtype}, attention "
          f"{getattr(model.config, '_attn_implementation', '?')}) in {time.time() - t0:.1f} s",
          flush=True)
    g = torch.Generator().manual_seed(seed)
    pad = 128001

    def generate(batch, p, n):
        ids = torch.randint(1000, 120000, (batch, p), generator=g).to("cuda")
        mask = torch.ones_like(ids)
        torch.cuda.synchronize()
        t = time.time()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n,
                                 min_new_tokens=n, do_sample=False, pad_token_id=pad)
        torch.cuda.synchronize()
        return time.time() - t, out.shape[1] - p

    try:
        generate(2, 16, 8)  # warm-up: kernels, allocator
    except Exception as e:  # noqa: BLE001
        print(f"warm-up failed: {type(e).__name__}: {e}", flush=True)
    results = []
    for batch in batches:
        try:
            wall, made = generate(batch, prompt, new)
            tokens = batch * (prompt + made)
            r = {"batch": batch, "wall_seconds": wall, "new_tokens": made,
                 "tokens_per_s": tokens / wall, "output_tokens_per_s": batch * made / wall,
                 "peak_memory_gb": torch.cuda.max_memory_allocated() / 1e9}
            print(f"batch {batch}: {batch} x ({prompt} + {made}) tokens in {wall:.2f} s = "
                  f"{r['tokens_per_s']:.0f} tokens/s (peak memory {r['peak_memory_gb']:.1f} GB)",
                  flush=True)
        except torch.cuda.OutOfMemoryError as e:
            r = {"batch": batch, "error": "OOM: " + str(e).splitlines()[0][:200]}
            print(f"batch {batch}: out of memory", flush=True)
        except Exception as e:  # noqa: BLE001
            r = {"batch": batch, "error": f"{type(e).__name__}: {str(e)[:200]}"}
            print(f"batch {batch}: {r['error']}", flush=True)
        torch.cuda.empty_cache()
        results.append(r)
    print(json.dumps({"transformers": transformers.__version__, "torch": torch.__version__,
                      "prompt": prompt, "new": new, "runs": results}))


# ----------------------------------------------------------------------------------------------
# blend


def write_workload(path, n, prompt, output, seed, model_name):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            ids = [rng.randrange(1000, 120000) for _ in range(prompt)]
            f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                                "body": {"model": model_name, "prompt": ids, "max_tokens": output,
                                         "temperature": 0, "ignore_eos": True}}) + "\n")


def count_done(path):
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return sum(1 for line in f if '"status_code":200' in line.replace(" ", ""))


def blend_run(a, model_dir, budget, n, run_dir, limit=None):
    """One `blend batch` run; its --stats, or counts from the output when it was stopped."""
    # The request and result files (MBs) stay in the work folder; logs and stats go to OUT.
    os.makedirs(os.path.join(a.work, "runs"), exist_ok=True)
    inp = os.path.join(a.work, "runs", f"b{budget}-n{n}.in.jsonl")
    out = os.path.join(a.work, "runs", f"b{budget}-n{n}.out.jsonl")
    stats = os.path.join(run_dir, f"b{budget}-n{n}.stats.json")
    write_workload(inp, n, a.prompt, a.output, budget, os.path.basename(model_dir))
    for p in (out, stats):
        if os.path.exists(p):
            os.remove(p)
    cmd = [a.blend, "batch", "--model", model_dir, "--input", inp, "--output", out,
           "--stats", stats, "--backend", a.backend, "--max-batch-tokens", str(budget),
           "--max-running", str(a.max_running), "--quiet"] + shlex.split(a.blend_args)
    hard = 2 * a.run_cap + a.load_allowance
    if limit is not None:
        hard = min(hard, limit)
    t0 = time.time()
    try:
        run(cmd, os.path.join(run_dir, f"b{budget}-n{n}.log"), hard)
    except subprocess.TimeoutExpired:
        done = count_done(out)
        wall = time.time() - t0
        log(f"  stopped after {wall:.0f} s (past {hard} s): {done} of {n} requests finished")
        return {"budget": budget, "requests": n, "partial": True, "completed": done,
                "wall_seconds": wall,
                "throughput_tokens_per_s": done * (a.prompt + a.output) / wall}
    with open(stats) as f:
        s = json.load(f)
    r = {"budget": budget, "requests": n, "partial": False}
    for k in ("completed", "failed", "input_tokens", "output_tokens", "wall_seconds",
              "load_seconds", "throughput_tokens_per_s", "output_tokens_per_s", "steps",
              "mean_batch_tokens", "preemptions", "kv_capacity_bytes", "kv_peak_bytes"):
        r[k] = s.get(k)
    r["process_seconds"] = time.time() - t0
    if r["input_tokens"] != n * a.prompt or r["output_tokens"] != n * a.output:
        log(f"  note: {r['input_tokens']} in + {r['output_tokens']} out tokens, expected "
            f"{n * a.prompt} + {n * a.output}")
    log(f"  budget {budget}, {n} requests: {r['throughput_tokens_per_s']:.0f} tokens/s "
        f"({r['output_tokens_per_s']:.0f} output), {r['wall_seconds']:.1f} s + load "
        f"{r['load_seconds']:.1f} s, {r['steps']} steps of {r['mean_batch_tokens']:.0f} tokens, "
        f"{r['preemptions']} preemptions, KV {(r['kv_capacity_bytes'] or 0) / 1e9:.1f} GB")
    return r


def size_next(a, wanted, rate):
    """Requests for the next run: `wanted`, cut to what `rate` tokens/s does in run_cap s."""
    if not rate:
        return wanted
    fit = int(a.run_cap * rate / (a.prompt + a.output))
    n = min(wanted, max(a.min_requests, fit // 32 * 32))
    if n < wanted:
        log(f"  {wanted} requests would take ~{wanted * (a.prompt + a.output) / rate:.0f} s at "
            f"{rate:.0f} tokens/s; running {n} (--run-cap {a.run_cap:g} s)")
    return n


# ----------------------------------------------------------------------------------------------


def fmt(x, spec=".0f"):
    return "-" if x is None else format(x, spec)


def report(res, a):
    peak = (res.get("gemm") or {}).get("peak_flops")
    params = res.get("parameters")
    lines = [f"# blend throughput ({time.strftime('%Y-%m-%d %H:%M')})", ""]
    dev = (res.get("gemm") or {}).get("device", "?")
    init = res.get("init_seconds")
    lines.append(f"Model {res.get('model_dir')}: {params or '?'} parameters (P), "
                 f"{'reused' if init is None else f'generated in {init:.1f} s'}. "
                 f"GPU {dev}; dense bf16 GEMM peak measured "
                 f"{fmt(peak and peak / 1e12, '.1f')} TFLOP/s (8192^3, 10 after 3 warm-ups).")
    opt = peak / (2 * params) if peak and params else None
    lines.append(f"Optimal throughput (NanoFlow eq. 9) = peak / 2P = {fmt(opt)} tokens/s; with "
                 f"the datasheet's 989 TFLOP/s: {fmt(H100_H200_DENSE_BF16 / (2 * params) if params else None)}.")
    lines += ["", f"blend batch --backend {a.backend}, {a.prompt} prompt + {a.output} output tokens "
              f"per request (random ids, ignore_eos), --max-running {a.max_running} {a.blend_args}",
              "", "| max-batch-tokens | requests | tokens/s | output tokens/s | fraction of "
              "optimal (measured peak) | of datasheet | wall s | load s | steps | mean step "
              "tokens | preemptions | KV GB |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in res.get("blend", []):
        if r.get("error"):
            lines.append(f"| {r['budget']} | {r['requests']} | {r['error'][:120]} |" + " - |" * 9)
            continue
        tps = r["throughput_tokens_per_s"]
        frac = tps / opt if opt else None
        frac_ds = tps / (H100_H200_DENSE_BF16 / (2 * params)) if params else None
        part = f" (partial: {r['completed']}/{r['requests']} done)" if r.get("partial") else ""
        lines.append(
            f"| {r['budget']} | {r['requests']}{part} | {tps:.0f} | {fmt(r.get('output_tokens_per_s'))} | "
            f"{fmt(frac, '.3f')} | {fmt(frac_ds, '.3f')} | {fmt(r.get('wall_seconds'), '.1f')} | "
            f"{fmt(r.get('load_seconds'), '.1f')} | {fmt(r.get('steps'), 'd')} | "
            f"{fmt(r.get('mean_batch_tokens'))} | {r.get('preemptions', '-')} | "
            f"{fmt((r.get('kv_capacity_bytes') or 0) / 1e9, '.1f')} |")
    hf = res.get("hf")
    if hf:
        lines += ["", f"transformers {hf.get('transformers')} (torch {hf.get('torch')}), bf16, "
                  f"sdpa, generate of {hf.get('prompt')}-token prompts + {hf.get('new')} new "
                  f"tokens; tokens/s = batch x (prompt + new) / wall", "",
                  "| batch | tokens/s | output tokens/s | fraction of optimal | wall s | peak GB |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for r in hf.get("runs", []):
            if r.get("error"):
                lines.append(f"| {r['batch']} | {r['error'][:120]} | - | - | - | - |")
            else:
                lines.append(f"| {r['batch']} | {r['tokens_per_s']:.0f} | "
                             f"{r['output_tokens_per_s']:.0f} | "
                             f"{fmt(r['tokens_per_s'] / opt if opt else None, '.3f')} | "
                             f"{r['wall_seconds']:.1f} | {r['peak_memory_gb']:.1f} |")
    elif not a.no_torch:
        lines += ["", "transformers peer: failed (see throughput.log)"]
    return "\n".join(lines) + "\n"


def self_test(a):
    assert last_json('x\n{"a": 1}\nWarning: at exit\n') == {"a": 1}
    assert last_json('{"a": 1}\n{"b": 2}') == {"b": 2}
    a.run_cap, a.min_requests, a.prompt, a.output = 60.0, 64, 1024, 512
    assert size_next(a, 512, None) == 512
    assert size_next(a, 512, 1e6) == 512
    assert size_next(a, 512, 4096) == 160  # 60 s x 4096 / 1536 = 160
    assert size_next(a, 512, 100) == 64  # never under --min-requests
    assert size_next(a, 32, 100) == 32  # nor over what was asked
    res = {"model_dir": "/tmp/m", "parameters": 8030261248, "init_seconds": 12.3,
           "gemm": {"device": "NVIDIA H200", "peak_flops": 8.0e14},
           "blend": [{"budget": 512, "requests": 128, "partial": False, "completed": 128,
                      "throughput_tokens_per_s": 20000.0, "output_tokens_per_s": 6666.0,
                      "wall_seconds": 9.8, "load_seconds": 5.0, "steps": 700,
                      "mean_batch_tokens": 280.0, "preemptions": 0, "kv_capacity_bytes": 9e10},
                     {"budget": 1024, "requests": 256, "partial": True, "completed": 100,
                      "wall_seconds": 130.0, "throughput_tokens_per_s": 1181.5},
                     {"budget": 2048, "requests": 512, "error": "skipped: no time left"}],
           "hf": {"transformers": "5.0", "torch": "2.11", "prompt": 512, "new": 128,
                  "runs": [{"batch": 64, "wall_seconds": 5.0, "new_tokens": 128,
                            "tokens_per_s": 8192.0, "output_tokens_per_s": 1638.4,
                            "peak_memory_gb": 30.0},
                           {"batch": 256, "error": "OOM: CUDA out of memory"}]}}
    a.backend, a.max_running, a.blend_args, a.no_torch = "cuda", 512, "", False
    md = report(res, a)
    opt = 8.0e14 / (2 * 8030261248)  # 49812 tokens/s
    assert f"{opt:.0f} tokens/s" in md, md
    assert f"| 512 | 128 | 20000 | 6666 | {20000 / opt:.3f} |" in md, md
    assert "(partial: 100/256 done)" in md and "skipped: no time left" in md, md
    assert f"| 64 | 8192 | 1638 | {8192 / opt:.3f} | 5.0 | 30.0 |" in md, md
    assert "| 256 | OOM: CUDA out of memory |" in md, md
    for line in md.splitlines():  # every table row has its header's column count
        if line.startswith("| max-batch") or line.startswith("| batch"):
            cols = line.count("|")
        elif line.startswith("|"):
            assert line.count("|") == cols, line
    print("throughput self-test: 12 checks pass")


def write_outputs(res, a, out):
    """The table and the numbers so far (rewritten after every step: a run stopped from outside
    still leaves what it measured)."""
    md = report(res, a)
    with open(os.path.join(out, "throughput.md"), "w") as f:
        f.write(md)
    with open(os.path.join(out, "throughput.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    return md


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("blend", nargs="?")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--child", choices=["gemm", "hf"], help=argparse.SUPPRESS)
    ap.add_argument("--self-test", action="store_true",
                    help="check the sizing, result parsing and tables on made-up numbers")
    ap.add_argument("--quick", action="store_true",
                    help="one budget (2048) of 128 requests, transformers at batch 64 only")
    ap.add_argument("--work", default="/tmp/blend-throughput", help="model folder and workloads")
    ap.add_argument("--preset", default="llama-3-8b")
    ap.add_argument("--layers", type=int, default=0, help="blend model init --layers")
    ap.add_argument("--model-dir", default=None, help="use this folder instead of generating one")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--budgets", default="512,1024,2048")
    ap.add_argument("--requests", default="128,256,512", help="per budget, before --run-cap")
    ap.add_argument("--min-requests", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--output", type=int, default=512)
    ap.add_argument("--max-running", type=int, default=512)
    ap.add_argument("--run-cap", type=float, default=60.0,
                    help="seconds a blend run is sized to take (stopped at twice that + load)")
    ap.add_argument("--deadline", type=float, default=0,
                    help="seconds from the start by which everything must end (0: none): blend "
                         "runs are stopped or skipped to leave the transformers peer its time")
    ap.add_argument("--load-allowance", type=float, default=60.0,
                    help="seconds allowed for blend to load the model, on top of the run")
    ap.add_argument("--blend-args", default=os.environ.get("BLEND_ARGS", ""),
                    help="more blend batch flags (default $BLEND_ARGS)")
    ap.add_argument("--hf-batches", default="64,256")
    ap.add_argument("--hf-prompt", type=int, default=512)
    ap.add_argument("--hf-new", type=int, default=128)
    ap.add_argument("--no-torch", action="store_true", help="skip the GEMM peak and transformers")
    ap.add_argument("--no-blend", action="store_true", help="skip the blend runs")
    ap.add_argument("--seed", type=int, default=0)
    # Child arguments.
    ap.add_argument("--child-model", help=argparse.SUPPRESS)
    a = ap.parse_args()

    if a.self_test:
        self_test(a)
        return 0
    if a.child == "gemm":
        child_gemm()
        return 0
    if a.child == "hf":
        child_hf(a.child_model, [int(b) for b in a.hf_batches.split(",") if b], a.hf_prompt,
                 a.hf_new, a.seed)
        return 0
    if not a.blend or not a.out:
        ap.error("BLEND and OUT are required")
    if a.quick:
        a.budgets, a.requests, a.hf_batches = "2048", "128", "64"
        a.run_cap = min(a.run_cap, 45.0)

    a.blend = os.path.abspath(a.blend) if os.path.exists(a.blend) else a.blend
    out = os.path.abspath(a.out)
    runs = os.path.join(out, "throughput")
    os.makedirs(runs, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    STEPS.file = os.path.join(out, "throughput.log")
    t_start = time.time()
    log(f"blend {a.blend}, out {out}, work {a.work}, backend {a.backend}, budgets {a.budgets}, "
        f"requests {a.requests}, {a.prompt} + {a.output} tokens, run cap {a.run_cap:g} s")
    res = {"args": vars(a)}

    # 1. The model.
    model_dir = a.model_dir or os.path.join(a.work, "model" + (f"-{a.layers}l" if a.layers else ""))
    res["model_dir"] = model_dir
    marker = os.path.join(model_dir, ".blend-init-done")
    if a.model_dir:
        log(f"model: {model_dir} (given)")
    elif os.path.exists(marker) and open(marker).read().strip() == a.preset:
        log(f"model: {model_dir} (generated earlier)")
    else:
        def init():
            cmd = [a.blend, "model", "init", "--preset", a.preset, "--allow-large", "--out",
                   model_dir, "--dtype", "bf16"] + (["--layers", str(a.layers)] if a.layers else [])
            t0 = time.time()
            run(cmd, os.path.join(runs, "init.log"), 900)
            res["init_seconds"] = time.time() - t0
            with open(os.path.join(runs, "init.log")) as f:
                log("  " + f.read().strip().splitlines()[-1])
            with open(marker, "w") as f:
                f.write(a.preset)
        attempt(f"blend model init --preset {a.preset}", init)

    def info():
        p = subprocess.run([a.blend, "model", "info", "--model", model_dir], capture_output=True,
                           text=True, timeout=300)
        if p.returncode != 0:
            raise RuntimeError(p.stderr.strip()[-300:])
        j = json.loads(p.stdout)
        log(f"  {j['parameters']} parameters, {j['num_layers']} layers, hidden {j['hidden_size']}, "
            f"{j['weight_bytes'] / 1e9:.2f} GB {j['dtype']}")
        return j
    mi = attempt("blend model info", info)
    if mi:
        res["parameters"] = mi["parameters"]

    # 2. The GEMM peak.
    if not a.no_torch:
        res["gemm"] = attempt("torch bf16 GEMM peak", child, "gemm", [],
                              os.path.join(runs, "gemm.log"), 300)

    write_outputs(res, a, out)
    # Seconds left before the deadline, keeping `reserve` for the transformers peer.
    hf_reserve = 0 if a.no_torch else 100

    def left(reserve=0):
        return None if not a.deadline else a.deadline - (time.time() - t_start) - reserve

    # 3. blend.
    res["blend"] = []
    if not a.no_blend:
        budgets = [int(b) for b in a.budgets.split(",") if b]
        wanted = [int(n) for n in a.requests.split(",") if n]
        wanted += [wanted[-1]] * (len(budgets) - len(wanted))
        rate = None
        for budget, want in zip(budgets, wanted):
            n = size_next(a, want, rate)
            limit = left(hf_reserve)
            if limit is not None and limit < 30:
                log(f"budget {budget}: skipped, {limit:.0f} s left before the deadline")
                res["blend"].append({"budget": budget, "requests": n,
                                     "error": "skipped: no time left"})
                continue
            r = attempt(f"blend batch --backend {a.backend} --max-batch-tokens {budget}, "
                        f"{n} requests", blend_run, a, model_dir, budget, n, runs, limit)
            if r is None:
                r = {"budget": budget, "requests": n, "error": f"failed (see b{budget}-n{n}.log)"}
            else:
                rate = r.get("throughput_tokens_per_s") or rate
            res["blend"].append(r)
            write_outputs(res, a, out)

    # 4. transformers.
    if not a.no_torch:
        limit = left()
        res["hf"] = attempt("transformers peer", child, "hf",
                            ["--child-model", model_dir, "--hf-batches", a.hf_batches,
                             "--hf-prompt", str(a.hf_prompt), "--hf-new", str(a.hf_new),
                             "--seed", str(a.seed)], os.path.join(runs, "hf.log"),
                            600 if limit is None else max(30, limit))

    md = write_outputs(res, a, out)
    print(md, flush=True)
    log(f"wrote {os.path.join(out, 'throughput.md')} in {time.time() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
