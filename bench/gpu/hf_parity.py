#!/usr/bin/env python3
"""blend against Hugging Face transformers on the same weights (issue 28's parity check).

Runs on the lent GPU machine (torch, transformers, safetensors there). For each model folder:

  blend-tiny, blend-llama-3-8b-2l    written by `blend model init` (bf16; untied presets: a
                                     tied one, smollm-135m, has one-hot logits, since its
                                     std-1 embedding makes every token predict itself)
  hf-llama-tied        LlamaForCausalLM, tied embeddings, head_dim 64    (written by
  hf-llama32-rope      Llama-3.2-style rope_scaling llama3, head_dim 128  transformers'
  hf-qwen2             Qwen2ForCausalLM, q/k/v biases                    own
  hf-mistral           MistralForCausalLM, sliding_window 16 < prompts   save_pretrained, bf16)

and each blend backend (--backends, default cpu,cuda), blend generates greedy continuations of a
few token-id prompts (`blend batch`, /v1/completions lines with temperature 0, ignore_eos,
logprobs and return_tokens_as_token_ids), then transformers runs the prompt + blend's tokens
teacher-forced (one forward, eager attention) on the GPU in float32 (the reference) and in
bfloat16, and greedy-decodes the prompts itself. Reported per folder x backend: max and mean
|delta logprob| of blend's tokens against transformers f32 and bf16, the share of positions where
blend's token is the f32 argmax (positions whose f32 top-2 gap is under 1e-2, near-ties, left
out), whether blend's greedy tokens equal transformers' greedy ones, and the mean max-probability
(logits that are neither one-hot nor flat). The goal (issue 28): |delta logprob| <= 1e-2 against
f32 and argmax agreement but for near-ties.

Every step prints what it does; a failing step is reported and the next one runs. Output:
OUT/hf_parity.md (the table), OUT/hf_parity.json (every number), OUT/hf_parity/ (batch files,
blend's logs). OUT is --out, else $OUT, else WORK_DIR.

  python3 bench/gpu/hf_parity.py BLEND WORK_DIR [--backends cpu,cuda] [--out DIR]
  python3 bench/gpu/hf_parity.py BLEND WORK_DIR --dry-run   # no torch: blend's half only
  python3 bench/gpu/hf_parity.py --self-test                # the comparison on made-up data

--dry-run (for a machine without torch) makes only the blend-written folders, runs blend, parses
its output and fills the table against blend's own logprobs as a stand-in reference (every
delta 0): it checks the batch file, the parsing and the table, not the numerics.
"""

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from steplog import StepLog  # noqa: E402

BOS = 128000
EOS = [128001, 128008, 128009]
VOCAB = 128256
NEAR_TIE = 1e-2  # a reference top-2 gap under this is a near-tie: argmax not compared
TOLERANCE = 1e-2  # the goal for |delta logprob| against transformers f32 (bf16 folders)
TOLERANCE_F32 = 1e-3  # f32 folders: blend computes in f32 as transformers f32 does

# Prompts of about 20 to 60 tokens (tokenized by blend with BOS; every one longer than the
# Mistral folder's 16-token window).
PROMPT_TEXTS = [
    "The history of the printing press begins in the fifteenth century, when a goldsmith in "
    "Mainz combined movable metal type with an oil-based ink and a",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
    "    return a\n\nprint([fibonacci(i) for i in range(",
    "Question: A train leaves the station at 3 pm travelling at 60 km/h. A second train leaves "
    "the same station one hour later at 90 km/h on the same track. When does the second train "
    "catch up with the first one? Answer:",
    "Les montagnes du Jura s'étendent entre la France et la Suisse; leurs forêts et leurs "
    "lacs attirent chaque année",
]

# Where transformers runs: the GPU. bench/gpu/check_hf_parity.py sets cpu to run the script
# here against a stand-in transformers.
DEVICE = os.environ.get("HF_PARITY_DEVICE", "cuda")


STEPS = StepLog("hf_parity")
log, attempt = STEPS.log, STEPS.attempt


def run(cmd, log_path, timeout, stdin=None):
    """Runs a command, its stdout/stderr into log_path; raises with the log's tail on failure."""
    log("$ " + " ".join(cmd))
    with open(log_path, "w") as f:
        p = subprocess.run(cmd, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=timeout)
        f.write(f"$ {' '.join(cmd)}\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}\n"
                f"--- exit {p.returncode}\n")
    if p.returncode != 0:
        tail = (p.stderr.strip() or p.stdout.strip()).splitlines()[-5:]
        raise RuntimeError(f"exit {p.returncode}: " + " | ".join(tail))
    return p.stdout


