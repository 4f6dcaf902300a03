"""The GPT of nx's train_gpt (nx::nn::gpt), written in PyTorch, trained from nx's initial weights on
nx's batches; prints its per-step losses as JSON.

usage: python tests/torch_gpt.py FILE.safetensors

FILE holds the initial parameters under nx's names (weights [in, out]), `ids` and `labels`
([steps, batch, t], int64, labels of -1 ignored) and `config` (int64: vocab, context, layers,
heads, width, steps) and `lr` (float64: the peak rate).
"""
import json
import math
import sys

import torch
from safetensors.torch import load_file

torch.set_num_threads(2)
torch.manual_seed(0)
t = load_file(sys.argv[1])
vocab, context, layers, heads, width, steps = (int(x) for x in t["config"])
peak = float(t["lr"][0])
names = [k for k in t if k not in ("ids", "labels", "config", "lr")]
p = {k: torch.nn.Parameter(t[k].clone().float()) for k in names}


def layer_norm(x, pre):
    return torch.nn.functional.layer_norm(x, (width,), p[pre + ".g"], p[pre + ".b"], 1e-5)


def linear(x, pre, bias=True):
    # nx's fused q, k, v weight [width, 3, width] (bias [3, width]) read as [width, 3·width]
    w = p[pre + ".w"]
    y = x @ w.reshape(w.shape[0], -1)
    return y + p[pre + ".b"].reshape(-1) if bias else y


def forward(ids):
    b, n = ids.shape
    x = p["tok"][ids] + p["pos"][:n]
    d = width // heads
    for i in range(layers):
        h = layer_norm(x, f"h{i}.ln1")
        q, k, v = (y.view(b, n, heads, d).transpose(1, 2) for y in linear(h, f"h{i}.attn.qkv").split(width, dim=2))
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + linear(o.transpose(1, 2).reshape(b, n, width), f"h{i}.attn.out")
        h = layer_norm(x, f"h{i}.ln2")
        h = torch.nn.functional.gelu(linear(h, f"h{i}.mlp.fc"), approximate="tanh")
        x = x + linear(h, f"h{i}.mlp.proj")
    return linear(layer_norm(x, "ln_f"), "head", bias=False)


def warmup_cosine(step, warmup, total, peak, floor):
    if step < warmup:
        return peak * (step + 1) / warmup
    if step >= total:
        return floor
    q = (step - warmup) / max(total - warmup, 1)
    return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * q))


opt = torch.optim.AdamW(list(p.values()), lr=peak, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
losses = []
for step in range(steps):
    logits = forward(t["ids"][step])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), t["labels"][step].reshape(-1), ignore_index=-1)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(list(p.values()), 1.0)
    for g in opt.param_groups:
        g["lr"] = warmup_cosine(step, steps // 20 + 1, steps, peak, peak / 10)
    opt.step()
    losses.append(loss.item())
print(json.dumps(losses))
