#!/usr/bin/env python3
"""The GPU demonstration's figures: reads what scripts/gpu_demo.sh produced
and writes OUT/summary.md (the tables docs/quality.md quotes), OUT/results.json
(the same figures, machine-readable) and OUT/curves.png (the training curves).

    python3 scripts/gpu_demo/summarize.py --work WORK --out OUT
"""
import argparse
import json
import os
import re


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def load_lines(path):
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line:
                    out.append(json.loads(line))
    except OSError:
        pass
    return out


def lossless_cell(report):
    """Identical outputs, and how the others diverge: at near-ties (bf16
    rounding, docs/eval.md) or elsewhere (wrong tokens)."""
    cell = f"{report.get('identical_prompts', '?')} / {report['prompts']}"
    if report.get("lossless") is False and "near_tie_divergences" in report:
        cell += f"; {report['near_tie_divergences']} near-ties, {report['other_divergences']} other"
    return cell


def eval_summary(report):
    """A report without its per-prompt rows (every token), keeping where and
    how each differing prompt diverged."""
    out = {k: v for k, v in (report or {}).items() if k != "per_prompt"}
    divergences = [dict(line=row["line"], **row["divergence"])
                   for row in (report or {}).get("per_prompt", []) if "divergence" in row]
    if divergences:
        out["divergences"] = divergences
    return out


def eval_row(name, report):
    if not report:
        return f"| {name} | (no report) | | | | |"
    # A position never offered (a tree that never reached its depth) is null.
    accept = " ".join("—" if a is None else f"{a:.2f}" for a in report.get("acceptance_by_position", [])[:15])
    return (f"| {name} | {report['tau_mean']:.3f} | {accept} | {report['speculative_tokens_per_s']:.0f} "
            f"({report.get('greedy_tokens_per_s', 0):.0f}) | {report.get('speedup', 0):.2f}x | "
            f"{lossless_cell(report)} |")


def plot(metrics, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    train = [m for m in metrics if "loss" in m]
    evals = [m for m in metrics if "eval_tau" in m]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    axes[0].plot([m["step"] for m in train], [m["loss"] for m in train])
    axes[0].set_title("training loss (CE + KL)")
    axes[0].set_xlabel("step")
    slots = len(train[-1].get("slot_accuracy", [])) if train else 0
    for k in (0, 1, 3, 7, 14):
        if k < slots:
            axes[1].plot([m["step"] for m in train], [m["slot_accuracy"][k] for m in train], label=f"slot {k + 1}")
    axes[1].set_title("slot accuracy")
    axes[1].set_xlabel("step")
    axes[1].legend()
    axes[2].plot([m["step"] for m in train], [m.get("acceptance_length_sim", 0) for m in train], label="simulated")
    axes[2].plot([m["step"] for m in evals], [m["eval_tau"] for m in evals], "o-", label="real tau (eval)")
    axes[2].set_title("acceptance length")
    axes[2].set_xlabel("step")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def tree_sweep(out_dir):
    """The tree evals of stage 4d, by node budget: {nodes: report}."""
    sweep = {}
    for name in os.listdir(out_dir):
        m = re.fullmatch(r"eval_tree_(\d+)\.json", name)
        if m:
            report = load(os.path.join(out_dir, name))
            if report:
                sweep[int(m.group(1))] = report
    return dict(sorted(sweep.items()))


def scale_sweep(out_dir):
    """Stage 4f: the scale model's eval of every arm in one run (eval_scale.json:
    {"arms": [chain, tree, ...], "comparison": [...]}): the chain's report, the
    trees' by (tree temperature, node budget), and eval's own comparison of the
    trees with the chain, the first arm (τ and speed ratios), keyed alike."""
    both = load(os.path.join(out_dir, "eval_scale.json")) or {}
    chain, sweep, against_chain = None, {}, {}
    for report, entry in zip(both.get("arms", []), both.get("comparison", [])):
        if report.get("verify") == "tree":
            key = (float(report.get("tree_temperature", 1.0)), int(report["tree_nodes"]))
            sweep[key] = report
            if entry.get("tau_ratio_to_first") is not None and entry.get("speed_ratio_to_first") is not None:
                against_chain[key] = entry  # null where the chain's τ or speed was 0
        else:
            chain = report
    return chain, dict(sorted(sweep.items())), dict(sorted(against_chain.items()))


def tree_name(key):
    """(temperature, nodes) as the summary names an arm: "16", "16 T=0.7"."""
    temperature, nodes = key
    return f"{nodes}" if temperature == 1.0 else f"{nodes} T={temperature:g}"


def plot_trees(chain, sweep, path):
    """τ and speed-up against the node budget, one line per tree temperature
    (sweep: {(temperature, nodes): report}), the chain's as a line across."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    temperatures = sorted({t for t, _ in sweep}, key=lambda t: (t != 1.0, t))
    budgets = sorted({n for _, n in sweep})
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, title in ((axes[0], "tau_mean", "acceptance length τ"), (axes[1], "speedup", "speed-up at batch 1")):
        for t in temperatures:
            xs = [n for n in budgets if (t, n) in sweep]
            ax.plot(xs, [sweep[(t, n)].get(key, 0) for n in xs], "o-",
                    label="tree (DDTree)" if t == 1.0 else f"tree, temperature {t:g}")
        if chain and key in chain:
            ax.axhline(chain[key], color="gray", linestyle="--", label="chain")
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.set_xlabel("node budget")
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def tau_by_source(report, texts):
    """τ of each corpus source's prompts (train_target.py writes each prompt
    text with its document's source; eval's rows name their 1-based line):
    a source's step tokens over its verification steps."""
    if not report or not texts:
        return {}
    tokens, steps, prompts = {}, {}, {}
    for row in report.get("per_prompt", []):
        line = row.get("line", 0)
        if not 1 <= line <= len(texts):
            continue
        src = texts[line - 1].get("source", "unknown")
        n = max(0, row.get("target_passes", 0) - 1)  # the prefill pass verifies nothing
        tokens[src] = tokens.get(src, 0) + row.get("tau", 0) * n
        steps[src] = steps.get(src, 0) + n
        prompts[src] = prompts.get(src, 0) + 1
    return {src: {"tau": tokens[src] / steps[src] if steps[src] else 0.0, "prompts": prompts[src], "steps": steps[src]}
            for src in sorted(tokens)}