# ----------------------------------------------------------------------------------------------
# blend's half


def blend_init(blend, out_dir, preset, logs, layers=None):
    cmd = [blend, "model", "init", "--preset", preset, "--out", out_dir, "--dtype", "bf16"]
    if layers:
        cmd += ["--layers", str(layers), "--allow-large"]
    print(run(cmd, os.path.join(logs, f"init-{os.path.basename(out_dir)}.log"), 600).strip())


def blend_model_info(blend, model_dir, logs):
    out = run([blend, "model", "info", "--model", model_dir],
              os.path.join(logs, f"info-{os.path.basename(model_dir)}.log"), 300)
    info = json.loads(out)
    log(f"blend model info {os.path.basename(model_dir)}: {info.get('architecture')}, "
        f"{info.get('parameters')} parameters, {info.get('num_layers')} layers, "
        f"head_dim {info.get('head_dim')}, dtype {info.get('dtype')}, "
        f"tied {info.get('tie_word_embeddings')}")
    return info


def make_prompts(blend, model_dir, logs):
    """Token-id prompts: PROMPT_TEXTS tokenized by blend (with BOS), else seeded random ids."""
    prompts = []
    for i, text in enumerate(PROMPT_TEXTS):
        try:
            ids = json.loads(run([blend, "tokenize", "--model", model_dir, "--add-bos"],
                                 os.path.join(logs, f"tokenize-{i}.log"), 120, stdin=text))
            assert isinstance(ids, list) and all(isinstance(t, int) for t in ids) and ids
        except Exception as e:  # noqa: BLE001
            rng = random.Random(i)
            ids = [BOS] + [rng.randrange(1000, 120000) for _ in range(20 + 12 * i)]
            log(f"prompt {i}: tokenize failed ({e}); {len(ids)} random ids instead")
        prompts.append(ids)
    log("prompt lengths: " + ", ".join(str(len(p)) for p in prompts))
    return prompts


def batch_lines(prompts, new_tokens, model_name):
    lines = []
    for i, p in enumerate(prompts):
        lines.append({
            "custom_id": f"p{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {
                "model": model_name,
                "prompt": p,
                "max_tokens": new_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "logprobs": 2,
                "return_tokens_as_token_ids": True,
            },
        })
    return lines


def token_id(name):
    """'token_id:123' -> 123 (return_tokens_as_token_ids)."""
    if not isinstance(name, str) or not name.startswith("token_id:"):
        raise ValueError(f"token {name!r} is not 'token_id:<id>' (no return_tokens_as_token_ids?)")
    return int(name[len("token_id:"):])


def parse_batch_output(path, n_prompts):
    """blend batch's output -> per prompt {tokens, logprobs, top: [[(id, lp), ...]]}."""
    results = {}
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            cid = r.get("custom_id")
            resp = r.get("response") or {}
            if r.get("error") or resp.get("status_code") != 200:
                raise RuntimeError(f"{cid}: {r.get('error') or resp}")
            choice = resp["body"]["choices"][0]
            lp = choice["logprobs"]
            toks = [token_id(t) for t in lp["tokens"]]
            tops = [sorted(((token_id(k), v) for k, v in d.items()), key=lambda kv: -kv[1])
                    for d in lp["top_logprobs"]]
            if len(toks) != len(lp["token_logprobs"]) or len(toks) != len(tops):
                raise RuntimeError(f"{cid}: ragged logprobs")
            results[cid] = {"tokens": toks, "logprobs": [float(x) for x in lp["token_logprobs"]],
                            "top": tops, "finish_reason": choice.get("finish_reason")}
    missing = [f"p{i}" for i in range(n_prompts) if f"p{i}" not in results]
    if missing:
        raise RuntimeError(f"no result for {missing}")
    return [results[f"p{i}"] for i in range(n_prompts)]


def run_blend(blend, model_dir, backend, prompts, new_tokens, run_dir, timeout):
    os.makedirs(run_dir, exist_ok=True)
    inp = os.path.join(run_dir, f"{backend}.in.jsonl")
    out = os.path.join(run_dir, f"{backend}.out.jsonl")
    stats = os.path.join(run_dir, f"{backend}.stats.json")
    with open(inp, "w") as f:
        for line in batch_lines(prompts, new_tokens, os.path.basename(model_dir)):
            f.write(json.dumps(line) + "\n")
    if os.path.exists(out):
        os.remove(out)  # a rerun would skip the custom_ids already there
    run([blend, "batch", "--model", model_dir, "--input", inp, "--output", out, "--stats", stats,
         "--backend", backend, "--quiet"], os.path.join(run_dir, f"{backend}.log"), timeout)
    res = parse_batch_output(out, len(prompts))
    for i, r in enumerate(res):
        if len(r["tokens"]) != new_tokens:
            log(f"  prompt {i}: {len(r['tokens'])} tokens, not {new_tokens} "
                f"(finish {r['finish_reason']})")
        if r["top"] and r["top"][0] and any(t[0][0] != tok for t, tok in zip(r["top"], r["tokens"])
                                            if t):
            log(f"  prompt {i}: a greedy token is not blend's own top-1 (ties?)")
    log(f"  blend {backend}: first tokens of prompt 0: {res[0]['tokens'][:8]}, "
        f"logprobs {[round(x, 3) for x in res[0]['logprobs'][:4]]}")
    return res


