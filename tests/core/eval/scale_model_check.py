#!/usr/bin/env python3
"""The GPU demonstration's scale model keeps the trained functions
(scripts/gpu_demo/scale_model.py, docs/eval.md): the quickstart's target and
a drafter trained on it for a few steps, widened by the script's own rules
(its plain-Python arithmetic, fp32), decode every prompt to the same tokens
with the same acceptance, step for step, as the originals.

    scale_model_check.py DFLASH_HOST PLUGIN_DIR SOURCE_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

STEPS = 50  # enough for a drafter some of whose proposals the target accepts


def main():
    host, plugins, root = sys.argv[1:4]
    base = [host, "--no-default-plugin-dirs", "--plugin-dir", plugins]
    config = os.path.join(root, "configs", "quickstart.json")
    prompts = os.path.join(root, "configs", "quickstart", "data", "heldout.jsonl")

    def run(*args):
        done = subprocess.run(list(args), cwd=root, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{' '.join(args)}\nexited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")

    def evaluate(work, name, target, drafter):
        report = os.path.join(work, name + ".json")
        run(*base, "eval", "--config", config, "--set", f"target.path={target}", "--drafter-checkpoint", drafter,
            "--prompts", prompts, "--max-prompts", "6", "--max-new-tokens", "40", "--report", report)
        with open(report) as f:
            return json.load(f)

    with tempfile.TemporaryDirectory() as work:
        run_dir = os.path.join(work, "run")
        run(*base, "train", "--config", config, "--set", f"train.steps={STEPS}", "--set", f"train.output_dir={run_dir}",
            "--set", "train.eval_every=0", "--set", f"train.checkpoint_every={STEPS}")
        target = os.path.join(root, "configs", "quickstart", "target")
        original = evaluate(work, "original", target, run_dir)
        if original["tau_mean"] <= 1.0:
            sys.exit(f"the {STEPS}-step drafter had no proposal accepted (τ {original['tau_mean']}): the check would be empty")
        failures = []
        for r, h in ((2, 2), (4, 1)):
            wide = os.path.join(work, f"r{r}h{h}")
            run(sys.executable, os.path.join(root, "scripts", "gpu_demo", "scale_model.py"), "--plain-python",
                "--factor", str(r), "--head-factor", str(h), "--target", target, os.path.join(wide, "target"),
                "--drafter", run_dir, os.path.join(wide, "drafter"))
            with open(os.path.join(wide, "target", "config.json")) as f:
                hidden = json.load(f)["hidden_size"]
            scaled = evaluate(work, f"r{r}h{h}", os.path.join(wide, "target"), os.path.join(wide, "drafter"))
            label = f"widened {r}x (heads {h}x, hidden {hidden})"
            for key in ("tau_mean", "acceptance_by_position", "tau_histogram", "verification_steps"):
                if scaled[key] != original[key]:
                    failures.append(f"{label}: {key} {scaled[key]} where the original has {original[key]}")
            for a, b in zip(original["per_prompt"], scaled["per_prompt"]):
                if a["tokens"] != b["tokens"]:
                    failures.append(f"{label}: prompt line {a['line']} decodes to other tokens")
            if not scaled.get("lossless"):
                failures.append(f"{label}: not lossless against its own greedy decoding")
        if failures:
            sys.exit("\n".join(failures))
        print(f"τ {original['tau_mean']:.3f} on {original['prompts']} prompts, the same for both widenings")


if __name__ == "__main__":
    main()
