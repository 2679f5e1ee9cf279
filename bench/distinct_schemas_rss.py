#!/usr/bin/env python3
# RSS of `blend serve` under a stream of distinct large JSON schemas (issue 54: +22% in a 10-minute
# soak), with nothing else running: N chat requests one after another, each with its own
# 1,000-value enum (60 KB), the server's VmRSS printed every 20 as (schemas, RSS MiB, seconds).
#   python3 bench/distinct_schemas_rss.py build/blend /tmp/tiny 18440 240
# Before the shape registry had a byte bound: 1,262 MiB after 240 (+2.6 MiB a schema once the
# grammar cache was full); after: 873 MiB (2-core machine, tiny model, --threads 1).
import json, sys, time, urllib.request, subprocess, os, signal
binary, model, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
env = dict(os.environ)
p = subprocess.Popen([binary, "serve", "--model", model, "--port", str(port), "--quiet",
                      "--threads", "1", "--kv-memory", "0.05", "--data-dir", f"/tmp/distinct-schemas-data-{port}"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
def rss():
    for l in open(f"/proc/{p.pid}/status"):
        if l.startswith("VmRSS"): return int(l.split()[1]) / 1024
for _ in range(100):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1); break
    except Exception: time.sleep(0.2)
out = []
t0 = time.time()
for i in range(n):
    values = [f"schema {i} value {v} " + "x" * 40 for v in range(1000)]
    body = {"model": os.path.basename(model.rstrip("/")), "messages": [{"role": "user", "content": "pick"}], "max_tokens": 8,
            "response_format": {"type": "json_schema", "json_schema": {"name": "e", "schema": {"enum": values}}}}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=120).read()
    except Exception as e:
        print("error", i, e, file=sys.stderr)
    if i % 20 == 19:
        out.append((i + 1, round(rss(), 1), round(time.time() - t0, 1)))
        print(out[-1], flush=True)
p.send_signal(signal.SIGTERM); p.wait()
