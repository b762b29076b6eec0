// One small, real plugin per kind, written with the SDK the way a third
// party would, so the tests can drive every vtable slot through the host.
#include <limits>
#include <dflash/sdk.hpp>

#include <torch/types.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <chrono>
#include <thread>

namespace {
using dflash::sdk::Bounds;
using dflash::sdk::CreateContext;
using dflash::sdk::Schema;
using dflash::sdk::TensorDict;

// --- loss: weighted CE on full logits, with metrics and a memory estimate.
class TestLoss : public dflash::sdk::Loss {
 public:
  static constexpr dflash::sdk::PluginInfo info{"test_loss", "2.3.4", "weighted CE for tests"};
  static std::string config_schema() {
    return Schema()
        .number("scale", 1.0, "multiplies the loss", Bounds::above(0))
        .integer("nan_from_call", 0, "from this call on (1-based) the loss is NaN; 0 = never", Bounds::at_least(0))
        .integer("oom_at_call", 0, "this call (1-based) fails as out of memory, as a CUDA allocation would; 0 = never",
                 Bounds::at_least(0))
        .integer("torch_error_at_call", 0, "this call (1-based) fails inside LibTorch (a plugin bug); 0 = never",
                 Bounds::at_least(0))
        .string("accuracy", "per_row", "the 'accuracy' metric it reports: per_row (the contract), none, or scalar (a "
                "contract breach)", {"per_row", "none", "scalar"})
        .dump();
  }
  explicit TestLoss(const CreateContext& context)
      : scale_(context.config().at("scale").get<double>()),
        nan_from_call_(context.config().value("nan_from_call", int64_t{0})),
        oom_at_call_(context.config().value("oom_at_call", int64_t{0})),
        torch_error_at_call_(context.config().value("torch_error_at_call", int64_t{0})),
        accuracy_(context.config().value("accuracy", std::string("per_row"))) {
    context.log(DFLASH_LOG_INFO, "constructed");  // tests count constructions
  }

  dflash::sdk::LossResult compute(const dflash::sdk::LossInputs& in) {
    if (in.hidden.dim() != 2 || in.hidden.size(1) != in.lm_head_weight.size(1))
      throw dflash::sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "hidden must be [N, H] with H = lm_head_weight.size(1)");
    if (oom_at_call_ > 0 && ++oom_calls_ == oom_at_call_)
      throw dflash::sdk::Error(DFLASH_ERR_OUT_OF_MEMORY, "out of memory: tried to allocate 3.79 GiB (test_loss.oom_at_call)");
    if (torch_error_at_call_ > 0 && ++torch_error_calls_ == torch_error_at_call_)
      (void)torch::matmul(in.hidden, in.lm_head_weight);  // [N, H]·[V, H]: a shape error LibTorch raises
    torch::Tensor logits = torch::matmul(in.hidden, in.lm_head_weight.t());
    torch::Tensor valid = in.targets.ne(in.ignore_index);
    torch::Tensor safe = torch::where(valid, in.targets, torch::zeros_like(in.targets));
    torch::Tensor nll = -torch::log_softmax(logits, -1).gather(1, safe.unsqueeze(1)).squeeze(1);
    torch::Tensor w = valid.to(nll.scalar_type());
    if (in.row_weights.defined()) w = w * in.row_weights;
    if (in.teacher == dflash::sdk::Teacher::kHidden) {
      // A KL term, so the teacher path is exercised too.
      torch::Tensor teacher = torch::log_softmax(torch::matmul(in.teacher_hidden, in.lm_head_weight.t()), -1).detach();
      nll = nll + (teacher.exp() * (teacher - torch::log_softmax(logits, -1))).sum(-1);
    }
    dflash::sdk::LossResult result;
    result.loss = scale_ * (nll * w).sum() / w.sum().clamp_min(1e-12);
    if (nan_from_call_ > 0 && ++calls_ >= nan_from_call_) result.loss = result.loss * std::numeric_limits<double>::quiet_NaN();
    torch::NoGradGuard no_grad;
    const torch::Tensor hits = logits.argmax(-1).eq(in.targets).to(torch::kFloat);
    if (accuracy_ == "per_row") result.metrics.set("accuracy", hits);
    if (accuracy_ == "scalar") result.metrics.set("accuracy", hits.mean());
    result.metrics.set("rows", torch::tensor(static_cast<double>(in.hidden.size(0))));
    return result;
  }
  dflash::sdk::MemoryEstimate estimate_memory(const dflash::sdk::LossShape& s) const {
    return {static_cast<uint64_t>(s.rows * s.vocab * s.element_bytes * 3), static_cast<uint64_t>(s.rows * s.vocab * s.element_bytes)};
  }