def repeated_ngram_share(report, n=4):
    """How loopy the target's outputs are: of all generated tokens, the share
    that complete an n-gram already seen earlier in the same output. Greedy
    decoding of a small LM falls into loops, which prompt lookup copies; a
    chat LLM's answers score near 0."""
    if not report:
        return None
    repeated = total = 0
    for row in report.get("per_prompt", []):
        ids = row.get("tokens", [])
        seen = set()
        for i in range(n - 1, len(ids)):
            gram = tuple(ids[i - n + 1:i + 1])
            repeated += gram in seen
            seen.add(gram)
        total += len(ids)
    return repeated / total if total else None


def stage_seconds(log_path):
    """Each stage's wall time from demo.log's "== HH:MM:SS [key] text" lines, and
    the run's total so far (the issue's bound: 9 minutes on one H200)."""
    try:
        with open(log_path) as f:
            marks = [line[3:].rstrip("\n").split(" ", 1) for line in f if line.startswith("== ")]
    except OSError:
        return None
    times = []
    for clock, name in marks:
        h, m, sec = (int(x) for x in clock.split(":"))
        times.append((h * 3600 + m * 60 + sec, name))
    if len(times) < 2:
        return None
    # gpu_demo.sh's stage lines carry their key in brackets; its other "=="
    # lines are notes within the stage before them.
    stages, total, current = {}, 0, None
    for (start, name), (end, _) in zip(times, times[1:]):
        if name.startswith("[") and "]" in name:
            current = name[1:name.index("]")]
        current = current or name
        seconds = (end - start) % 86400  # a run over midnight
        stages[current] = stages.get(current, 0) + seconds
        total += seconds
    return {"stages": stages, "total_seconds": total}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    dflash = load(os.path.join(args.out, "eval_dflash.json"))
    lookup = load(os.path.join(args.out, "eval_prompt_lookup.json"))
    unseen = load(os.path.join(args.work, "eval_dflash_unseen.json"))
    trained_on = load(os.path.join(args.work, "eval_dflash_train_prompts.json"))
    fp32 = load(os.path.join(args.work, "eval_dflash_fp32.json"))
    usual = load(os.path.join(args.work, "eval_dflash_usual.json"))
    eagle3 = load(os.path.join(args.out, "eval_eagle3.json"))
    profile = load(os.path.join(args.out, "decode_profile.json"))
    tree_profile = load(os.path.join(args.out, "decode_profile_tree.json"))
    gen = load(os.path.join(args.work, "generate.json"))
    gen_slice = load(os.path.join(args.work, "generate_slice.json"))
    peer = load_lines(os.path.join(args.work, "generate_transformers.json"))
    peer = peer[-1] if peer else None
    metrics = load_lines(os.path.join(args.out, "metrics.jsonl"))
    eval_texts = load_lines(os.path.join(args.work, "eval_texts.jsonl"))

    results = {"eval_dflash": eval_summary(dflash),
               "eval_prompt_lookup": eval_summary(lookup),
               "eval_dflash_unseen": eval_summary(unseen),
               "eval_dflash_train_prompts": eval_summary(trained_on),
               "eval_dflash_fp32": eval_summary(fp32),
               "eval_dflash_usual_kernels": eval_summary(usual),
               "eval_eagle3": eval_summary(eagle3),
               "decode_profile": profile,
               "generate": gen, "generate_slice": gen_slice, "generate_transformers": peer,
               "last_training_record": next((m for m in reversed(metrics) if "loss" in m), None)}
    if dflash and lookup and lookup.get("tau_mean"):
        results["tau_ratio_to_prompt_lookup"] = dflash["tau_mean"] / lookup["tau_mean"]
    if gen_slice and peer and peer.get("tokens_per_s"):
        results["generate_speed_ratio_to_transformers"] = gen_slice["tokens_per_s"] / peer["tokens_per_s"]
    lines = ["| drafter | tau | acceptance at block positions 1 ... 15 | tokens/s (target alone) | speed-up | lossless |",
             "| --- | ---: | --- | ---: | ---: | ---: |",
             eval_row("prompt lookup", lookup), eval_row("DFlash (trained here)", dflash)]
    if trained_on:
        lines.append(eval_row("DFlash, prompts it trained on", trained_on))
    if unseen:
        lines.append(eval_row("DFlash, the other prompt set (unseen_texts: train_target.py)", unseen))
    if fp32:
        lines.append(eval_row("DFlash, fp32: the lossless check", fp32))
    if usual:
        lines.append(eval_row("DFlash, the target's exact_decoding off (target alone: the same kernels)", usual))
    if eagle3:
        lines.append(eval_row("EAGLE-3 (trained here, same data and target)", eagle3))
    sweep = tree_sweep(args.out)
    for nodes, report in sweep.items():
        lines.append(eval_row(f"DFlash, draft tree of {nodes} nodes (same drafter, same prompts)", report))
    lines.append("")
    if sweep:
        results["eval_tree"] = {str(n): eval_summary(r) for n, r in sweep.items()}
        if dflash and dflash.get("tau_mean") and dflash.get("speedup"):
            for nodes, r in sweep.items():
                results["eval_tree"][str(nodes)]["tau_ratio_to_chain"] = r["tau_mean"] / dflash["tau_mean"]
                results["eval_tree"][str(nodes)]["speedup_ratio_to_chain"] = r.get("speedup", 0) / dflash["speedup"]
            best = max(sweep, key=lambda n: sweep[n].get("speedup", 0))
            lines.append(f"draft trees against the chain: " + ", ".join(
                f"{n} nodes tau {sweep[n]['tau_mean'] / dflash['tau_mean']:.2f}x, speed-up "
                f"{sweep[n].get('speedup', 0) / dflash['speedup']:.2f}x" for n in sweep) + f" (best budget: {best})")
        if plot_trees(dflash, {(1.0, n): r for n, r in sweep.items()}, os.path.join(args.out, "trees.png")):
            lines.append("tree curves: trees.png")
    scale = load(os.path.join(args.out, "scale_model.json"))
    scale_chain, scale_trees, scale_ratios = scale_sweep(args.out)
    if scale or scale_chain:
        factor = (scale or {}).get("factor", "?")
        results["scale_model"] = dict(scale or {}, chain=eval_summary(scale_chain),
                                      trees={tree_name(k): eval_summary(r) for k, r in scale_trees.items()})
        check = (scale or {}).get("check", {})
        lines.append("")
        lines.append(f"scale model (stage 4f): target and drafter widened {factor}x, the same functions up to rounding; "
                     f"target {check.get('scale_target_parameters', 0) / 1e9:.2f} B parameters, its greedy choices "
                     f"{check.get('greedy_agreement', 0):.1%} the trained target's on {check.get('positions', 0)} positions "
                     f"(largest logit difference {check.get('max_abs_logit_difference', 0):.3f})")
        lines.append("")
        lines.append(lines[0])
        lines.append(lines[1])
        lines.append(eval_row(f"scale model, chain", scale_chain))
        for (temperature, nodes), report in scale_trees.items():
            at = "" if temperature == 1.0 else f" at temperature {temperature:g}"
            lines.append(eval_row(f"scale model, draft tree of {nodes} nodes{at}", report))
        if scale_chain and scale_trees:
            for k, entry in scale_ratios.items():
                results["scale_model"]["trees"][tree_name(k)].update(
                    tau_ratio_to_chain=entry["tau_ratio_to_first"], speed_ratio_to_chain=entry["speed_ratio_to_first"])
            if scale_ratios:
                best = max(scale_ratios, key=lambda k: scale_ratios[k]["speed_ratio_to_first"])
                lines.append("scale model, draft trees against the chain: " + ", ".join(
                    f"{tree_name(k)} nodes tau {e['tau_ratio_to_first']:.2f}x, speed {e['speed_ratio_to_first']:.2f}x"
                    for k, e in scale_ratios.items()) + f" (best budget: {tree_name(best)})")
            if plot_trees(scale_chain, scale_trees, os.path.join(args.out, "trees_scale.png")):
                lines.append("scale model tree curves: trees_scale.png")
        lines.append("")
    if "tau_ratio_to_prompt_lookup" in results:
        lines.append(f"tau ratio DFlash / prompt lookup: {results['tau_ratio_to_prompt_lookup']:.2f}")
    loops = repeated_ngram_share(lookup or dflash)
    if loops is not None:
        results["output_repeated_4gram_share"] = loops
        lines.append(f"target outputs (greedy): {loops:.1%} of tokens repeat an earlier 4-gram of the same output")
    by_source = {name: tau_by_source(report, eval_texts) for name, report in (("dflash", dflash), ("prompt_lookup", lookup))}
    if any(by_source.values()):
        results["tau_by_source"] = by_source
        for name, table in by_source.items():
            cells = ", ".join(f"{src} {v['tau']:.2f} ({v['prompts']} prompts)" for src, v in table.items())
            lines.append(f"tau by prompt source, {name}: {cells}")
    if gen:
        lines.append(f"generate (all prompts): {gen['generated_tokens']} tokens in {gen['seconds']:.1f} s, "
                     f"{gen['tokens_per_s']:.0f} tokens/s")
    if gen_slice and peer:
        lines.append(f"generate, the same {gen_slice.get('prompts')} prompts: dflash-host {gen_slice['tokens_per_s']:.0f} "
                     f"tokens/s, transformers {peer['tokens_per_s']:.0f} tokens/s "
                     f"({results.get('generate_speed_ratio_to_transformers', 0):.2f}x)")
    timed = sorted(m["step_seconds"] for m in metrics if "step_seconds" in m)
    if timed:
        results["drafter_step_seconds"] = {"median": timed[len(timed) // 2], "steps": len(timed),
                                           "total": sum(timed)}
        lines.append(f"drafter training: {len(timed)} steps, median {timed[len(timed) // 2]:.3f} s a step, "
                     f"{sum(timed):.0f} s in all")
    steps = [m for m in metrics if "memory_peak_bytes" in m and m.get("memory_planned_peak_bytes")]
    if steps:
        measured = max(m["memory_peak_bytes"] for m in steps)
        planned = steps[-1]["memory_planned_peak_bytes"]
        results["drafter_step_memory"] = {"planned_peak_bytes": planned, "measured_peak_bytes": measured}
        lines.append(f"drafter training memory: planned peak {planned / 2**30:.2f} GiB, measured peak "
                     f"{measured / 2**30:.2f} GiB ({100 * (planned - measured) / measured:+.1f} %)")
    if tree_profile:
        results["decode_profile_tree"] = tree_profile
    scale_profiles = {kind: load(os.path.join(args.out, f"decode_profile_scale_{kind}.json")) for kind in ("chain", "tree")}
    for kind, scale_profile in scale_profiles.items():
        if scale_profile:
            results.setdefault("scale_model", {})[f"decode_profile_{kind}"] = scale_profile
    labelled = [(profile, ""), (tree_profile, ", tree"), (scale_profiles["chain"], ", scale model"),
                (scale_profiles["tree"], ", scale model, tree")]
    for arm in [dict(a, arm=a["arm"] + suffix) for p, suffix in labelled for a in (p or {}).get("arms", [])]:
        g, sp = arm.get("greedy", {}), arm.get("speculative", {})
        phases = ", ".join(f"{k} {v:.3f}" for k, v in sp.get("profiled_ms_per_step", {}).items())
        lines.append(f"decode profile, {arm['arm']}: target alone {g.get('ms_per_token', 0):.3f} ms/token; speculative "
                     f"{sp.get('ms_per_step', 0):.3f} ms/step, tau {sp.get('tau', 0):.2f}, speed-up "
                     f"{sp.get('speedup', 0):.2f}x; ms per step: {phases}")
        tgt = arm.get("target", {})
        if "decode_graph_stats_after_greedy" in tgt:
            before, end = tgt["decode_graph_stats_after_greedy"], tgt.get("decode_graph_stats", {})
            lines.append(f"  target graphs, {arm['arm']}: after greedy {before.get('captured', 0)} captured / "
                         f"{before.get('replayed', 0)} replays; at the end {end.get('captured', 0)} / "
                         f"{end.get('replayed', 0)} ({end.get('failed', 0)} failed)")
    timing = stage_seconds(os.path.join(args.out, "demo.log"))
    if timing:
        results["wall_seconds"] = timing
        lines.append(f"wall time up to the summary: {timing['total_seconds']} s (" +
                     ", ".join(f"{name} {sec} s" for name, sec in timing["stages"].items()) + ")")
    if plot(metrics, os.path.join(args.out, "curves.png")):
        lines.append("curves: curves.png")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
