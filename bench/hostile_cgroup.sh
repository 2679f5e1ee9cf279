#!/usr/bin/env bash
# One hostile client against `blend serve` in a memory cgroup (issue 54): each attack that took
# the server down before must now get a clean error while the server stays up and within its
# memory. Prints one row per attack: the answers it got, the seconds it took, the server's peak
# memory in the cgroup, and whether /health still answered at once afterwards.
#
#   bench/hostile_cgroup.sh [MODEL_DIR]     (root; cgroup v1 memory controller or cgroup v2)
#
# MEMORY_LIMIT (default 1800M, the limit the attacks were first measured under), BLEND (default
# build/blend). Makes a tiny model when none is given. Only bash and python3 (standard
# library) are used.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
BLEND=${BLEND:-$ROOT/build/blend}
need_blend_and_python
limit=${MEMORY_LIMIT:-1800M}
work=$(mktemp -d)
model=${1:-}
if [ -z "$model" ]; then
  model=$work/tiny
  "$BLEND" model init --preset tiny --out "$model" >/dev/null
fi

# The cgroup: v1's memory controller, or a v2 group with memory.max.
if [ -d /sys/fs/cgroup/memory ] && [ -w /sys/fs/cgroup/memory ]; then
  cg=/sys/fs/cgroup/memory/blend-hostile-$$
  mkdir "$cg"
  echo "$limit" >"$cg/memory.limit_in_bytes"
  peak_file=$cg/memory.max_usage_in_bytes
elif [ -w /sys/fs/cgroup/cgroup.subtree_control ]; then
  cg=/sys/fs/cgroup/blend-hostile-$$
  mkdir "$cg"
  echo "$limit" >"$cg/memory.max"
  peak_file=$cg/memory.peak
else
  die "no writable memory cgroup (run as root on a machine with cgroup v1 or v2)"