# ----------------------------------------------------------------------------------------------
# The comparison (plain Python: testable without torch)


def self_reference(blend_res):
    """A stand-in reference from blend's own output (--dry-run): every delta 0."""
    ref = []
    for r in blend_res:
        rows = []
        for tok, lp, top in zip(r["tokens"], r["logprobs"], r["top"]):
            gap = (top[0][1] - top[1][1]) if len(top) > 1 else float("inf")
            rows.append({"lp": lp, "argmax": top[0][0] if top else tok, "gap": gap,
                         "maxprob": math.exp(top[0][1]) if top else math.exp(lp)})
        ref.append(rows)
    return ref


def first_divergence(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(blend_res, ref32, ref16=None, greedy32=None, greedy16=None, tolerance=TOLERANCE):
    """Per-position reference records (lp of blend's token, argmax, top-2 gap, max prob) against
    blend's tokens and logprobs. Returns the row's numbers."""
    d32, d16, d16_32 = [], [], []
    agree = considered = ties = 0
    maxprob = []
    for i, r in enumerate(blend_res):
        for j, (tok, lp) in enumerate(zip(r["tokens"], r["logprobs"])):
            a = ref32[i][j]
            d32.append(abs(lp - a["lp"]))
            maxprob.append(a["maxprob"])
            if ref16 is not None:
                d16.append(abs(lp - ref16[i][j]["lp"]))
                d16_32.append(abs(ref16[i][j]["lp"] - a["lp"]))
            if a["gap"] < NEAR_TIE:
                ties += 1
                continue
            considered += 1
            agree += int(a["argmax"] == tok)
    row = {
        "positions": len(d32),
        "max_d_f32": max(d32) if d32 else None,
        "mean_d_f32": sum(d32) / len(d32) if d32 else None,
        "max_d_bf16": max(d16) if d16 else None,
        "hf_bf16_vs_f32": max(d16_32) if d16_32 else None,
        "argmax_agree": agree,
        "argmax_considered": considered,
        "near_ties": ties,
        "mean_maxprob": sum(maxprob) / len(maxprob) if maxprob else None,
    }
    for key, greedy in (("greedy_f32", greedy32), ("greedy_bf16", greedy16)):
        if greedy is None:
            row[key] = None
            continue
        same, notes = 0, []
        for i, r in enumerate(blend_res):
            k = first_divergence(r["tokens"], greedy[i])
            if k is None:
                same += 1
            else:
                tie = k < len(ref32[i]) and ref32[i][k]["gap"] < NEAR_TIE
                notes.append(f"p{i}@{k}{' (near-tie)' if tie else ''}")
        row[key] = {"equal": same, "of": len(blend_res), "diverged": notes}
    row["tolerance"] = tolerance
    row["pass"] = (row["max_d_f32"] is not None and row["max_d_f32"] <= tolerance
                   and row["argmax_agree"] == row["argmax_considered"])
    # Near one-hot logits make every check pass trivially: say so.
    row["one_hot"] = row["mean_maxprob"] is not None and row["mean_maxprob"] > 0.9
    return row


def fmt(x, digits=4):
    return "-" if x is None else f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def greedy_cell(g):
    if g is None:
        return "-"
    s = f"{g['equal']}/{g['of']}"
    return s + (" (" + ", ".join(g["diverged"]) + ")" if g["diverged"] else "")


def table(rows, dry_run):
    head = ("| folder | backend | positions | max \\|Δlp\\| vs HF f32 | mean \\|Δlp\\| vs f32 | "
            "max \\|Δlp\\| vs HF bf16 | HF bf16 vs f32 (same tokens) | argmax = f32 argmax "
            "(near-ties left out) | greedy = HF f32 greedy | greedy = HF bf16 greedy | "
            "mean max-prob | verdict |")
    lines = [head, "|" + " --- |" * head.count(" | ") + " --- |"]
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['folder']} | {r['backend']} | " + " | ".join(["-"] * 9)
                         + f" | {r['error'][:160].replace('|', '/')} |")
            continue
        verdict = ("PASS" if r["pass"] else "FAIL") + (" (one-hot logits: weak)" if r.get("one_hot")
                                                        else "")
        lines.append(
            f"| {r['folder']} | {r['backend']} | {r['positions']} | {fmt(r['max_d_f32'])} | "
            f"{fmt(r['mean_d_f32'])} | {fmt(r['max_d_bf16'])} | {fmt(r['hf_bf16_vs_f32'])} | "
            f"{r['argmax_agree']}/{r['argmax_considered']} ({r['near_ties']} near-ties) | "
            f"{greedy_cell(r['greedy_f32'])} | {greedy_cell(r['greedy_bf16'])} | "
            f"{fmt(r['mean_maxprob'], 3)} | {verdict} |")
    note = (f"\nGoal: max |Δ logprob| of blend's generated tokens against transformers f32 "
            f"<= {TOLERANCE} (folders saved in bf16; <= {TOLERANCE_F32} for the -f32 folders, "
            f"which blend computes in f32), argmax agreement at every position whose f32 top-2 gap is >= "
            f"{NEAR_TIE}. Teacher-forced on blend's own tokens, eager attention.\n")
    if dry_run:
        note = ("\n**DRY RUN**: no transformers; the reference is blend's own logprobs (every "
                "delta 0 by construction). It checks the batch file, the parsing and the table "
                "only.\n")
    return "\n".join(lines) + "\n" + note


