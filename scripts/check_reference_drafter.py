#!/usr/bin/env python3
"""Is a drafter exported by dflash-host served, unchanged, by the code users deploy DFlash drafters with?

The reference is z-lab's transformers-based `DFlashDraftModel` (dflash/model.py of github.com/z-lab/dflash).
Its code is not in this repository: scripts/fetch_reference_dflash.sh copies it into .ref/dflash/ (ignored by
git), and this script imports it from there. Run on the GPU machine by scripts/device/reference_check.sh; it
also runs on a CPU with torch + transformers + safetensors installed.

Inputs:
  --reference  the reference's model.py
  --dump       what tests/plugins/drafter/dflash/reference_dump.cpp (build/bin/drafter_reference_dump) wrote: the token ids,
               our target's context features (the hidden states of target_layer_ids, concatenated), the
               blocks, and our drafter's logits for each block from both of our code paths (the cached
               drafting path eval uses, and the training forward)
  --target     the target's Hugging Face directory (its embed_tokens and lm_head are the drafter's, as in the
               reference's dflash_generate; transformers also recomputes the context features from it)
  --drafter    the exported drafter directory (default: the one the dump names)

Checks, each printed PASS / FAIL with its figures (INFO lines are figures without a verdict):
  1. config.json carries every field the reference reads, with consistent values;
  2. from_pretrained loads it with no missing, unexpected or mismatched keys, and every loaded tensor equals
     the file's (nothing renamed or re-initialised on the way);
  3. the loaded model's target_layer_ids, block_size, mask_token_id and rotary frequencies are ours;
  4. our target's features equal transformers' hidden_states[id + 1] (the reference's extract_context_feature);
  5. for every block of the dump: the reference's logits (target lm_head over DFlashDraftModel's output, fed
     OUR context features and the block's embeddings) equal ours within tolerance, for both of our paths, with
     the reference run fresh (whole context at once) and cached (the context added block by block through a
     DynamicCache cropped after each block, as dflash_generate does);
  6. controls: the reference with the last context position left out, and with the block one position later,
     must differ from ours by more than the tolerance in some block, or the tolerance could not see an
     off-by-one there (a warning, not a failure: a barely trained drafter may barely read its context);
  7. optional (--auto-model): AutoModel.from_pretrained(trust_remote_code=True) through config.json's auto_map,
     with the reference copied in as dflash.py, as users load published drafters;
  8. optional (--generate-prompts): the reference's own dflash_generate with our drafter on held-out prompts:
     lossless against the target's greedy decoding, its mean acceptance length beside our eval's (--our-eval).
     On identical outputs the reference's tau reads a little higher: it verifies until max_new_tokens + 1
     tokens exist and counts what the last block accepts past the limit; ours stops at max_new_tokens.

Tolerance: max |ours - reference| <= rtol * max |reference| over each block's logits, rtol = 0.02 in bf16/fp16
(about five bf16 steps at the largest logit) and 1e-4 in fp32 (--rtol overrides). Also printed: the
reference's own bf16 error against an fp32 run of the same weights, the floor any bf16 implementation sits on.
In bf16 the lossless check of 8 is a figure, not a verdict: verifying a block and decoding token by token
round differently, and bf16 logits tie often enough on a small vocabulary for the argmax to flip; the fp32 run
is where it must hold.

Exit status: 0 when every check passes, 1 when one fails, 2 for bad arguments or missing packages.
"""

import argparse
import copy
import importlib.util
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                epilog="See the module docstring (head -40 of this file) for what is checked.")
    p.add_argument("--reference", required=True, help="the reference's dflash/model.py (e.g. .ref/dflash/model.py)")
    p.add_argument("--dump", required=True, help="the safetensors file drafter_reference_dump wrote")
    p.add_argument("--target", required=True, help="the target's Hugging Face directory")
    p.add_argument("--drafter", help="the exported drafter directory (default: the one the dump names)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"], help="transformers attention implementation")
    p.add_argument("--rtol", type=float, default=None, help="tolerance relative to max |reference logit|")
    p.add_argument("--auto-model", action="store_true",
                   help="also load through AutoModel + trust_remote_code (config.json's auto_map)")
    p.add_argument("--generate-prompts", help="JSON lines with input_ids / prompt_ids: run the reference's dflash_generate")
    p.add_argument("--generate-count", type=int, default=8, help="prompts to generate from (default 8)")
    p.add_argument("--prompt-tokens", type=int, default=64, help="prefix of input_ids used as a prompt (as eval)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens to generate per prompt (as eval)")
    p.add_argument("--our-eval", help="dflash-host eval --report JSON of the same prompts, to compare tau with")
    p.add_argument("--json", help="write the whole report here")
    return p.parse_args()