fi
cleanup() {
  [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  rmdir "$cg" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# The server joins the cgroup before it execs: all its memory is counted there.
bash -c "echo \$\$ > $cg/cgroup.procs && exec '$BLEND' serve --model '$model' --port $port \
  --data-dir '$work/data' --quiet --threads 2 --kv-memory 0.2 --threads-http 32" \
  2>"$work/serve.log" &
pid=$!
for _ in $(seq 600); do
  python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health', timeout=1)" \
    2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/serve.log" >&2; die "blend serve did not start"; }
  sleep 0.1
done

echo "machine: $(cpu_model); memory limit $limit; blend serve defaults (--max-body-bytes 64 MiB, --max-body-bytes-in-flight 256 MiB, --http-head-timeout 10 s)"
PORT=$port PID=$pid PEAK_FILE=$peak_file python3 - <<'PY'
import json, os, socket, threading, time

import urllib.request

port, pid, peak_file = int(os.environ["PORT"]), int(os.environ["PID"]), os.environ["PEAK_FILE"]
model = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models"))["data"][0]["id"]

def connect(timeout=60):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    return s

def status_of(raw):
    return raw[9:12].decode() if raw.startswith(b"HTTP/1.1 ") else "none"

def read_all(s):
    out = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except OSError:
        pass
    return out

def post(path, body, chunked=False):
    s = connect()
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
    try:
        if chunked:
            s.sendall((head + "Transfer-Encoding: chunked\r\n\r\n").encode())
            step = 1 << 20
            for i in range(0, len(body), step):
                piece = body[i:i + step]
                s.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
            s.sendall(b"0\r\n\r\n")
        else:
            s.sendall((head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
    except OSError:
        pass  # the server answered and closed before the body ended
    raw = read_all(s)
    s.close()
    return status_of(raw)

def alive():
    t0 = time.time()
    try:
        s = connect(30)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        ok = status_of(read_all(s)) == "200"
        s.close()
    except OSError:
        ok = False
    return ok and os.path.exists(f"/proc/{pid}"), time.time() - t0

def peak_mib():
    with open(peak_file) as f:
        return int(f.read()) / 2**20

def reset_peak():
    try:
        with open(peak_file, "w") as f:
            f.write("0")
    except OSError:
        pass

def prompt_body(mb, chat=False):
    text = "word " * (mb * 2**20 // 5)
    if chat:
        return json.dumps({"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 1}).encode()
    return json.dumps({"model": model, "prompt": text, "max_tokens": 1}).encode()

def in_parallel(n, fn):
    out = [None] * n
    def run(i):
        out[i] = fn()
    ts = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in ts: t.start()
    for t in ts: t.join()
    return out

def health_while_trickling(socks, piece, every_s):
    # /health asked once while each socket gets `piece` every `every_s` seconds (up to 60 s).
    t0 = time.time()
    answered = []
    probe = threading.Thread(target=lambda: answered.append(alive()[1]))
    probe.start()
    while probe.is_alive() and time.time() - t0 < 60:
        for s in socks:
            try:
                s.sendall(piece)
            except OSError:
                pass
        probe.join(every_s)
    return f"/health in {answered[0]:.1f}s" if answered else "/health timed out"

def slowloris(n=40):
    socks = []
    for _ in range(n):
        s = connect()
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        socks.append(s)
    health = health_while_trickling(socks, b"X-Slow: 1\r\n", 3)
    statuses = []
    for s in socks:
        s.settimeout(15)
        statuses.append(status_of(read_all(s)))
        s.close()
    return statuses + [health]

def slow_bodies(n=40):
    # Half chunked, half by Content-Length: each sends a byte of its body a second and never ends.
    socks = []
    for i in range(n):
        s = connect()
        framing = "Transfer-Encoding: chunked\r\n\r\n100\r\n" if i % 2 == 0 else "Content-Length: 256\r\n\r\n"
        s.sendall(f"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{framing}{{".encode())
        socks.append(s)
    health = health_while_trickling(socks, b" ", 1)
    for s in socks:
        s.close()
    return [health]

def pipelined():
    s = connect()
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" * 4 + b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    raw = read_all(s)
    s.close()
    return [raw[i + 9:i + 12].decode() for i in range(len(raw)) if raw.startswith(b"HTTP/1.1 ", i)]

def enum_schema(values, length, tag=0):
    enum = [f"s{tag}-v{i:07d}-" + "x" * length for i in range(values)]
    return json.dumps({"model": model, "messages": [{"role": "user", "content": "pick"}], "max_tokens": 4,
                       "response_format": {"type": "json_schema", "json_schema": {"name": "e", "schema": {"enum": enum}}}}).encode()

attacks = [
    ("chunked body of 300 MB", lambda: [post("/v1/completions", b"a" * (300 << 20), chunked=True)]),
    ("8 concurrent 60 MB prompts", lambda: in_parallel(8, lambda: post("/v1/completions", prompt_body(60)))),
    ("60 MB chat to /tokenize", lambda: [post("/tokenize", prompt_body(60, chat=True))]),
    ("3 MB enum schema", lambda: [post("/v1/chat/completions", enum_schema(3000, 1000))]),
    ("200 distinct 60 KB enum schemas", lambda: [post("/v1/chat/completions", enum_schema(600, 90, tag=i)) for i in range(200)]),
    ("40 slow-header connections", slowloris),
    ("40 slow-body connections", slow_bodies),
    ("5 pipelined requests", pipelined),
]
print(f"{'attack':34} {'answers':40} {'seconds':>8} {'peak MiB':>9} {'healthy after':>14}")
for name, fn in attacks:
    reset_peak()
    t0 = time.time()
    answers = fn()
    seconds = time.time() - t0
    ok, t = alive()
    counts = {}
    for a in answers:
        counts[a] = counts.get(a, 0) + 1
    shown = ", ".join(f"{v}x {k}" for k, v in counts.items())
    print(f"{name:34} {shown[:40]:40} {seconds:8.1f} {peak_mib():9.0f} {('yes' if ok else 'NO'):>10} {t:.2f}s", flush=True)
    if not ok:
        raise SystemExit("the server is down")
PY