# ----------------------------------------------------------------------------------------------
# transformers' half (imported only when used)


def torch_setup():
    import torch
    import transformers
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, cuda "
        f"{torch.version.cuda}, device "
        f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'NONE'}")
    if DEVICE != "cuda":
        log(f"transformers runs on {DEVICE} (HF_PARITY_DEVICE)")
        return True
    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no GPU")
    # The f32 reference must be true f32, not TF32: the newer setting where torch has it (it
    # refuses to mix it with the older one), else the older.
    try:
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.fp32_precision = "ieee"
    except Exception:  # noqa: BLE001
        try:
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        except Exception as e:  # noqa: BLE001
            log(f"cannot turn TF32 off: {e}")
    # Checked, not assumed: an f32 GEMM against float64 (TF32 errs ~1e-3, f32 ~1e-6).
    a = torch.randn(1024, 1024, device="cuda")
    b = torch.randn(1024, 1024, device="cuda")
    exact = a.double().cpu() @ b.double().cpu()
    err = float(((a @ b).double().cpu() - exact).abs().max() / exact.abs().max())
    log(f"f32 GEMM relative error {err:.1e}"
        + ("  <-- WARNING: looks like TF32, the f32 reference is not f32" if err > 1e-4 else ""))
    return True  # attempt() reads None as a failure


# The transformers-written folders: (architecture, config fields, rope scaling or None).
HF_FOLDERS = {
    "hf-llama-tied": ("LlamaForCausalLM", dict(
        hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=2, head_dim=64, max_position_embeddings=8192, rms_norm_eps=1e-5,
        tie_word_embeddings=True), 500000.0, None),
    "hf-llama32-rope": ("LlamaForCausalLM", dict(
        hidden_size=512, intermediate_size=2048, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=128, max_position_embeddings=131072, rms_norm_eps=1e-5,
        tie_word_embeddings=False), 500000.0,
        {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 8192}),
    "hf-qwen2": ("Qwen2ForCausalLM", dict(
        hidden_size=384, intermediate_size=1024, num_hidden_layers=3, num_attention_heads=6,
        num_key_value_heads=2, head_dim=64, max_position_embeddings=32768, rms_norm_eps=1e-6,
        tie_word_embeddings=False, use_sliding_window=False), 1000000.0, None),
    "hf-mistral": ("MistralForCausalLM", dict(
        hidden_size=256, intermediate_size=768, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, max_position_embeddings=32768, rms_norm_eps=1e-5,
        tie_word_embeddings=False, sliding_window=16), 1000000.0, None),
}


def hf_config(arch, fields, theta, scaling, rope_parameters):
    import transformers
    cls = getattr(transformers, arch.replace("ForCausalLM", "Config"))
    kw = dict(fields, vocab_size=VOCAB, bos_token_id=BOS, eos_token_id=[EOS[0], EOS[2]],
              hidden_act="silu", attention_dropout=0.0, initializer_range=0.02)
    if arch == "LlamaForCausalLM":
        kw.update(attention_bias=False, mlp_bias=False)
    # transformers 5 takes rope_parameters (theta inside); 4 takes rope_theta + rope_scaling.
    if rope_parameters:
        kw["rope_parameters"] = dict(scaling or {"rope_type": "default"}, rope_theta=theta)
    else:
        kw["rope_theta"] = theta
        if scaling:
            kw["rope_scaling"] = dict(scaling)
    return cls(**kw)


