#!/usr/bin/env node
// Prints, as a JSON string, the Jinja chat template that a model's GGUF file
// holds, as @huggingface/ollama-utils records it: the "gguf" field of the
// model's entry in OLLAMA_CHAT_TEMPLATE_MAPPING (src/chat-template-automap.ts,
// generated from the GGUF files of Ollama's library). The package does not
// export the mapping, so the file's array literal is evaluated on its own, in
// an empty context: it is plain data, and nothing of the package runs.
//
//   node ollama_chat_template.js NODE_DIR MODEL    e.g. library/mistral:7b-instruct-fp16
//
// Exits 2, saying why on stderr, when the package or the model's entry is
// not there.
"use strict";
const fs = require("fs");
const path = require("path");
const vm = require("vm");

function fail(message) {
  process.stderr.write(message + "\n");
  process.exit(2);
}

const [nodeDir, model] = process.argv.slice(2);
if (!nodeDir || !model) fail("usage: node ollama_chat_template.js NODE_DIR MODEL");
const file = path.join(nodeDir, "node_modules", "@huggingface", "ollama-utils", "src", "chat-template-automap.ts");
if (!fs.existsSync(file))
  fail(`${file} is missing: @huggingface/ollama-utils is not installed (npm ci in ${nodeDir})`);
const source = fs.readFileSync(file, "utf8");
const declaration = source.search(/export const OLLAMA_CHAT_TEMPLATE_MAPPING\b[^=]*=\s*\[/);
if (declaration < 0) fail(`${file} no longer declares OLLAMA_CHAT_TEMPLATE_MAPPING = [...]`);
const begin = source.indexOf("[", source.indexOf("=", declaration));
const end = source.lastIndexOf("]");
let mapping;
try {
  mapping = vm.runInNewContext("(" + source.slice(begin, end + 1) + ")", Object.create(null), { timeout: 5000 });
} catch (e) {
  fail(`${file}: OLLAMA_CHAT_TEMPLATE_MAPPING is not a plain array literal any more (${e.message})`);
}
const entry = Array.isArray(mapping) ? mapping.find((m) => m && m.model === model) : undefined;
if (!entry || typeof entry.gguf !== "string")
  fail(`${file} has no entry for ${model} with a "gguf" chat template (the package's version in package.json may have changed)`);
process.stdout.write(JSON.stringify(entry.gguf));
