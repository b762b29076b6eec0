#!/usr/bin/env python3
"""Writes a Qwen3-style Hugging Face checkpoint of a real model's width with
random weights and only a few layers: the DFlash drafter's shape depends on
the target's width, vocabulary and head layout, not on its depth, so a
5-layer "Qwen3.6-27B-wide" target trains the 27B drafter shape in ~8 GB.
Used by scripts/device/memory_plan.sh (GPU machine: torch + safetensors).

    python3 scripts/make_wide_target.py OUT_DIR --preset qwen3.6-27b|qwen3-8b|gpu-demo|small-128 [--layers 5]
"""
import argparse
import json
import os

import torch
from safetensors.torch import save_file

PRESETS = {
    # The drafter shape of recipe.md: hidden 5120, 32 / 8 heads × 128, MLP 17408, vocab 248,320.
    "qwen3.6-27b": dict(hidden_size=5120, intermediate_size=17408, num_attention_heads=32, num_key_value_heads=8,
                        head_dim=128, vocab_size=248320),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, vocab_size=151936),
    # The GPU demonstration's target (scripts/gpu_demo/train_target.py's defaults): head_dim 64, 2 query heads
    # per KV head, so the drafter's block kernel does not take it (grouped attention instead).
    "gpu-demo": dict(hidden_size=512, intermediate_size=1536, num_attention_heads=8, num_key_value_heads=4,
                     head_dim=64, vocab_size=8192),
    # Small, of the block kernel's head shape (head_dim 128, 4 query heads per KV head).
    "small-128": dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=8, num_key_value_heads=2,
                      head_dim=128, vocab_size=32000),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--preset", choices=sorted(PRESETS), required=True)
    p.add_argument("--layers", type=int, default=5)
    a = p.parse_args()
    c = dict(PRESETS[a.preset])
    config = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", num_hidden_layers=a.layers,
                  rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=32768,
                  tie_word_embeddings=False, torch_dtype="bfloat16", **c)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=device).manual_seed(0)
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    q, kv, d = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"], c["head_dim"]

    def w(*shape):
        return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * 0.02).to(torch.bfloat16).cpu()

    def ones(n):
        return torch.ones(n, dtype=torch.bfloat16)

    tensors = {"model.embed_tokens.weight": w(v, h), "model.norm.weight": ones(h), "lm_head.weight": w(v, h)}
    for layer in range(a.layers):
        p_ = f"model.layers.{layer}."
        tensors.update({
            p_ + "input_layernorm.weight": ones(h), p_ + "post_attention_layernorm.weight": ones(h),
            p_ + "self_attn.q_proj.weight": w(q, h), p_ + "self_attn.k_proj.weight": w(kv, h),
            p_ + "self_attn.v_proj.weight": w(kv, h), p_ + "self_attn.o_proj.weight": w(h, q),
            p_ + "self_attn.q_norm.weight": ones(d), p_ + "self_attn.k_norm.weight": ones(d),
            p_ + "mlp.gate_proj.weight": w(i, h), p_ + "mlp.up_proj.weight": w(i, h), p_ + "mlp.down_proj.weight": w(h, i),
        })
    save_file(tensors, os.path.join(a.out, "model.safetensors"))
    print(f"{a.out}: {sum(t.numel() for t in tensors.values()) / 1e9:.2f} B parameters")


if __name__ == "__main__":
    main()
