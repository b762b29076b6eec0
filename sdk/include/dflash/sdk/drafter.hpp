// dflash/sdk/drafter.hpp — write a drafter architecture plugin:
//
//   class MyDrafter : public dflash::sdk::Drafter {
//    public:
//     static constexpr dflash::sdk::PluginInfo info{"my_drafter", "1.0.0", "..."};
//     static std::string config_schema();
//     explicit MyDrafter(const dflash::sdk::CreateContext& context);
//     dflash::sdk::TensorDict parameters();     // live trainable leaves, stable names
//     void bind_target(const nlohmann::json& target, const dflash::sdk::TensorDict& frozen);
//     dflash::sdk::TensorDict forward(const dflash::sdk::TensorDict& inputs);
//     nlohmann::json export_config() const;     // the checkpoint's config.json, with block_size
//                                               // and target_layer_ids (required, ABI 1.5)
//     // optional:
//     void set_training(bool training);
//     // optional (ABI 1.5): the config.json keys a checkpoint must share before its weights load,
//     // {"drafter": [keys of export_config], "target": {key: the target's describe fact}}
//     nlohmann::json checkpoint_match() const;
//     // optional, all four or none (speculative decoding, for `dflash-host eval`):
//     int64_t draft_begin();                                        // a new session's id
//     void draft_extend(int64_t session, const dflash::sdk::TensorDict& inputs);  // input_ids [n], hidden.<id> [n, H]
//     at::Tensor draft_propose(int64_t session, const dflash::sdk::TensorDict& inputs, int64_t count);  // [m ≤ count] int64
//     void draft_end(int64_t session);
//     // optional, beside the four (ABI 1.4): a tree's candidates, the best k at each position
//     dflash::sdk::TopKProposal draft_propose_topk(int64_t session, const dflash::sdk::TensorDict& inputs,
//                                                  int64_t count, int64_t k);  // tokens, log_probs [m ≤ count, k]
//     // optional (ABI 1.6): a head of its own over a draft vocabulary, for the loss:
//     // {"lm_head": [V_d, H] (one of its parameters), "teacher_lm_head": [V_d, H_t] (frozen)}
//     dflash::sdk::TensorDict loss_heads();
//     // optional (ABI 1.6): persistent tensors that are not trained (saved, restored in place)
//     dflash::sdk::TensorDict buffers();
//     // optional (ABI 1.2): parameters and activations for the planner, no instance needed
//     static dflash::sdk::MemoryPlan plan_memory(const dflash::sdk::PlanRequest& request);
//   };
//   DFLASH_PLUGINS(MyDrafter)
#pragma once

#include <dflash/sdk/memory_plan.hpp>
#include <dflash/sdk/schema.hpp>
#include <dflash/sdk/torch.hpp>

namespace dflash::sdk {

class Drafter {
 public:
  static constexpr dflash_kind kKind = DFLASH_KIND_DRAFTER;
};

// A tree's candidates (ABI 1.4): tokens [m, k] int64 and log_probs [m, k]
// float32, row d the drafter's best k at position d + 1, best first.
struct TopKProposal {
  at::Tensor tokens, log_probs;
};

namespace detail {

DFLASH_SDK_DETECT(has_drafter_forward, std::declval<T&>().forward(std::declval<const TensorDict&>()))
DFLASH_SDK_DETECT(has_parameters, std::declval<T&>().parameters())
DFLASH_SDK_DETECT(has_bind_target, std::declval<T&>().bind_target(std::declval<const nlohmann::json&>(),
                                                                  std::declval<const TensorDict&>()))
DFLASH_SDK_DETECT(has_export_config, nlohmann::json(std::declval<T&>().export_config()))
DFLASH_SDK_DETECT(has_set_training, std::declval<T&>().set_training(true))
DFLASH_SDK_DETECT(has_checkpoint_match, nlohmann::json(std::declval<T&>().checkpoint_match()))
DFLASH_SDK_DETECT(has_loss_heads, std::declval<T&>().loss_heads())
DFLASH_SDK_DETECT(has_buffers, std::declval<T&>().buffers())
DFLASH_SDK_DETECT(has_draft_begin, std::declval<T&>().draft_begin())
DFLASH_SDK_DETECT(has_draft_extend, std::declval<T&>().draft_extend(int64_t{}, std::declval<const TensorDict&>()))
DFLASH_SDK_DETECT(has_draft_propose,
                  std::declval<T&>().draft_propose(int64_t{}, std::declval<const TensorDict&>(), int64_t{}))
DFLASH_SDK_DETECT(has_draft_end, std::declval<T&>().draft_end(int64_t{}))
DFLASH_SDK_DETECT(has_draft_propose_topk, std::declval<T&>().draft_propose_topk(int64_t{}, std::declval<const TensorDict&>(),
                                                                                int64_t{}, int64_t{}))

template <class T>
struct KindTraits<T, DFLASH_KIND_DRAFTER> : TorchKind {
  static_assert(std::is_same_v<typename has_drafter_forward<T>::type, TensorDict>,
                "a Drafter plugin needs `TensorDict forward(const TensorDict& inputs)`");
  static_assert(std::is_same_v<typename has_parameters<T>::type, TensorDict>,
                "a Drafter plugin needs `TensorDict parameters()`");
  static_assert(has_bind_target<T>::value,
                "a Drafter plugin needs `void bind_target(const nlohmann::json& target, const TensorDict& frozen)`");
  static_assert(has_export_config<T>::value,
                "a Drafter plugin needs `nlohmann::json export_config() const` (required since ABI 1.5), stating "
                "block_size and target_layer_ids");

