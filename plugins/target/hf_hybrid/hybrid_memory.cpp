#include "hybrid_memory.h"

#include <checkpoint.h>
#include <dflash/sdk/memory_plan.hpp>

#include <algorithm>
#include <cmath>

namespace dflash::target {
namespace fs = std::filesystem;

HybridMemory plan_hybrid_memory(const fs::path& dir, c10::ScalarType dtype, int64_t rows, int64_t row_length,
                                bool on_cuda) {
  HybridMemory m;
  m.config = read_hybrid_config(dir / "config.json");
  const HybridConfig& c = m.config;
  const hf::Checkpoint ckpt(dir);  // headers only
  const double e = static_cast<double>(c10::elementSize(dtype));
  const double h = static_cast<double>(c.hidden_size), vocab = static_cast<double>(c.vocab_size);
  const double hd = static_cast<double>(c.head_dim), heads = static_cast<double>(c.num_heads);
  const double kv = static_cast<double>(c.num_kv_heads), hv = static_cast<double>(c.linear_value_heads);
  const double conv_dim = static_cast<double>(c.conv_dim()), vd = static_cast<double>(c.value_dim());
  const double linear_layers = static_cast<double>(c.count(Mixer::kLinearAttention));
  const double full_layers = static_cast<double>(c.count(Mixer::kFullAttention));
  // Exactly what the constructor keeps (norms in fp32).
  double elements = vocab * h + (ckpt.has("lm_head.weight") ? vocab * h : 0.0);
  double fp32 = h + static_cast<double>(c.num_layers) * 2 * h + full_layers * 2 * hd;
  const double linear = (conv_dim + vd + 2 * hv) * h + conv_dim * static_cast<double>(c.conv_kernel) + 2 * hv +
                        static_cast<double>(c.linear_value_dim) + h * vd;
  const double full = (2 * heads * hd + 2 * kv * hd) * h + h * heads * hd;
  const double mlp = c.is_moe() ? hf::moe_weight_elements(c.moe, c.hidden_size)
                                : 3 * static_cast<double>(c.intermediate_size) * h;
  elements += linear_layers * linear + full_layers * full + static_cast<double>(c.num_layers) * mlp;
  m.weight_bytes = sdk::MemoryPlan::saturated_bytes(elements * e + fp32 * 4);
  // One forward: the residual stream (and its next value while a layer adds
  // to it), plus the largest of the three stages' working sets per token,
  // each counted from what the code keeps alive at its peak:
  const double tokens = static_cast<double>(rows) * static_cast<double>(row_length);
  const double dk = static_cast<double>(c.linear_key_dim), dv = static_cast<double>(c.linear_value_dim);
  const double chunk = 64;  // gdn::chunked_delta_rule's default
  // - a linear layer: its normed input, the four projections and the conv
  //   output, with the larger of two stages on top:
  //   the delta rule — in the ATen form, its fp32 tensors at the largest of
  //     its three stages (forming the UT inverse: q, k, β·k, v and three
  //     [Hv, 64] chunk matrices per token; applying it to β·v: q, k, β·k,
  //     β·v, the new values and two chunk matrices; applying it to the
  //     decayed β·k: q, k, β·k, the new values, its result and two chunk
  //     matrices — gated_deltanet.cpp releases the rest as it goes); in the
  //     CUDA kernels (16-bit on CUDA, head dims ≤ 128), their workspace (w,
  //     u, the decayed q and k and the 64 × 64 intra-chunk matrix, 16-bit,
  //     head dims padded to 16; a chunk's last decay in fp32), g and β in
  //     fp32 and the output;
  //   the gated RMSNorm after it — the rule's output and the result; in
  //     ATen also its fp32 copy and square, the normalised product, SiLU(z)
  //     in fp32 and their product.
  // (16-bit on CUDA runs the norms and SwiGLU in CUDA kernels too: no fp32
  // temporaries.)
  const bool kernels = on_cuda && e == 2;
  const double projected = conv_dim + vd + 2 * hv;
  const auto pad16 = [](double d) { return std::ceil(d / 16) * 16; };
  const bool rule_kernels = kernels && dk <= 128 && dv <= 128;
  const double rule =
      rule_kernels ? 2 * hv * (3 * pad16(dk) + pad16(dv) + chunk) + 4 * hv / chunk + 8 * hv + e * vd
                   : 4 * hv * std::max({3 * dk + dv + 3 * chunk, 3 * dk + 2 * dv + 2 * chunk, 4 * dk + dv + 2 * chunk});
  const double gated_norm = kernels ? 2 * e * vd : e * vd + 4 * 2 * vd + e * vd + 4 * 2 * vd + e * vd;
  const double linear_work = e * (h + projected + conv_dim) + std::max(rule, gated_norm);
  // - a full-attention layer: its normed input, the q/gate/k/v projection,
  //   q and k after norm and rotary, K/V repeated to every query head for
  //   SDPA, the attention output and its gated copy, an fp32 norm temporary,
  //   and a packed row's additive document mask ([S] per token);
  const double full_work = e * (h + (2 * heads + 2 * kv) * hd + 5 * heads * hd + static_cast<double>(row_length)) +
                           4 * heads * hd;
  // - the MLP: its normed input and, dense, gate_up, SiLU(gate) and the
  //   product (4 I; 3 I with the SwiGLU kernel); MoE, each token's k routed copies and their expert
  //   outputs (2 k H), the busiest expert's gate_up and product (at most
  //   3 k I), and the shared expert (3 S).
  const double k = static_cast<double>(c.moe.top_k);
  const double mlp_work =
      c.is_moe() ? e * (h + 2 * k * h + 3 * k * static_cast<double>(c.moe.intermediate) +
                        3 * static_cast<double>(c.moe.shared_intermediate))
                 : e * (h + (kernels ? 3 : 4) * static_cast<double>(c.intermediate_size));
  m.forward_bytes = sdk::MemoryPlan::saturated_bytes(
      tokens * (2 * e * h + std::max({linear_layers > 0 ? linear_work : 0.0, full_layers > 0 ? full_work : 0.0, mlp_work})));
  // Two of each a session (linear_state_pool.h): the current one and the one
  // before the last step, which truncate goes back to.
  m.state_bytes_per_session = sdk::MemoryPlan::saturated_bytes(
      2 * linear_layers * (4.0 * hv * dk * dv + e * static_cast<double>(c.conv_kernel - 1) * conv_dim));
  m.kv_bytes_per_token = sdk::MemoryPlan::saturated_bytes(full_layers * 2 * kv * hd * e);
  return m;
}

}  // namespace dflash::target
