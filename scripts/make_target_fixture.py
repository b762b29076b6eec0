#!/usr/bin/env python3
"""Builds the tiny Hugging Face checkpoints and transformers' reference outputs
that tests/plugins/target/hf_decoder/hf_parity_test.cpp checks target/hf_decoder against.

Run on the GPU machine (it has torch + transformers + safetensors):
    python3 scripts/make_target_fixture.py tests/fixtures/hf_tiny
For each model it writes <out>/<name>/config.json, model.safetensors (random
weights, odd sizes) and reference.safetensors: input_ids, and transformers'
hidden states ("hidden.<i>" = output of layer i = hidden_states[i + 1], for
every layer but the last), "last_hidden" (after the final norm) and "logits",
in fp32 (eager attention, CPU) and, where a GPU is present, bf16 (SDPA, GPU)
under the suffix ".bf16".
"""
import json
import math
import os
import sys

import torch
import transformers
from safetensors.torch import save_file

MODELS = {
    # Qwen3: q/k norm, GQA 6/2, head_dim 16 != hidden/heads, untied.
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, dict(
        hidden_size=72, intermediate_size=100, num_hidden_layers=4, num_attention_heads=6,
        num_key_value_heads=2, head_dim=16, vocab_size=301, rope_theta=1000000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=256)),
    # Llama: GQA 4/1, llama3 rope scaling, tied embeddings.
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, dict(
        hidden_size=48, intermediate_size=88, num_hidden_layers=5, num_attention_heads=4,
        num_key_value_heads=1, head_dim=12, vocab_size=257, rope_theta=500000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=True, max_position_embeddings=256,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=16))),
}


def reference(model, input_ids, suffix):
    with torch.no_grad():
        out = model(input_ids=input_ids, output_hidden_states=True)
    hidden = out.hidden_states
    layers = model.config.num_hidden_layers
    tensors = {f"hidden.{i}{suffix}": hidden[i + 1].float().cpu().contiguous() for i in range(layers - 1)}
    tensors[f"last_hidden{suffix}"] = hidden[layers].float().cpu().contiguous()
    tensors[f"logits{suffix}"] = out.logits.float().cpu().contiguous()
    return tensors


def main(out_dir):
    torch.manual_seed(1234)
    for name, (config_class, model_class, kwargs) in MODELS.items():
        config = config_class(**kwargs)
        config._attn_implementation = "eager"
        model = model_class(config).eval()
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if pname.endswith("norm.weight") or "layernorm" in pname:
                    p.copy_(1.0 + 0.1 * torch.randn_like(p))
                else:
                    p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))
        target = os.path.join(out_dir, name)
        model.save_pretrained(target, safe_serialization=True)
        for extra in ("generation_config.json",):
            path = os.path.join(target, extra)
            if os.path.exists(path):
                os.remove(path)
        input_ids = torch.randint(0, config.vocab_size, (2, 13))
        tensors = {"input_ids": input_ids}
        tensors.update(reference(model, input_ids, ""))
        if torch.cuda.is_available():
            gpu = model_class.from_pretrained(target, torch_dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
            tensors.update(reference(gpu, input_ids.cuda(), ".bf16"))
        save_file(tensors, os.path.join(target, "reference.safetensors"),
                  metadata={"transformers": transformers.__version__, "torch": torch.__version__})
        print(name, "->", target, "transformers", transformers.__version__)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/hf_tiny")
