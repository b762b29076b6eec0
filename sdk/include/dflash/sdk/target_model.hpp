// dflash/sdk/target_model.hpp — write a target model plugin (the frozen LLM
// whose hidden states feed the drafter):
//
//   class MyTarget : public dflash::sdk::TargetModel {
//    public:
//     static constexpr dflash::sdk::PluginInfo info{"my_target", "1.0.0", "..."};
//     static std::string config_schema();
//     explicit MyTarget(const dflash::sdk::CreateContext& context);
//     nlohmann::json describe() const;  // num_layers, hidden_size, vocab_size, default_layer_ids
//     dflash::sdk::TensorDict forward(const dflash::sdk::TargetRequest& request);
//     dflash::sdk::TensorDict frozen_weights();  // embed_tokens, lm_head, final_norm
//     // optional, all four or none (incremental decoding, for `dflash-host eval`):
//     int64_t decode_begin(int64_t max_length);                       // a new session's id
//     dflash::sdk::TensorDict decode_extend(int64_t session, const dflash::sdk::DecodeRequest& request);
//     void decode_truncate(int64_t session, int64_t length);
//     void decode_end(int64_t session);
//     // optional, beside the four (ABI 1.3): one pass over several sessions, for `dflash-host generate`
//     dflash::sdk::TensorDict decode_extend_batch(const dflash::sdk::BatchDecodeRequest& request);
//     // optional, both or neither, beside the four (ABI 1.4): a tree of drafts verified in one pass
//     dflash::sdk::TensorDict decode_verify_tree(int64_t session, const dflash::sdk::TreeDecodeRequest& request);
//     void decode_accept_path(int64_t session, const std::vector<int64_t>& path);
//     // optional (ABI 1.2): weights and forward memory for the planner, no instance needed
//     static dflash::sdk::MemoryPlan plan_memory(const dflash::sdk::PlanRequest& request);
//   };
//   DFLASH_PLUGINS(MyTarget)
#pragma once

#include <dflash/sdk/memory_plan.hpp>
#include <dflash/sdk/schema.hpp>
#include <dflash/sdk/torch.hpp>

#include <vector>

namespace dflash::sdk {

class TargetModel {
 public:
  static constexpr dflash_kind kKind = DFLASH_KIND_TARGET_MODEL;
};

struct TargetRequest {
  TensorDict batch;
  std::vector<int64_t> layer_ids;
  bool want_last_hidden = false;
  bool want_logits = false;
};

// One decoding step: tokens [n] int64 appended to a session; "hidden.<id>"
// [n, H] for each layer id and, if asked, "logits" [n, V] come back.
struct DecodeRequest {
  at::Tensor tokens;
  std::vector<int64_t> layer_ids;
  bool want_logits = false;
};

// One decoding step over several sessions (ABI 1.3): tokens [count, n] int64,
// row i appended to sessions[i]. "hidden.<id>" [count, n, H] for each layer id
// and the logits asked for come back: kAll [count, n, V], kLast [count, 1, V]
// (after each session's last new token).
enum class DecodeLogits : int32_t {
  kNone = DFLASH_DECODE_LOGITS_NONE,
  kAll = DFLASH_DECODE_LOGITS_ALL,
  kLast = DFLASH_DECODE_LOGITS_LAST
};
struct BatchDecodeRequest {
  std::vector<int64_t> sessions;
  at::Tensor tokens;
  std::vector<int64_t> layer_ids;
  DecodeLogits logits = DecodeLogits::kNone;
};

// A tree of drafts verified in one pass (ABI 1.4): node i holds tokens[i]
// and hangs below node parents[i] (< i; −1: the session's last cached token);
// it attends to the cache, its ancestors and itself. "hidden.<id>" [n, H]
// and, if asked, "logits" [n, V] come back, each node's rows as for its path
// alone. The tree is pending until decode_accept_path keeps one chain of it.
struct TreeDecodeRequest {
  at::Tensor tokens;
  std::vector<int64_t> parents;
  std::vector<int64_t> layer_ids;
  bool want_logits = false;
};

namespace detail {

DFLASH_SDK_DETECT(has_decode_begin, std::declval<T&>().decode_begin(int64_t{}))
DFLASH_SDK_DETECT(has_decode_extend, std::declval<T&>().decode_extend(int64_t{}, std::declval<const DecodeRequest&>()))
DFLASH_SDK_DETECT(has_decode_truncate, std::declval<T&>().decode_truncate(int64_t{}, int64_t{}))
DFLASH_SDK_DETECT(has_decode_end, std::declval<T&>().decode_end(int64_t{}))
DFLASH_SDK_DETECT(has_decode_extend_batch, std::declval<T&>().decode_extend_batch(std::declval<const BatchDecodeRequest&>()))
DFLASH_SDK_DETECT(has_decode_verify_tree, std::declval<T&>().decode_verify_tree(int64_t{}, std::declval<const TreeDecodeRequest&>()))
DFLASH_SDK_DETECT(has_decode_accept_path, std::declval<T&>().decode_accept_path(int64_t{}, std::declval<const std::vector<int64_t>&>()))
DFLASH_SDK_DETECT(has_target_forward, std::declval<T&>().forward(std::declval<const TargetRequest&>()))
DFLASH_SDK_DETECT(has_target_describe, nlohmann::json(std::declval<T&>().describe()))
DFLASH_SDK_DETECT(has_frozen_weights, std::declval<T&>().frozen_weights())

template <class T>
struct KindTraits<T, DFLASH_KIND_TARGET_MODEL> : TorchKind {
  static_assert(std::is_same_v<typename has_target_forward<T>::type, TensorDict>,
                "a TargetModel plugin needs `TensorDict forward(const TargetRequest&)`");
  static_assert(has_target_describe<T>::value,
                "a TargetModel plugin needs `nlohmann::json describe()` (num_layers, hidden_size, vocab_size, ...)");
  static_assert(std::is_same_v<typename has_frozen_weights<T>::type, TensorDict>,
                "a TargetModel plugin needs `TensorDict frozen_weights()` (embed_tokens, lm_head, final_norm)");