def expected_inv_freq(head_dim, theta, scaling):
    """Llama-3 RoPE frequencies (transformers' _compute_llama3_parameters), in float64."""
    inv = [1.0 / theta ** (i / head_dim) for i in range(0, head_dim, 2)]
    if not scaling:
        return inv
    factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    lo_wavelen, hi_wavelen = old / lo, old / hi
    out = []
    for f in inv:
        wavelen = 2 * math.pi / f
        if wavelen < hi_wavelen:
            out.append(f)
        elif wavelen > lo_wavelen:
            out.append(f / factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append((1 - smooth) * f / factor + smooth * f)
    return out


def rope_error(model, head_dim, theta, scaling):
    """Max relative error of the model's RoPE frequencies against the formula; None when the
    model has no inv_freq to read."""
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    inv = getattr(rotary, "inv_freq", None)
    if inv is None:
        return None
    want = expected_inv_freq(head_dim, theta, scaling)
    got = inv.double().cpu().tolist()
    if len(got) != len(want):
        return float("inf")
    return max(abs(a - b) / b for a, b in zip(got, want))


def rope_of_config(cfg):
    """(theta, llama3 scaling or None) from a config.json in either layout."""
    rp = cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta") or rp.get("rope_theta") or 10000.0
    scaling = cfg.get("rope_scaling") or (rp if rp.get("rope_type", "default") != "default" else None)
    if scaling and scaling.get("rope_type", scaling.get("type")) != "llama3":
        raise ValueError(f"rope scaling {scaling} is not llama3")
    return float(theta), scaling


def hf_base(name):
    """hf-qwen2-f32 -> hf-qwen2: the -f32 folders are the same models saved in float32."""
    return name[:-4] if name.endswith("-f32") else name


def hf_make_folder(name, out_dir, tokenizer_dir, seed=0):
    import inspect
    import torch
    import transformers
    f32 = name.endswith("-f32")
    name = hf_base(name)
    arch, fields, theta, scaling = HF_FOLDERS[name]
    # The RoPE fields as transformers 5 (rope_parameters) or 4 (rope_theta + rope_scaling)
    # takes them: the one this version's config declares first, the other if its model's
    # frequencies do not come out as intended.
    cls = getattr(transformers, arch.replace("ForCausalLM", "Config"))
    v5 = ("rope_parameters" in inspect.signature(cls.__init__).parameters
          or int(transformers.__version__.split(".")[0]) >= 5)
    model = None
    for style in ([True, False] if v5 else [False, True]):
        try:
            config = hf_config(arch, fields, theta, scaling, style)
            torch.manual_seed(seed)
            model = getattr(transformers, arch)(config)
        except Exception as e:  # noqa: BLE001 - the other style may work
            log(f"  {name}: config with {'rope_parameters' if style else 'rope_theta/rope_scaling'}"
                f" failed: {type(e).__name__}: {e}")
            continue
        err = rope_error(model, fields["head_dim"], theta, scaling)
        kind = scaling["rope_type"] if scaling else "default"
        log(f"  {name}: config with {'rope_parameters' if style else 'rope_theta/rope_scaling'}: "
            f"RoPE frequencies vs the {kind} formula (theta {theta:g}): max relative error "
            f"{'unknown (no inv_freq)' if err is None else f'{err:.1e}'}")
        if err is None or err < 1e-3:  # a wrong theta or a missing scaling errs by far more
            break
        log(f"  {name}: WARNING: RoPE not as intended with this style")
    if model is None:
        raise RuntimeError("no config style could be built")
    hidden = fields["hidden_size"]
    # Weights set here, whatever transformers' own init does: linear and embedding N(0, 0.02),
    # norms near 1 but not 1 (an ignored norm weight shows), q/k/v biases large enough to
    # matter, and an lm_head (the embedding when tied) scaled so logits have std ~2 over the
    # vocabulary: neither flat nor one-hot.
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.uniform_(0.9, 1.1)
            elif pname.endswith(".bias"):
                p.normal_(0.0, 0.3)
            else:
                p.normal_(0.0, 0.02)
        head = model.get_output_embeddings().weight
        head.normal_(0.0, 2.0 / math.sqrt(hidden))
    model = model.to(torch.float32 if f32 else torch.bfloat16)
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    model.save_pretrained(out_dir)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokenizer_dir, f), os.path.join(out_dir, f))
    with open(os.path.join(out_dir, "config.json")) as f:
        cfg = json.load(f)
    keys = ("architectures", "dtype", "torch_dtype", "rope_theta", "rope_scaling", "rope_parameters",
            "sliding_window", "use_sliding_window", "tie_word_embeddings", "attention_bias")
    log(f"  {name}: config.json " + json.dumps({k: cfg[k] for k in keys if k in cfg}))
    log(f"  {name}: files {sorted(os.listdir(out_dir))}")
    return True  # attempt() reads None as a failure


