#!/usr/bin/env python3
"""Builds tiny random checkpoints of the 2026 target families and transformers'
own outputs for them, which tests/plugins/target/hf_hybrid/hf_hybrid_test.cpp checks the
C++ target plugins against on the CPU at every commit.

Families (three configurations or more each, odd sizes and layer patterns):
  qwen3_5      Qwen3.5 / Qwen3.6 hybrid (Gated DeltaNet + gated attention), dense MLP.
               One is saved as the multimodal Qwen3_5ForConditionalGeneration
               (model.language_model.* keys, a tiny vision tower), as the real
               Qwen3.6-27B folder is.
  qwen3_5_moe  the same hybrid with a Mixture-of-Experts MLP and a shared expert.
  qwen3_moe    Qwen3-30B-A3B's family: Qwen3 attention, MoE MLP (sparse steps,
               mlp_only_layers, norm_topk_prob on and off).

Run on the GPU machine (torch + transformers + safetensors):
    python3 scripts/make_hybrid_fixtures.py OUT_DIR
For each model it writes OUT_DIR/<name>/config.json, model.safetensors and
reference.safetensors holding:
  input_ids [2, 13]           the prompt rows of the forward references
  hidden.<i>, last_hidden, logits
                              fp32, eager attention, on the CPU: the output of
                              every decoder layer i (forward hooks on the
                              layers, so no guessing at hidden_states' layout),
                              the final norm's output and the logits
  *.bf16                      the same from the checkpoint loaded in bf16 on
                              the GPU with SDPA (absent without a GPU)
  greedy.prompt [1, 12], greedy.tokens [64]
                              transformers' generate(): greedy decoding of 64
                              new tokens in fp32 with its cache (conv and
                              recurrent states, KV)
A summary of every model (its tensors' names and shapes, which layout the
experts were saved in, the versions) is printed and written to
OUT_DIR/manifest.json.
"""
import json
import math
import os
import sys
import traceback
import zlib

import torch
import transformers
from safetensors.torch import load_file, save_file


