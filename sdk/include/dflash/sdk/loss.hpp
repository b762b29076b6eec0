// dflash/sdk/loss.hpp — write a loss plugin:
//
//   class MyLoss : public dflash::sdk::Loss {
//    public:
//     static constexpr dflash::sdk::PluginInfo info{"my_loss", "1.0.0", "what it computes"};
//     static std::string config_schema();
//     explicit MyLoss(const dflash::sdk::CreateContext& context);
//     dflash::sdk::LossResult compute(const dflash::sdk::LossInputs& inputs);
//     // optional:
//     dflash::sdk::MemoryEstimate estimate_memory(const dflash::sdk::LossShape& shape);
//   };
//   DFLASH_PLUGINS(MyLoss)
#pragma once

#include <dflash/abi.h>
#include <dflash/sdk/schema.hpp>
#include <dflash/sdk/torch.hpp>

namespace dflash::sdk {

class Loss {
 public:
  static constexpr dflash_kind kKind = DFLASH_KIND_LOSS;
};

enum class Teacher { kNone = DFLASH_TEACHER_NONE, kHidden = DFLASH_TEACHER_HIDDEN, kTopK = DFLASH_TEACHER_TOPK };

struct LossInputs {
  at::Tensor hidden;          // [N, H], requires grad
  at::Tensor lm_head_weight;  // [V, H]
  at::Tensor targets;         // [N] int64
  int64_t ignore_index = DFLASH_IGNORE_INDEX;
  at::Tensor row_weights;     // [N] or undefined (all ones)
  Teacher teacher = Teacher::kNone;
  at::Tensor teacher_hidden;          // [N, H] when teacher == kHidden
  at::Tensor teacher_topk_ids;        // [N, K] when teacher == kTopK
  at::Tensor teacher_topk_logprobs;   // [N, K] when teacher == kTopK
  // (ABI 1.6) [V, H_t] or undefined: with teacher == kHidden, the teacher's
  // logits are teacher_hidden · teacher_lm_head_weightᵀ (a drafter's draft
  // vocabulary: the target's head restricted to it); undefined: lm_head_weight.
  at::Tensor teacher_lm_head_weight;
  // The weight the teacher's logits go through.
  const at::Tensor& teacher_weight() const { return teacher_lm_head_weight.defined() ? teacher_lm_head_weight : lm_head_weight; }
};

struct LossResult {
  at::Tensor loss;     // 0-dim, with its autograd graph
  TensorDict metrics;  // 0-dim or [N] tensors, no grad
};

struct LossShape {
  int64_t rows = 0, hidden = 0, vocab = 0, topk = 0;
  Teacher teacher = Teacher::kNone;
  int32_t element_bytes = 4;
  bool weight_trainable = false;
  // (ABI 1.6) the teacher's logits through a weight of their own, of hidden
  // size teacher_hidden (0: hidden).
  bool separate_teacher_weight = false;
  int64_t teacher_hidden = 0;
};

struct MemoryEstimate {
  uint64_t peak_bytes = 0;
  uint64_t saved_for_backward_bytes = 0;
};

namespace detail {

DFLASH_SDK_DETECT(has_compute, std::declval<T&>().compute(std::declval<const LossInputs&>()))
DFLASH_SDK_DETECT(has_estimate_memory, std::declval<T&>().estimate_memory(std::declval<const LossShape&>()))

template <class T>
struct KindTraits<T, DFLASH_KIND_LOSS> : TorchKind {
  static_assert(std::is_same_v<typename has_compute<T>::type, LossResult>,
                "a Loss plugin needs `LossResult compute(const LossInputs&)`");
  static_assert(!has_estimate_memory<T>::value ||
                    std::is_same_v<typename has_estimate_memory<T>::type, MemoryEstimate>,
                "estimate_memory must return dflash::sdk::MemoryEstimate");

  static dflash_error* compute(dflash_instance* self, const dflash_loss_inputs* in,
                               dflash_loss_outputs* out) noexcept {
    auto* instance = instance_of<T>(self);
    const dflash_host_api* host = instance->host;
    return guard(host, T::info.name, translate, [&] {
      if (in == nullptr || out == nullptr) throw Error(DFLASH_ERR_INVALID_ARGUMENT, "compute called with null inputs/outputs");
      LossInputs inputs;
      inputs.hidden = borrow_tensor(host, in->hidden);
      inputs.lm_head_weight = borrow_tensor(host, in->lm_head_weight);
      inputs.targets = borrow_tensor(host, in->targets);
      inputs.ignore_index = in->ignore_index;
      if (in->row_weights != nullptr) inputs.row_weights = borrow_tensor(host, in->row_weights);
      inputs.teacher = static_cast<Teacher>(in->teacher_kind);
      if (in->teacher_kind == DFLASH_TEACHER_HIDDEN) {
        inputs.teacher_hidden = borrow_tensor(host, in->teacher_hidden);
        if (DFLASH_HAS_FIELD(dflash_loss_inputs, in, teacher_lm_head_weight) && in->teacher_lm_head_weight != nullptr)
          inputs.teacher_lm_head_weight = borrow_tensor(host, in->teacher_lm_head_weight);
      } else if (in->teacher_kind == DFLASH_TEACHER_TOPK) {
        inputs.teacher_topk_ids = borrow_tensor(host, in->teacher_topk_ids);
        inputs.teacher_topk_logprobs = borrow_tensor(host, in->teacher_topk_logprobs);
      } else if (in->teacher_kind != DFLASH_TEACHER_NONE) {
        throw Error(DFLASH_ERR_INVALID_ARGUMENT, "unknown teacher kind " + std::to_string(in->teacher_kind));
      }
      LossResult result = instance->impl->compute(inputs);
      if (!result.loss.defined() || result.loss.dim() != 0)
        throw Error(DFLASH_ERR_INTERNAL, "compute must return a 0-dim loss tensor");
      write_map(host, out->metrics, result.metrics);
      out->loss = new_handle(host, result.loss);
    });
  }

  static dflash_error* estimate_memory(dflash_instance* self, const dflash_loss_shape* shape,
                                       dflash_memory_estimate* out) noexcept {
    auto* instance = instance_of<T>(self);
    return guard(instance->host, T::info.name, translate, [&] {
      if constexpr (has_estimate_memory<T>::value) {
        LossShape s;
        s.rows = shape->rows;
        s.hidden = shape->hidden;
        s.vocab = shape->vocab;
        s.topk = shape->topk;
        s.teacher = static_cast<Teacher>(shape->teacher_kind);
        s.element_bytes = shape->element_bytes;
        s.weight_trainable = shape->weight_trainable != 0;
        if (DFLASH_HAS_FIELD(dflash_loss_shape, shape, teacher_hidden)) {
          s.separate_teacher_weight = shape->separate_teacher_weight != 0;
          s.teacher_hidden = shape->teacher_hidden;
        }
        MemoryEstimate estimate = instance->impl->estimate_memory(s);
        out->peak_bytes = estimate.peak_bytes;
        if (DFLASH_HAS_FIELD(dflash_memory_estimate, out, saved_for_backward_bytes))
          out->saved_for_backward_bytes = estimate.saved_for_backward_bytes;
      }
    });
  }

  static const void* vtable() noexcept {
    static const dflash_loss_vtable table = {
        sizeof(dflash_loss_vtable),
        &compute,
        has_estimate_memory<T>::value ? &estimate_memory : nullptr,
    };
    return &table;
  }
};

}  // namespace detail
}  // namespace dflash::sdk

