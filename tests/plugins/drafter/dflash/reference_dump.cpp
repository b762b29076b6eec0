// drafter_reference_dump: our side of the check against z-lab's reference
// DFlashDraftModel (scripts/check_reference_drafter.py, docs/drafter.md,
// "Serving: the reference DFlashDraftModel").
//
// It loads the target through the host (the hf_decoder plugin, as train and
// eval do) and an exported drafter directory — rebuilt from its config.json
// and model.safetensors alone, strictly: a missing or unexpected tensor is an
// error — runs the target over a prompt, and for each context length S writes
// one block (the token at S, then mask tokens) with our drafter's output from
// both of its code paths:
//   draft.*  the cached drafting path eval uses (extend_context + draft), the
//            context added block after block as speculative decoding does;
//   train.*  the training forward, every block in one batch as an anchor at S,
//            under the training attention mask (grouped, as configured by
//            default).
//
// The file (safetensors; metadata "dflash_reference_dump" holds a JSON object
// with drafter_dir, target_layer_ids, block_size, mask_token_id, dtype,
// device, context_lengths):
//   input_ids [L] int64            the prompt
//   context_features [L, F·H]      the target's hidden states of target_layer_ids, concatenated
//   block_ids [K, Bs] int64        block j: input_ids[S_j], then mask_token_id
//   draft.hidden, train.hidden     [K, Bs, H]: the drafter's output after its final norm
//   draft.logits, train.logits     [K, Bs, V] float32: those through the target's lm_head
#include "checkpoint/checkpoint.h"
#include "config/config_schema.h"
#include "dflash_model.h"
#include "eval/prompts.h"
#include "export_format.h"
#include "plugin/instances.h"
#include "plugin/registry.h"

#include <dflash/sdk/safetensors_torch.hpp>
#include <dflash/sdk/torch.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <climits>
#include <cstdlib>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {
using namespace dflash;

const char* const kUsage =
    "usage: drafter_reference_dump --plugin-dir DIR --target DIR --drafter PATH --out FILE.safetensors\n"
    "                              [--device cpu|cuda] [--dtype auto|float32|bfloat16|float16]\n"
    "                              [--prompts FILE.jsonl [--prompt-index N]] [--contexts S1,S2,...] [--seed N]\n"
    "  --drafter   an exported drafter directory (config.json + model.safetensors), a checkpoint root\n"
    "              holding `latest`, or a run's output_dir\n"
    "  --dtype     auto (default) = the dtype of the drafter's weights; the target runs in it too, as in training\n"
    "  --prompts   JSON lines as eval reads them (the whole of input_ids is used); default: random token ids\n"
    "  --contexts  ascending context lengths, one block after each (default 8,37,90)\n";

struct Options {
  std::string plugin_dir, target, drafter, out, device = "cpu", dtype = "auto", prompts;
  int64_t prompt_index = 0;
  uint64_t seed = 0;
  std::vector<int64_t> contexts = {8, 37, 90};
};

std::vector<int64_t> parse_list(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoll(item));
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--plugin-dir") o.plugin_dir = v;
    else if (a == "--target") o.target = v;
    else if (a == "--drafter") o.drafter = v;
    else if (a == "--out") o.out = v;
    else if (a == "--device") o.device = v;
    else if (a == "--dtype") o.dtype = v;
    else if (a == "--prompts") o.prompts = v;
    else if (a == "--prompt-index") o.prompt_index = std::stoll(v);
    else if (a == "--contexts") o.contexts = parse_list(v);
    else if (a == "--seed") o.seed = std::stoull(v);
    else throw std::invalid_argument("unknown option " + a);
  }
  if (o.plugin_dir.empty() || o.target.empty() || o.drafter.empty() || o.out.empty())
    throw std::invalid_argument("--plugin-dir, --target, --drafter and --out are required");
  if (o.contexts.empty() || o.contexts.front() < 1)
    throw std::invalid_argument("--contexts: give context lengths of at least 1");
  for (size_t i = 1; i < o.contexts.size(); ++i)
    if (o.contexts[i] <= o.contexts[i - 1]) throw std::invalid_argument("--contexts must be strictly ascending");
  return o;
}

std::string dtype_name(c10::ScalarType t) {
  if (t == at::kBFloat16) return "bfloat16";
  if (t == at::kHalf) return "float16";
  if (t == at::kFloat) return "float32";
  throw std::invalid_argument("unsupported dtype " + std::string(c10::toString(t)));
}

