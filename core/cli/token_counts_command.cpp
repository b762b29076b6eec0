// `dflash-host token-counts`: how often each target token is supervised in
// one epoch of the config's data, as the data source feeds training. A
// drafter with a draft vocabulary (EAGLE-3's most frequent tokens) is built
// from these counts; the host reads them from the data plugin's batches, so
// they hold for any data source and any drafter.
#include "checkpoint/checkpoint.h"
#include "cli/commands.h"
#include "eval/prompts.h"
#include "plugin/host_api.h"

#include <ATen/ATen.h>

#include <chrono>
#include <iostream>
#include <stdexcept>

namespace dflash::cli {
namespace {

// The target's vocabulary, from what its plugin says before loading anything.
int64_t target_vocabulary(const CliOptions& options, const host::PluginRegistry& registry) {
  const nlohmann::json facts = target_facts(options, registry);
  if (!facts.contains("vocab_size") || !facts["vocab_size"].is_number_integer() || facts["vocab_size"].get<int64_t>() < 1)
    throw std::invalid_argument("token-counts needs the target's vocabulary size, and the config's target plugin states "
                                "none before loading (its plan_memory facts have no vocab_size)");
  return facts["vocab_size"].get<int64_t>();
}

// Adds the supervised tokens of one batch; refuses an id outside the vocabulary.
int64_t count_batch(const host::NamedTensors& batch, at::Tensor& counts, int64_t batch_index) {
  const at::Tensor ids = host::require_tensor(batch, "input_ids", "the data source").to(at::kCPU, at::kLong).flatten();
  const at::Tensor mask = host::require_tensor(batch, "loss_mask", "the data source").to(at::kCPU).flatten().ne(0);
  const at::Tensor supervised = ids.masked_select(mask);
  const int64_t vocab = counts.size(0);
  if (supervised.numel() > 0 && (supervised.min().item<int64_t>() < 0 || supervised.max().item<int64_t>() >= vocab))
    throw std::runtime_error("batch " + std::to_string(batch_index) + " of the data holds a supervised token id outside the "
                             "target's vocabulary [0, " + std::to_string(vocab) + "): the data was made for another tokenizer");
  counts.index_add_(0, supervised, at::ones_like(supervised));
  return supervised.numel();
}

}  // namespace

int run_token_counts(const CliOptions& options) {
  if (!options.config_file) throw std::invalid_argument("token-counts needs a config: --config FILE.json (its data and target)");
  if (!options.out_dir) throw std::invalid_argument("token-counts needs an output file: --out FILE.json (the counts it writes)");
  eval::check_output_file(*options.out_dir, "--out");
  const host::PluginRegistry registry = find_plugins(options);
  const int64_t vocab = target_vocabulary(options, registry);
  const auto data = make_data_source(options, registry, vocab, /*epochs=*/1);
  const auto start = std::chrono::steady_clock::now();
  at::Tensor counts = at::zeros({vocab}, at::kLong);
  int64_t batches = 0, supervised = 0;
  while (const std::optional<host::NamedTensors> batch = data->next_batch()) supervised += count_batch(*batch, counts, batches++);
  if (supervised == 0)
    throw std::runtime_error("one epoch of the data holds no supervised token (" + std::to_string(batches) +
                             " batches): nothing to count");
  const nlohmann::json out = {{"vocab_size", vocab},
                              {"supervised_tokens", supervised},
                              {"batches", batches},
                              {"distinct_tokens", counts.gt(0).sum().item<int64_t>()},
                              {"counts", std::vector<int64_t>(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + vocab)}};
  checkpoint::write_file_whole(*options.out_dir, out.dump() + "\n");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cerr << "token-counts: " << supervised << " supervised tokens (" << out["distinct_tokens"].get<int64_t>()
            << " distinct of " << vocab << ") in " << batches << " batches, " << seconds << " s\n  counts: " << *options.out_dir
            << "\n";
  return kExitOk;
}

}  // namespace dflash::cli