  static dflash_error* describe(dflash_instance* self, const char** out_json) noexcept {
    auto* instance = instance_of<T>(self);
    return guard(instance->host, T::info.name, translate, [&] {
      instance->long_lived = nlohmann::json(instance->impl->describe()).dump();
      *out_json = instance->long_lived.c_str();
    });
  }
  static dflash_error* forward(dflash_instance* self, const dflash_target_request* request,
                               dflash_tensor_map* out) noexcept {
    auto* instance = instance_of<T>(self);
    return guard(instance->host, T::info.name, translate, [&] {
      if (request == nullptr) throw Error(DFLASH_ERR_INVALID_ARGUMENT, "forward called without a request");
      TargetRequest r;
      r.batch = read_map(instance->host, request->batch);
      r.layer_ids.assign(request->layer_ids, request->layer_ids + request->layer_count);
      r.want_last_hidden = request->want_last_hidden != 0;
      r.want_logits = request->want_logits != 0;
      write_map(instance->host, out, instance->impl->forward(r));
    });
  }
  static dflash_error* frozen_weights(dflash_instance* self, dflash_tensor_map* out) noexcept {
    auto* instance = instance_of<T>(self);
    return guard(instance->host, T::info.name, translate,
                 [&] { write_map(instance->host, out, instance->impl->frozen_weights()); });
  }
  static constexpr bool kDecodes = has_decode_begin<T>::value;
  static_assert(kDecodes == has_decode_extend<T>::value && kDecodes == has_decode_truncate<T>::value &&
                    kDecodes == has_decode_end<T>::value,
                "a TargetModel plugin that decodes needs all four of `int64_t decode_begin(int64_t max_length)`, "
                "`TensorDict decode_extend(int64_t session, const DecodeRequest&)`, "
                "`void decode_truncate(int64_t session, int64_t length)` and `void decode_end(int64_t session)`");

  static dflash_error* decode_begin(dflash_instance* self, int64_t max_length, int64_t* out_session) noexcept {
    auto* instance = instance_of<T>(self);
    return guard(instance->host, T::info.name, translate, [&] {
      if constexpr (kDecodes) *out_session = instance->impl->decode_begin(max_length);
    });
  }
  static dflash_error* decode_extend(dflash_instance* self, int64_t session, const dflash_target_decode_request* request,
                                     dflash_tensor_map* out) noexcept {
    auto* instance = instance_of<T>(self);
    return guard(instance->host, T::info.name, translate, [&] {
      if constexpr (kDecodes) {
        if (request == nullptr || request->tokens == nullptr)
          throw Error(DFLASH_ERR_INVALID_ARGUMENT, "decode_extend called without tokens");
        DecodeRequest r;
        r.tokens = borrow_tensor(instance->host, request->tokens);
        r.layer_ids.assign(request->layer_ids, request->layer_ids + request->layer_count);
        r.want_logits = request->want_logits != 0;
        write_map(instance->host, out, instance->impl->decode_extend(session, r));
      }
    });
  }
  static constexpr bool kBatchDecodes = has_decode_extend_batch<T>::value;
  static_assert(!kBatchDecodes || kDecodes,
                "a TargetModel plugin with `decode_extend_batch` needs the decoding group too (decode_begin, "
                "decode_extend, decode_truncate, decode_end): sessions are opened and ended one at a time");
  static_assert(!kBatchDecodes || std::is_same_v<typename has_decode_extend_batch<T>::type, TensorDict>,
                "`decode_extend_batch(const BatchDecodeRequest&)` must return TensorDict");