std::string absolute(const std::string& path) {
  // realpath, not std::filesystem: see tests/support/temp_dir.h for why the
  // GPU build stays off std::filesystem.
  char buffer[PATH_MAX];
  return ::realpath(path.c_str(), buffer) != nullptr ? std::string(buffer) : path;
}

const at::Tensor& find(const host::NamedTensors& tensors, const std::string& name, const std::string& whose) {
  for (const auto& [key, t] : tensors)
    if (key == name) return t;
  throw std::runtime_error(whose + " gave no '" + name + "'");
}

int run(const Options& o) {
  const c10::NoGradGuard no_grad;
  const c10::Device device(o.device);

  // The drafter, rebuilt from its directory alone.
  const checkpoint::DrafterDirectory saved = checkpoint::load_drafter(o.drafter);
  const drafter::ExportedDrafter exported = drafter::read_export_config(saved.config);
  if (saved.weights.empty()) throw std::runtime_error(saved.dir + "/model.safetensors holds no tensors");
  const c10::ScalarType dtype =
      o.dtype == "auto" ? saved.weights.front().second.scalar_type() : sdk::parse_dtype(o.dtype);
  drafter::DFlashModel model(exported.shape, 0, 0.02, dtype, device);
  std::map<std::string, at::Tensor> file(saved.weights.begin(), saved.weights.end());
  std::set<std::string> used;
  for (const auto& [name, parameter] : model.parameters()) {
    auto it = file.find(name);
    if (it == file.end()) throw std::runtime_error(saved.dir + "/model.safetensors: no tensor '" + name + "'");
    if (it->second.sizes() != parameter.sizes())
      throw std::runtime_error(saved.dir + "/model.safetensors: '" + name + "' has shape " + c10::str(it->second.sizes()) +
                               ", config.json implies " + c10::str(parameter.sizes()));
    parameter.detach().copy_(it->second);
    used.insert(name);
  }
  for (const auto& [name, tensor] : file)
    if (!used.count(name)) throw std::runtime_error(saved.dir + "/model.safetensors: unexpected tensor '" + name + "'");

  // The target, as train and eval create it: hf_decoder's defaults, the host's dtype.
  host::PluginRegistry registry;
  registry.add_directory(o.plugin_dir);
  const host::PluginRecord& record = registry.find(DFLASH_KIND_TARGET_MODEL, "hf_decoder");
  nlohmann::json target_config = config::defaults_of(record.schema);
  target_config["path"] = o.target;
  host::TargetModelInstance target(record, target_config, {o.device, dtype_name(dtype), 0});
  const nlohmann::json info = target.describe();
  const host::NamedTensors frozen = target.frozen_weights();
  const at::Tensor embed = find(frozen, "embed_tokens", "the target").to(device, dtype);
  const at::Tensor lm_head = find(frozen, "lm_head", "the target").to(device, dtype);
  const int64_t vocab = info.at("vocab_size").get<int64_t>();
  if (exported.shape.hidden != info.at("hidden_size").get<int64_t>())
    throw std::runtime_error("the drafter's hidden_size " + std::to_string(exported.shape.hidden) + " is not the target's " +
                             info.at("hidden_size").dump());

  // The prompt: long enough for the last block's first token.
  const int64_t bs = exported.block_size, length = o.contexts.back() + 1;
  std::vector<int64_t> ids;
  if (!o.prompts.empty()) {
    // The whole of each line's input_ids (eval would take only its first 64).
    const auto prompts = eval::read_prompts(eval::PromptSettings{o.prompts, 1 << 20, o.prompt_index + 1, false}, info);
    if (static_cast<int64_t>(prompts.size()) <= o.prompt_index)
      throw std::invalid_argument(o.prompts + ": has no prompt " + std::to_string(o.prompt_index));
    ids = prompts.at(static_cast<size_t>(o.prompt_index)).ids;
    if (static_cast<int64_t>(ids.size()) < length)
      throw std::invalid_argument(o.prompts + ": prompt " + std::to_string(o.prompt_index) + " has " +
                                  std::to_string(ids.size()) + " tokens; --contexts needs " + std::to_string(length));
    ids.resize(static_cast<size_t>(length));
  } else {
    at::Generator generator = at::detail::createCPUGenerator(o.seed);
    const at::Tensor random = at::randint(0, vocab, {length}, generator, at::kLong);
    ids.assign(random.data_ptr<int64_t>(), random.data_ptr<int64_t>() + length);
  }
  const at::Tensor input_ids = at::tensor(ids, at::kLong);

  std::vector<at::Tensor> layers;
  const host::NamedTensors hidden =
      target.forward({{"input_ids", input_ids.view({1, length}).to(device)}}, exported.layer_ids, false, false);
  for (int64_t id : exported.layer_ids) layers.push_back(find(hidden, "hidden." + std::to_string(id), "the target"));
  const at::Tensor features = at::cat(layers, -1);  // [1, L, F·H]

  // One block per context length: the token at S, then the mask token.
  const auto k = static_cast<int64_t>(o.contexts.size());
  at::Tensor block_ids = at::full({k, bs}, exported.mask_token, at::kLong);
  for (int64_t j = 0; j < k; ++j) block_ids[j][0] = ids[static_cast<size_t>(o.contexts[static_cast<size_t>(j)])];
  const at::Tensor slot_embeddings = embed.index_select(0, block_ids.flatten().to(device)).view({k, bs, -1});

  // Drafting path: the context grows block after block, as in speculative decoding.
  drafter::DraftContext context;
  std::vector<at::Tensor> draft_hidden;
  int64_t done = 0;
  for (int64_t j = 0; j < k; ++j) {
    const int64_t s = o.contexts[static_cast<size_t>(j)];
    model.extend_context(context, features[0].narrow(0, done, s - done));
    done = s;
    draft_hidden.push_back(model.draft(context, slot_embeddings[j]));
  }
  const at::Tensor draft = at::stack(draft_hidden);  // [K, Bs, H]

  // Training path: the blocks as anchors of one batch row, one document.
  const at::Tensor anchors = at::tensor(o.contexts, at::kLong).view({1, k});
  const at::Tensor slot_positions = (anchors.view({k, 1}) + at::arange(bs, at::kLong)).view({1, k * bs});
  const drafter::BlockMasks masks{anchors, at::zeros({1, length}, at::kLong), bs, /*group_blocks=*/64};
  const at::Tensor train = model.forward(features, at::arange(length, at::kLong).view({1, length}).to(device),
                                         slot_embeddings.reshape({1, k * bs, -1}), slot_positions.to(device), masks)
                               .view({k, bs, -1});

  auto logits = [&](const at::Tensor& h) { return at::linear(h, lm_head).to(at::kFloat); };  // as draft_propose
  const nlohmann::json meta = {{"drafter_dir", absolute(saved.dir)},
                               {"target_dir", absolute(o.target)},
                               {"target_layer_ids", exported.layer_ids},
                               {"block_size", bs},
                               {"mask_token_id", exported.mask_token},
                               {"dtype", dtype_name(dtype)},
                               {"target_dtype", dtype_name(features.scalar_type())},
                               {"device", o.device},
                               {"context_lengths", o.contexts},
                               {"prompt", o.prompts.empty() ? "random ids, seed " + std::to_string(o.seed)
                                                            : o.prompts + " #" + std::to_string(o.prompt_index)}};
  sdk::safetensors::save_tensors(o.out,
                                 {{"input_ids", input_ids},
                                  {"context_features", features[0]},
                                  {"block_ids", block_ids},
                                  {"draft.hidden", draft},
                                  {"train.hidden", train},
                                  {"draft.logits", logits(draft)},
                                  {"train.logits", logits(train)}},
                                 {{"format", "pt"}, {"dflash_reference_dump", meta.dump()}});
  const double gap = (logits(draft) - logits(train)).abs().max().item<double>();
  std::cout << "drafter " << meta["drafter_dir"].get<std::string>() << ": " << exported.shape.layers << " layers, target layers "
            << meta["target_layer_ids"].dump() << ", block " << bs << ", mask " << exported.mask_token << ", "
            << meta["dtype"].get<std::string>() << " on " << o.device << "\n"
            << "prompt: " << meta["prompt"].get<std::string>() << ", " << length << " tokens; blocks after contexts "
            << meta["context_lengths"].dump() << "\n"
            << "our two paths (drafting, training forward) differ by max |Δ logit| " << gap << "\n"
            << "wrote " << o.out << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::invalid_argument& e) {
    std::cerr << "drafter_reference_dump: " << e.what() << "\n" << kUsage;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "drafter_reference_dump: " << e.what() << "\n";
    return 1;
  }
}