def rope(theta, partial, head_dim):
    rotary = int(head_dim * partial)
    n = rotary // 2
    section = [n - 2 * (n // 3), n // 3, n // 3]  # as [11, 11, 10] for 32 frequencies
    return dict(rope_type="default", rope_theta=theta, partial_rotary_factor=partial,
                mrope_section=section, mrope_interleaved=True)


def hybrid_text(hidden, layers, layer_types, heads, kv_heads, head_dim, partial, k_heads, v_heads, k_dim, v_dim,
                conv, vocab, tie, **extra):
    return dict(hidden_size=hidden, num_hidden_layers=layers, layer_types=layer_types, num_attention_heads=heads,
                num_key_value_heads=kv_heads, head_dim=head_dim, partial_rotary_factor=partial,
                rope_parameters=rope(10000000.0, partial, head_dim), linear_num_key_heads=k_heads,
                linear_num_value_heads=v_heads, linear_key_head_dim=k_dim, linear_value_head_dim=v_dim,
                linear_conv_kernel_dim=conv, vocab_size=vocab, tie_word_embeddings=tie, rms_norm_eps=1e-6,
                max_position_embeddings=512, attn_output_gate=True, **extra)


L, F = "linear_attention", "full_attention"

MODELS = {
    # The real checkpoint's layout: multimodal wrapper, 3 linear : 1 full,
    # grouped value heads (2 key heads serve 4 value heads), partial rotary 1/4.
    "qwen3_5_mm": ("qwen3_5_mm", hybrid_text(64, 4, [L, L, L, F], 4, 2, 16, 0.25, 2, 4, 16, 8, 4, 311, False,
                                             intermediate_size=96)),
    # An odd pattern starting with full attention, 3 query heads on one KV
    # head, rotary on half the head, conv kernel 3, tied embeddings.
    "qwen3_5_odd": ("qwen3_5", hybrid_text(48, 5, [F, L, F, L, L], 3, 1, 24, 0.5, 1, 3, 12, 16, 3, 257, True,
                                           intermediate_size=72)),
    # Equal key and value heads, head_dim 32 with rotary on 8 of it.
    "qwen3_5_wide": ("qwen3_5", hybrid_text(80, 6, [L, F, L, L, F, L], 4, 4, 32, 0.25, 4, 4, 8, 8, 4, 263, False,
                                            intermediate_size=56)),
    # MoE hybrids: every layer routed, with a gated shared expert.
    "qwen3_5_moe_a": ("qwen3_5_moe", hybrid_text(48, 4, [L, L, L, F], 4, 2, 16, 0.25, 2, 4, 12, 8, 4, 263, False,
                                                 num_experts=8, num_experts_per_tok=2, moe_intermediate_size=24,
                                                 shared_expert_intermediate_size=32)),
    "qwen3_5_moe_k1": ("qwen3_5_moe", hybrid_text(40, 3, [F, L, L], 2, 1, 20, 0.4, 1, 2, 8, 12, 4, 241, True,
                                                  num_experts=5, num_experts_per_tok=1, moe_intermediate_size=16,
                                                  shared_expert_intermediate_size=24)),
    "qwen3_5_moe_k3": ("qwen3_5_moe", hybrid_text(56, 5, [L, F, L, L, F], 4, 2, 16, 0.25, 2, 2, 16, 16, 4, 277,
                                                  False, num_experts=6, num_experts_per_tok=3,
                                                  moe_intermediate_size=24, shared_expert_intermediate_size=28)),
    # Qwen3 MoE: every layer sparse, top-2 of 8, normalised.
    "qwen3_moe_a": ("qwen3_moe", dict(hidden_size=48, intermediate_size=80, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=269,
                                      num_experts=8, num_experts_per_tok=2, moe_intermediate_size=24,
                                      norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                                      rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                      max_position_embeddings=512)),
    # Top-3 of 6 without normalisation, every second layer sparse, layer 0 dense.
    # (Expert widths are multiples of 8: transformers' bf16 grouped GEMM on the
    # GPU needs 16-byte strides.)
    "qwen3_moe_sparse2": ("qwen3_moe", dict(hidden_size=40, intermediate_size=64, num_hidden_layers=5,
                                            num_attention_heads=5, num_key_value_heads=1, head_dim=12,
                                            vocab_size=233, num_experts=6, num_experts_per_tok=3,
                                            moe_intermediate_size=24, norm_topk_prob=False, decoder_sparse_step=2,
                                            mlp_only_layers=[0], rope_theta=10000.0, rms_norm_eps=1e-5,
                                            tie_word_embeddings=True, max_position_embeddings=512)),
    # Top-1 of 4, head_dim 24 (not hidden / heads).
    "qwen3_moe_k1": ("qwen3_moe", dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                       num_attention_heads=4, num_key_value_heads=4, head_dim=24, vocab_size=251,
                                       num_experts=4, num_experts_per_tok=1, moe_intermediate_size=32,
                                       norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                       max_position_embeddings=512)),
}

# The fixture whose experts are rewritten in the other on-disk layout than the
# one transformers saved, so the plugin's loader is checked on both (per-expert
# tensors as Qwen3-30B-A3B ships, fused [E, 2I, H] / [E, H, I] as Qwen3.5 MoE).
OTHER_LAYOUT = {"qwen3_moe_sparse2", "qwen3_5_moe_k1"}


def build(kind, kwargs):
    t = transformers
    if kind == "qwen3_5_mm":
        text = dict(kwargs)
        tie = text.pop("tie_word_embeddings")
        vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, in_channels=3, patch_size=2,
                      temporal_patch_size=1, spatial_merge_size=1, out_hidden_size=text["hidden_size"],
                      num_position_embeddings=16)
        config = t.Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=tie)
        return config, t.Qwen3_5ForConditionalGeneration, config.text_config
    if kind == "qwen3_5":
        config = t.Qwen3_5TextConfig(**kwargs)
        return config, t.Qwen3_5ForCausalLM, config
    if kind == "qwen3_5_moe":
        config = t.Qwen3_5MoeTextConfig(**kwargs)
        return config, t.Qwen3_5MoeForCausalLM, config
    if kind == "qwen3_moe":
        config = t.Qwen3MoeConfig(**kwargs)
        return config, t.Qwen3MoeForCausalLM, config
    raise ValueError(kind)