  static dflash_error* decode_extend_batch(dflash_instance* self, const dflash_target_batch_decode_request* request,
                                           dflash_tensor_map* out) noexcept {
    auto* instance = instance_of<T>(self);
    return guard(instance->host, T::info.name, translate, [&] {
      if constexpr (kBatchDecodes) {
        if (request == nullptr || request->tokens == nullptr || request->sessions == nullptr || request->count == 0)
          throw Error(DFLASH_ERR_INVALID_ARGUMENT, "decode_extend_batch called without sessions or tokens");
        if (request->logits < DFLASH_DECODE_LOGITS_NONE || request->logits > DFLASH_DECODE_LOGITS_LAST)
          throw Error(DFLASH_ERR_INVALID_ARGUMENT,
                      "decode_extend_batch: logits " + std::to_string(request->logits) + " is not a dflash_decode_logits value");
        BatchDecodeRequest r;
        r.sessions.assign(request->sessions, request->sessions + request->count);
        r.tokens = borrow_tensor(instance->host, request->tokens);
        r.layer_ids.assign(request->layer_ids, request->layer_ids + request->layer_count);
        r.logits = static_cast<DecodeLogits>(request->logits);
        write_map(instance->host, out, instance->impl->decode_extend_batch(r));
      }
    });
  }
  static constexpr bool kVerifiesTrees = has_decode_verify_tree<T>::value;
  static_assert(kVerifiesTrees == has_decode_accept_path<T>::value,
                "a TargetModel plugin that verifies trees needs both `TensorDict decode_verify_tree(int64_t session, "
                "const TreeDecodeRequest&)` and `void decode_accept_path(int64_t session, const std::vector<int64_t>& path)`");
  static_assert(!kVerifiesTrees || kDecodes,
                "a TargetModel plugin that verifies trees needs the decoding group too (decode_begin, decode_extend, "
                "decode_truncate, decode_end): a tree extends a session");
  static dflash_error* decode_verify_tree(dflash_instance* self, int64_t session, const dflash_target_tree_request* request,
                                          dflash_tensor_map* out) noexcept {
    auto* instance = instance_of<T>(self);
    return guard(instance->host, T::info.name, translate, [&] {
      if constexpr (kVerifiesTrees) {
        if (request == nullptr || request->tokens == nullptr || request->parents == nullptr || request->count == 0)
          throw Error(DFLASH_ERR_INVALID_ARGUMENT, "decode_verify_tree called without tokens or parents");
        TreeDecodeRequest r;
        r.tokens = borrow_tensor(instance->host, request->tokens);
        r.parents.assign(request->parents, request->parents + request->count);
        r.layer_ids.assign(request->layer_ids, request->layer_ids + request->layer_count);
        r.want_logits = request->want_logits != 0;
        if (r.tokens.dim() != 1 || r.tokens.size(0) != static_cast<int64_t>(request->count))
          throw Error(DFLASH_ERR_INVALID_ARGUMENT, "decode_verify_tree: tokens " + c10::str(r.tokens.sizes()) + " for " +
                                                       std::to_string(request->count) + " parents; expected [" +
                                                       std::to_string(request->count) + "]");
        for (size_t i = 0; i < r.parents.size(); ++i)
          if (r.parents[i] < -1 || r.parents[i] >= static_cast<int64_t>(i))
            throw Error(DFLASH_ERR_INVALID_ARGUMENT, "decode_verify_tree: node " + std::to_string(i) + "'s parent " +
                                                         std::to_string(r.parents[i]) + " is not in [-1, " + std::to_string(i) +
                                                         ") (parents come before their children)");
        write_map(instance->host, out, instance->impl->decode_verify_tree(session, r));
      }
    });
  }
  static dflash_error* decode_accept_path(dflash_instance* self, int64_t session, const int64_t* path, size_t count) noexcept {
    auto* instance = instance_of<T>(self);
    return guard(instance->host, T::info.name, translate, [&] {
      if constexpr (kVerifiesTrees) {
        if (path == nullptr && count > 0) throw Error(DFLASH_ERR_INVALID_ARGUMENT, "decode_accept_path: a NULL path of " + std::to_string(count) + " nodes");
        instance->impl->decode_accept_path(session, std::vector<int64_t>(path, path + count));
      }
    });
  }
  static dflash_error* decode_truncate(dflash_instance* self, int64_t session, int64_t length) noexcept {
    auto* instance = instance_of<T>(self);
    return guard(instance->host, T::info.name, translate, [&] {
      if constexpr (kDecodes) instance->impl->decode_truncate(session, length);
    });
  }
  static void decode_end(dflash_instance* self, int64_t session) noexcept {
    auto* instance = instance_of<T>(self);
    if constexpr (kDecodes) {
      try {
        instance->impl->decode_end(session);
      } catch (...) {  // freeing never fails across the ABI
      }
    }
  }

  static const void* vtable() noexcept {
    static const dflash_target_vtable table = {sizeof(dflash_target_vtable), &describe, &forward, &frozen_weights,
                                               kDecodes ? &decode_begin : nullptr, kDecodes ? &decode_extend : nullptr,
                                               kDecodes ? &decode_truncate : nullptr, kDecodes ? &decode_end : nullptr,
                                               plan_memory_of<T>(), kBatchDecodes ? &decode_extend_batch : nullptr,
                                               kVerifiesTrees ? &decode_verify_tree : nullptr,
                                               kVerifiesTrees ? &decode_accept_path : nullptr};
    return &table;
  }
};

}  // namespace detail
}  // namespace dflash::sdk
