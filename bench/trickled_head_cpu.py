#!/usr/bin/env python3
# The CPU time `blend serve` spends on one request head trickled in byte by byte (issue 54): its
# busiest thread's utime + stime (from /proc: the thread that waits for heads; the others idle
# meanwhile) across a head of N bytes (a request line, then X-Pad header lines) sent one byte a
# TCP segment, for each N given. Linear reading costs the same per byte at every N; the poller
# used to peek the whole head so far at each byte, a cost per byte that grew with N.
#   python3 bench/trickled_head_cpu.py build/blend /tmp/tiny 18450 8192 16384 32000
import os, signal, socket, subprocess, sys, time, urllib.request
binary, model, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
sizes = [int(a) for a in sys.argv[4:]]
p = subprocess.Popen([binary, "serve", "--model", model, "--port", str(port), "--quiet",
                      "--threads", "1", "--kv-memory", "0.05", "--http-head-timeout", "60",
                      "--data-dir", f"/tmp/trickled-head-data-{port}"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
tick = os.sysconf("SC_CLK_TCK")
def thread_cpu():  # utime + stime of each of the server's threads, seconds
    out = {}
    for t in os.listdir(f"/proc/{p.pid}/task"):
        try: fields = open(f"/proc/{p.pid}/task/{t}/stat").read().rsplit(")", 1)[1].split()
        except OSError: continue
        out[t] = (int(fields[11]) + int(fields[12])) / tick
    return out
for _ in range(100):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1); break
    except Exception: time.sleep(0.2)
time.sleep(1)
for n in sizes:
    head = b"GET /health HTTP/1.1\r\nHost: x\r\n"
    line = b"X-Pad: " + b"a" * 57 + b"\r\n"  # 66 bytes
    while len(head) + len(line) + 2 <= n: head += line
    head += b"\r\n"
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c0, t0 = thread_cpu(), time.time()
    for i in range(len(head)):
        s.send(head[i:i + 1])
        time.sleep(0.0001)  # each byte its own readable event at the poller
    answer = s.recv(100)
    wall = time.time() - t0
    c1 = thread_cpu()
    # The thread that spent the most is the one waiting for heads (the others idle meanwhile).
    cpu = max(c1[t] - c0.get(t, 0) for t in c1)
    s.close()
    print(f"head {len(head)} bytes: {answer[:12].decode(errors='replace')!r}, {wall:.2f} s, "
          f"poller CPU {cpu:.3f} s, {1e6 * cpu / len(head):.2f} us a byte", flush=True)
p.send_signal(signal.SIGTERM); p.wait()
