#!/usr/bin/env python3
"""Runs bench/gpu/hf_parity.py's transformers half here, without transformers or a GPU.

It writes a stand-in `transformers` package into a temporary folder: AutoModelForCausalLM
.from_pretrained reads a blend-written Llama folder (config.json, model.safetensors in bf16) and
computes the Llama forward pass in plain torch as transformers' eager code does (RMSNorm in f32,
RoPE with llama3 scaling, grouped-query attention with the softmax in f32, SwiGLU, untied or
tied lm_head) in the dtype asked for. hf_parity.py then runs with HF_PARITY_DEVICE=cpu on the
blend-tiny folder and the cpu backend, through its real path: load in f32 and bf16,
teacher-forced logprobs, greedy decoding, the comparison and the table. The numbers are a real
check of blend's cpu backend against an independent torch forward (not against transformers).

Needs a python3 with torch (Debian's python3-torch is enough). Usage:
  /usr/bin/python3 bench/gpu/check_hf_parity.py BLEND [OUT_DIR]
"""

import os
import subprocess
import sys
import tempfile

STUB = r'''
"""A stand-in for transformers (bench/gpu/check_hf_parity.py): Llama only, eager math."""
import json
import math
import os
import types

import torch

__version__ = "0.0-stand-in"


def _read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    base = 8 + n
    kinds = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16}
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        buf = bytearray(data[base + a:base + b])
        out[name] = torch.frombuffer(buf, dtype=kinds[t["dtype"]]).reshape(t["shape"]).clone()
    return out


def _inv_freq(cfg, head_dim):
    rp = cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta") or rp.get("rope_theta") or 10000.0
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    sc = cfg.get("rope_scaling") or (rp if rp.get("rope_type", "default") != "default" else None)
    if sc:
        factor, lo, hi = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"]
        old = sc["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / hi) & (wavelen <= old / lo)
        inv = torch.where(medium, smoothed, scaled)
    return inv


class _Rotary(torch.nn.Module):
    def __init__(self, inv):
        super().__init__()
        self.register_buffer("inv_freq", inv, persistent=False)


class _Model(torch.nn.Module):
    def __init__(self, cfg, weights, dtype):
        super().__init__()
        self.cfg = cfg
        self.config = types.SimpleNamespace(_attn_implementation="eager")
        self.w = torch.nn.ParameterDict(
            {k.replace(".", "__"): torch.nn.Parameter(v.to(dtype), requires_grad=False)
             for k, v in weights.items()})
        self.head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        self.model = types.SimpleNamespace(rotary_emb=_Rotary(_inv_freq(cfg, self.head_dim)))

    def W(self, name):
        return self.w[name.replace(".", "__")]

    def _norm(self, x, name):
        var = x.float().pow(2).mean(-1, keepdim=True)
        return self.W(name) * (x.float() * torch.rsqrt(var + self.cfg["rms_norm_eps"])).to(x.dtype)

    def forward(self, input_ids):
        c, hd = self.cfg, self.head_dim
        nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
        ids = input_ids[0]
        t = ids.shape[0]
        x = self.W("model.embed_tokens.weight")[ids]
        pos = torch.arange(t).float()
        freqs = torch.outer(pos, self.model.rotary_emb.inv_freq.float())
        emb = torch.cat([freqs, freqs], -1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)

        def rope(v):  # v: heads x t x hd
            half = hd // 2
            rot = torch.cat([-v[..., half:], v[..., :half]], -1)
            return v * cos + rot * sin

        mask = torch.ones(t, t, dtype=torch.bool).tril()
        if c.get("sliding_window"):
            mask &= ~torch.ones(t, t, dtype=torch.bool).tril(-c["sliding_window"])
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            h = self._norm(x, p + "input_layernorm.weight")
            q = (h @ self.W(p + "self_attn.q_proj.weight").T).view(t, nh, hd).transpose(0, 1)
            k = (h @ self.W(p + "self_attn.k_proj.weight").T).view(t, nkv, hd).transpose(0, 1)
            v = (h @ self.W(p + "self_attn.v_proj.weight").T).view(t, nkv, hd).transpose(0, 1)
            q, k = rope(q), rope(k)
            k = k.repeat_interleave(nh // nkv, 0)
            v = v.repeat_interleave(nh // nkv, 0)
            s = (q @ k.transpose(1, 2)) / math.sqrt(hd)
            s = s.masked_fill(~mask, float("-inf"))
            a = torch.softmax(s, -1, dtype=torch.float32).to(q.dtype)
            o = (a @ v).transpose(0, 1).reshape(t, nh * hd)
            x = x + o @ self.W(p + "self_attn.o_proj.weight").T
            h = self._norm(x, p + "post_attention_layernorm.weight")
            g = torch.nn.functional.silu(h @ self.W(p + "mlp.gate_proj.weight").T)
            u = h @ self.W(p + "mlp.up_proj.weight").T
            x = x + (g * u) @ self.W(p + "mlp.down_proj.weight").T
        x = self._norm(x, "model.norm.weight")
        head = ("lm_head.weight" if "lm_head__weight" in self.w else "model.embed_tokens.weight")
        return types.SimpleNamespace(logits=(x @ self.W(head).T)[None])


class AutoModelForCausalLM:
    @staticmethod
    def from_pretrained(model_dir, attn_implementation="eager", dtype=None, **kw):
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        if cfg["architectures"] != ["LlamaForCausalLM"] or cfg.get("attention_bias"):
            raise NotImplementedError("the stand-in runs Llama without biases only")
        weights = _read_safetensors(os.path.join(model_dir, "model.safetensors"))
        return _Model(cfg, weights, dtype or torch.float32)
'''


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    blend = os.path.abspath(sys.argv[1])
    out = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else tempfile.mkdtemp()
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as stub:
        os.makedirs(os.path.join(stub, "transformers"))
        with open(os.path.join(stub, "transformers", "__init__.py"), "w") as f:
            f.write(STUB)
        env = dict(os.environ, HF_PARITY_DEVICE="cpu",
                   PYTHONPATH=stub + os.pathsep + os.environ.get("PYTHONPATH", ""))
        cmd = [sys.executable, os.path.join(here, "hf_parity.py"), blend,
               os.path.join(out, "work"), "--out", out, "--backends", "cpu",
               "--folders", "blend-tiny", "--new-tokens", "16"]
        print("$ " + " ".join(cmd), flush=True)
        rc = subprocess.call(cmd, env=env)
    with open(os.path.join(out, "hf_parity.md")) as f:
        md = f.read()
    ok = rc == 0 and "| blend-tiny | cpu | 64 |" in md and "DRY RUN" not in md
    print(f"check_hf_parity: hf_parity exit {rc}; the non-dry path "
          f"{'ran' if ok else 'did NOT run'} (table in {out}/hf_parity.md)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
