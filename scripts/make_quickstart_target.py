#!/usr/bin/env python3
"""Trains the quickstart's small target: a Qwen3-architecture causal LM
(hidden 192, 6 layers, 3 heads / 1 KV head of 64, MLP 512, about 2.4 M
parameters) over bytes, on the Python 3.11 documentation's reST sources
(Debian package python3.11-doc, PSF licence), everything except tutorial/,
which stays held out. Run on the GPU machine with transformers; writes a
Hugging Face directory (config.json + model.safetensors in bf16).

    tar -C /usr/share/doc/python3.11/html -cf .deps/corpus/python-docs.tar _sources   # on the CPU machine
    python3 scripts/make_quickstart_target.py --corpus .deps/corpus/python-docs.tar --out DIR

Tokens: ids 0-255 are bytes; 256 = BOS, 257 = EOS, 258 = PAD, 259 = MASK
(the drafter's mask token, never seen by the target).
"""
import argparse
import io
import json
import math
import os
import random
import tarfile
import time

import torch
import transformers
from safetensors.torch import save_file

BOS, EOS, PAD, MASK, VOCAB = 256, 257, 258, 259, 260


def documents(tar_path):
    train, heldout = [], []
    with tarfile.open(tar_path) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            if not member.isfile() or not member.name.endswith(".txt"):
                continue
            data = tar.extractfile(member).read()
            (heldout if "/tutorial/" in member.name else train).append(data)
    return train, heldout


def stream(docs):
    out = []
    for d in docs:
        out.append(BOS)
        out.extend(d)
        out.append(EOS)
    return torch.tensor(out, dtype=torch.long)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--corpus", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    train_docs, heldout_docs = documents(args.corpus)
    train, heldout = stream(train_docs).cuda(), stream(heldout_docs).cuda()
    print(f"train bytes {train.numel()}, held-out bytes {heldout.numel()}", flush=True)
    config = transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=192, intermediate_size=512, num_hidden_layers=6, num_attention_heads=3,
        num_key_value_heads=1, head_dim=64, max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=False, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)
    model = transformers.Qwen3ForCausalLM(config).cuda()
    print(f"parameters {sum(p.numel() for p in model.parameters())}", flush=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = 200

    def lr_at(step):
        if step < warmup:
            return args.lr * (step + 1) / warmup
        progress = (step - warmup) / max(1, args.steps - warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    def batch(tokens, n):
        starts = torch.randint(0, tokens.numel() - args.seq - 1, (n,), device="cuda")
        index = starts[:, None] + torch.arange(args.seq + 1, device="cuda")[None, :]
        return tokens[index]

    @torch.no_grad()
    def evaluate():
        model.eval()
        g = torch.Generator(device="cuda").manual_seed(1)
        starts = torch.randint(0, heldout.numel() - args.seq - 1, (64,), device="cuda", generator=g)
        x = heldout[starts[:, None] + torch.arange(args.seq + 1, device="cuda")[None, :]]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x[:, :-1]).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1))
        acc = (logits.argmax(-1) == x[:, 1:]).float().mean()
        model.train()
        return loss.item() / math.log(2), acc.item()

    start = time.time()
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        x = batch(train, args.batch)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x[:, :-1]).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 500 == 0 or step == args.steps - 1:
            bits, acc = evaluate()
            print(json.dumps({"step": step, "train_loss": loss.item(), "heldout_bits_per_byte": bits,
                              "heldout_next_byte_accuracy": acc, "seconds": time.time() - start}), flush=True)
    os.makedirs(args.out, exist_ok=True)
    config.torch_dtype = "bfloat16"
    config.architectures = ["Qwen3ForCausalLM"]
    config.to_json_file(os.path.join(args.out, "config.json"))
    state = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(args.out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(args.out, "tokenizer.json"), "w") as f:
        json.dump({"type": "bytes", "vocab_size": VOCAB, "bos_token_id": BOS, "eos_token_id": EOS,
                   "pad_token_id": PAD, "mask_token_id": MASK,
                   "note": "ids 0-255 are the bytes of UTF-8 text; made by scripts/make_quickstart_target.py"}, f, indent=2)


if __name__ == "__main__":
    main()
