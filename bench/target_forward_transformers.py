#!/usr/bin/env python3
"""The peer side of the target-forward benchmark: times Hugging Face
transformers' Qwen3 forward (SDPA, bf16, no lm_head, all hidden states, as a
Python trainer calls it) at the Qwen3-8B shape on one GPU, and with --save-dir
writes the same random weights as a sharded Hugging Face directory, which
bench/target_bench.cpp then loads, so both sides run identical weights in the
same session.

    python3 bench/target_forward_transformers.py [--batch 8 --seq 4096 --layers 36] [--save-dir DIR]

Prints one JSON line: median ms, tokens/s, linear-layer TFLOP/s, extra peak GiB.
"""
import argparse
import json
import os
import statistics
import time

import torch
import transformers


def save_hf_directory(model, config, directory, layers_per_shard=4, architecture="Qwen3ForCausalLM"):
    """config.json + model-XXXXX-of-YYYYY.safetensors + the index, as
    save_pretrained lays them out, without a second copy of the model.
    (bench/hybrid_forward_transformers.py saves its model with it too.)"""
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    config.architectures = [architecture]
    config.to_json_file(os.path.join(directory, "config.json"))
    state = {"model." + k: v.detach().contiguous() for k, v in model.state_dict().items()}
    torch.manual_seed(1)
    state["lm_head.weight"] = torch.randn(config.vocab_size, config.hidden_size, dtype=torch.bfloat16,
                                          device=state["model.embed_tokens.weight"].device) * 0.02
    groups = {}
    for name in state:
        if name.startswith("model.layers."):
            key = int(name.split(".")[2]) // layers_per_shard
        else:
            key = -1
        groups.setdefault(key, []).append(name)
    keys = sorted(groups)
    weight_map = {}
    for i, key in enumerate(keys):
        file = f"model-{i + 1:05d}-of-{len(keys):05d}.safetensors"
        save_file({n: state[n].cpu() for n in groups[key]}, os.path.join(directory, file), metadata={"format": "pt"})
        weight_map.update({n: file for n in groups[key]})
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


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
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = transformers.Qwen3Model(config).eval()
    torch.set_default_dtype(torch.float32)
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
    h, q, kv, inter = 4096, 32 * 128, 8 * 128, 12288
    linear_flop = 2.0 * args.batch * args.seq * args.layers * (h * (q + 2 * kv) + q * h + 3 * h * inter)
    print(json.dumps({"impl": "transformers " + transformers.__version__ + ", torch " + torch.__version__,
                      "median_ms": median, "tokens_per_s": args.batch * args.seq / (median / 1000),
                      "linear_tflops": linear_flop / (median / 1000) / 1e12, "extra_peak_gib": peak,
                      "times_ms": times}), flush=True)
    if args.save_dir:
        save_hf_directory(model, config, args.save_dir)


if __name__ == "__main__":
    main()
