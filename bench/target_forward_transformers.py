#!/usr/bin/env python3
"""The peer side of the target-forward benchmark (issue 4): times Hugging Face
transformers' Qwen3 forward (SDPA, bf16, no lm_head, all hidden states) at the
Qwen3-8B shape on one GPU, and can save the same random weights as a Hugging
Face directory so dflash-host's hf_decoder is timed on identical weights in the
same session.

    python3 bench/target_forward_transformers.py [--batch 8 --seq 4096 --layers 36] [--save-dir DIR]

Prints one JSON line: tokens/s, median ms, peak GiB.
Status: written 2026-11-30 without GPU time left to run it; its first run and
the C++ side (bench/target_bench.cpp) are the next step of issue 4.
"""
import argparse
import json
import statistics
import time

import torch
import transformers


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=36)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--save-dir", default=None)
    args = parser.parse_args()

    config = transformers.Qwen3Config(
        hidden_size=4096, intermediate_size=12288, num_hidden_layers=args.layers, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=False, max_position_embeddings=40960)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.Qwen3Model(config).to(torch.bfloat16).eval()
    ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), device="cuda")

    def step():
        with torch.no_grad():
            return model(input_ids=ids, output_hidden_states=True, use_cache=False)

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    times = []
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    for _ in range(args.repeats):
        start = time.perf_counter()
        out = step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1000)
        del out
    median = statistics.median(times)
    peak = (torch.cuda.max_memory_allocated() - before) / 2**30
    print(json.dumps({"impl": "transformers " + transformers.__version__, "median_ms": median,
                      "tokens_per_s": args.batch * args.seq / (median / 1000), "extra_peak_gib": peak}))
    if args.save_dir:
        wrapper = transformers.Qwen3ForCausalLM(config)
        wrapper.model = model
        wrapper.lm_head.weight.data = torch.randn_like(wrapper.lm_head.weight, dtype=torch.bfloat16, device="cuda") * 0.02
        wrapper.save_pretrained(args.save_dir, safe_serialization=True)


if __name__ == "__main__":
    main()