  static_assert(!has_loss_heads<T>::value || std::is_same_v<typename has_loss_heads<T>::type, TensorDict>,
                "loss_heads() must return a TensorDict {\"lm_head\", \"teacher_lm_head\"}");
  static_assert(!has_buffers<T>::value || std::is_same_v<typename has_buffers<T>::type, TensorDict>,
                "buffers() must return a TensorDict");
  // A host before ABI 1.6 would never ask for the heads (it would score
  // draft-vocabulary targets through the target's head) nor save the buffers.
  static constexpr uint32_t host_minor_needed() { return has_loss_heads<T>::value || has_buffers<T>::value ? 6 : 0; }
  static std::string host_minor_reason() {
    return has_loss_heads<T>::value ? "its loss_heads: a head of its own for the loss" : "its buffers: saved beside its parameters";
  }

  static dflash_error* parameters(dflash_instance* self, dflash_tensor_map* out) noexcept {
    auto* instance = instance_of<T>(self);
    return guard(instance->host, T::info.name, translate,
                 [&] { write_map(instance->host, out, instance->impl->parameters()); });
  }
  static dflash_error* bind_target(dflash_instance* self, const char* target_json,
                                   const dflash_tensor_map* frozen) noexcept {
    auto* instance = instance_of<T>(self);
    return guard(instance->host, T::info.name, translate, [&] {
      instance->impl->bind_target(nlohmann::json::parse(target_json ? target_json : "{}"),
                                  read_map(instance->host, frozen));
    });
  }
  static dflash_error* forward(dflash_instance* self, const dflash_tensor_map* inputs,
                               dflash_tensor_map* out) noexcept {
    auto* instance = instance_of<T>(self);
    return guard(instance->host, T::info.name, translate, [&] {
      write_map(instance->host, out, instance->impl->forward(read_map(instance->host, inputs)));
    });
  }
  static dflash_error* export_config(dflash_instance* self, const char** out_json) noexcept {
    auto* instance = instance_of<T>(self);
    return guard(instance->host, T::info.name, translate, [&] {
      if constexpr (has_export_config<T>::value)
        *out_json = keep_until_next_call(instance, nlohmann::json(instance->impl->export_config()).dump());
    });
  }
  static dflash_error* checkpoint_match(dflash_instance* self, const char** out_json) noexcept {
    auto* instance = instance_of<T>(self);
    return guard(instance->host, T::info.name, translate, [&] {
      if constexpr (has_checkpoint_match<T>::value)
        *out_json = keep_until_next_call(instance, nlohmann::json(instance->impl->checkpoint_match()).dump());
    });
  }
  static dflash_error* loss_heads(dflash_instance* self, dflash_tensor_map* out) noexcept {
    auto* instance = instance_of<T>(self);
    return guard(instance->host, T::info.name, translate, [&] {
      if constexpr (has_loss_heads<T>::value) write_map(instance->host, out, instance->impl->loss_heads());
    });
  }
  static dflash_error* buffers(dflash_instance* self, dflash_tensor_map* out) noexcept {
    auto* instance = instance_of<T>(self);
    return guard(instance->host, T::info.name, translate, [&] {
      if constexpr (has_buffers<T>::value) write_map(instance->host, out, instance->impl->buffers());
    });
  }
  static dflash_error* set_training(dflash_instance* self, int32_t training) noexcept {
    auto* instance = instance_of<T>(self);
    return guard(instance->host, T::info.name, translate, [&] {
      if constexpr (has_set_training<T>::value) instance->impl->set_training(training != 0);
    });
  }
  static constexpr bool kDrafts = has_draft_begin<T>::value;
  static_assert(kDrafts == has_draft_extend<T>::value && kDrafts == has_draft_propose<T>::value &&
                    kDrafts == has_draft_end<T>::value,
                "a Drafter plugin that drafts needs all four of `int64_t draft_begin()`, "
                "`void draft_extend(int64_t session, const TensorDict&)`, "
                "`at::Tensor draft_propose(int64_t session, const TensorDict&, int64_t count)` and "
                "`void draft_end(int64_t session)`");