class Report:
    """The checks and their figures: printed as they come, and kept for --json."""

    def __init__(self):
        self.checks = []

    def add(self, name, passed, detail, **figures):
        tag = "INFO" if passed is None else ("PASS" if passed else "FAIL")
        print(f"[{tag}] {name}: {detail}", flush=True)
        self.checks.append({"check": name, "result": tag, "detail": detail, **figures})
        return passed

    def failed(self):
        return [c for c in self.checks if c["result"] == "FAIL"]


def section(title):
    print(f"\n== {title}", flush=True)


def main():
    args = parse_args()
    try:
        import safetensors
        import torch
        import transformers
        from safetensors import safe_open
    except ImportError as e:
        print(f"error: this check needs torch, transformers and safetensors ({e})", file=sys.stderr)
        return 2
    for path, what in [(args.reference, "--reference"), (args.dump, "--dump"), (args.target, "--target")]:
        if not os.path.exists(path):
            print(f"error: {what} {path} does not exist", file=sys.stderr)
            return 2
    report = Report()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    section("environment")
    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "safetensors": safetensors.__version__, "device": str(device),
           "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()}
    report.add("environment", None, ", ".join(f"{k} {v}" for k, v in env.items()), **env)

    section("the reference")
    ref = import_reference(args.reference, report)
    if ref is None:
        return finish(report, args)

    with safe_open(args.dump, framework="pt", device="cpu") as f:
        meta = json.loads(f.metadata()["dflash_reference_dump"])
        dump = {name: f.get_tensor(name) for name in f.keys()}
    drafter_dir = args.drafter or meta["drafter_dir"]
    dtype = getattr(torch, meta["dtype"])  # the drafter's, as we computed it; the reference runs in it too
    target_dtype = getattr(torch, meta["target_dtype"])  # the target's, as our host ran it
    rtol = args.rtol if args.rtol is not None else (1e-4 if dtype == torch.float32 else 2e-2)
    report.add("dump", None, f"{args.dump}: drafter {drafter_dir}, dtype {meta['dtype']}, computed on "
               f"{meta['device']}, target layers {meta['target_layer_ids']}, block size {meta['block_size']}, "
               f"contexts {meta['context_lengths']}", dump_meta=meta)

    section("1. config.json")
    with open(os.path.join(drafter_dir, "config.json")) as f:
        config = json.load(f)
    check_config(config, meta, report)

    section("2. strict load with from_pretrained")
    model = load_strict(ref, drafter_dir, dtype, args.attn, report)
    if model is None:
        return finish(report, args)
    model = model.to(device).eval()

    section("3. what the reference made of it")
    check_loaded_view(model, config, meta, report, torch)

    torch.manual_seed(0)
    target = transformers.AutoModelForCausalLM.from_pretrained(args.target, dtype=target_dtype,
                                                               attn_implementation=args.attn).to(device).eval()
    embed, lm_head = target_heads(target, dtype)

    section("4. our target's features against transformers'")
    ids = dump["input_ids"].to(device)
    ours_features = dump["context_features"].to(device)
    with torch.no_grad():
        out = target(ids[None], output_hidden_states=True)
    theirs = ref.extract_context_feature(out.hidden_states, model.target_layer_ids)[0]
    check_features(ours_features, theirs, meta, target_dtype, report, torch)

    section(f"5. logits: the reference against ours (tolerance {rtol:g} × max |reference logit|)")
    model32 = copy.deepcopy(model).float()
    cases = compare_logits(ref, model, model32, embed, lm_head, dump, meta, rtol, device, report, torch)

    section("6. controls: the reference computing two off-by-one mistakes")
    control(model, embed, lm_head, dump, meta, rtol, cases, device, report, torch)

    if args.auto_model:
        section("7. AutoModel.from_pretrained(trust_remote_code=True)")
        auto_model(args.reference, drafter_dir, model, dtype, args.attn, report, torch, transformers)

    if args.generate_prompts:
        section("8. the reference's dflash_generate with our drafter")
        generate(ref, model, target, args, report, torch)

    return finish(report, args)