def hf_load(model_dir, dtype):
    import transformers
    model = None
    # transformers 5 names the argument dtype; 4 torch_dtype (and keeps an unknown one quietly).
    for key in ("dtype", "torch_dtype"):
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                model_dir, attn_implementation="eager", **{key: dtype})
        except TypeError:
            continue
        if next(model.parameters()).dtype == dtype:
            break
    if model is None or next(model.parameters()).dtype != dtype:
        raise RuntimeError(f"could not load {model_dir} as {dtype}")
    model = model.to(DEVICE).eval()
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    try:
        err = rope_error(model, head_dim, *rope_of_config(cfg))
        log(f"  loaded {os.path.basename(model_dir)} ({dtype}, {type(model).__name__}, "
            f"attention {getattr(model.config, '_attn_implementation', '?')}): RoPE frequencies "
            f"vs config.json: max relative error {'unknown' if err is None else f'{err:.1e}'}"
            + ("  <-- WARNING" if err is not None and err > 1e-2 else ""))
    except Exception as e:  # noqa: BLE001
        log(f"  RoPE check skipped: {e}")
    return model


def hf_teacher_forced(model, prompts, gens):
    """Per prompt, per generated position: logprob of blend's token, argmax, top-2 gap, max
    prob, from one forward over prompt + generated tokens (logits upcast to f32)."""
    import torch
    out = []
    with torch.no_grad():
        for p, g in zip(prompts, gens):
            ids = torch.tensor([p + g[:-1]], device=DEVICE)
            logits = model(input_ids=ids).logits[0, len(p) - 1:].float()
            lp = torch.log_softmax(logits, dim=-1)
            top2 = torch.topk(lp, 2, dim=-1)
            tok = torch.tensor(g, device=DEVICE)
            rows = lp.gather(1, tok[:, None])[:, 0]
            out.append([{"lp": float(rows[j]), "argmax": int(top2.indices[j, 0]),
                         "gap": float(top2.values[j, 0] - top2.values[j, 1]),
                         "maxprob": float(top2.values[j, 0].exp())} for j in range(len(g))])
    return out


def hf_greedy(model, prompts, n):
    """Greedy decoding by full forwards (no cache, no EOS, no generation_config)."""
    import torch
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = list(p)
            for _ in range(n):
                logits = model(input_ids=torch.tensor([ids], device=DEVICE)).logits[0, -1]
                ids.append(int(logits.float().argmax()))
            out.append(ids[len(p):])
    return out


# ----------------------------------------------------------------------------------------------


