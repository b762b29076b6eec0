// The parts of a Hugging Face config.json that a Llama-family decoder needs
// (Llama, Qwen2, Qwen3, Mistral, and Qwen3 MoE: Qwen3 with experts in place
// of some or all MLPs), read with errors that name the file and key.
#pragma once

#include <moe.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace dflash::target {

struct RopeScaling {
  std::string type = "default";  // "default" or "llama3"
  double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct DecoderConfig {
  std::string model_type;
  int64_t hidden_size = 0, intermediate_size = 0, num_layers = 0;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0, vocab_size = 0;
  double rms_norm_eps = 1e-6, rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool qk_norm = false;  // Qwen3: RMSNorm over each head's q and k
  std::string torch_dtype = "float32";
  // Decoding: where generation stops, and how long a sequence may get
  // (0 = config.json does not say).
  std::vector<int64_t> eos_token_ids;
  int64_t bos_token_id = -1;
  int64_t max_position_embeddings = 0;
  // Qwen3 MoE: the experts (moe.experts == 0 for every other family), and
  // which layers route through them instead of the dense SwiGLU of
  // intermediate_size. read_decoder_config applies transformers' rule
  // (mlp_only_layers, decoder_sparse_step) once; everything else asks
  // is_sparse.
  hf::MoeSpec moe;
  std::vector<bool> sparse_layers;  // [num_layers]
  bool is_sparse(int64_t layer) const { return sparse_layers.at(static_cast<size_t>(layer)); }
  bool has_experts() const;  // any layer is sparse
};

// Throws std::runtime_error "<file>: <key>: <problem>" for anything missing,
// mistyped or unsupported.
DecoderConfig read_decoder_config(const std::filesystem::path& config_json);

}  // namespace dflash::target
