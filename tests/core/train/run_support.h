// Running the real dflash-host binary on a small configuration: the
// helpers the end-to-end training tests share.
#pragma once

#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace dflash::test {

struct Result {
  int status;
  std::string err;
};

inline Result host(const std::string& args, const std::string& scratch) {
  const std::string err_file = scratch + "/stderr.txt";
  const std::string command = std::string(DFLASH_HOST_EXE) + " --no-default-plugin-dirs --plugin-dir " +
                              DFLASH_INTREE_PLUGIN_DIR + " --plugin-dir " + DFLASH_GOOD_PLUGIN_DIR + " " + args +
                              " > /dev/null 2>" + err_file;
  const int status = std::system(command.c_str());
  std::ifstream in(err_file);
  std::stringstream text;
  text << in.rdbuf();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, text.str()};
}

inline std::vector<nlohmann::json> metrics_of(const std::string& dir) {
  std::vector<nlohmann::json> out;
  std::ifstream in(dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

// A small run: the committed tiny Qwen3 target, Markov synthetic data, a
// one-layer drafter, the fused loss with a KL term.
inline std::string small_config(const std::string& dir, const std::string& output, int steps,
                         const nlohmann::json& loss = {{"plugin", "fused_ckpt_kl"}, {"kl_weight", 0.5}}) {
  const nlohmann::json config = {
      {"train", {{"seed", 3}, {"steps", steps}, {"lr", 3e-3}, {"output_dir", output}, {"progress", "lines"},
                 {"grad_accumulation", 2}, {"checkpoint_every", 0}}},
      {"data", {{"plugin", "synthetic"}, {"sequences", 64}, {"min_length", 24}, {"max_length", 64}, {"row_length", 64},
                {"tokens_per_batch", 128}, {"branching", 2}}},
      {"target", {{"plugin", "hf_decoder"}, {"path", std::string(DFLASH_HF_FIXTURES) + "/qwen3"}}},
      {"drafter", {{"plugin", "dflash"}, {"num_layers", 1}, {"block_size", 4}, {"max_anchors", 8}}},
      {"loss", loss},
      {"scheduler", {{"plugin", "warmup_cosine"}, {"warmup_steps", 2}}}};
  const std::string path = dir + "/config.json";
  std::ofstream(path) << config.dump(2);
  return path;
}

inline std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace dflash::test