def self_test():
    """compare() on made-up records: deltas, near-ties, greedy divergence."""
    blend = [{"tokens": [5, 6, 7], "logprobs": [-1.0, -2.0, -0.5], "top": [[]] * 3}]
    ref = [[{"lp": -1.004, "argmax": 5, "gap": 0.5, "maxprob": 0.4},
            {"lp": -2.0, "argmax": 9, "gap": 0.001, "maxprob": 0.2},   # near-tie, other argmax
            {"lp": -0.52, "argmax": 7, "gap": 1.0, "maxprob": 0.6}]]
    ref16 = [[{"lp": -1.0}, {"lp": -2.1}, {"lp": -0.5}]]
    r = compare(blend, ref, ref16, [[5, 6, 7]], [[5, 9, 7]])
    assert abs(r["max_d_f32"] - 0.02) < 1e-9, r
    assert abs(r["mean_d_f32"] - 0.008) < 1e-9, r
    assert abs(r["max_d_bf16"] - 0.1) < 1e-9, r
    assert (r["argmax_agree"], r["argmax_considered"], r["near_ties"]) == (2, 2, 1), r
    assert r["greedy_f32"] == {"equal": 1, "of": 1, "diverged": []}, r
    assert r["greedy_bf16"]["diverged"] == ["p0@1 (near-tie)"], r
    assert not r["pass"]  # 0.02 > 1e-2
    ref[0][2]["lp"] = -0.505
    assert compare(blend, ref)["pass"]
    ref[0][0]["argmax"] = 4  # a clear argmax disagreement fails
    assert not compare(blend, ref)["pass"]
    assert token_id("token_id:128000") == 128000
    try:
        token_id("Hello")
        raise AssertionError("expected ValueError")
    except ValueError:
        pass
    line = batch_lines([[BOS, 1, 2]], 4, "m")[0]
    assert line["body"]["return_tokens_as_token_ids"] and line["body"]["ignore_eos"]
    t = table([dict(r, folder="f", backend="cpu"), {"folder": "g", "backend": "cuda",
                                                       "error": "no | cuda"}], False)
    assert t.count("\n|") == 3 and "FAIL" in t and "no / cuda" in t, t
    rows = [line for line in t.splitlines() if line.startswith("|")]
    assert all(line.count(" | ") == rows[0].count(" | ") for line in rows), rows
    inv = expected_inv_freq(128, 500000.0, HF_FOLDERS["hf-llama32-rope"][3])
    assert abs(inv[0] - 1.0) < 1e-12 and inv[-1] < 1.0 / 500000.0 ** (126 / 128) / 31, inv[-1]
    v4 = {"rope_theta": 500000.0, "rope_scaling": HF_FOLDERS["hf-llama32-rope"][3]}
    v5 = {"rope_parameters": dict(HF_FOLDERS["hf-llama32-rope"][3], rope_theta=500000.0)}
    assert rope_of_config(v4)[0] == rope_of_config(v5)[0] == 500000.0
    assert rope_of_config(v4)[1]["factor"] == rope_of_config(v5)[1]["factor"] == 32.0
    assert rope_of_config({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}) == (1e6, None)
    assert rope_of_config({"rope_theta": 1e4, "rope_scaling": None}) == (1e4, None)
    print("hf_parity self-test: 11 checks pass")


