#!/usr/bin/env python3
"""Makes the GPU demonstration's target: a byte-level BPE tokenizer trained on
the offline corpus (scripts/gpu_demo/make_corpus.py), and a small Qwen3
language model trained on it for a fixed time on the GPU, saved as a Hugging
Face model directory (config.json, model.safetensors, tokenizer.json,
tokenizer_config.json with a ChatML template). Training a target is not
dflash-host's job; its output is what a user would bring.

Also writes the prompts the demonstration uses, as {"text": ...} lines that
`dflash-host prepare --for-generate` turns into prompts. With --prompts-from
unseen-docs (the default), 30% of the documents are kept from the target, and
split by document:
  generate_texts.jsonl  windows of 5/6 of them: the target answers them with
                        its own generation (a prompt it never saw, as a real
                        target's users' are), and the drafter trains on that;
  eval_texts.jsonl      windows of the other 1/6: documents neither the target
                        nor the drafter saw;
  unseen_texts.jsonl    the other kind, for comparison: windows of the
                        target's training documents, which a small overfit
                        target recites.
With --prompts-from target-docs the first two come from the target's training
documents (90% / 10%) and the third from 3% kept from it.

    python3 scripts/gpu_demo/train_target.py --corpus .corpus/corpus.jsonl.gz --out WORK --seconds 150
"""
import argparse
import gzip
import json
import math
import os
import random
import time

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import Qwen3Config, Qwen3ForCausalLM

# Qwen2/Qwen3's pre-tokenizer split (their tokenizer.json), so the tokenizer is
# of the family dflash-host reads.
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
         r"\s+(?!\S)|\s+")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def log(**fields):
    print(json.dumps(fields), flush=True)


SOURCE_OF = {}  # document text -> its corpus source (make_corpus.py tags each document)


def read_corpus(path, heldout_percent, seed):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    docs = [line["text"] for line in lines]
    for line in lines:
        SOURCE_OF.setdefault(line["text"], line.get("source", "unknown"))
    rng = random.Random(seed)
    flags = [rng.random() * 100 < heldout_percent for _ in docs]
    train = [d for d, h in zip(docs, flags) if not h]
    heldout = [d for d, h in zip(docs, flags) if h]
    return train, heldout


def train_tokenizer(docs, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer)
    return tok


def token_stream(tok, docs, eos):
    ids = []
    for enc in tok.encode_batch(docs):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.int32)


def windows(tok, docs, count, tokens, seed):
    """Prompt texts: `tokens`-token windows of random documents, decoded,
    each with its document's source."""
    rng = random.Random(seed)
    encoded = [(e.ids, SOURCE_OF.get(d, "unknown")) for e, d in zip(tok.encode_batch(docs), docs)]
    usable = [(ids, src) for ids, src in encoded if len(ids) > tokens + 8]
    out = []
    for _ in range(count):
        ids, src = rng.choice(usable)
        start = rng.randrange(0, len(ids) - tokens)
        out.append((tok.decode(ids[start:start + tokens]), src))
    return out


def unlikelihood_loss(logits, x, y):
    """Token-level unlikelihood: at position t the candidates are the tokens
    x_0..x_t already seen, less the true next token y_t; the loss is
    -sum log(1 - p(c)) over them, averaged over positions."""
    b, t, v = logits.shape
    seen = torch.zeros(b, t, v, device=logits.device, dtype=torch.int16)
    seen.scatter_(2, x.unsqueeze(-1), 1)
    candidates = seen.cumsum(dim=1, dtype=torch.int16) > 0
    candidates.scatter_(2, y.unsqueeze(-1), False)
    probs = torch.softmax(logits.float(), dim=-1)
    penalty = -torch.log1p(-probs.clamp(max=1 - 1e-5)) * candidates
    return penalty.sum() / (b * t)


