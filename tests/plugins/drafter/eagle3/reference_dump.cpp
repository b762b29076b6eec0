// eagle3_reference_dump: our side of the check against SpecForge's reference
// LlamaForCausalLMEagle3 (scripts/check_reference_eagle3.py, docs/eagle3.md,
// "Serving").
//
// It rebuilds an exported EAGLE-3 drafter from its config.json and
// model.safetensors alone — strictly: a tensor the model has no place for, or
// one it lacks, is an error — and runs the first drafting step (the
// training-time test's step 0, what a serving framework computes for the first
// draft token) on seeded random inputs:
//   features [B, S, 3·H_t]   the target's hidden states, concatenated (random)
//   embeddings [B, S, H]     the input tokens' embeddings (random: the
//                            reference takes inputs_embeds, so no target)
//   hidden [B, S, H]         our output after the final norm
//   logits [B, S, V_d]       float32: hidden through the draft head
//   d2t [V_d], t2d [V]       the checkpoint's maps, as loaded
// Each row is one document at positions 0 … S − 1, as the reference's own
// forward lays it out.
//
//   eagle3_reference_dump --checkpoint DIR --out FILE.safetensors [--rows 2] [--length 37]
//                         [--dtype float32|bfloat16] [--device cpu|cuda] [--seed 1]
#include "eagle3_model.h"
#include "ttt_layout.h"

#include <dflash/sdk/safetensors_torch.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <stdexcept>
#include <string>

namespace {
using namespace dflash;

struct Args {
  std::string checkpoint, out, dtype = "float32", device = "cpu";
  int64_t rows = 2, length = 37;
  uint64_t seed = 1;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--checkpoint") a.checkpoint = value;
    else if (flag == "--out") a.out = value;
    else if (flag == "--dtype") a.dtype = value;
    else if (flag == "--device") a.device = value;
    else if (flag == "--rows") a.rows = std::stoll(value);
    else if (flag == "--length") a.length = std::stoll(value);
    else if (flag == "--seed") a.seed = std::stoull(value);
    else throw std::invalid_argument("unknown flag " + flag);
  }
  if (a.checkpoint.empty() || a.out.empty()) throw std::invalid_argument("--checkpoint DIR and --out FILE are required");
  return a;
}

eagle3::Eagle3Shape shape_of(const nlohmann::json& c) {
  eagle3::Eagle3Shape s;
  s.hidden = c.at("hidden_size").get<int64_t>();
  s.target_hidden = c.value("target_hidden_size", s.hidden);
  s.heads = c.at("num_attention_heads").get<int64_t>();
  s.kv_heads = c.at("num_key_value_heads").get<int64_t>();
  s.head_dim = c.value("head_dim", s.hidden / s.heads);
  s.intermediate = c.at("intermediate_size").get<int64_t>();
  s.draft_vocab = c.at("draft_vocab_size").get<int64_t>();
  s.rms_norm_eps = c.at("rms_norm_eps").get<double>();
  s.rope_theta = c.at("rope_theta").get<double>();
  return s;
}

}  // namespace

int main(int argc, char** argv) try {
  const Args a = parse(argc, argv);
  const c10::NoGradGuard no_grad;
  std::ifstream config_file(a.checkpoint + "/config.json");
  if (!config_file) throw std::runtime_error(a.checkpoint + "/config.json: cannot read");
  const nlohmann::json config = nlohmann::json::parse(config_file);
  const eagle3::Eagle3Shape shape = shape_of(config);
  const auto dtype = a.dtype == "bfloat16" ? at::kBFloat16 : at::kFloat;
  const auto options = at::TensorOptions().dtype(dtype).device(a.device);
  eagle3::Eagle3Model model(shape, options, 0);

  // The weights, strictly: every parameter from the file, every tensor of the
  // file a parameter or one of the two maps.
  const auto file = sdk::safetensors::File::open(a.checkpoint + "/model.safetensors");
  std::map<std::string, at::Tensor> saved;
  for (const auto& info : file->tensors()) saved[info.name] = sdk::safetensors::load_tensor(file, info);
  std::set<std::string> used{"d2t", "t2d"};
  for (const auto& [name, parameter] : model.parameters()) {
    const auto found = saved.find(name);
    if (found == saved.end()) throw std::runtime_error("model.safetensors has no '" + name + "'");
    if (found->second.sizes() != parameter.sizes())
      throw std::runtime_error("'" + name + "' is " + c10::str(found->second.sizes()) + ", the model's " +
                               c10::str(parameter.sizes()));
    parameter.copy_(found->second);
    used.insert(name);
  }
  for (const auto& [name, tensor] : saved)
    if (!used.count(name)) throw std::runtime_error("model.safetensors holds '" + name + "', which the model does not read");
  for (const char* map : {"d2t", "t2d"})
    if (!saved.count(map)) throw std::runtime_error(std::string("model.safetensors has no '") + map + "'");

  at::manual_seed(static_cast<int64_t>(a.seed));
  const int64_t b = a.rows, s = a.length;
  const at::Tensor features = at::randn({b, s, 3 * shape.target_hidden}, at::kFloat).to(options);
  const at::Tensor embeddings = (at::randn({b, s, shape.hidden}, at::kFloat) * 0.02).to(options);
  const at::Tensor positions = at::arange(s, at::kLong).expand({b, s}).contiguous();
  const at::Tensor documents = at::zeros({b, s}, at::kLong);
  const at::Tensor ids = at::zeros({b, s}, at::kLong), loss_mask = at::ones({b, s}, at::kLong);
  const eagle3::TttLayout layout = eagle3::layout_ttt(ids, positions, documents, loss_mask, 1);
  const at::Tensor out = model.forward_ttt(features, embeddings.unsqueeze(0), layout, documents)[0];
  const at::Tensor hidden = model.final_norm(out);
  const at::Tensor logits = model.draft_logits(out).to(at::kFloat);
  const nlohmann::json meta = {{"checkpoint", a.checkpoint}, {"dtype", a.dtype}, {"device", a.device},
                               {"rows", b}, {"length", s}, {"seed", a.seed}};
  sdk::safetensors::save_tensors(a.out,
                                 {{"features", features}, {"embeddings", embeddings}, {"hidden", hidden},
                                  {"logits", logits}, {"d2t", saved.at("d2t")}, {"t2d", saved.at("t2d")}},
                                 {{"eagle3_reference_dump", meta.dump()}});
  std::cout << "wrote " << a.out << ": step 0 of " << b << " rows of " << s << " tokens, " << a.dtype << " on "
            << a.device << "\n";
  return 0;
} catch (const std::exception& e) {
  std::cerr << "eagle3_reference_dump: " << e.what() << "\n";
  return 2;
}