 private:
  double scale_;
  int64_t nan_from_call_ = 0, calls_ = 0, oom_at_call_ = 0, oom_calls_ = 0;
  int64_t torch_error_at_call_ = 0, torch_error_calls_ = 0;
  std::string accuracy_;
};

// --- loss whose construction fails with a plain C++ exception.
class ThrowingLoss : public dflash::sdk::Loss {
 public:
  static constexpr dflash::sdk::PluginInfo info{"throwing_loss", "0.0.1", "always fails to create"};
  static std::string config_schema() { return Schema().dump(); }
  explicit ThrowingLoss(const CreateContext&) { throw std::runtime_error("cannot open /nonexistent/table.bin"); }
  dflash::sdk::LossResult compute(const dflash::sdk::LossInputs&) { return {}; }
};

// --- scheduler with state: lr decays by `factor` each time lr_at is asked for a new step.
class TestSchedule : public dflash::sdk::Scheduler {
 public:
  static constexpr dflash::sdk::PluginInfo info{"test_schedule", "1.0.0", "step decay with state"};
  static std::string config_schema() {
    return Schema().number("factor", 0.5, "decay per step", Bounds::between(0, 1)).dump();
  }
  explicit TestSchedule(const CreateContext& context) : factor_(context.config().at("factor").get<double>()) {}
  double lr_at(int64_t step, int64_t total, double base) const {
    if (step > total) throw dflash::sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "step past the end of the run");
    return base * std::pow(factor_, static_cast<double>(step)) + offset_;
  }
  nlohmann::json save_state() const { return {{"offset", offset_}}; }
  void load_state(const nlohmann::json& state) { offset_ = state.at("offset").get<double>(); }

 private:
  double factor_;
  double offset_ = 0.125;
};

// --- data: `batches` batches of [rows, length] counting tokens.
class TestData : public dflash::sdk::DataSource {
 public:
  static constexpr dflash::sdk::PluginInfo info{"test_data", "1.0.0", "counting tokens"};
  static std::string config_schema() {
    return Schema()
        .integer("batches", 3, "batches per epoch", Bounds::at_least(1))
        .integer("rows", 2, "rows per batch", Bounds::at_least(1))
        .integer("length", 5, "tokens per row", Bounds::at_least(2))
        .integer("vocab", 11, "token ids are taken modulo this", Bounds::at_least(2))
        .dump();
  }
  explicit TestData(const CreateContext& c)
      : batches_(c.config().at("batches")), rows_(c.config().at("rows")), length_(c.config().at("length")),
        vocab_(c.config().at("vocab")) {}
  std::optional<TensorDict> next_batch() {
    if (next_ >= batches_) return std::nullopt;
    const int64_t start = next_ * rows_ * length_;
    ++next_;
    torch::Tensor ids = torch::arange(start, start + rows_ * length_, torch::kLong).remainder(vocab_).view({rows_, length_});
    return TensorDict{{"input_ids", ids}, {"loss_mask", torch::ones({rows_, length_}, torch::kLong)}};
  }
  nlohmann::json save_state() const { return {{"next", next_}}; }
  void load_state(const nlohmann::json& state) { next_ = state.at("next").get<int64_t>(); }
  nlohmann::json describe() const { return {{"vocab_size", vocab_}, {"batches", batches_}}; }

 private:
  int64_t batches_, rows_, length_, vocab_, next_ = 0;
};