def randomise(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "visual" in name:
                p.normal_(0.0, 0.1)
            elif name.endswith("linear_attn.norm.weight"):  # gated RMSNorm: weight · x̂
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("norm.weight") or "layernorm" in name:
                # (1 + w) norms in the Qwen3.5 families, w · x̂ in Qwen3 MoE.
                if type(model).__name__.startswith("Qwen3_5"):
                    p.copy_(0.1 * torch.randn_like(p))
                else:
                    p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(1.0, 16.0).log())
            elif name.endswith("dt_bias"):
                p.copy_(1.0 + 0.5 * torch.randn_like(p))
            elif name.endswith("conv1d.weight"):
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))
            elif name.endswith("mlp.gate.weight"):
                # Router: spread the experts' scores so that no token sits on
                # a near-tie between two experts.
                p.normal_(0.0, 3.0 / math.sqrt(p.shape[-1]))
            else:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))


def text_parts(model):
    """The decoder layers and the final norm of the text model, by module name."""
    layers, norm = {}, None
    for name, module in model.named_modules():
        parts = name.split(".")
        if "visual" in parts or "mtp" in parts:
            continue
        if len(parts) >= 2 and parts[-2] == "layers" and parts[-1].isdigit() and \
                type(module).__name__.endswith("DecoderLayer"):
            layers[int(parts[-1])] = module
        if name in ("model.norm", "model.language_model.norm"):
            norm = module
    assert norm is not None and layers, "text model not found"
    return [layers[i] for i in sorted(layers)], norm


def reference(model, input_ids, suffix):
    layers, norm = text_parts(model)
    captured = {}

    def keep(key):
        def hook(_module, _inputs, output):
            out = output[0] if isinstance(output, tuple) else output
            captured[key] = out.detach().float().cpu().contiguous()
        return hook

    handles = [layer.register_forward_hook(keep(f"hidden.{i}{suffix}")) for i, layer in enumerate(layers)]
    handles.append(norm.register_forward_hook(keep(f"last_hidden{suffix}")))
    with torch.no_grad():
        out = model(input_ids=input_ids, use_cache=False)
    for h in handles:
        h.remove()
    captured[f"logits{suffix}"] = out.logits.detach().float().cpu().contiguous()
    return captured


def greedy(model, prompt, new_tokens):
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    with torch.no_grad():
        out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, use_cache=True)
    return out[0, prompt.shape[1]:].contiguous()


def expert_layout(tensors):
    if any(k.endswith("mlp.experts.gate_up_proj") for k in tensors):
        return "fused"
    if any(".mlp.experts.0.gate_proj.weight" in k for k in tensors):
        return "per_expert"
    return "none"


