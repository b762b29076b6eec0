// How long Tokenizer::load takes on real tokenizer files (issue 44: Qwen3's
// 11 MB tokenizer.json at most 0.3 s), beside the floor of the same run:
// reading the file and scanning its JSON once with nlohmann's SAX parser and
// a handler that keeps nothing, which any JSON-reading loader pays. A
// program, not a test (docs/tokenizer.md, "Loading time").
//
//   tokenizer_load_bench [--repeats 7] [--json FILE] --tokenizer NAME=PATH ...
//
// PATH is a tokenizer.json or a model folder; each is loaded `repeats` times
// (the first also warms the page cache) and the median and fastest are shown.
#include "bench_args.h"
#include "text/tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

using nlohmann::json;

// A SAX handler that keeps nothing: what scanning the text costs.
struct Discard : json::json_sax_t {
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct Times {
  double median = 0, fastest = 0;
};

template <class F>
Times time_of(int64_t repeats, F&& run) {
  std::vector<double> t;
  for (int64_t i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    t.push_back(seconds_since(start));
  }
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t.front()};
}

}  // namespace

int main(int argc, char** argv) try {
  int64_t repeats = 7;
  std::string json_out;
  std::vector<std::pair<std::string, std::filesystem::path>> files;
  dflash::bench::FlagReader r(argc, argv);
  while (r.next()) {
    if (r.is("--repeats")) repeats = r.integer();
    else if (r.is("--json")) json_out = r.text();
    else if (r.is("--tokenizer")) {
      const std::string pair = r.text();
      const std::size_t eq = pair.find('=');
      if (eq == std::string::npos || eq == 0) throw std::invalid_argument("--tokenizer takes NAME=PATH, not '" + pair + "'");
      files.emplace_back(pair.substr(0, eq), pair.substr(eq + 1));
    } else {
      r.unknown();
    }
  }
  if (repeats < 1 || files.empty())
    throw std::invalid_argument("usage: tokenizer_load_bench [--repeats N] [--json FILE] --tokenizer NAME=PATH ...");
  std::ofstream records;
  if (!json_out.empty()) records.open(json_out, std::ios::app);
  std::printf("| tokenizer | file MB | vocab | load s (median) | load s (fastest) | read + scan s | load / scan |\n"
              "|---|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& [name, path] : files) {
    // The JSON the load reads: the file, a folder's tokenizer.json, or GPT-2's encoder.json.
    std::filesystem::path file = path;
    if (std::filesystem::is_directory(path))
      file = std::filesystem::exists(path / "tokenizer.json") ? path / "tokenizer.json" : path / "encoder.json";
    int64_t vocab = 0;
    const Times load = time_of(repeats, [&] { vocab = dflash::text::Tokenizer::load(path).vocab_size(); });
    const Times scan = time_of(repeats, [&] {
      std::ifstream in(file, std::ios::binary);
      std::stringstream text;
      text << in.rdbuf();
      Discard discard;
      if (!json::sax_parse(text.str(), &discard)) throw std::runtime_error(file.string() + " is not JSON");
    });
    const double mb = static_cast<double>(std::filesystem::file_size(file)) / 1e6;
    std::printf("| %s | %.1f | %lld | %.3f | %.3f | %.3f | %.2f |\n", name.c_str(), mb, static_cast<long long>(vocab),
                load.median, load.fastest, scan.median, load.median / scan.median);
    if (records)
      records << json{{"tokenizer", name}, {"file_mb", mb}, {"vocab", vocab}, {"repeats", repeats},
                      {"load_median_s", load.median}, {"load_fastest_s", load.fastest}, {"scan_median_s", scan.median}}
                     .dump()
              << "\n";
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "tokenizer_load_bench: " << e.what() << "\n";
  return 2;
}
