#!/usr/bin/env python3
"""Does SpecForge's reference LlamaForCausalLMEagle3 serve the EAGLE-3 drafters
we export, as we compute them? (issue 43; docs/eagle3.md, "Serving")

Given an exported drafter folder (config.json + model.safetensors) and our
dump of step 0 on seeded inputs (eagle3_reference_dump), it
  1. builds SpecForge's LlamaForCausalLMEagle3 from our config.json alone
     (transformers' LlamaConfig, attention backend sdpa);
  2. loads our model.safetensors into it: every tensor of ours must land
     (no unexpected key), and the only key it lacks may be embed_tokens.weight
     (the target's embedding, which serving shares and the reference's forward
     does not read: it takes inputs_embeds);
  3. checks that the maps d2t / t2d came through unchanged;
  4. runs its forward (hidden_states = the features, inputs_embeds = the
     embeddings) and its lm_head, and compares hidden states and logits with
     ours: within the tolerance of the dtype (relative to the scale), and the
     argmax (the draft token) equal wherever our top two logits are apart by
     more than that tolerance.
Prints a verdict line and writes --json. Exit status 0 only if every check holds.

  python3 scripts/check_reference_eagle3.py --specforge .ref/eagle3 --drafter DIR --dump dump.safetensors \
      --device cuda --json check.json

SpecForge is imported from --specforge (a copy of its specforge/ package,
scripts/fetch_reference_eagle3.sh): only the modules llama3_eagle.py needs are
loaded, without running the package's __init__ files (which import every
draft model SpecForge has).
"""
import argparse
import importlib.util
import json
import os
import sys
import types


def load_specforge_eagle3(root):
    """specforge.modeling.draft.llama3_eagle from the copy under root, its
    parent packages as bare namespaces (their __init__ files import models
    this check does not need)."""
    base = os.path.join(root, "specforge")
    for name, folder in (("specforge", base), ("specforge.modeling", os.path.join(base, "modeling")),
                         ("specforge.modeling.draft", os.path.join(base, "modeling", "draft"))):
        module = types.ModuleType(name)
        module.__path__ = [folder]
        sys.modules[name] = module
    name = "specforge.modeling.draft.llama3_eagle"
    spec = importlib.util.spec_from_file_location(name, os.path.join(base, "modeling", "draft", "llama3_eagle.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--specforge", required=True, help="folder holding SpecForge's specforge/ package")
    parser.add_argument("--drafter", required=True, help="our exported drafter folder")
    parser.add_argument("--dump", required=True, help="eagle3_reference_dump's output")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file
    from transformers import LlamaConfig

    eagle = load_specforge_eagle3(args.specforge)
    with open(os.path.join(args.drafter, "config.json")) as f:
        config_json = json.load(f)
    config = LlamaConfig(**config_json)
    with safe_open(args.dump, "pt") as f:
        meta = json.loads(f.metadata()["eagle3_reference_dump"])
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[meta["dtype"]]
    # Tolerances, as a fraction of each tensor's scale (max |ours|): fp32
    # differs by summation order only; bf16 by the rounding of every stage.
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2

    model = eagle.LlamaForCausalLMEagle3(config, attention_backend="sdpa").to(args.device, dtype).eval()
    ours = load_file(os.path.join(args.drafter, "model.safetensors"))
    result = model.load_state_dict(ours, strict=False)
    missing, unexpected = sorted(result.missing_keys), sorted(result.unexpected_keys)
    checks = {}
    checks["no_unexpected_keys"] = {"ok": unexpected == [], "unexpected": unexpected}
    checks["only_the_embedding_missing"] = {"ok": missing in ([], ["embed_tokens.weight"]), "missing": missing}
    checks["every_tensor_of_ours_loaded"] = {
        "ok": all(k in model.state_dict() for k in ours), "count": len(ours)}

    dump = load_file(args.dump)
    state = model.state_dict()
    checks["d2t_t2d_unchanged"] = {
        "ok": torch.equal(state["d2t"].cpu(), dump["d2t"].cpu()) and torch.equal(state["t2d"].cpu(), dump["t2d"].cpu())}

    features = dump["features"].to(args.device, dtype)
    embeddings = dump["embeddings"].to(args.device, dtype)
    with torch.no_grad():
        hidden = model(hidden_states=features, inputs_embeds=embeddings, ttt_length=1)  # after the final norm
        logits = model.lm_head(hidden).float()
    ours_hidden = dump["hidden"].to(args.device).float()
    ours_logits = dump["logits"].to(args.device).float()

    def relative(a, b):
        return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-12))

    hidden_error, logits_error = relative(hidden, ours_hidden), relative(logits, ours_logits)
    checks["hidden_states"] = {"ok": hidden_error <= tolerance, "relative_error": hidden_error, "tolerance": tolerance}
    checks["logits"] = {"ok": logits_error <= tolerance, "relative_error": logits_error, "tolerance": tolerance}
    # The draft token: the same wherever our top two are farther apart than the tolerance allows.
    top2 = ours_logits.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 2 * tolerance * float(ours_logits.abs().max())
    same = logits.argmax(-1) == ours_logits.argmax(-1)
    checks["draft_tokens"] = {"ok": bool(same[clear].all()), "positions": int(same.numel()),
                              "clear_positions": int(clear.sum()), "equal_everywhere": int(same.sum())}

    ok = all(c["ok"] for c in checks.values())
    report = {"ok": ok, "dump": meta, "drafter": os.path.basename(os.path.normpath(args.drafter)), "checks": checks,
              "reference": "SpecForge LlamaForCausalLMEagle3 (sdpa)", "torch": torch.__version__}
    line = ("PASS" if ok else "FAIL") + f" eagle3 reference {meta['dtype']}: hidden {hidden_error:.2e}, logits " \
        f"{logits_error:.2e} (tolerance {tolerance:g}); draft tokens equal at {checks['draft_tokens']['equal_everywhere']}" \
        f"/{checks['draft_tokens']['positions']}; missing {missing}, unexpected {unexpected}"
    print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