def rewrite_experts(path):
    """Rewrites the experts of model.safetensors in the other layout; returns it."""
    tensors = load_file(path)
    layout = expert_layout(tensors)
    out = {}
    if layout == "fused":
        for k, v in tensors.items():
            if k.endswith("mlp.experts.gate_up_proj"):
                prefix = k[: -len("gate_up_proj")]
                half = v.shape[1] // 2
                for e in range(v.shape[0]):
                    out[f"{prefix}{e}.gate_proj.weight"] = v[e, :half].contiguous()
                    out[f"{prefix}{e}.up_proj.weight"] = v[e, half:].contiguous()
            elif k.endswith("mlp.experts.down_proj"):
                prefix = k[: -len("down_proj")]
                for e in range(v.shape[0]):
                    out[f"{prefix}{e}.down_proj.weight"] = v[e].contiguous()
            else:
                out[k] = v
        new = "per_expert"
    elif layout == "per_expert":
        groups = {}
        for k, v in tensors.items():
            marker = ".mlp.experts."
            if marker in k and k.split(marker)[1].split(".")[0].isdigit():
                prefix, rest = k.split(marker)
                e, proj = rest.split(".")[0], rest.split(".")[1]
                groups.setdefault(prefix, {}).setdefault(proj, {})[int(e)] = v
            else:
                out[k] = v
        for prefix, projs in groups.items():
            n = len(projs["gate_proj"])
            gate_up = [torch.cat([projs["gate_proj"][e], projs["up_proj"][e]]) for e in range(n)]
            out[f"{prefix}.mlp.experts.gate_up_proj"] = torch.stack(gate_up).contiguous()
            out[f"{prefix}.mlp.experts.down_proj"] = torch.stack([projs["down_proj"][e] for e in range(n)]).contiguous()
        new = "fused"
    else:
        return layout
    save_file(out, path, metadata={"format": "pt"})
    return new


def make(name, kind, kwargs, out_dir, manifest):
    torch.manual_seed(zlib.crc32(name.encode()))
    config, model_class, text = build(kind, kwargs)
    config._attn_implementation = "eager"
    model = model_class(config).eval()
    randomise(model)
    target = os.path.join(out_dir, name)
    model.save_pretrained(target, safe_serialization=True)
    for extra in ("generation_config.json",):
        path = os.path.join(target, extra)
        if os.path.exists(path):
            os.remove(path)
    weights = os.path.join(target, "model.safetensors")
    saved = load_file(weights)
    entry = {"class": model_class.__name__, "saved_layout": expert_layout(saved),
             "tensors": {k: list(v.shape) for k, v in sorted(saved.items())}}
    if name in OTHER_LAYOUT:
        entry["rewritten_layout"] = rewrite_experts(weights)
    vocab = text.vocab_size
    gen = torch.Generator().manual_seed(7)
    input_ids = torch.randint(0, vocab, (2, 13), generator=gen)
    tensors = {"input_ids": input_ids}
    # The references come from the checkpoint as saved (and rewritten), read
    # back by transformers, so the files and the numbers agree.
    cpu = model_class.from_pretrained(target, dtype=torch.float32, attn_implementation="eager").eval()
    tensors.update(reference(cpu, input_ids, ""))
    prompt = torch.randint(0, vocab, (1, 12), generator=gen)
    tensors["greedy.prompt"] = prompt
    tensors["greedy.tokens"] = greedy(cpu, prompt, 64)
    if torch.cuda.is_available():
        gpu = model_class.from_pretrained(target, dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
        tensors.update(reference(gpu, input_ids.cuda(), ".bf16"))
        entry["bf16_scale"] = float(tensors["last_hidden.bf16"].abs().max())
        entry["bf16_vs_fp32_last_hidden"] = float((tensors["last_hidden.bf16"] - tensors["last_hidden"]).abs().max())
    save_file(tensors, os.path.join(target, "reference.safetensors"),
              metadata={"transformers": transformers.__version__, "torch": torch.__version__,
                        "script": "scripts/make_hybrid_fixtures.py"})
    entry["greedy_tokens"] = tensors["greedy.tokens"].tolist()
    manifest[name] = entry
    print(name, "->", target, entry["class"], "experts:", entry["saved_layout"], entry.get("rewritten_layout", ""),
          flush=True)


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    manifest = {"transformers": transformers.__version__, "torch": torch.__version__}
    only = set(sys.argv[2].split(",")) if len(sys.argv) > 2 else None
    failed = []
    for name, (kind, kwargs) in MODELS.items():
        if only and name not in only:
            continue
        try:
            make(name, kind, kwargs, out_dir, manifest)
        except Exception:  # keep going: one family's failure must not hide the others
            traceback.print_exc()
            failed.append(name)
    manifest["failed"] = failed
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    if failed:
        print("FAILED:", failed)
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/hf_hybrid")
