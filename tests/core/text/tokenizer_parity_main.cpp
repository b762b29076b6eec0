// tokenizer_parity: our tokenizers against the Node reference on a whole
// corpus (scripts/tokenizer_parity.sh runs it; the figures go to
// docs/tokenizer.md). Exit status 1 when any document differs.
//
//   tokenizer_parity --corpus docs.jsonl --reference ref.jsonl [--node-timing timing.json]
//       [--qwen3 tokenizer.json] [--llama3 tokenizer.json] [--llama3_bos tokenizer.json] [--gpt2 dir]
#include "core/text/parity.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>

int main(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 1; i + 1 < argc; i += 2) args[std::string(argv[i]).substr(2)] = argv[i + 1];
  if (!args.count("corpus") || !args.count("reference")) {
    std::cerr << "usage: tokenizer_parity --corpus docs.jsonl --reference ref.jsonl [--node-timing FILE] "
                 "[--qwen3 F] [--llama3 F] [--llama3_bos F] [--gpt2 DIR]\n";
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
    struct Family {
      const char* name;
      bool add_special;
      const char* prefix;
      bool nfc;
    };
    const Family families[] = {{"qwen3", false, "", true},
                               {"llama3", false, "", false},
                               {"llama3_bos", true, "<|begin_of_text|>", false},
                               {"gpt2", false, "", false}};
    bool all_equal = true;
    std::printf("| family | documents | bytes | tokens | id mismatches | decode mismatches | round-trip failures | "
                "C++ encode MB/s | Node encode MB/s | C++ load s |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (const Family& f : families) {
      if (!args.count(f.name)) continue;
      const auto start = std::chrono::steady_clock::now();
      const auto tokenizer = dflash::text::Tokenizer::load(args[f.name]);
      const double load = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const auto r = dflash::test::compare_family(tokenizer, f.name, docs, reference, f.add_special, f.prefix, f.nfc);
      double node_mbs = 0;
      if (node_timing.contains(f.name))
        node_mbs = node_timing[f.name]["bytes"].get<double>() / 1e6 / node_timing[f.name]["seconds"].get<double>();
      std::printf("| %s | %lld | %lld | %lld | %lld | %lld | %lld | %.2f | %.2f | %.2f |\n", f.name,
                  static_cast<long long>(r.documents), static_cast<long long>(r.bytes), static_cast<long long>(r.tokens),
                  static_cast<long long>(r.id_mismatches), static_cast<long long>(r.decode_mismatches),
                  static_cast<long long>(r.round_trip_failures), double(r.bytes) / 1e6 / r.encode_seconds, node_mbs, load);
      for (const std::string& report : r.reports) std::fprintf(stderr, "%s\n", report.c_str());
      all_equal = all_equal && r.id_mismatches == 0 && r.decode_mismatches == 0 && r.round_trip_failures == 0;
    }
    return all_equal ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "tokenizer_parity: " << e.what() << "\n";
    return 2;
  }
}