  static dflash_error* draft_begin(dflash_instance* self, int64_t* out_session) noexcept {
    auto* instance = instance_of<T>(self);
    return guard(instance->host, T::info.name, translate, [&] {
      if constexpr (kDrafts) *out_session = instance->impl->draft_begin();
    });
  }
  static dflash_error* draft_extend(dflash_instance* self, int64_t session, const dflash_tensor_map* inputs) noexcept {
    auto* instance = instance_of<T>(self);
    return guard(instance->host, T::info.name, translate, [&] {
      if constexpr (kDrafts) instance->impl->draft_extend(session, read_map(instance->host, inputs));
    });
  }
  static dflash_error* draft_propose(dflash_instance* self, int64_t session, const dflash_tensor_map* inputs,
                                     int64_t count, dflash_tensor_map* out) noexcept {
    auto* instance = instance_of<T>(self);
    return guard(instance->host, T::info.name, translate, [&] {
      if constexpr (kDrafts) {
        TensorDict result;
        result.set("tokens", instance->impl->draft_propose(session, read_map(instance->host, inputs), count));
        write_map(instance->host, out, result);
      }
    });
  }
  static constexpr bool kDraftsTopK = has_draft_propose_topk<T>::value;
  static_assert(!kDraftsTopK || kDrafts,
                "a Drafter plugin with `draft_propose_topk` needs the drafting group too (draft_begin, draft_extend, "
                "draft_propose, draft_end): its sessions are those");
  static_assert(!kDraftsTopK || std::is_same_v<typename has_draft_propose_topk<T>::type, TopKProposal>,
                "`draft_propose_topk(int64_t session, const TensorDict&, int64_t count, int64_t k)` must return TopKProposal");
  static dflash_error* draft_propose_topk(dflash_instance* self, int64_t session, const dflash_tensor_map* inputs,
                                          int64_t count, int64_t k, dflash_tensor_map* out) noexcept {
    auto* instance = instance_of<T>(self);
    return guard(instance->host, T::info.name, translate, [&] {
      if constexpr (kDraftsTopK) {
        if (k < 1) throw Error(DFLASH_ERR_INVALID_ARGUMENT, "draft_propose_topk: k is " + std::to_string(k) + "; it must be at least 1");
        const TopKProposal proposal = instance->impl->draft_propose_topk(session, read_map(instance->host, inputs), count, k);
        TensorDict result;
        result.set("tokens", proposal.tokens);
        result.set("log_probs", proposal.log_probs);
        write_map(instance->host, out, result);
      }
    });
  }
  static void draft_end(dflash_instance* self, int64_t session) noexcept {
    auto* instance = instance_of<T>(self);
    if constexpr (kDrafts) {
      try {
        instance->impl->draft_end(session);
      } catch (...) {  // freeing never fails across the ABI
      }
    }
  }

  static const void* vtable() noexcept {
    static const dflash_drafter_vtable table = {
        sizeof(dflash_drafter_vtable), &parameters, &bind_target, &forward,
        &export_config,
        has_set_training<T>::value ? &set_training : nullptr,
        kDrafts ? &draft_begin : nullptr, kDrafts ? &draft_extend : nullptr,
        kDrafts ? &draft_propose : nullptr, kDrafts ? &draft_end : nullptr,
        plan_memory_of<T>(),
        kDraftsTopK ? &draft_propose_topk : nullptr,
        has_checkpoint_match<T>::value ? &checkpoint_match : nullptr,
        has_loss_heads<T>::value ? &loss_heads : nullptr,
        has_buffers<T>::value ? &buffers : nullptr,
    };
    return &table;
  }
};

}  // namespace detail
}  // namespace dflash::sdk
