// tokenizer_parity: our tokenizers against the Node reference on a whole
// corpus (scripts/tokenizer_parity.sh runs it; the figures go to
// docs/tokenizer.md). Exit status 1 when any document differs.
//
//   tokenizer_parity --corpus docs.jsonl --reference ref.jsonl --node-dir DIR --variant-dir DIR
//       [--families qwen3,gemma3,...] [--node-timing timing.json]
// --node-dir: the Node project (tests/core/text/node) whose packages hold the
// files; --variant-dir: where reference.js wrote its variant files.
#include "core/text/parity.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

int main(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 1; i + 1 < argc; i += 2) args[std::string(argv[i]).substr(2)] = argv[i + 1];
  if (!args.count("corpus") || !args.count("reference") || !args.count("node-dir") || !args.count("variant-dir")) {
    std::cerr << "usage: tokenizer_parity --corpus docs.jsonl --reference ref.jsonl --node-dir DIR --variant-dir DIR "
                 "[--families a,b,...] [--node-timing FILE]\n";
    return 2;
  }
  try {
    const auto docs = dflash::test::read_corpus(args["corpus"]);
    const auto reference = dflash::test::read_reference(args["reference"]);
    nlohmann::json node_timing;
    if (args.count("node-timing")) {
      std::ifstream in(args["node-timing"]);
      node_timing = nlohmann::json::parse(in).at("timing");
    }
    std::vector<const dflash::test::ParityFamily*> families;
    if (args.count("families")) {
      std::stringstream list(args["families"]);
      for (std::string name; std::getline(list, name, ',');) families.push_back(&dflash::test::parity_family(name));
    } else {
      for (const auto& f : dflash::test::parity_families()) families.push_back(&f);
    }
    bool all_equal = true;
    std::printf("| family | documents | bytes | tokens | id mismatches | decode mismatches | round-trip failures | "
                "C++ encode MB/s | reference encode MB/s | C++ load s |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (const dflash::test::ParityFamily* f : families) {
      const auto start = std::chrono::steady_clock::now();
      const auto tokenizer =
          dflash::text::Tokenizer::load(dflash::test::family_file(*f, args["node-dir"], args["variant-dir"]));
      const double load = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const auto r = dflash::test::compare_family(tokenizer, *f, docs, reference);
      double node_mbs = 0;
      if (node_timing.contains(f->name))
        node_mbs = node_timing[f->name]["bytes"].get<double>() / 1e6 / node_timing[f->name]["seconds"].get<double>();
      std::printf("| %s | %lld | %lld | %lld | %lld | %lld | %s | %.2f | %.2f | %.2f |\n", f->name.c_str(),
                  static_cast<long long>(r.documents), static_cast<long long>(r.bytes), static_cast<long long>(r.tokens),
                  static_cast<long long>(r.id_mismatches), static_cast<long long>(r.decode_mismatches),
                  f->round_trip ? std::to_string(r.round_trip_failures).c_str() : "not checked",
                  double(r.bytes) / 1e6 / r.encode_seconds, node_mbs, load);
      std::fflush(stdout);
      for (const std::string& report : r.reports) std::fprintf(stderr, "%s\n", report.c_str());
      all_equal = all_equal && r.id_mismatches == 0 && r.decode_mismatches == 0 && r.round_trip_failures == 0;
    }
    return all_equal ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "tokenizer_parity: " << e.what() << "\n";
    return 2;
  }
}
