#!/usr/bin/env python3
"""The GPU demonstration's scale model (stage 4f, issue 41): the target and
the drafter trained in the demonstration, widened so that they compute the
same functions (up to rounding) with the weights, and so the memory traffic
per token, of models about r² times larger (r = 16: the 46 M-parameter demo
target becomes an 8 B-parameter one of hidden size 8,192, MLP 24,576, 32
query and 16 key-value heads).

Why: a draft tree pays when the target's pass is memory-bound and costs what
a real LLM's does at batch 1 (milliseconds), so that verifying 64 nodes costs
about what 16 tokens do and a step's fixed costs (the drafter's top-k, the
walk, keeping the path) are small beside it. The demonstration's target is
trained in the same device call, so it is small (12 layers, hidden 512,
≈ 0.5 ms a token); a target trained at 8B width in those minutes would be an
untrained one. Widening keeps what training gave it.

How (Net2Net-style, function-preserving): every unit of the hidden state is
repeated r times (x → [x, x, …, x]), as is every MLP unit; every attention
head is repeated h times (`--head-factor`; the query, key and value heads as
blocks, so grouped-query attention pairs them as before). A weight writing a
repeated dimension has its rows repeated; a weight reading one has its
columns repeated and divided by the number of copies (a power of two: exact
in bf16), so each sum of equal terms gives the original value. RMSNorm's
mean of squares over r copies is the original mean, so norms only repeat
their weights; per-head norms (q_norm, k_norm) and the head size are
unchanged, so rotary and the attention's scale are too. The drafter's fc
reads F target features side by side: each feature's columns repeat within
its own block. Nothing is zero and nothing is skipped: every weight is a
copy of a trained one.

    python3 scripts/gpu_demo/scale_model.py --factor 16 --head-factor 4 \\
        --target WORK/target SCALE/target --drafter WORK/run SCALE/drafter \\
        --check-prompts WORK/eval_prompts.jsonl --json OUT/scale_model.json

The target becomes a Hugging Face folder (bf16, tokenizer files copied), the
drafter a drafter folder (config.json + model.safetensors: what
`dflash-host eval --drafter-checkpoint` takes). The check runs both targets
(transformers, bf16) on a few prompts and reports how often their greedy
choices agree and the largest logit difference (GPU machine: torch,
safetensors, transformers).
"""
import argparse
import array
import json
import math
import os
import shutil
import struct

HEAD_NORMS = ("q_norm.weight", "k_norm.weight")  # over one head's dimensions: unchanged
WIDENED_SIZES = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads")


def widen(name, w, r, h, hidden):
    """One tensor of either model: the hidden state and the MLP widened r
    times, the attention heads h times (see the module's text)."""
    if name.endswith(HEAD_NORMS):
        return w
    if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):  # heads from the hidden state
        return w.repeat(h, r) / r
    if name.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")):
        return w.repeat(h)
    if name.endswith("o_proj.weight"):  # the heads back into the hidden state
        return w.repeat(r, h) / h
    if w.dim() == 1:  # norms over the hidden state, and biases of widened outputs
        return w.repeat(r)
    if name.endswith("embed_tokens.weight"):  # a lookup: writes the hidden state
        return w.repeat(1, r)
    if name.endswith("lm_head.weight"):  # reads the hidden state
        return w.repeat(1, r) / r
    if name == "fc.weight":  # the drafter's [hidden, F·hidden]: F features side by side
        out_features, in_features = w.shape
        features = in_features // hidden
        if features * hidden != in_features:
            raise SystemExit(f"fc.weight is {list(w.shape)}: its input is not a whole number of {hidden}-wide features")
        return (w.reshape(out_features, features, hidden).repeat(r, 1, r) / r).reshape(out_features * r, features * hidden * r)
    return w.repeat(r, r) / r  # projections: both sides repeated


class TorchWeights:
    """The GPU machine's way: torch and safetensors, the arithmetic in fp32 on
    the device, the widened weights written in bf16."""
    dtype_name = "bfloat16"

    def __init__(self):
        import torch
        self.torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"

    def load(self, path):
        from safetensors.torch import load_file
        return {name: w.to(self.device, self.torch.float32) for name, w in load_file(path).items()}

    def stored(self, w):
        """A widened tensor as it is written, off the device at once: the
        device then holds one widened tensor at a time, not the whole model in fp32."""
        return w.to(self.torch.bfloat16).cpu().contiguous()

    def save(self, path, tensors):
        from safetensors.torch import save_file
        save_file(tensors, path, metadata={"format": "pt"})