def build_model(args, vocab, eos):
    """The demo's target: a dense Qwen3, or the hybrid Qwen3.5 of the same width and depth."""
    common = dict(vocab_size=vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 3,
                  num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                  num_key_value_heads=args.hidden // 128, head_dim=64, max_position_embeddings=2048,
                  rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=None, eos_token_id=eos, pad_token_id=eos)
    if args.family == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(**common, rope_theta=10000.0, attn_implementation="sdpa"))
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    pattern = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
    config = Qwen3_5TextConfig(**common, layer_types=[pattern[i % 4] for i in range(args.layers)],
                               linear_num_key_heads=args.hidden // 128, linear_num_value_heads=args.hidden // 64,
                               linear_key_head_dim=64, linear_value_head_dim=64, linear_conv_kernel_dim=4,
                               partial_rotary_factor=0.25, attn_output_gate=True,
                               rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25),
                               attn_implementation="sdpa")
    return Qwen3_5ForCausalLM(config)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True)
    p.add_argument("--out", required=True, help="work folder: target/ and the prompt files go here")
    p.add_argument("--seconds", type=float, default=150, help="training time budget")
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--family", choices=["qwen3", "qwen3_5"], default="qwen3",
                   help="qwen3: a dense Qwen3 (target plugin hf_decoder); qwen3_5: the Qwen3.5 / Qwen3.6 hybrid, "
                        "3 Gated DeltaNet layers to 1 gated full-attention layer (target plugin hf_hybrid)")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1.5e-3)
    p.add_argument("--generate-prompts", type=int, default=8192)
    p.add_argument("--eval-prompts", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompts-from", choices=["unseen-docs", "target-docs"], default="unseen-docs",
                   help="unseen-docs: the prompts (the drafter's and eval's, disjoint) come from documents the target "
                        "never trained on, so its answers are its own generation; target-docs: from the target's "
                        "training documents, where an overfit small target recites them")
    p.add_argument("--unlikelihood", type=float, default=0.0,
                   help="weight of token-level unlikelihood training (Welleck et al. 2019, 'Neural text generation "
                        "with unlikelihood training'): each position also pushes down the probability of the tokens "
                        "already in its context, the remedy for a small LM's greedy loops; 0 = plain cross-entropy")
    p.add_argument("--unseen-percent", type=float, default=30.0,
                   help="unseen-docs: the share of documents kept from the target for prompts")
    args = p.parse_args()
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    target_dir = os.path.join(args.out, "target")
    os.makedirs(target_dir, exist_ok=True)
    started = time.time()

    unseen = args.prompts_from == "unseen-docs"
    train_docs, heldout_docs = read_corpus(args.corpus, args.unseen_percent if unseen else 3.0, args.seed)
    tok = train_tokenizer(train_docs, args.vocab)
    tok.save(os.path.join(target_dir, "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    with open(os.path.join(target_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "bos_token": None,
                   "pad_token": "<|endoftext|>", "model_max_length": 2048, "chat_template": CHATML}, f, indent=2)
    stream = token_stream(tok, train_docs, eos)
    held = token_stream(tok, heldout_docs, eos)
    log(stage="tokenizer", vocab=tok.get_vocab_size(), train_docs=len(train_docs), heldout_docs=len(heldout_docs),
        train_tokens=int(stream.numel()), heldout_tokens=int(held.numel()), seconds=round(time.time() - started, 1))

    model = build_model(args, tok.get_vocab_size(), eos).cuda()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    data = stream.cuda().long()
    n = data.numel() - args.seq - 1
    g = torch.Generator(device="cuda").manual_seed(args.seed)

    def batch(source, size, gen):
        starts = torch.randint(0, source.numel() - args.seq - 1, (size,), device="cuda", generator=gen)
        idx = starts[:, None] + torch.arange(args.seq + 1, device="cuda")[None, :]
        x = source[idx]
        return x[:, :-1], x[:, 1:]

    train_start, step, warmup = time.time(), 0, 100
    model.train()
    while True:
        elapsed = time.time() - train_start
        if elapsed >= args.seconds:
            break
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * elapsed / args.seconds)))
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = batch(data, args.batch, g)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))
        if args.unlikelihood > 0:
            loss = loss + args.unlikelihood * unlikelihood_loss(logits, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 200 == 0:
            log(stage="train", step=step, loss=round(loss.item(), 4), lr=lr, seconds=round(time.time() - train_start, 1))

    model.eval()
    heldout = held.cuda().long()
    hg = torch.Generator(device="cuda").manual_seed(1)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        losses = []
        for _ in range(8):
            x, y = batch(heldout, 32, hg)
            logits = model(input_ids=x).logits
            losses.append(torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1)).item())
    model = model.to(torch.bfloat16)
    model.save_pretrained(target_dir, safe_serialization=True)
    log(stage="target", parameters=params, steps=step, tokens_seen=step * args.batch * args.seq,
        train_loss=round(loss.item(), 4), heldout_loss=round(sum(losses) / len(losses), 4),
        seconds=round(time.time() - started, 1), path=target_dir)

    # The drafter's prompts and eval's come from disjoint documents: eval's
    # are documents the drafter never saw, in either mode.
    rng = random.Random(args.seed + 1)
    source = heldout_docs if unseen else train_docs
    eval_flags = [rng.random() < (1 / 6 if unseen else 0.1) for _ in source]
    generate_docs = [d for d, e in zip(source, eval_flags) if not e]
    eval_docs = [d for d, e in zip(source, eval_flags) if e]
    # The third set is the other kind: with unseen-docs, the target's own training documents (recitation);
    # with target-docs, documents the target never saw.
    other_docs = train_docs if unseen else heldout_docs
    log(stage="prompts", prompts_from=args.prompts_from, generate_docs=len(generate_docs), eval_docs=len(eval_docs),
        other_docs=len(other_docs))
    for name, docs, count, seed in (("generate_texts.jsonl", generate_docs, args.generate_prompts, 2),
                                    ("eval_texts.jsonl", eval_docs, args.eval_prompts, 3),
                                    ("unseen_texts.jsonl", other_docs, args.eval_prompts, 4)):
        with open(os.path.join(args.out, name), "w") as f:
            for text, src in windows(tok, docs, count, args.prompt_tokens, seed):
                f.write(json.dumps({"text": text, "source": src}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
