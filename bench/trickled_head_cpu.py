#!/usr/bin/env python3
# The server's CPU time for one request head trickled in byte by byte (issue 54): `blend serve`'s
# utime + stime (from /proc) across a head of N bytes (a request line, then X-Pad header lines)
# sent one byte a TCP segment, for each N given. Linear reading costs the same per byte at every
# N; the poller used to peek the whole head so far at each byte, which grows with N.
#   python3 bench/trickled_head_cpu.py build/blend /tmp/tiny 18450 8192 16384 32000
import os, signal, socket, subprocess, sys, time, urllib.request
binary, model, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
sizes = [int(a) for a in sys.argv[4:]]
p = subprocess.Popen([binary, "serve", "--model", model, "--port", str(port), "--quiet",
                      "--threads", "1", "--kv-memory", "0.05", "--http-head-timeout", "60",
                      "--data-dir", f"/tmp/trickled-head-data-{port}"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
tick = os.sysconf("SC_CLK_TCK")
def cpu_seconds():
    fields = open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / tick  # utime, stime
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
    idle0, t_idle = cpu_seconds(), time.time()
    time.sleep(2)  # the idle server's own CPU over 2 s, subtracted below
    idle_rate = (cpu_seconds() - idle0) / (time.time() - t_idle)
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c0, t0 = cpu_seconds(), time.time()
    for i in range(len(head)):
        s.send(head[i:i + 1])
        time.sleep(0.0001)  # each byte its own readable event at the poller
    answer = s.recv(100)
    wall = time.time() - t0
    cpu = cpu_seconds() - c0 - idle_rate * wall
    s.close()
    print(f"head {len(head)} bytes: {answer[:12].decode(errors='replace')!r}, {wall:.2f} s, "
          f"server CPU {cpu:.3f} s, {1e6 * cpu / len(head):.2f} us a byte", flush=True)
p.send_signal(signal.SIGTERM); p.wait()
