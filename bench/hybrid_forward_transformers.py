#!/usr/bin/env python3
"""The peer side of the hybrid target benchmark (issue 39): times Hugging Face
transformers' Qwen3.5 text model forward (bf16, SDPA, no lm_head, all hidden
states, as a Python trainer calls it) at the Qwen3.6-27B shape, 8 of its
layers in its pattern (3 Gated DeltaNet : 1 full attention), on one GPU; then
the gated delta rule alone, transformers' torch form and, where the package
`fla` (flash-linear-attention, pure Python + Triton) imports, its chunked
kernel. With --save-dir it writes the same random weights as a sharded
Hugging Face directory, which bench/hybrid_bench.cpp then loads, so both
sides run identical weights in the same session.

    python3 bench/hybrid_forward_transformers.py [--batch 8 --seq 4096 --layers 8] [--save-dir DIR]

transformers uses FLA's kernels for its linear layers when `fla` imports;
--no-fla hides it (PYTHONPATH without it), so both configurations can be
timed. Prints one JSON line per arm.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from target_forward_transformers import save_hf_directory  # noqa: E402  (the same layout for both benchmarks)


def qwen36_27b_text(layers):
    """Qwen3.6-27B's text config (config.json of the released folder), `layers` of its 64."""
    import transformers
    pattern = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
    return transformers.Qwen3_5TextConfig(
        hidden_size=5120, intermediate_size=17408, num_hidden_layers=layers,
        layer_types=[pattern[i % 4] for i in range(layers)], num_attention_heads=24, num_key_value_heads=4,
        head_dim=256, linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_conv_kernel_dim=4, vocab_size=248320, rms_norm_eps=1e-6,
        tie_word_embeddings=False, max_position_embeddings=262144, attn_output_gate=True,
        partial_rotary_factor=0.25,
        rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25,
                             mrope_section=[11, 11, 10], mrope_interleaved=True))


def timed(fn, warmup, repeats):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1000)
        del out
    return statistics.median(times), (torch.cuda.max_memory_allocated() - before) / 2**30, times


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--save-dir", default=None)
    parser.add_argument("--fla", default=None, help="a folder holding the fla package (flash-linear-attention)")
    parser.add_argument("--skip-model", action="store_true", help="only the delta-rule arms")
    args = parser.parse_args()
    if args.fla:
        sys.path.insert(0, args.fla)
    import transformers
    from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen

    try:
        import fla  # noqa: F401
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
        fla_version = getattr(fla, "__version__", "?")
    except Exception as e:  # the peer kernel is optional: say why it is absent
        fla_chunk, fla_version = None, None
        print(json.dumps({"arm": "fla", "absent": repr(e)[:200]}), flush=True)
    base = {"transformers": transformers.__version__, "torch": torch.__version__, "fla": fla_version,
            "batch": args.batch, "seq": args.seq, "layers": args.layers, "gpu": torch.cuda.get_device_name()}

    config = qwen36_27b_text(args.layers)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    if not args.skip_model:
        torch.set_default_dtype(torch.bfloat16)
        with torch.device("cuda"):
            model = transformers.Qwen3_5TextModel(config).eval()
        torch.set_default_dtype(torch.float32)
        ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), device="cuda")

        def forward():
            with torch.no_grad():
                return model(input_ids=ids, output_hidden_states=True, use_cache=False)

        median, peak, times = timed(forward, args.warmup, args.repeats)
        print(json.dumps({**base, "arm": "transformers forward" + (" (fla kernels)" if fla_chunk else " (torch delta rule)"),
                          "median_ms": median, "tokens_per_s": args.batch * args.seq / (median / 1000),
                          "extra_peak_gib": peak, "times_ms": times}), flush=True)
        if args.save_dir:
            save_hf_directory(model, config, args.save_dir, layers_per_shard=1, architecture="Qwen3_5ForCausalLM")
        del model
        torch.cuda.empty_cache()

    # The gated delta rule alone, one layer's worth: q, k [B, S, 16, 128], v [B, S, 48, 128].
    # transformers' torch rule takes as many q/k heads as v heads: its layer
    # (Qwen3_5GatedDeltaNet.forward) repeats q and k to the value heads first,
    # q.repeat_interleave(num_v_heads // num_k_heads, dim=2), so the torch arm
    # does the same, inside the timed call as in the layer. FLA's kernel (and
    # our rule) take the 16 key heads as they are.
    b, s, hk, hv, d = args.batch, args.seq, 16, 48, 128
    q = torch.randn(b, s, hk, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, s, hk, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, s, hv, d, device="cuda", dtype=torch.bfloat16)
    g = -torch.rand(b, s, hv, device="cuda", dtype=torch.float32) * 0.5
    beta = torch.rand(b, s, hv, device="cuda", dtype=torch.bfloat16)

    def torch_rule():
        query, key = q, k
        if hv // hk > 1:  # as the layer does before calling the rule
            query = query.repeat_interleave(hv // hk, dim=2)
            key = key.repeat_interleave(hv // hk, dim=2)
        return qwen.torch_chunk_gated_delta_rule(query, key, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)

    arms = [("delta rule: transformers torch_chunk_gated_delta_rule", torch_rule)]
    if fla_chunk:
        arms.append(("delta rule: fla chunk_gated_delta_rule",
                     lambda: fla_chunk(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)))
    for label, fn in arms:
        try:
            with torch.no_grad():
                median, peak, times = timed(fn, args.warmup, args.repeats)
            print(json.dumps({**base, "arm": label, "median_ms": median, "extra_peak_gib": peak, "times_ms": times}),
                  flush=True)
        except Exception as e:
            print(json.dumps({**base, "arm": label, "failed": repr(e)[:300]}), flush=True)


if __name__ == "__main__":
    main()
