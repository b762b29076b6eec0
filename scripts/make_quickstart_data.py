#!/usr/bin/env python3
"""Pre-tokenises the quickstart's drafter data (SpecForge-style JSON lines,
{"input_ids": [...], "loss_mask": [...]}) with the quickstart target's byte
tokenizer (ids 0-255 = bytes, 256 = BOS). Source: the Python 3.11
documentation's reST (Debian python3.11-doc, PSF licence). train.jsonl comes
from howto/ and faq/, text the target was trained on; heldout.jsonl from
tutorial/, which the target never saw. No third-party modules needed.

    python3 scripts/make_quickstart_data.py [--sources /usr/share/doc/python3.11/html/_sources] [--out configs/quickstart/data]

Each document is cut into pieces of at most --length bytes at line breaks;
the first --prompt tokens of a piece are unsupervised (loss_mask 0).
"""
import argparse
import json
import os

BOS = 256


def pieces(data, length):
    out, start = [], 0
    while start < len(data):
        end = min(len(data), start + length)
        if end < len(data):
            cut = data.rfind(b"\n", start + length // 2, end)
            end = cut + 1 if cut > 0 else end
        out.append(data[start:end])
        start = end
    return out


def write(files, path, length, prompt, budget):
    used = 0
    with open(path, "w") as f:
        for name in files:
            with open(name, "rb") as g:
                data = g.read()
            for i, piece in enumerate(pieces(data, length - 1)):
                ids = ([BOS] if i == 0 else []) + list(piece)
                mask = [0 if j < prompt else 1 for j in range(len(ids))]
                if sum(1 for j in range(len(ids) - 1) if mask[j] and mask[j + 1]) == 0:
                    continue
                f.write(json.dumps({"input_ids": ids, "loss_mask": mask}, separators=(",", ":")) + "\n")
                used += len(piece)
                if used >= budget:
                    return used
    return used


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sources", default="/usr/share/doc/python3.11/html/_sources")
    p.add_argument("--out", default="configs/quickstart/data")
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--prompt", type=int, default=8)
    p.add_argument("--train-bytes", type=int, default=600_000)
    p.add_argument("--heldout-bytes", type=int, default=60_000)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)

    def listing(*subdirs):
        found = []
        for sub in subdirs:
            for root, _, names in os.walk(os.path.join(args.sources, sub)):
                found += [os.path.join(root, n) for n in names if n.endswith(".txt")]
        return sorted(found)

    train = write(listing("howto", "faq"), os.path.join(args.out, "train.jsonl"), args.length, args.prompt, args.train_bytes)
    held = write(listing("tutorial"), os.path.join(args.out, "heldout.jsonl"), args.length, args.prompt, args.heldout_bytes)
    print(json.dumps({"train_bytes": train, "heldout_bytes": held}))


if __name__ == "__main__":
    main()
