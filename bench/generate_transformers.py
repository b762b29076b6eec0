#!/usr/bin/env python3
"""The peer side of `dflash-host generate`'s speed: Hugging Face transformers'
`generate` on the same model directory and the same prompts, greedy, with the
same max_new_tokens and batch size, timed the same way (generated tokens over
wall clock, prefill included).

    python3 bench/generate_transformers.py --model DIR --prompts FILE.jsonl \
        [--batch-size 32 --max-new-tokens 256 --max-prompts 256 --prompt-tokens 64 --dtype bfloat16]

Prompts are read as `dflash-host generate` reads them:
  {"prompt_ids": [...]}                 the whole list;
  {"input_ids": [...], "loss_mask": [...]}  the tokens before the first supervised one;
  {"input_ids": [...]}                  the first --prompt-tokens;
  {"text": "..."}                       through the directory's tokenizer (AutoTokenizer), without special tokens added.

transformers batches statically: a batch of --batch-size prompts (left-padded)
decodes until its last sequence stops, and the next batch starts only then.
Tokens after a sequence's end-of-sequence token are padding and are not
counted. `dflash-host generate` replaces a finished sequence with the next
prompt at once (continuous batching); that difference is part of what is
compared.

Prints one JSON line: tokens/s, generated tokens, seconds, the settings and the
versions. With --out FILE it also writes the generated lines in the format of
`dflash-host generate --out` (input_ids = prompt + answer, loss_mask), so the
two outputs can be compared token for token (in bf16 they may differ where two
tokens' logits nearly tie: the two implementations round differently).
"""
import argparse
import json
import time

import torch
import transformers


def read_prompts(path, prompt_tokens, max_prompts, tokenizer_dir):
    prompts = []
    tokenizer = None
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            j = json.loads(line)
            if "prompt_ids" in j:
                ids = list(j["prompt_ids"])
            elif "input_ids" in j:
                ids = list(j["input_ids"])
                mask = j.get("loss_mask")
                if mask is not None and 1 in mask:
                    ids = ids[: mask.index(1)]
                else:
                    ids = ids[:prompt_tokens]
            elif "text" in j:
                if tokenizer is None:
                    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
                ids = tokenizer(j["text"], add_special_tokens=False)["input_ids"]
            else:
                raise SystemExit(f"{path}:{number}: needs \"prompt_ids\", \"input_ids\" or \"text\"")
            if not ids:
                raise SystemExit(f"{path}:{number}: the prompt is empty")
            prompts.append((number, ids))
            if max_prompts and len(prompts) >= max_prompts:
                break
    return prompts


def eos_ids(config):
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        return []
    return list(eos) if isinstance(eos, (list, tuple)) else [eos]


def answer_of(row, eos):
    """The generated tokens up to and including the first end-of-sequence token."""
    out = []
    for token in row:
        out.append(token)
        if token in eos:
            break
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, help="the Hugging Face model directory")
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--max-prompts", type=int, default=0, help="0: all")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--attention", default="sdpa", help="attn_implementation (sdpa, eager, flash_attention_2)")
    parser.add_argument("--cache-implementation", default=None, help="e.g. static (default: transformers' dynamic cache)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed generate calls on the first batch first")
    parser.add_argument("--out", default=None, help="also write the generated lines here")
    args = parser.parse_args()

    dtype = getattr(torch, args.dtype)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype,
                                                              attn_implementation=args.attention).to(args.device).eval()
    prompts = read_prompts(args.prompts, args.prompt_tokens, args.max_prompts, args.model)
    eos = eos_ids(model.config)
    pad = model.config.pad_token_id if getattr(model.config, "pad_token_id", None) is not None else (eos[0] if eos else 0)
    settings = dict(do_sample=False, max_new_tokens=args.max_new_tokens, eos_token_id=eos or None, pad_token_id=pad,
                    temperature=None, top_p=None, top_k=None)
    if args.cache_implementation:
        settings["cache_implementation"] = args.cache_implementation

    def batch_tensors(batch):
        width = max(len(ids) for _, ids in batch)
        input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (_, ids) in enumerate(batch):  # left padding: every row's last prompt token is aligned
            input_ids[i, width - len(ids):] = torch.tensor(ids)
            attention[i, width - len(ids):] = 1
        return input_ids.to(args.device), attention.to(args.device), width

    batches = [prompts[i:i + args.batch_size] for i in range(0, len(prompts), args.batch_size)]
    with torch.no_grad():
        for _ in range(args.warmup):
            ids, attention, _ = batch_tensors(batches[0])
            model.generate(input_ids=ids, attention_mask=attention, **settings)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        lines, generated = [], 0
        start = time.perf_counter()
        for batch in batches:
            ids, attention, width = batch_tensors(batch)
            out = model.generate(input_ids=ids, attention_mask=attention, **settings)
            rows = out[:, width:].tolist()  # a host copy: every batch ends with one, as ours does per step
            for (number, prompt), row in zip(batch, rows):
                answer = answer_of(row, eos)
                generated += len(answer)
                lines.append({"input_ids": prompt + answer, "loss_mask": [0] * len(prompt) + [1] * len(answer),
                              "prompt_line": number})
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start

    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")
    print(json.dumps({"impl": "transformers " + transformers.__version__ + ", torch " + torch.__version__,
                      "tokens_per_s": generated / seconds if seconds > 0 else 0.0, "generated_tokens": generated,
                      "seconds": seconds, "prompts": len(prompts), "batch_size": args.batch_size,
                      "max_new_tokens": args.max_new_tokens, "dtype": args.dtype, "attention": args.attention,
                      "cache_implementation": args.cache_implementation or "dynamic"}), flush=True)


if __name__ == "__main__":
    main()
