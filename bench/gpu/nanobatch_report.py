#!/usr/bin/env python3
"""The nano-batch combinations' steps against the sequential step (issue 29): from
cuda_forward_bench's JSON lines (nanobatch_run.sh's $OUT/forward_bench.jsonl, each tagged with
its "combo"), per step kind and size, each combination's step time, its speed-up over the
sequential combination (BLEND_CUDA_NANO_BATCHES=off, the first one by default), and the GEMM-
attention interference the step implies: with G and A the sequential step's non-attention and
attention GPU times (its per-op times),

    interference = (T - max(G, A)) / min(G, A),

the term blend's cost model charges an overlapped step (cost/hardware.h overlap_interference:
max(parts) + interference x the rest). 0 is perfect overlap, 1 is no gain over running the
parts one after the other, above 1 is a loss. Writes OUT/nanobatch.md.

  python3 bench/gpu/nanobatch_report.py OUT/forward_bench.jsonl OUT/nanobatch.md [--sequential COMBO]
  python3 bench/gpu/nanobatch_report.py --self-test
"""

import json
import sys


def key_of(j):
    kind = j.get("kind")
    if kind == "decode":
        return (kind, f"{j['batch']} x {j['context']} ctx")
    if kind == "prefill":
        return (kind, f"{j['prompts']} x {j['prompt_len']}")
    if kind == "mixed":
        return (kind, f"{j['decodes']} decodes x {j['context']} ctx + {j['prompt_tokens']}")
    return None


def interference(seq, t_ms):
    ops = seq.get("ops", {})
    a = ops.get("attention_ms", 0.0)
    g = ops.get("total_ms", 0.0) - a
    if a <= 0 or g <= 0:
        return None
    return (t_ms - max(g, a)) / min(g, a)


def report(rows, sequential=None):
    combos = list(dict.fromkeys(r["combo"] for r in rows if "combo" in r))
    if not combos:
        return "# Nano-batch steps\n\nNo steps measured.\n"
    sequential = sequential or combos[0]
    steps = {}
    for r in rows:
        k = key_of(r)
        if k and "combo" in r:
            steps.setdefault(k, {})[r["combo"]] = r
    out = ["# Nano-batch steps against the sequential step", "",
           f"Sequential: `{sequential}`. Each cell: step ms, speed-up over sequential, and the "
           "interference the step implies ((T - max(G, A)) / min(G, A), G and A the sequential "
           "step's GEMM-side and attention GPU times; 1 = no gain from overlap).", "",
           "| step | " + " | ".join(f"`{c}`" for c in combos) + " |",
           "| --- |" + " --- |" * len(combos)]
    implied = {c: [] for c in combos}
    for (kind, size), by_combo in steps.items():
        seq = by_combo.get(sequential)
        cells = []
        for c in combos:
            r = by_combo.get(c)
            if not r:
                cells.append("-")
                continue
            t = r["step_ms"]
            cell = f"{t:.2f} ms"
            if seq and c != sequential:
                cell += f", {seq['step_ms'] / t:.3f}x"
                i = interference(seq, t)
                if i is not None:
                    cell += f", I {i:.2f}"
                    implied[c].append(i)
            cells.append(cell)
        out.append(f"| {kind} {size} | " + " | ".join(cells) + " |")
    out.append("")
    for c in combos:
        if implied[c]:
            v = sorted(implied[c])
            out.append(f"- `{c}`: implied interference median {v[len(v) // 2]:.2f} "
                       f"(min {v[0]:.2f}, max {v[-1]:.2f}, {len(v)} steps)")
    return "\n".join(out) + "\n"


def self_test():
    seq = {"combo": "off", "kind": "mixed", "decodes": 256, "context": 1024,
           "prompt_tokens": 512, "step_ms": 30.0,
           "ops": {"attention_ms": 10.0, "total_ms": 30.0}}
    # G 20, A 10: perfect overlap is 20 ms (I 0), no gain 30 ms (I 1).
    rows = [seq, dict(seq, combo="always", step_ms=25.0, ops={}),
            dict(seq, combo="auto", step_ms=30.0, ops={}),
            {"combo": "off", "kind": "bounds"}]
    text = report(rows)
    assert "1.200x, I 0.50" in text, text
    assert "1.000x, I 1.00" in text, text
    assert "`always`: implied interference median 0.50" in text, text
    assert interference({"ops": {"attention_ms": 0.0, "total_ms": 5.0}}, 5.0) is None
    assert "No steps measured" in report([])
    print("self-test passed")


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    sequential = None
    if "--sequential" in sys.argv:
        sequential = sys.argv[sys.argv.index("--sequential") + 1]
    rows = []
    try:
        for line in open(sys.argv[1]):
            line = line.strip()
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    continue
    except OSError as e:
        print(f"nanobatch_report: {e}")
    text = report(rows, sequential)
    with open(sys.argv[2], "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
