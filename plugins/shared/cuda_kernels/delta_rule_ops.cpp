#include "delta_rule_ops.h"

#include <ATen/ATen.h>
#include <host_upload.h>

#include <stdexcept>
#include <string>

#if DFLASH_CUDA_KERNELS
#include "gated_delta_rule.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace dflash::kernel_ops {

DeltaChunkPlan plan_delta_chunks(const at::Tensor& resets_in, int64_t rows, int64_t seq_len,
                                 const c10::optional<c10::Device>& device) {
  if (resets_in.defined() && (resets_in.dim() != 2 || resets_in.size(0) != rows || resets_in.size(1) != seq_len))
    throw std::invalid_argument("plan_delta_chunks: resets " + c10::str(resets_in.sizes()) + " is not [" +
                                std::to_string(rows) + ", " + std::to_string(seq_len) + "]");
  DeltaChunkPlan plan;
  plan.rows = rows;
  plan.seq_len = seq_len;
  const at::Tensor resets = resets_in.defined() ? resets_in.to(at::kCPU, at::kBool).contiguous() : at::Tensor();
  const bool* reset = resets.defined() ? resets.data_ptr<bool>() : nullptr;
  constexpr int32_t kFromInitial = 1, kWritesFinal = 2;  // gated_delta_rule.h's flags
  for (int64_t r = 0; r < rows; ++r) {
    int64_t start = 0;
    while (start < seq_len) {
      int64_t end = start + 1;
      while (end < seq_len && !(reset != nullptr && reset[r * seq_len + end])) ++end;
      const bool continues = start == 0 && !(reset != nullptr && reset[r * seq_len]);
      const int64_t first = plan.chunk_count(), count = (end - start + kDeltaRuleChunk - 1) / kDeltaRuleChunk;
      for (int64_t c = start; c < end; c += kDeltaRuleChunk)
        plan.chunks.insert(plan.chunks.end(), {static_cast<int32_t>(r), static_cast<int32_t>(c),
                                               static_cast<int32_t>(std::min(kDeltaRuleChunk, end - c)), 0});
      plan.sequences.insert(plan.sequences.end(),
                            {static_cast<int32_t>(r), static_cast<int32_t>(first), static_cast<int32_t>(count),
                             (continues ? kFromInitial : 0) | (end == seq_len ? kWritesFinal : 0)});
      start = end;
    }
  }
  if (device.has_value()) {
    // Without waiting for the stream's earlier work (host_upload.h).
    const auto upload = [&](const std::vector<int32_t>& table) {
      return decode_support::on_device(at::tensor(table, at::TensorOptions().dtype(at::kInt)).view({-1, 4}), *device);
    };
    plan.device_chunks = upload(plan.chunks);
    plan.device_sequences = upload(plan.sequences);
  }
  return plan;
}

#if DFLASH_CUDA_KERNELS

static_assert(kDeltaRuleChunk == cuda_kernels::kDeltaChunk && kDeltaRuleMaxHeadDim == cuda_kernels::kDeltaMaxHeadDim,
              "one chunk and one head-dim bound, stated in both headers");
static_assert(sizeof(cuda_kernels::DeltaChunk) == 16 && sizeof(cuda_kernels::DeltaSequence) == 16,
              "the plan's int32 [n, 4] rows are these structs");

bool delta_rule_fits(const at::Tensor& like, int64_t key_heads, int64_t value_heads, int64_t dk, int64_t dv) {
  return like.is_cuda() && (like.scalar_type() == at::kBFloat16 || like.scalar_type() == at::kHalf) && dk >= 1 &&
         dk <= kDeltaRuleMaxHeadDim && dv >= 1 && dv <= kDeltaRuleMaxHeadDim && key_heads >= 1 &&
         value_heads % key_heads == 0;
}

