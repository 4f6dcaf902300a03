"""train_gpt's model (nx::nn::gpt) in PyTorch eager on CPU: times training steps (forward, backward,
clipping, AdamW) and prints tokens a second as JSON.

usage: python benches/torch_gpt_step.py VOCAB CONTEXT LAYERS HEADS WIDTH BATCH STEPS THREADS
"""
import json
import sys
import time

import torch

vocab, context, layers, heads, width, batch, steps, threads = (int(x) for x in sys.argv[1:9])
torch.set_num_threads(threads)
torch.manual_seed(0)


def param(*shape, std=0.02):
    return torch.nn.Parameter(torch.randn(*shape) * std)


p = {"tok": param(vocab, width), "pos": param(context, width), "head.w": param(width, vocab)}
for i in range(layers):
    # q, k and v one fused projection (GPT-2's c_attn), as nx's
    for n, (a, b) in {"attn.qkv": (width, 3 * width), "attn.out": (width, width),
                      "mlp.fc": (width, 4 * width), "mlp.proj": (4 * width, width)}.items():
        p[f"h{i}.{n}.w"] = param(a, b)
        p[f"h{i}.{n}.b"] = torch.nn.Parameter(torch.zeros(b))
    for n in ("ln1", "ln2"):
        p[f"h{i}.{n}.g"] = torch.nn.Parameter(torch.ones(width))
        p[f"h{i}.{n}.b"] = torch.nn.Parameter(torch.zeros(width))
p["ln_f.g"] = torch.nn.Parameter(torch.ones(width))
p["ln_f.b"] = torch.nn.Parameter(torch.zeros(width))


def ln(x, pre):
    return torch.nn.functional.layer_norm(x, (width,), p[pre + ".g"], p[pre + ".b"], 1e-5)


def lin(x, pre):
    return x @ p[pre + ".w"] + p[pre + ".b"]


def forward(ids):
    b, n = ids.shape
    d = width // heads
    x = p["tok"][ids] + p["pos"][:n]
    for i in range(layers):
        h = ln(x, f"h{i}.ln1")
        q, k, v = (y.view(b, n, heads, d).transpose(1, 2) for y in lin(h, f"h{i}.attn.qkv").split(width, dim=2))
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + lin(o.transpose(1, 2).reshape(b, n, width), f"h{i}.attn.out")
        h = torch.nn.functional.gelu(lin(ln(x, f"h{i}.ln2"), f"h{i}.mlp.fc"), approximate="tanh")
        x = x + lin(h, f"h{i}.mlp.proj")
    return ln(x, "ln_f") @ p["head.w"]


opt = torch.optim.AdamW(list(p.values()), lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
ids = torch.randint(0, vocab, (batch, context))
labels = torch.randint(0, vocab, (batch, context))


def step():
    loss = torch.nn.functional.cross_entropy(forward(ids).reshape(-1, vocab), labels.reshape(-1))
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(list(p.values()), 1.0)
    opt.step()


for _ in range(2):
    step()
start = time.perf_counter()
for _ in range(steps):
    step()
print(json.dumps({"tokens_per_s": steps * batch * context / (time.perf_counter() - start)}))
