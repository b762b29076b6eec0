#!/usr/bin/env python3
"""Writes a Qwen3 Hugging Face directory (config.json + model.safetensors) of
any shape with random weights, for timing decoding (bench/decode_bench.cpp):
speed depends on the shape, not on what the weights say. GPU machine (torch +
safetensors).

    python3 bench/make_random_qwen3.py OUT_DIR --layers 8 --hidden 512 --heads 8 --kv-heads 4 \
        --head-dim 64 --intermediate 1536 --vocab 8192
"""
import argparse
import json
import os

import torch
from safetensors.torch import save_file


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--hidden", type=int, required=True)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--kv-heads", type=int, required=True)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--intermediate", type=int, required=True)
    p.add_argument("--vocab", type=int, required=True)
    a = p.parse_args()
    config = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", num_hidden_layers=a.layers,
                  hidden_size=a.hidden, intermediate_size=a.intermediate, num_attention_heads=a.heads,
                  num_key_value_heads=a.kv_heads, head_dim=a.head_dim, vocab_size=a.vocab, rms_norm_eps=1e-6,
                  rope_theta=1000000.0, max_position_embeddings=32768, tie_word_embeddings=False,
                  torch_dtype="bfloat16", eos_token_id=a.vocab - 1, bos_token_id=a.vocab - 2)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=device).manual_seed(0)
    h, d = a.hidden, a.head_dim

    def w(*shape):
        return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * 0.02).to(torch.bfloat16).cpu()

    def ones(n):
        return torch.ones(n, dtype=torch.bfloat16)

    tensors = {"model.embed_tokens.weight": w(a.vocab, h), "model.norm.weight": ones(h), "lm_head.weight": w(a.vocab, h)}
    for layer in range(a.layers):
        q = f"model.layers.{layer}."
        tensors.update({
            q + "input_layernorm.weight": ones(h), q + "post_attention_layernorm.weight": ones(h),
            q + "self_attn.q_proj.weight": w(a.heads * d, h), q + "self_attn.k_proj.weight": w(a.kv_heads * d, h),
            q + "self_attn.v_proj.weight": w(a.kv_heads * d, h), q + "self_attn.o_proj.weight": w(h, a.heads * d),
            q + "self_attn.q_norm.weight": ones(d), q + "self_attn.k_norm.weight": ones(d),
            q + "mlp.gate_proj.weight": w(a.intermediate, h), q + "mlp.up_proj.weight": w(a.intermediate, h),
            q + "mlp.down_proj.weight": w(h, a.intermediate),
        })
    save_file(tensors, os.path.join(a.out, "model.safetensors"))
    print(f"{a.out}: {sum(t.numel() for t in tensors.values()) / 1e9:.3f} B parameters")


if __name__ == "__main__":
    main()