namespace {

// The tensors both forms read, checked and laid out as the kernels take them.
struct RuleTensors {
  at::Tensor q, k, v, g, beta, initial;
};
RuleTensors rule_tensors(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in, const at::Tensor& g_in,
                         const at::Tensor& beta_in, const at::Tensor& initial_in, const char* who) {
  const int64_t hv = v_in.size(2), dv = v_in.size(3), hk = k_in.size(2), dk = k_in.size(3);
  if (!delta_rule_fits(v_in, hk, hv, dk, dv))
    throw std::invalid_argument(std::string(who) + ": the kernels do not take v " + c10::str(v_in.sizes()) + " " +
                                c10::toString(v_in.scalar_type()) + " with " + std::to_string(hk) + " key heads of " +
                                std::to_string(dk));
  const auto dense_last = [](const at::Tensor& t) { return t.stride(-1) == 1 ? t : t.contiguous(); };
  RuleTensors r;
  r.q = dense_last(q_in.to(v_in.scalar_type()));
  r.k = dense_last(k_in.to(v_in.scalar_type()));
  r.v = dense_last(v_in);
  r.g = g_in.to(at::kFloat).contiguous();
  r.beta = beta_in.to(at::kFloat).contiguous();
  r.initial = initial_in.defined() ? initial_in.to(at::kFloat).contiguous() : at::Tensor();
  return r;
}

cuda_kernels::DeltaRuleArgs rule_args(const RuleTensors& t, DeltaRuleResult& result) {
  cuda_kernels::DeltaRuleArgs a;
  a.q = t.q.data_ptr();
  a.k = t.k.data_ptr();
  a.v = t.v.data_ptr();
  for (int d = 0; d < 3; ++d) {
    a.q_stride[d] = t.q.stride(d);
    a.k_stride[d] = t.k.stride(d);
    a.v_stride[d] = t.v.stride(d);
  }
  a.g = t.g.data_ptr<float>();
  a.beta = t.beta.data_ptr<float>();
  a.initial = t.initial.defined() ? t.initial.data_ptr<float>() : nullptr;
  const int64_t b = t.v.size(0), s = t.v.size(1), hv = t.v.size(2), dv = t.v.size(3), dk = t.k.size(3);
  result.out = at::empty({b, s, hv, dv}, t.v.options());
  result.state = at::zeros({b, hv, dk, dv}, t.v.options().dtype(at::kFloat));
  a.out = result.out.data_ptr();
  a.final_state = result.state.data_ptr<float>();
  a.rows = b;
  a.seq_len = s;
  a.key_heads = t.k.size(2);
  a.value_heads = hv;
  a.dk = dk;
  a.dv = dv;
  return a;
}

cuda_kernels::Element element_of(const at::Tensor& v) {
  return v.scalar_type() == at::kBFloat16 ? cuda_kernels::Element::kBFloat16 : cuda_kernels::Element::kFloat16;
}

}  // namespace

DeltaRuleResult chunked_gated_delta_rule(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                         const at::Tensor& g_in, const at::Tensor& beta_in, const at::Tensor& initial_in,
                                         const DeltaChunkPlan& plan) {
  const c10::cuda::CUDAGuard guard(v_in.device());
  const RuleTensors t = rule_tensors(q_in, k_in, v_in, g_in, beta_in, initial_in, "chunked_gated_delta_rule");
  if (plan.rows != v_in.size(0) || plan.seq_len != v_in.size(1) || !plan.device_chunks.defined() ||
      plan.device_chunks.device() != v_in.device())
    throw std::invalid_argument("chunked_gated_delta_rule: the chunk plan is not of these rows on " +
                                v_in.device().str());
  DeltaRuleResult result;
  cuda_kernels::DeltaRuleArgs a = rule_args(t, result);
  const int64_t chunks = plan.chunk_count();
  const int64_t workspace_bytes =
      cuda_kernels::delta_rule_workspace_bytes(chunks, a.key_heads, a.value_heads, a.dk, a.dv);
  const at::Tensor workspace = at::empty({workspace_bytes}, t.v.options().dtype(at::kByte));
  a.chunks = reinterpret_cast<const cuda_kernels::DeltaChunk*>(plan.device_chunks.data_ptr<int32_t>());
  a.sequences = reinterpret_cast<const cuda_kernels::DeltaSequence*>(plan.device_sequences.data_ptr<int32_t>());
  a.chunk_count = chunks;
  a.sequence_count = plan.sequence_count();
  a.workspace = workspace.data_ptr();
  cuda_kernels::chunked_gated_delta_rule(element_of(t.v), a, c10::cuda::getCurrentCUDAStream(v_in.device().index()).stream());
  return result;
}

DeltaRuleResult recurrent_gated_delta_rule(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                           const at::Tensor& g_in, const at::Tensor& beta_in,
                                           const at::Tensor& initial_in) {
  const c10::cuda::CUDAGuard guard(v_in.device());
  const RuleTensors t = rule_tensors(q_in, k_in, v_in, g_in, beta_in, initial_in, "recurrent_gated_delta_rule");
  DeltaRuleResult result;
  const cuda_kernels::DeltaRuleArgs a = rule_args(t, result);
  cuda_kernels::recurrent_gated_delta_rule(element_of(t.v), a,
                                           c10::cuda::getCurrentCUDAStream(v_in.device().index()).stream());
  return result;
}

#else  // no CUDA kernels in this build

bool delta_rule_fits(const at::Tensor&, int64_t, int64_t, int64_t, int64_t) { return false; }
DeltaRuleResult chunked_gated_delta_rule(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, const at::Tensor&, const DeltaChunkPlan&) {
  throw std::logic_error("dflash: this build has no CUDA kernels (chunked_gated_delta_rule)");
}
DeltaRuleResult recurrent_gated_delta_rule(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                           const at::Tensor&, const at::Tensor&) {
  throw std::logic_error("dflash: this build has no CUDA kernels (recurrent_gated_delta_rule)");
}

#endif

}  // namespace dflash::kernel_ops