def write_outputs(out, rows, prompts, a):
    """The table and the numbers so far (rewritten after every folder: a run stopped from
    outside still leaves what it compared)."""
    md = (f"# blend vs transformers ({time.strftime('%Y-%m-%d %H:%M')}, "
          f"{len(prompts or [])} prompts x {a.new_tokens} greedy tokens)\n\n" + table(rows, a.dry_run))
    with open(os.path.join(out, "hf_parity.md"), "w") as f:
        f.write(md)
    with open(os.path.join(out, "hf_parity.json"), "w") as f:
        json.dump({"rows": rows, "prompts": prompts, "dry_run": a.dry_run,
                   "tolerance": TOLERANCE, "near_tie": NEAR_TIE}, f, indent=1)
    return md


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("blend", nargs="?", help="the blend executable (the unpacked wrapper)")
    ap.add_argument("work", nargs="?", help="work folder for the model folders")
    ap.add_argument("--backends", default="cpu,cuda")
    ap.add_argument("--out", default=None, help="output folder (default $OUT, else WORK)")
    ap.add_argument("--folders", default=None,
                    help="comma list of folders to run (default: all; see the module doc)")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--blend-timeout", type=int, default=240, help="seconds per blend batch")
    ap.add_argument("--tokenizer-dir", default=os.environ.get("BLEND_TOKENIZER_DIR"))
    ap.add_argument("--dry-run", action="store_true", help="no torch: blend's half only")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        self_test()
        return 0
    if not a.blend or not a.work:
        ap.error("BLEND and WORK_DIR are required")

    blend = os.path.abspath(a.blend) if os.path.exists(a.blend) else a.blend
    work = os.path.abspath(a.work)
    out = os.path.abspath(a.out or os.environ.get("OUT") or work)
    runs = os.path.join(out, "hf_parity")
    os.makedirs(runs, exist_ok=True)
    os.makedirs(os.path.join(work, "models"), exist_ok=True)
    STEPS.file = os.path.join(out, "hf_parity.log")
    backends = [b for b in a.backends.split(",") if b]
    t_start = time.time()
    log(f"blend {blend}, work {work}, out {out}, backends {backends}, dry run {a.dry_run}")

    # (preset, layers): tiny (head_dim 16) and an 8B layer shape (head_dim 128) at 2 layers.
    blend_folders = {"blend-tiny": ("tiny", None), "blend-llama-3-8b-2l": ("llama-3-8b", 2)}
    # Each transformers folder twice: bf16 (blend computes bf16 GEMMs: the 1e-2 goal) and f32
    # (blend computes f32 throughout: the same math must agree to TOLERANCE_F32).
    hf_names = [] if a.dry_run else list(HF_FOLDERS) + [n + "-f32" for n in HF_FOLDERS]
    names = list(blend_folders) + hf_names
    if a.folders:
        names = [n for n in a.folders.split(",") if n in blend_folders or hf_base(n) in HF_FOLDERS]
    if not a.dry_run and attempt("import torch + transformers", torch_setup) is None:
        log("no transformers reference: running blend's half only (as --dry-run)")
        a.dry_run = True
        names = [n for n in names if n in blend_folders]

    tokenizer_dir = a.tokenizer_dir
    # The unpacked bundle's (bench/gpu/unpack.sh: DEST/bin/blend beside DEST/tokenizer).
    bundled = os.path.join(os.path.dirname(os.path.dirname(blend)), "tokenizer")
    if not tokenizer_dir and os.path.isfile(os.path.join(bundled, "tokenizer.json")):
        tokenizer_dir = bundled
    log(f"tokenizer folder: {tokenizer_dir or 'the first blend-written folder'}")
    made = {}
    for name in names:
        d = os.path.join(work, "models", name)
        if name in blend_folders:
            preset, layers = blend_folders[name]
            ok = attempt(f"{name}: blend model init", blend_init, blend, d, preset, runs, layers)
            if ok is None and not os.path.exists(os.path.join(d, "config.json")):
                continue
            if not tokenizer_dir:
                tokenizer_dir = d  # init copied the tokenizer in
        else:
            if not tokenizer_dir:
                log(f"{name}: no tokenizer folder (--tokenizer-dir or BLEND_TOKENIZER_DIR); skipped")
                continue
            if attempt(f"{name}: transformers save_pretrained", hf_make_folder, name, d,
                       tokenizer_dir) is None:
                continue
        attempt(f"{name}: blend model info", blend_model_info, blend, d, runs)
        made[name] = d
    if not made:
        log("no model folder could be made; nothing to compare")

    prompts = None
    if made:
        prompts = attempt("tokenize the prompts", make_prompts, blend, next(iter(made.values())),
                          runs)

    rows = []
    for name, d in made.items():
        gens = {}
        for backend in backends:
            res = attempt(f"{name}: blend batch --backend {backend}", run_blend, blend, d, backend,
                          prompts, a.new_tokens, os.path.join(runs, name), a.blend_timeout)
            if res is None:
                rows.append({"folder": name, "backend": backend,
                             "error": f"blend failed (see hf_parity/{name}/{backend}.log)"})
            else:
                gens[backend] = res
        if not gens:
            continue
        refs = {}
        if a.dry_run:
            for backend, res in gens.items():
                refs[backend] = {"f32": self_reference(res)}
        else:
            import torch
            for dtype_name, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
                model = attempt(f"{name}: transformers load ({dtype_name}, {DEVICE}, eager)", hf_load,
                                d, dtype)
                if model is None:
                    continue
                for backend, res in gens.items():
                    ref = attempt(f"{name}: transformers {dtype_name} teacher-forced on blend "
                                  f"{backend}'s tokens", hf_teacher_forced, model, prompts,
                                  [r["tokens"] for r in res])
                    if ref is not None:
                        refs.setdefault(backend, {})[dtype_name] = ref
                greedy = attempt(f"{name}: transformers {dtype_name} greedy", hf_greedy, model,
                                 prompts, a.new_tokens)
                if greedy is not None:
                    for backend in gens:
                        refs.setdefault(backend, {})["greedy_" + dtype_name] = greedy
                del model
                if DEVICE == "cuda":
                    torch.cuda.empty_cache()
        for backend, res in gens.items():
            ref = refs.get(backend, {})
            if "f32" not in ref:
                rows.append({"folder": name, "backend": backend,
                             "error": "no transformers f32 reference (see hf_parity.log)"})
                continue
            row = attempt(f"{name} {backend}: compare", compare, res, ref["f32"], ref.get("bf16"),
                          ref.get("greedy_f32"), ref.get("greedy_bf16"),
                          TOLERANCE_F32 if name.endswith("-f32") else TOLERANCE)
            if row is not None:
                row.update(folder=name, backend=backend)
                rows.append(row)
                log(f"{name} {backend}: max |dlp| vs f32 {fmt(row['max_d_f32'])}, argmax "
                    f"{row['argmax_agree']}/{row['argmax_considered']}, mean max-prob "
                    f"{fmt(row['mean_maxprob'], 3)}, {'PASS' if row['pass'] else 'FAIL'}")

        order = list(made)
        rows.sort(key=lambda r: (order.index(r["folder"]), backends.index(r["backend"])))
        write_outputs(out, rows, prompts, a)
    md = write_outputs(out, rows, prompts, a)
    print(md, flush=True)
    log(f"wrote {os.path.join(out, 'hf_parity.md')} and hf_parity.json in "
        f"{time.time() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
