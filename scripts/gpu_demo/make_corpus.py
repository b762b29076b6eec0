#!/usr/bin/env python3
"""The text the GPU demonstration trains its target on, from what Debian ships
offline (see ../shared/design/machines.md): the Python 3.11 documentation's
reST sources (python3.11-doc, PSF licence) and the fortunes (fortunes,
fortunes-min). One {"text": ...} document per line, gzip'd, deterministic.
The GPU machine has no network, so this runs here and the file travels with
the device call (`carry: [".corpus"]`).

    python3 scripts/gpu_demo/make_corpus.py --out .corpus/corpus.jsonl.gz
"""
import argparse
import glob
import gzip
import json
import os

PYDOC = "/usr/share/doc/python3.11/html/_sources"
FORTUNES = "/usr/share/games/fortunes"
# Long reST files are cut at blank lines into pieces of about this many
# characters, so that documents are of a size a prompt window can come from.
PIECE_CHARS = 6000


def pieces(text):
    out, current = [], []
    size = 0
    for block in text.split("\n\n"):
        current.append(block)
        size += len(block) + 2
        if size >= PIECE_CHARS:
            out.append("\n\n".join(current))
            current, size = [], 0
    if current:
        out.append("\n\n".join(current))
    return [p for p in out if p.strip()]


def python_docs():
    for path in sorted(glob.glob(os.path.join(PYDOC, "**", "*.txt"), recursive=True)):
        with open(path, encoding="utf-8", errors="replace") as f:
            yield from pieces(f.read())


def fortunes():
    for path in sorted(glob.glob(os.path.join(FORTUNES, "*"))):
        if "." in os.path.basename(path) or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for fortune in f.read().split("\n%\n"):
                if fortune.strip():
                    yield fortune.strip("\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    count = chars = 0
    with gzip.open(args.out, "wt", encoding="utf-8", compresslevel=9) as out:
        for source in (python_docs(), fortunes()):
            for text in source:
                out.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
                count += 1
                chars += len(text)
    if count == 0:
        raise SystemExit(f"no text found: install python3.11-doc and fortunes ({PYDOC}, {FORTUNES})")
    print(f"{args.out}: {count} documents, {chars / 1e6:.1f} M characters")


if __name__ == "__main__":
    main()