class Flat:
    """A tensor as a flat list of floats, row-major: the few operations
    widen() uses, with torch's meaning (repeat tiles each axis)."""

    def __init__(self, shape, data):
        self.shape, self.data = tuple(shape), data

    def dim(self):
        return len(self.shape)

    def reshape(self, *shape):
        if math.prod(shape) != len(self.data):
            raise ValueError(f"cannot reshape {list(self.shape)} to {list(shape)}")
        return Flat(shape, self.data)

    def __truediv__(self, divisor):
        return Flat(self.shape, [v / divisor for v in self.data])

    def repeat(self, *reps):
        def tile(data, shape, reps):
            if len(shape) == 1:
                return data * reps[0]
            inner = math.prod(shape[1:])
            rows = []
            for i in range(shape[0]):
                rows.extend(tile(data[i * inner:(i + 1) * inner], shape[1:], reps[1:]))
            return rows * reps[0]
        return Flat([n * k for n, k in zip(self.shape, reps)], tile(self.data, self.shape, reps))


class PlainWeights:
    """Plain Python, no torch (the CPU test: tests/core/eval/scale_model_check.py):
    BF16 or F32 safetensors read, F32 written, so the widened model's
    arithmetic is the original's in fp32. For small models only."""
    dtype_name = "float32"

    def load(self, path):
        with open(path, "rb") as f:
            header_size = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(header_size))
            data = f.read()
        out = {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            begin, end = entry["data_offsets"]
            raw = data[begin:end]
            if entry["dtype"] == "F32":
                values = array.array("f")
                values.frombytes(raw)
            elif entry["dtype"] == "BF16":
                halves = array.array("H")
                halves.frombytes(raw)
                values = array.array("f", struct.pack(f"<{len(halves)}I", *[b << 16 for b in halves]))
            else:
                raise SystemExit(f"{path}: {name} is {entry['dtype']}; the plain-Python widening reads F32 and BF16")
            out[name] = Flat(entry["shape"], list(values))
        return out

    def stored(self, w):
        return w

    def save(self, path, tensors):
        header, blobs, offset = {}, [], 0
        for name, w in tensors.items():
            blob = array.array("f", w.data).tobytes()
            header[name] = {"dtype": "F32", "shape": list(w.shape), "data_offsets": [offset, offset + len(blob)]}
            blobs.append(blob)
            offset += len(blob)
        header["__metadata__"] = {"format": "pt"}
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for blob in blobs:
                f.write(blob)


def weights_file(folder):
    path = os.path.join(folder, "model.safetensors")
    if not os.path.isfile(path):
        raise SystemExit(f"{folder}: no model.safetensors (a sharded checkpoint is not expected here)")
    return path


def widened_config(config, r, h):
    out = dict(config)
    if "head_dim" not in out or not out["head_dim"]:
        out["head_dim"] = config["hidden_size"] // config["num_attention_heads"]
    for key in ("hidden_size", "intermediate_size"):
        out[key] = config[key] * r
    for key in ("num_attention_heads", "num_key_value_heads"):
        out[key] = config[key] * h
    return out


def widen_folder(src, dst, r, h, weights, extra_config=None):
    """Widens src's model.safetensors into dst; returns dst's config."""
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    hidden = config["hidden_size"]
    os.makedirs(dst, exist_ok=True)
    tensors = {name: weights.stored(widen(name, w, r, h, hidden)) for name, w in weights.load(weights_file(src)).items()}
    weights.save(os.path.join(dst, "model.safetensors"), tensors)
    out = widened_config(config, r, h)
    out.update({"torch_dtype": weights.dtype_name, "dtype": weights.dtype_name})
    out.update(extra_config or {})
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(out, f, indent=2)
    return out


def drafter_folder(path):
    """A drafter folder, a checkpoint root with `latest`, or a run folder (as eval takes them)."""
    if os.path.isfile(os.path.join(path, "model.safetensors")):
        return path
    for root in (os.path.join(path, "checkpoints"), path):
        latest = os.path.join(root, "latest")
        if os.path.isfile(latest):
            with open(latest) as f:
                return os.path.join(root, f.read().strip())
    raise SystemExit(f"{path}: not a drafter folder, a checkpoint root with `latest`, or a run folder")


def check_prompts(path, count, length):
    rows = []
    with open(path) as f:
        for line in f:
            ids = json.loads(line).get("prompt_ids") or json.loads(line).get("input_ids")
            if ids:
                rows.append(ids[:length])
            if len(rows) == count:
                break
    return rows


def load_model(auto, folder, device):
    import torch
    try:  # straight onto the device where accelerate is installed (the scale target is tens of GB)
        model = auto.from_pretrained(folder, torch_dtype=torch.bfloat16, device_map=device)
    except (ImportError, ValueError):
        model = auto.from_pretrained(folder, torch_dtype=torch.bfloat16).to(device)
    return model.eval()


def check(small_dir, scale_dir, prompts, device):
    """Both targets on the same prompts: greedy agreement and the largest logit gap."""
    import torch
    from transformers import AutoModelForCausalLM
    agree = positions = 0
    worst = 0.0
    small = load_model(AutoModelForCausalLM, small_dir, device)
    small_logits = []
    with torch.no_grad():
        for ids in prompts:
            small_logits.append(small(torch.tensor([ids], device=device)).logits[0].float().cpu())
    del small
    scale = load_model(AutoModelForCausalLM, scale_dir, device)
    scale_size = sum(p.numel() for p in scale.parameters())
    with torch.no_grad():
        for ids, a in zip(prompts, small_logits):
            b = scale(torch.tensor([ids], device=device)).logits[0].float().cpu()
            agree += int((a.argmax(-1) == b.argmax(-1)).sum())
            positions += a.shape[0]
            worst = max(worst, float((a - b).abs().max()))
    del scale
    torch.cuda.empty_cache()
    return {"prompts": len(prompts), "positions": positions, "greedy_agreement": agree / max(positions, 1),
            "max_abs_logit_difference": worst, "scale_target_parameters": scale_size}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--factor", type=int, default=16, help="r: each hidden unit and MLP unit repeated r times")
    p.add_argument("--head-factor", type=int, default=4,
                   help="h (at most r): each attention head repeated h times (4: the demo target's 8 query and 4 "
                        "key-value heads of 64 become 32 and 16, Qwen3-8B's query heads and its key-value bytes a token)")
    p.add_argument("--target", nargs=2, metavar=("SRC", "DST"), required=True)
    p.add_argument("--drafter", nargs=2, metavar=("SRC", "DST"), required=True)
    p.add_argument("--check-prompts", help="JSON lines with prompt_ids or input_ids: the two targets compared on them")
    p.add_argument("--check-count", type=int, default=4)
    p.add_argument("--json", help="where the figures go (else printed)")
    p.add_argument("--plain-python", action="store_true",
                   help="no torch: plain-Python arithmetic, F32 out (small models: the CPU test)")
    a = p.parse_args()
    r, h = a.factor, a.head_factor
    for flag, value in (("--factor", r), ("--head-factor", h)):
        if value < 1 or value & (value - 1):
            raise SystemExit(f"{flag} {value}: must be a power of two (dividing by it is then exact)")
    if h > r:
        raise SystemExit(f"--head-factor {h} is more than --factor {r}")
    if a.plain_python and a.check_prompts:
        raise SystemExit("--check-prompts runs transformers: not with --plain-python")
    weights = PlainWeights() if a.plain_python else TorchWeights()
    (src, dst), (drafter_src, drafter_dst) = a.target, a.drafter
    target_config = widen_folder(src, dst, r, h, weights, {"tie_word_embeddings": False})
    for name in os.listdir(src):  # tokenizer and generation files
        if name not in ("config.json", "model.safetensors") and os.path.isfile(os.path.join(src, name)):
            shutil.copy(os.path.join(src, name), os.path.join(dst, name))
    drafter_config = widen_folder(drafter_folder(drafter_src), drafter_dst, r, h, weights)
    if drafter_config["hidden_size"] != target_config["hidden_size"]:
        raise SystemExit(f"the widened drafter's hidden_size {drafter_config['hidden_size']} is not the widened "
                         f"target's {target_config['hidden_size']}")
    figures = {"factor": r, "head_factor": h, **{f"target_{k}": target_config[k] for k in WIDENED_SIZES},
               "target_layers": target_config["num_hidden_layers"], "drafter_layers": drafter_config["num_hidden_layers"],
               "target_bytes": os.path.getsize(os.path.join(dst, "model.safetensors")),
               "drafter_bytes": os.path.getsize(os.path.join(drafter_dst, "model.safetensors"))}
    if a.check_prompts:
        figures["check"] = check(src, dst, check_prompts(a.check_prompts, a.check_count, 256), weights.device)
    text = json.dumps(figures)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