// --- target: embed, then `layers` fixed tanh(h·W) layers; deterministic from the seed.
class TestTarget : public dflash::sdk::TargetModel {
 public:
  static constexpr dflash::sdk::PluginInfo info{"test_target", "1.0.0", "tiny deterministic target"};
  static std::string config_schema() {
    return Schema()
        .integer("layers", 4, "decoder layers", Bounds::at_least(1))
        .integer("hidden", 8, "hidden size", Bounds::at_least(1))
        .integer("vocab", 11, "vocabulary size", Bounds::at_least(2))
        .string("frozen_device", "", "tests: hand the frozen weights over on this device instead (a misplaced one)")
        .dump();
  }
  explicit TestTarget(const CreateContext& c) : frozen_device_(c.config().at("frozen_device").get<std::string>()) {
    torch::manual_seed(c.seed());
    const int64_t layers = c.config().at("layers"), hidden = c.config().at("hidden"), vocab = c.config().at("vocab");
    embed_ = torch::randn({vocab, hidden});
    lm_head_ = torch::randn({vocab, hidden});
    norm_ = torch::ones({hidden});
    for (int64_t i = 0; i < layers; ++i) weights_.push_back(torch::randn({hidden, hidden}) / std::sqrt(double(hidden)));
  }
  nlohmann::json describe() const {
    return {{"num_layers", weights_.size()}, {"hidden_size", embed_.size(1)}, {"vocab_size", embed_.size(0)},
            {"default_layer_ids", {1, static_cast<int64_t>(weights_.size()) - 1}}};
  }
  TensorDict forward(const dflash::sdk::TargetRequest& request) {
    torch::NoGradGuard no_grad;
    torch::Tensor h = embed_.index_select(0, request.batch.at("input_ids").flatten()).view(
        {request.batch.at("input_ids").size(0), request.batch.at("input_ids").size(1), -1});
    std::vector<torch::Tensor> states{h};
    for (const auto& w : weights_) states.push_back(h = torch::tanh(torch::matmul(h, w)));
    TensorDict out;
    for (int64_t id : request.layer_ids) {
      if (id < 0 || id >= static_cast<int64_t>(states.size()))
        throw dflash::sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "layer id " + std::to_string(id) + " out of range");
      out.set("hidden." + std::to_string(id), states[id]);
    }
    if (request.want_last_hidden) out.set("last_hidden", h);
    if (request.want_logits) out.set("logits", torch::matmul(h, lm_head_.t()));
    return out;
  }
  TensorDict frozen_weights() {
    if (!frozen_device_.empty())
      return {{"embed_tokens", embed_}, {"lm_head", lm_head_.to(torch::Device(frozen_device_))}, {"final_norm", norm_}};
    return {{"embed_tokens", embed_}, {"lm_head", lm_head_}, {"final_norm", norm_}};
  }

 private:
  std::string frozen_device_;
  torch::Tensor embed_, lm_head_, norm_;
  std::vector<torch::Tensor> weights_;
};

// --- drafter: hidden = concat(target layers) · W, trainable W.
class TestDrafter : public dflash::sdk::Drafter {
 public:
  static constexpr dflash::sdk::PluginInfo info{"test_drafter", "1.0.0", "one linear map"};
  static std::string config_schema() {
    return Schema()
        .integer_array("layer_ids", {1, 3}, "target layers it reads", Bounds::at_least(0))
        .integer("delay_ms", 0, "tests: sleep this long in every forward (a slow drafter)", Bounds::at_least(0))
        .string("parameter_device", "", "tests: keep the parameter on this device instead (a misplaced one)")
        .dump();
  }
  explicit TestDrafter(const CreateContext& c)
      : layer_ids_(c.config().at("layer_ids").get<std::vector<int64_t>>()),
        delay_ms_(c.config().at("delay_ms").get<int64_t>()),
        parameter_device_(c.config().at("parameter_device").get<std::string>()) {
    torch::manual_seed(c.seed() + 1);
  }
  TensorDict parameters() { return {{"proj.weight", weight_}}; }
  void bind_target(const nlohmann::json& target, const TensorDict& frozen) {
    const int64_t hidden = target.at("hidden_size");
    lm_head_ = frozen.at("lm_head");
    weight_ = (torch::randn({hidden * static_cast<int64_t>(layer_ids_.size()), hidden}) * 0.1).requires_grad_(true);
    if (!parameter_device_.empty()) weight_ = weight_.detach().to(torch::Device(parameter_device_)).requires_grad_(true);
  }
  TensorDict forward(const TensorDict& inputs) {
    if (!weight_.defined()) throw dflash::sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, "bind_target was not called");
    if (delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
    std::vector<torch::Tensor> features;
    for (int64_t id : layer_ids_) features.push_back(inputs.at("hidden." + std::to_string(id)));
    torch::Tensor x = torch::cat(features, -1);
    torch::Tensor ids = inputs.at("input_ids");
    torch::Tensor hidden = torch::matmul(x.flatten(0, 1), weight_);
    torch::Tensor targets = torch::roll(ids, -1, 1);
    targets.select(1, ids.size(1) - 1).fill_(-100);
    return {{"hidden", hidden}, {"targets", targets.flatten()},
            {"row_weights", torch::ones({hidden.size(0)})}, {"slot", torch::zeros({hidden.size(0)}, torch::kLong)}};
  }
  nlohmann::json export_config() const {
    return {{"layer_ids", layer_ids_}, {"architecture", "test"}, {"block_size", 1}, {"target_layer_ids", layer_ids_},
            {"mask_token_id", nullptr}};
  }
  void set_training(bool training) { training_ = training; }

 private:
  std::vector<int64_t> layer_ids_;
  int64_t delay_ms_;
  std::string parameter_device_;
  torch::Tensor weight_, lm_head_;
  bool training_ = true;
};

}  // namespace

DFLASH_PLUGINS(TestLoss, ThrowingLoss, TestSchedule, TestData, TestTarget, TestDrafter)