def import_reference(path, report):
    spec = importlib.util.spec_from_file_location("dflash_reference_model", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception:
        import transformers
        report.add("import", False, f"{path} failed to import under transformers {transformers.__version__} "
                   f"(the reference pins 4.57.1):\n{traceback.format_exc()}")
        return None
    missing = [n for n in ("DFlashDraftModel", "extract_context_feature", "build_target_layer_ids", "dflash_generate")
               if not hasattr(module, n)]
    if missing:
        report.add("import", False, f"{path} lacks {missing}: not the reference this check was written for")
        return None
    report.add("import", True, f"{path} defines DFlashDraftModel, extract_context_feature, dflash_generate")
    return module


# Every field the reference reads, directly or through the transformers Qwen3 modules it builds on, and why.
# Qwen3Config has defaults for most of them (Qwen3-8B's), so a field left out would load silently wrong.
REQUIRED_FIELDS = {
    "architectures": "names DFlashDraftModel",
    "model_type": "qwen3: from_pretrained builds a Qwen3Config",
    "num_hidden_layers": "the drafter's layers",
    "hidden_size": "every projection; fc's input is len(target_layer_ids) × hidden_size",
    "num_attention_heads": "q_proj, o_proj",
    "num_key_value_heads": "k_proj, v_proj",
    "head_dim": "q/k norms, RoPE",
    "intermediate_size": "the MLP",
    "hidden_act": "the MLP's activation (silu)",
    "rms_norm_eps": "every RMSNorm",
    "attention_bias": "whether q/k/v/o have biases (ours: none)",
    "attention_dropout": "read by the attention",
    "layer_types": "each layer's attention kind (sliding_window only for sliding_attention)",
    "max_position_embeddings": "the rotary embedding's cache length",
    "block_size": "DFlashDraftModel.block_size (top level)",
    "num_target_layers": "evaluated for the default target_layer_ids even when dflash_config gives them",
    "dflash_config": "target_layer_ids and mask_token_id",
    "tie_word_embeddings": "the drafter has no embedding or lm_head of its own to tie",
}


def check_config(config, meta, report):
    missing = [k for k in REQUIRED_FIELDS if k not in config]
    if "rope_theta" not in config and "theta" not in str(config.get("rope_parameters", "")):
        missing.append("rope_theta or rope_parameters.rope_theta")
    if "dtype" not in config and "torch_dtype" not in config:
        missing.append("dtype / torch_dtype")
    dflash = config.get("dflash_config", {})
    for key in ("target_layer_ids", "mask_token_id"):
        if not isinstance(dflash, dict) or key not in dflash:
            missing.append(f"dflash_config.{key}")
    report.add("fields", not missing,
               "every field the reference reads is there" if not missing else f"missing {missing}",
               missing=missing, fields={k: REQUIRED_FIELDS[k] for k in REQUIRED_FIELDS})
    if missing:
        return
    problems = []
    n = config["num_hidden_layers"]
    if config["architectures"] != ["DFlashDraftModel"]:
        problems.append(f"architectures {config['architectures']}")
    if config["model_type"] != "qwen3":
        problems.append(f"model_type {config['model_type']}")
    if config["layer_types"] != ["full_attention"] * n:
        problems.append(f"layer_types {config['layer_types']} (ours are {n} × full_attention)")
    if config["attention_bias"] is not False:
        problems.append("attention_bias is not false")
    ids = dflash["target_layer_ids"]
    if ids != meta["target_layer_ids"]:
        problems.append(f"dflash_config.target_layer_ids {ids} != the dump's {meta['target_layer_ids']}")
    if not ids or max(ids) >= config["num_target_layers"]:
        problems.append(f"target_layer_ids {ids} not within num_target_layers {config['num_target_layers']}")
    if config["block_size"] != meta["block_size"] or dflash.get("block_size", config["block_size"]) != config["block_size"]:
        problems.append(f"block_size {config['block_size']} / dflash_config.block_size {dflash.get('block_size')} "
                        f"!= the dump's {meta['block_size']}")
    if dflash["mask_token_id"] != meta["mask_token_id"]:
        problems.append(f"mask_token_id {dflash['mask_token_id']} != the dump's {meta['mask_token_id']}")
    if "vocab_size" in config and not 0 <= dflash["mask_token_id"] < config["vocab_size"]:
        problems.append(f"mask_token_id {dflash['mask_token_id']} outside vocab_size {config['vocab_size']}")
    report.add("values", not problems, "consistent with each other and with the dump" if not problems else
               "; ".join(problems), problems=problems)


def load_strict(ref, drafter_dir, dtype, attn, report):
    import torch
    from safetensors.torch import load_file
    try:
        try:
            model, info = ref.DFlashDraftModel.from_pretrained(drafter_dir, dtype=dtype, attn_implementation=attn,
                                                               output_loading_info=True)
        except TypeError as e:
            if "output_loading_info" not in str(e):
                raise
            # A transformers without loading info: our own comparison below is the strict check.
            model, info = ref.DFlashDraftModel.from_pretrained(drafter_dir, dtype=dtype, attn_implementation=attn), {}
    except Exception:
        report.add("from_pretrained", False, f"DFlashDraftModel.from_pretrained({drafter_dir}) raised:\n"
                   f"{traceback.format_exc()}")
        return None
    problems = {k: [str(x) for x in v] for k, v in info.items() if v}
    report.add("loading info", not problems,
               "no missing, unexpected or mismatched keys, no errors" if not problems else
               "\n  " + "\n  ".join(f"{k}: {v}" for k, v in problems.items()), loading_info=problems)
    # Our own strict comparison, independent of how this transformers version reports loading.
    weights = load_file(os.path.join(drafter_dir, "model.safetensors"))
    state = model.state_dict()
    missing = sorted(set(state) - set(weights))
    unexpected = sorted(set(weights) - set(state))
    wrong_shape = sorted(k for k in set(state) & set(weights) if tuple(state[k].shape) != tuple(weights[k].shape))
    differ = sorted(k for k in set(state) & set(weights) if k not in wrong_shape and
                    not torch.equal(state[k].cpu(), weights[k].to(state[k].dtype)))
    ok = not (missing or unexpected or wrong_shape or differ)
    report.add("state_dict", ok,
               f"the model's {len(state)} tensors are exactly the file's {len(weights)}" if ok else
               f"missing from the file {missing}; not in the model {unexpected}; other shape {wrong_shape}; "
               f"values differ after loading {differ}",
               tensors=len(weights), missing=missing, unexpected=unexpected, wrong_shape=wrong_shape, differ=differ)
    return model if ok and not problems else None


def check_loaded_view(model, config, meta, report, torch):
    problems = []
    if list(model.target_layer_ids) != meta["target_layer_ids"]:
        problems.append(f"target_layer_ids {model.target_layer_ids}")
    if model.block_size != meta["block_size"]:
        problems.append(f"block_size {model.block_size}")
    if model.mask_token_id != meta["mask_token_id"]:
        problems.append(f"mask_token_id {model.mask_token_id}")
    # The rotary frequencies it computes must be plain RoPE at our theta (a rope_parameters conversion that
    # fell back to a default theta would pass every other check on short contexts).
    theta = config.get("rope_theta") or config["rope_parameters"]["rope_theta"]
    d = config["head_dim"]
    expected = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    buffer = model.rotary_emb.inv_freq.detach()
    inv = buffer.to("cpu", torch.float64)
    scaling = getattr(model.rotary_emb, "attention_scaling", 1.0)
    # Within a few roundings of the buffer's own dtype (float32 normally; a model cast whole keeps it in bf16).
    if not torch.allclose(inv, expected, rtol=8 * torch.finfo(buffer.dtype).eps, atol=0) or scaling != 1.0:
        problems.append(f"rotary inv_freq / scaling not plain RoPE at theta {theta} (type "
                        f"{getattr(model.rotary_emb, 'rope_type', '?')}, scaling {scaling}, max relative error "
                        f"{((inv - expected).abs() / expected).max().item():.2e} in {buffer.dtype})")
    report.add("loaded model", not problems,
               f"target_layer_ids {list(model.target_layer_ids)}, block_size {model.block_size}, mask_token_id "
               f"{model.mask_token_id}, plain RoPE at theta {theta:g} (inv_freq in {buffer.dtype})"
               if not problems else "; ".join(problems), problems=problems)


def target_heads(target, dtype):
    """The target's embed_tokens and lm_head (dflash_generate's target.model.embed_tokens and target.lm_head),
    in the drafter's dtype, as our host places them for the drafter."""
    embed = target.model.embed_tokens if hasattr(target, "model") and hasattr(target.model, "embed_tokens") \
        else target.get_input_embeddings()
    lm_head = target.lm_head if hasattr(target, "lm_head") else target.get_output_embeddings()
    if next(embed.parameters()).dtype != dtype:
        embed, lm_head = copy.deepcopy(embed).to(dtype), copy.deepcopy(lm_head).to(dtype)
    return embed, lm_head


def stats(ours, theirs, torch):
    ours, theirs = ours.float(), theirs.float()
    diff = (ours - theirs).abs()
    scale = theirs.abs().max().item()
    return {"max_abs": diff.max().item(), "mean_abs": diff.mean().item(), "max_ref": scale,
            "rel": diff.max().item() / scale if scale > 0 else math.inf}


def check_features(ours, theirs, meta, dtype, report, torch):
    if ours.shape != theirs.shape:
        report.add("features", False, f"shapes differ: ours {tuple(ours.shape)}, transformers' {tuple(theirs.shape)}")
        return
    # Deep hidden states carry a few large activations; relative to the largest, bf16 through a few layers
    # stays well under 5 %. A wrong layer index (hidden_states[i] instead of [i + 1]) differs by O(1).
    tol = 1e-3 if dtype == torch.float32 else 5e-2
    hidden = theirs.shape[-1] // len(meta["target_layer_ids"])
    per_layer = []
    for i, layer in enumerate(meta["target_layer_ids"]):
        s = stats(ours[:, i * hidden:(i + 1) * hidden], theirs[:, i * hidden:(i + 1) * hidden], torch)
        per_layer.append({"layer": layer, **s})
    worst = max(p["rel"] for p in per_layer)
    report.add("features", worst <= tol,
               "per target layer, max |ours − transformers'| / max |transformers'|: " +
               ", ".join(f"layer {p['layer']} {p['rel']:.2e}" for p in per_layer) + f" (tolerance {tol:g})",
               per_layer=per_layer, tolerance=tol)


def reference_logits(model, embed, lm_head, features, block, position_ids, torch, cache=None):
    """DFlashDraftModel's hidden states for one block after a context, through the target's lm_head —
    the call dflash_generate makes."""
    with torch.no_grad():
        noise = embed(block[None])
        hidden = model(target_hidden=features[None], noise_embedding=noise, position_ids=position_ids[None],
                       past_key_values=cache, use_cache=cache is not None, is_causal=False)
        return lm_head(hidden)[0], hidden[0]


def compare_logits(ref, model, model32, embed, lm_head, dump, meta, rtol, device, report, torch):
    from transformers import DynamicCache
    features = dump["context_features"].to(device, next(model.parameters()).dtype)
    blocks = dump["block_ids"].to(device)
    lengths = meta["context_lengths"]
    bs = meta["block_size"]
    embed32 = copy.deepcopy(embed).float()
    lm_head32 = copy.deepcopy(lm_head).float()
    cache = DynamicCache()
    done = 0  # context positions already in the cache
    cases = []
    print(f"  {'case':>4} {'context':>7}  {'ours':<6} {'reference':<9} {'max|Δ|':>9} {'mean|Δ|':>9} {'max|ref|':>9} "
          f"{'rel':>8} {'argmax':>9}  verdict")
    for j, s in enumerate(lengths):
        block = blocks[j]
        fresh, fresh_hidden = reference_logits(model, embed, lm_head, features[:s], block,
                                               torch.arange(s + bs, device=device), torch)
        # Cached, as dflash_generate: only the new context positions, positions from the cache's length on;
        # then the block's own keys are cropped away.
        cached, _ = reference_logits(model, embed, lm_head, features[done:s], block,
                                     torch.arange(done, s + bs, device=device), torch, cache=cache)
        cache.crop(s)
        done = s
        exact, _ = reference_logits(model32, embed32, lm_head32, features[:s].float(), block,
                                    torch.arange(s + bs, device=device), torch)
        case = {"case": j, "context": s, "comparisons": []}
        for ours_name in ("draft", "train"):
            ours = dump[f"{ours_name}.logits"][j].to(device)
            for ref_name, theirs in (("fresh", fresh), ("cached", cached)):
                st = stats(ours, theirs, torch)
                agree = (ours.float().argmax(-1) == theirs.float().argmax(-1)).sum().item()
                ok = st["max_abs"] <= rtol * st["max_ref"]
                case["comparisons"].append({"ours": ours_name, "reference": ref_name, "argmax_agree": agree,
                                            "slots": bs, "pass": ok, **st})
                print(f"  {j:>4} {s:>7}  {ours_name:<6} {ref_name:<9} {st['max_abs']:>9.4f} {st['mean_abs']:>9.5f} "
                      f"{st['max_ref']:>9.3f} {st['rel']:>8.5f} {agree:>5}/{bs:<3}  {'PASS' if ok else 'FAIL'}")
        floor = stats(fresh, exact, torch)
        ours_exact = stats(dump["draft.logits"][j].to(device), exact, torch)
        case["reference_vs_fp32"] = floor
        case["ours_vs_fp32"] = ours_exact
        print(f"  {'':>4} {'':>7}  against an fp32 run of the reference: its own {meta['dtype']} error "
              f"{floor['max_abs']:.4f}, ours {ours_exact['max_abs']:.4f} (max |Δ|)")
        case["hidden_draft_vs_fresh"] = stats(dump["draft.hidden"][j].to(device), fresh_hidden, torch)
        cases.append(case)
    failures = [(c["case"], x["ours"], x["reference"]) for c in cases for x in c["comparisons"] if not x["pass"]]
    worst = max(x["rel"] for c in cases for x in c["comparisons"])
    agree = sum(x["argmax_agree"] for c in cases for x in c["comparisons"])
    total = sum(x["slots"] for c in cases for x in c["comparisons"])
    report.add("logits", not failures,
               f"{len(cases)} blocks × (our draft, our train) × (reference fresh, cached): worst max|Δ| / max|ref| "
               f"{worst:.5f} against {rtol:g}; argmax agrees on {agree}/{total} slots" +
               ("" if not failures else f"; failing (case, ours, reference): {failures}"),
               cases=cases, rtol=rtol)
    return cases


def control(model, embed, lm_head, dump, meta, rtol, cases, device, report, torch):
    """The reference computing two plausible mistakes; the tolerance must be able to tell them from ours."""
    features = dump["context_features"].to(device, next(model.parameters()).dtype)
    blocks = dump["block_ids"].to(device)
    bs = meta["block_size"]
    mistakes = {
        # The context one position short: "strictly before the anchor" read as "before the anchor's predecessor".
        "last context position left out": lambda s: (
            features[:s - 1], torch.cat([torch.arange(s - 1, device=device), torch.arange(s, s + bs, device=device)])),
        # The block's rotary positions one later than the reference's S + k.
        "block one position later": lambda s: (
            features[:s], torch.cat([torch.arange(s, device=device), torch.arange(s + 1, s + 1 + bs, device=device)])),
    }
    for name, mistake in mistakes.items():
        seen = []
        for j, s in enumerate(meta["context_lengths"]):
            if s < 2:
                continue
            context, positions = mistake(s)
            wrong, _ = reference_logits(model, embed, lm_head, context, blocks[j], positions, torch)
            st = stats(dump["draft.logits"][j].to(device), wrong, torch)
            seen.append({"case": j, "context": s, "max_abs": st["max_abs"], "tolerance": rtol * st["max_ref"],
                         "discriminates": st["max_abs"] > rtol * st["max_ref"]})
        told = [c for c in seen if c["discriminates"]]
        detail = (f"{name}: ours against it, max|Δ| " +
                  ", ".join(f"{c['max_abs']:.4f} (tolerance {c['tolerance']:.4f})" for c in seen))
        if told:
            report.add("control", True, detail + f" — the tolerance sees it in {len(told)}/{len(seen)} blocks",
                       mistake=name, control=seen)
        else:
            report.add("control", None, detail + " — WARNING: within tolerance everywhere, so this drafter reads "
                       "too little from its context for the check to see this mistake; train it longer",
                       mistake=name, control=seen)


def auto_model(reference, drafter_dir, model, dtype, attn, report, torch, transformers):
    with open(os.path.join(drafter_dir, "config.json")) as f:
        auto_map = json.load(f).get("auto_map", {})
    if auto_map.get("AutoModel") != "dflash.DFlashDraftModel":
        report.add("auto_map", False, f"config.json's auto_map is {auto_map}, not AutoModel → dflash.DFlashDraftModel")
        return
    with tempfile.TemporaryDirectory() as tmp:
        # What a user holding the published code does: the export plus the reference as dflash.py.
        for name in ("config.json", "model.safetensors"):
            os.symlink(os.path.abspath(os.path.join(drafter_dir, name)), os.path.join(tmp, name))
        shutil.copy(reference, os.path.join(tmp, "dflash.py"))
        try:
            loaded = transformers.AutoModel.from_pretrained(tmp, trust_remote_code=True, dtype=dtype,
                                                            attn_implementation=attn)
        except Exception:
            report.add("AutoModel", False, f"AutoModel.from_pretrained(trust_remote_code=True) raised:\n"
                       f"{traceback.format_exc()}")
            return
        same = type(loaded).__name__ == "DFlashDraftModel" and all(
            torch.equal(v.cpu(), model.state_dict()[k].cpu()) for k, v in loaded.state_dict().items())
        report.add("AutoModel", same, f"built {type(loaded).__name__} with the same "
                   f"{len(loaded.state_dict())} tensors" if same else f"built {type(loaded).__name__}, tensors differ")


def read_prompts(path, count, prompt_tokens):
    prompts = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            if "prompt_ids" in row:
                prompts.append(row["prompt_ids"])
            elif "input_ids" in row:
                prompts.append(row["input_ids"][:prompt_tokens])
            if len(prompts) == count:
                break
    return prompts


def generate(ref, model, target, args, report, torch):
    device = next(model.parameters()).device
    if device.type != "cuda":
        ref._cuda_time = time.perf_counter  # its timing synchronises CUDA; on a CPU a plain clock does
    eos = target.config.eos_token_id
    stop = eos if isinstance(eos, list) else ([eos] if eos is not None else None)
    prompts = read_prompts(args.generate_prompts, args.generate_count, args.prompt_tokens)
    rows, steps, tokens, identical = [], 0, 0, 0
    for i, prompt in enumerate(prompts):
        ids = torch.tensor([prompt], device=device)
        spec = ref.dflash_generate(model, target, ids, args.max_new_tokens, stop, 0.0, return_stats=True)
        greedy = ref.dflash_generate(model, target, ids, args.max_new_tokens, stop, 0.0, block_size=1)
        same = torch.equal(spec.output_ids, greedy)
        identical += same
        steps += len(spec.acceptance_lengths)
        tokens += sum(spec.acceptance_lengths)
        rows.append({"prompt": i, "tau": sum(spec.acceptance_lengths) / len(spec.acceptance_lengths),
                     "generated": spec.num_output_tokens, "identical_to_greedy": same,
                     "tokens": spec.output_ids[0, len(prompt):].tolist()})
    tau = tokens / steps if steps else 0.0
    exact = next(model.parameters()).dtype == torch.float32
    report.add("reference lossless", (identical == len(prompts)) if exact else None,
               f"{identical}/{len(prompts)} outputs of the reference's speculative decoding equal its target's "
               f"greedy decoding" + ("" if exact else " (in bf16 a figure only: a block verified at once and tokens "
                                     "decoded one by one round differently, and near-tied logits flip; the fp32 "
                                     "run is the verdict)"), per_prompt=rows)
    detail = f"the reference serving our drafter: mean acceptance length τ {tau:.3f} over {steps} verification steps"
    figures = {"tau_reference": tau}
    if args.our_eval:
        with open(args.our_eval) as f:
            ours = json.load(f)
        figures["tau_ours"] = ours["tau_mean"]
        same_tokens = sum(1 for r, o in zip(rows, ours["per_prompt"]) if r["tokens"] == o["tokens"])
        figures["same_output_as_our_eval"] = same_tokens
        detail += (f"; our eval on the same prompts: τ {ours['tau_mean']:.3f} (the reference's counts the last "
                   f"block's tokens past max_new_tokens); outputs identical on {same_tokens}/{len(rows)} prompts"
                   + ("" if exact else " (in bf16 transformers' target and ours may break near-ties differently)"))
    report.add("reference τ", None, detail, **figures)


def finish(report, args):
    failed = report.failed()
    print()
    if failed:
        print(f"RESULT: FAIL — {len(failed)} check(s) failed: " + ", ".join(c["check"] for c in failed))
    else:
        print(f"RESULT: PASS — {sum(c['result'] == 'PASS' for c in report.checks)} checks passed")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"result": "FAIL" if failed else "PASS", "checks": report.checks}, f, indent=2, default=str)
        print(f"report: {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
