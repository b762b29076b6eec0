#include "cli/commands.h"

#include "config/config_file.h"
#include "dist/process_group.h"
#include "dist/rank_agreement.h"
#include "config/config_schema.h"
#include "config/host_config.h"
#include "log/log.h"
#include "plugin/host_api.h"
#include "plugin/instances.h"
#include "plugin/plugin_kind.h"
#include "plugin/registry.h"
#include "metrics/tensorboard.h"
#include "eval/evaluation.h"
#include "memory/memory_plan.h"
#include "train/run_plan.h"
#include "train/frozen_weights.h"

#include <dflash/sdk/torch.hpp>
#include "train/train_schema.h"
#include "train/train_settings.h"
#include "train/trainer.h"
#include "train/run_directory.h"
#include "checkpoint/checkpoint.h"
#include "pipeline/calibration.h"
#include "pipeline/drafter_feed.h"
#include "pipeline/frozen_transfer.h"
#include "pipeline/target_rank.h"
#include "pipeline/topology.h"
#include "plugin/plugin_identity.h"

#include <boost/dll/runtime_symbol_info.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>

namespace dflash::cli {
namespace fs = std::filesystem;
using host::PluginRecord;
using host::PluginRegistry;

namespace {

// $DFLASH_PLUGIN_PATH's folders, made absolute. A relative entry is taken
// against the current directory, as the shell takes $PATH's; the log and the
// errors give the absolute folder so that the user sees which one that was.
std::vector<fs::path> plugin_path_folders() {
  std::vector<fs::path> folders;
  const char* env = std::getenv("DFLASH_PLUGIN_PATH");
  if (env == nullptr) return folders;
  std::stringstream paths(env);
  for (std::string entry; std::getline(paths, entry, ':');) {
    if (entry.empty()) continue;
    const fs::path folder = fs::absolute(entry);
    std::error_code ec;
    if (!fs::is_directory(folder, ec))
      throw std::invalid_argument("$DFLASH_PLUGIN_PATH entry '" + entry + "' is not a directory (" + folder.string() +
                                  (fs::path(entry).is_relative() ? ", relative entries are taken against the current directory"
                                                                 : "") +
                                  "); fix the entry or remove it");
    if (fs::path(entry).is_relative())
      log::info("$DFLASH_PLUGIN_PATH entry '" + entry + "' is relative: taken against the current directory, " +
                folder.string());
    folders.push_back(folder);
  }
  return folders;
}

// Where plugins are found without flags: next to the installed (or built)
// host, then $DFLASH_PLUGIN_PATH, then every --plugin-dir.
PluginRegistry load_plugins(const CliOptions& options, bool log_problems = true) {
  PluginRegistry registry(log_problems);
  registry.allow_world_writable(options.allow_world_writable_plugins);
  if (options.default_plugin_dirs) {
    std::error_code ec;
    const fs::path beside = boost::dll::program_location().parent_path().parent_path() / DFLASH_PLUGIN_RELATIVE_DIR;
    if (fs::is_directory(beside, ec)) registry.add_directory(beside);
    for (const fs::path& folder : plugin_path_folders()) registry.add_directory(folder);
  }
  for (const std::string& dir : options.plugin_dirs) registry.add_directory(dir);
  return registry;
}

// The config as the user wrote it: the file; then --loss NAME & co., which
// drop the file's settings of a section whose plugin they replace (those
// settings belong to the other plugin); then --set.
nlohmann::json raw_config(const CliOptions& options) {
  nlohmann::json raw = options.config_file ? config::load_json_file(*options.config_file) : nlohmann::json::object();
  for (const auto& [section, name] : options.plugin_choice) {
    if (raw.contains(section) && raw[section].is_object() && raw[section].contains("plugin") &&
        raw[section]["plugin"] != name) {
      log::info("--" + section + " " + name + " replaces the config's " + section + " plugin " + raw[section]["plugin"].dump() +
                "; that plugin's settings in the file are not used");
      raw[section] = nlohmann::json::object();
    }
    config::apply_override(raw, section + ".plugin=\"" + name + "\"");
  }
  for (const std::string& assignment : options.overrides) config::apply_override(raw, assignment);
  return raw;
}

config::ResolvedConfig resolve(const CliOptions& options, const PluginRegistry& registry,
                               const std::vector<std::string>& required_sections) {
  auto lookup = [&registry](const std::string& section, const std::string& name) {
    const PluginRecord& record = registry.find(*host::kind_from_name(section), name);
    return config::PluginSchema{record.schema, "plugin " + std::string(host::kind_section(record.kind)) + " '" +
                                                   record.name + "' from " + record.file.string()};
  };
  return config::resolve_config(raw_config(options), train::train_schema(), lookup, required_sections);
}

int list_plugins(const CliOptions& options) {
  PluginRegistry registry = load_plugins(options, /*log_problems=*/false);
  if (options.json) {
    nlohmann::json out{{"plugins", nlohmann::json::array()}, {"skipped", nlohmann::json::array()}};
    for (const PluginRecord& r : registry.plugins())
      out["plugins"].push_back({{"kind", host::kind_section(r.kind)}, {"name", r.name}, {"version", r.version},
                                {"abi", std::to_string(r.abi_major) + "." + std::to_string(r.abi_minor)},
                                {"torch", r.torch_build}, {"file", r.file.string()}, {"description", r.description}});
    for (const auto& problem : registry.problems())
      out["skipped"].push_back({{"file", problem.file.string()}, {"reason", problem.message}});
    std::cout << out.dump(2) << "\n";
    return kExitOk;
  }
  std::vector<const PluginRecord*> sorted;
  for (const PluginRecord& r : registry.plugins()) sorted.push_back(&r);
  std::stable_sort(sorted.begin(), sorted.end(), [](const PluginRecord* a, const PluginRecord* b) {
    return std::make_pair(static_cast<int>(a->kind), a->name) < std::make_pair(static_cast<int>(b->kind), b->name);
  });
  size_t name_width = 4;
  for (const PluginRecord* r : sorted) name_width = std::max(name_width, r->name.size());
  std::cout << std::left << std::setw(10) << "KIND" << std::setw(name_width + 2) << "NAME" << std::setw(10) << "VERSION"
            << std::setw(6) << "ABI" << "FILE\n";
  for (const PluginRecord* r : sorted)
    std::cout << std::left << std::setw(10) << host::kind_section(r->kind) << std::setw(name_width + 2) << r->name
              << std::setw(10) << r->version << std::setw(6)
              << (std::to_string(r->abi_major) + "." + std::to_string(r->abi_minor)) << r->file.string() << "\n";
  if (sorted.empty()) {
    std::cout << "(no plugins found; searched: ";
    for (const auto& dir : registry.directories()) std::cout << dir.string() << " ";
    std::cout << "— add a directory with --plugin-dir)\n";
  }
  if (!registry.problems().empty()) {
    std::cout << "\nskipped " << registry.problems().size() << " librar" << (registry.problems().size() == 1 ? "y" : "ies") << ":\n";
    for (const auto& problem : registry.problems()) std::cout << "  " << problem.message << "\n";
  }
  return kExitOk;
}

int describe_plugin(const CliOptions& options) {
  if (options.arguments.size() != 1)
    throw std::invalid_argument("describe takes one plugin name: dflash-host describe NAME [--kind KIND]");
  const std::string& name = options.arguments.front();
  if (name == "host" && !options.kind) {
    std::cout << "host section \"train\" (dflash-host's own settings)\n\n"
              << config::describe_schema(train::train_schema(), "train") << "\ndefaults:\n"
              << nlohmann::json{{"train", config::defaults_of(train::train_schema())}}.dump(2) << "\n";
    return kExitOk;
  }
  PluginRegistry registry = load_plugins(options);
  const PluginRecord* record = nullptr;
  if (options.kind) {
    auto kind = host::kind_from_name(*options.kind);
    if (!kind) throw std::invalid_argument("--kind " + *options.kind + ": expected data, target, drafter, loss or scheduler");
    record = &registry.find(*kind, name);
  } else {
    auto found = registry.find_any_kind(name);
    if (found.empty()) {
      std::string available;
      for (const PluginRecord& r : registry.plugins())
        available += (available.empty() ? "" : ", ") + std::string(host::kind_section(r.kind)) + "/" + r.name;
      throw host::PluginLookupError("no plugin named '" + name + "'; available: " + (available.empty() ? "none" : available) +
                                    " (see dflash-host list)");
    }
    if (found.size() > 1)
      throw std::invalid_argument("several plugins are named '" + name + "'; add --kind (" +
                                  host::kind_section(found[0]->kind) + ", " + host::kind_section(found[1]->kind) + ", ...)");
    record = found.front();
  }
  const std::string section = host::kind_section(record->kind);
  std::cout << host::kind_display(record->kind) << " plugin '" << record->name << "'\n"
            << "  version:     " << record->version << "\n"
            << "  description: " << record->description << "\n"
            << "  ABI:         " << record->abi_major << "." << record->abi_minor << "\n"
            << "  built with:  " << record->torch_build << "\n"
            << "  file:        " << record->file.string() << "\n\n"
            << "config (section \"" << section << "\"):\n"
            << config::describe_schema(record->schema, section) << "\ndefaults:\n";
  nlohmann::json defaults = config::defaults_of(record->schema);
  nlohmann::json section_json{{"plugin", record->name}};
  for (auto& [key, value] : defaults.items()) section_json[key] = value;
  std::cout << nlohmann::json{{section, section_json}}.dump(2) << "\n";
  return kExitOk;
}

int print_config(const CliOptions& options) {
  PluginRegistry registry = load_plugins(options);
  const config::ResolvedConfig resolved = resolve(options, registry, {});
  std::cout << resolved.root.dump(2) << "\n";
  return kExitOk;
}

// The "train" section, typed (parsed from the resolved config, once per use).
train::TrainSettings settings_of(const config::ResolvedConfig& resolved) {
  return train::parse_train_settings(resolved.root.at("train"));
}

template <class Instance>
std::unique_ptr<Instance> instantiate(const PluginRegistry& registry, const config::ResolvedConfig& resolved,
                                      dflash_kind kind, nlohmann::json plugin_config) {
  const std::string section = host::kind_section(kind);
  const PluginRecord& record = registry.find(kind, resolved.root.at(section).at("plugin").get<std::string>());
  return std::make_unique<Instance>(record, plugin_config, train::instance_options(settings_of(resolved)));
}

}  // namespace

namespace {

std::vector<std::string> all_sections() {
  std::vector<std::string> sections;
  for (dflash_kind kind : host::kAllKinds) sections.push_back(host::kind_section(kind));
  return sections;
}

void require_run_config(const CliOptions& options) {
  if (!options.config_file && options.plugin_choice.size() < host::kAllKinds.size())
    throw std::invalid_argument(options.command + " needs a config: --config FILE.json (see configs/), or every plugin "
                                "chosen with --data, --target, --drafter, --loss and --scheduler");
}

memory::Capacity capacity_for(const CliOptions& options, const std::string& device) {
  if (!options.device_memory) return memory::device_capacity(device);
  memory::Capacity c;
  c.total_bytes = c.free_bytes = memory::parse_size(*options.device_memory);
  c.source = "--gpu-memory";
  return c;
}

}  // namespace

namespace {

nlohmann::json section_config(const config::ResolvedConfig& resolved, dflash_kind kind) {
  return config::plugin_config_of(resolved, host::kind_section(kind));
}

// The data source's config section, its vocab_size of 0 made the target's
// (`target_info`: the target's describe, or at least its vocab_size).
nlohmann::json data_config_for(const config::ResolvedConfig& resolved, const nlohmann::json& target_info) {
  nlohmann::json data_config = section_config(resolved, DFLASH_KIND_DATA_SOURCE);
  if (data_config.contains("vocab_size") && data_config["vocab_size"].is_number_integer() &&
      data_config["vocab_size"].get<int64_t>() == 0)
    data_config["vocab_size"] = target_info.at("vocab_size");
  return data_config;
}

// The target and the data source (a target rank's plugins). The target comes
// first: a data source's vocab_size of 0 means the target's.
void add_target_side(const PluginRegistry& registry, const config::ResolvedConfig& resolved, train::RunPlugins& plugins) {
  plugins.target = instantiate<host::TargetModelInstance>(registry, resolved, DFLASH_KIND_TARGET_MODEL,
                                                          section_config(resolved, DFLASH_KIND_TARGET_MODEL));
  const nlohmann::json target_info = plugins.target->describe();
  plugins.data = instantiate<host::DataSourceInstance>(registry, resolved, DFLASH_KIND_DATA_SOURCE,
                                                       data_config_for(resolved, target_info));
}

// The drafter, the loss (`loss` when made already) and the scheduler (a drafter rank's plugins).
void add_drafter_side(const PluginRegistry& registry, const config::ResolvedConfig& resolved, train::RunPlugins& plugins,
                      std::unique_ptr<host::LossInstance> loss) {
  plugins.drafter = instantiate<host::DrafterInstance>(registry, resolved, DFLASH_KIND_DRAFTER,
                                                       section_config(resolved, DFLASH_KIND_DRAFTER));
  plugins.loss = loss ? std::move(loss)
                      : instantiate<host::LossInstance>(registry, resolved, DFLASH_KIND_LOSS, section_config(resolved, DFLASH_KIND_LOSS));
  plugins.scheduler = instantiate<host::SchedulerInstance>(registry, resolved, DFLASH_KIND_SCHEDULER,
                                                           section_config(resolved, DFLASH_KIND_SCHEDULER));
}

// Every section's plugin identity, from the registry: what a rank that
// instantiates only some of them records and compares.
nlohmann::json registry_identities(const PluginRegistry& registry, const config::ResolvedConfig& resolved) {
  nlohmann::json out = nlohmann::json::object();
  for (dflash_kind kind : host::kAllKinds) {
    const std::string section = host::kind_section(kind);
    out[section] = host::plugin_identity(registry.find(kind, resolved.root.at(section).at("plugin").get<std::string>()));
  }
  return out;
}

// The run from its already resolved config; `loss` when the caller made it
// already (train: for the memory plan), so it is made once.
std::unique_ptr<train::Run> run_from(const PluginRegistry& registry, const config::ResolvedConfig& resolved,
                                     std::unique_ptr<host::LossInstance> loss = nullptr) {
  // Every plugin is created before anything long-running begins, so one that
  // cannot start says so at once. The target comes first: a data source's
  // vocab_size of 0 means the target's.
  train::RunPlugins plugins;
  add_target_side(registry, resolved, plugins);
  add_drafter_side(registry, resolved, plugins, std::move(loss));
  return std::make_unique<train::Run>(std::move(plugins), resolved.root);
}

}  // namespace

train::TrainSettings train_settings(const CliOptions& options, const PluginRegistry& registry) {
  return settings_of(resolve(options, registry, {}));
}

std::unique_ptr<train::Run> make_run(const CliOptions& options, const PluginRegistry& registry) {
  require_run_config(options);
  const config::ResolvedConfig resolved = resolve(options, registry, all_sections());
  memory::require_device(settings_of(resolved).device);
  return run_from(registry, resolved);
}

namespace {

// Both kinds of rank of a disaggregated run, each against the device's
// capacity (every GPU of the run is taken to be like this rank's, or
// --gpu-memory).
struct RolePlans {
  std::vector<std::pair<memory::DevicePlan, std::optional<memory::Verdict>>> roles;
  memory::Capacity capacity;
  bool fits() const {
    for (const auto& [plan, verdict] : roles)
      if (verdict && !verdict->fits) return false;
    return true;
  }
};
RolePlans plan_roles(const CliOptions& options, const PluginRegistry& registry, const config::ResolvedConfig& resolved,
                     const host::LossInstance* loss = nullptr) {
  RolePlans out;
  for (memory::PlanRole role : {memory::PlanRole::kTargetRank, memory::PlanRole::kDrafterRank}) {
    memory::DevicePlan plan = train::plan_role(registry, resolved.root, role, loss);
    if (out.roles.empty()) out.capacity = capacity_for(options, plan.device);
    std::optional<memory::Verdict> verdict;
    if (plan.complete()) verdict = train::check_fit(registry, resolved.root, plan, out.capacity.free_bytes);
    out.roles.emplace_back(std::move(plan), verdict);
  }
  return out;
}

nlohmann::json role_plans_json(const RolePlans& plans, const train::TrainSettings& s) {
  nlohmann::json roles = nlohmann::json::object();
  for (const auto& [plan, verdict] : plans.roles) roles[memory::role_name(plan.role)] = memory::plan_to_json(plan, plans.capacity, verdict);
  return {{"mode", "disaggregated"}, {"target_ranks", s.target_ranks}, {"drafter_ranks", s.drafter_ranks},
          {"queue_depth", s.queue_depth}, {"roles", roles}};
}

void print_role_plans(const RolePlans& plans, const train::TrainSettings& s, bool json, std::ostream& out) {
  if (json) {
    out << role_plans_json(plans, s).dump(2) << "\n";
    return;
  }
  out << "disaggregated: " << s.target_ranks << " target + " << s.drafter_ranks << " drafter ranks, queue_depth "
      << s.queue_depth << "\n\n";
  for (const auto& [plan, verdict] : plans.roles) out << memory::format_plan(plan, plans.capacity, verdict) << "\n";
}

int plan_pipeline(const CliOptions& options, const PluginRegistry& registry, const config::ResolvedConfig& resolved) {
  const RolePlans plans = plan_roles(options, registry, resolved);
  const train::TrainSettings settings = settings_of(resolved);
  if (options.calibrate == 0) {
    print_role_plans(plans, settings, options.json, std::cout);
    return plans.fits() ? kExitOk : kExitDoesNotFit;
  }
  // The measured forecast: every plugin in this process, on this device.
  memory::require_device(settings.device);
  const std::unique_ptr<train::Run> run = run_from(registry, resolved);
  const pipeline::Calibration calibration = pipeline::calibrate(*run, static_cast<int>(options.calibrate));
  const int world = settings.target_ranks + settings.drafter_ranks;
  const auto splits = pipeline::forecast_splits(calibration, world, settings.grad_accumulation);
  const auto chosen = pipeline::forecast_split(calibration, settings.target_ranks, settings.drafter_ranks, settings.grad_accumulation);
  if (options.json) {
    nlohmann::json out = role_plans_json(plans, settings);
    out["throughput"] = pipeline::calibration_to_json(calibration, splits, chosen);
    std::cout << out.dump(2) << "\n";
  } else {
    print_role_plans(plans, settings, false, std::cout);
    std::cout << pipeline::format_calibration(calibration, splits, chosen);
  }
  return plans.fits() ? kExitOk : kExitDoesNotFit;
}

// `dflash-host plan`: the memory plan, the device, and what fits.
// plan --loss NAME --rows N --vocab V [--hidden H]: the loss's own estimate at
// that shape, no target folder, data or drafter needed.
int plan_loss_alone(const CliOptions& options) {
  if (!options.plugin_choice.count("loss"))
    throw std::invalid_argument("plan --rows plans a loss alone: name it with --loss NAME");
  if (!options.loss_alone_vocab) throw std::invalid_argument("plan --rows: give the vocabulary with --vocab V");
  const PluginRegistry registry = load_plugins(options);
  const config::ResolvedConfig resolved = resolve(options, registry, {"loss"});
  const memory::LossAlonePlan plan = train::plan_loss_alone(
      registry, resolved.root, *options.loss_alone_rows, *options.loss_alone_vocab, options.loss_alone_hidden.value_or(4096));
  if (options.json) std::cout << memory::loss_alone_to_json(plan).dump(2) << "\n";
  else std::cout << memory::format_loss_alone(plan);
  return kExitOk;
}

int plan(const CliOptions& options) {
  if (options.loss_alone_rows) return plan_loss_alone(options);
  require_run_config(options);
  const PluginRegistry registry = load_plugins(options);
  const config::ResolvedConfig resolved = resolve(options, registry, all_sections());
  if (settings_of(resolved).disaggregated()) return plan_pipeline(options, registry, resolved);
  if (options.calibrate > 0)
    throw std::invalid_argument("--calibrate forecasts the splits of a disaggregated run: give --target-ranks and "
                                "--drafter-ranks (or train.mode = disaggregated) too");
  const memory::DevicePlan plan = train::plan_run(registry, resolved.root, nullptr, options.world_size);
  const memory::Capacity capacity = capacity_for(options, plan.device);
  std::optional<memory::Verdict> verdict;
  if (plan.complete()) verdict = train::check_fit(registry, resolved.root, plan, capacity.free_bytes);
  if (options.json) std::cout << memory::plan_to_json(plan, capacity, verdict).dump(2) << "\n";
  else std::cout << memory::format_plan(plan, capacity, verdict);
  return verdict && !verdict->fits ? kExitDoesNotFit : kExitOk;
}

// --resume-from step-00000004, or 4.
std::optional<int64_t> resume_step(const CliOptions& options) {
  if (!options.resume_from) return std::nullopt;
  const std::string& value = *options.resume_from;
  const std::string name = value.find_first_not_of("0123456789") == std::string::npos && !value.empty() && value.size() < 19
                               ? "step-" + value : value;
  const auto step = checkpoint::step_of(name);
  if (!step) throw std::invalid_argument("--resume-from " + value + ": expected a checkpoint folder name (step-00000004) or a step number");
  return step;
}

// A run whose plan does not fit (`shortfall` says by how much): refused
// with its exit status, or started with a warning under --skip-memory-check.
std::optional<int> refuse_unless_skipped(const CliOptions& options, const std::string& shortfall) {
  if (!options.skip_memory_check) {
    log::error(shortfall + "; use a setting above, or --skip-memory-check to start anyway");
    return kExitDoesNotFit;
  }
  log::warn("the memory plan says the run does not fit; starting anyway (--skip-memory-check)");
  return std::nullopt;
}

// The memory check comes before any other plugin is created: nothing is
// allocated for a run that cannot fit. The loss comes first because it
// answers the plan from an instance (estimate_memory); the same instance
// then trains, so every plugin's constructor runs once. Returns the exit
// status when the run must not start.
std::optional<int> check_memory(const CliOptions& options, const PluginRegistry& registry,
                                const config::ResolvedConfig& resolved, const host::LossInstance& loss, int64_t world_size,
                                std::optional<memory::DevicePlan>& plan_out) {
  const memory::DevicePlan plan = train::plan_run(registry, resolved.root, &loss, world_size);
  plan_out = plan;
  if (!plan.complete()) {
    for (const std::string& missing : plan.missing) log::warn("memory plan incomplete: " + missing + "; not checked");
    return std::nullopt;
  }
  const memory::Capacity capacity = capacity_for(options, plan.device);
  const memory::Verdict verdict = train::check_fit(registry, resolved.root, plan, capacity.free_bytes);
  if (!verdict.fits) {
    std::cerr << memory::format_plan(plan, capacity, verdict) << std::flush;
    return refuse_unless_skipped(options, "the run does not fit on " + plan.device + ": it needs " +
                                              memory::format_bytes(plan.total_bytes) + ", " +
                                              memory::format_bytes(capacity.free_bytes) + " available (" + capacity.source + ")");
  } else {
    log::info("memory plan: predicted peak " + memory::format_bytes(plan.peak_bytes) + " (" +
              memory::phase_name(plan.peak_phase) + "), " + memory::format_bytes(plan.total_bytes) + " with slack, of " +
              memory::format_bytes(capacity.free_bytes) + " available on " + plan.device + " (`dflash-host plan` for the table)");
  }
  return std::nullopt;
}

// train.mode = disaggregated: this rank's role (pipeline/topology.h) decides
// which plugins it creates; target rank 0 hands the target's frozen weights
// to the drafter ranks, which train among themselves on a group of their own.
int train_disaggregated(const CliOptions& options, const PluginRegistry& registry, const config::ResolvedConfig& resolved,
                        const nlohmann::json& shared_config, const std::optional<dist::LaunchEnvironment>& launch) {
  const train::TrainSettings settings = settings_of(resolved);
  if (!launch)
    throw std::invalid_argument("train.mode is disaggregated, which needs " +
                                std::to_string(settings.target_ranks + settings.drafter_ranks) +
                                " ranks (train.topology): start it with `dflash-host launch --nproc-per-node " +
                                std::to_string(settings.target_ranks + settings.drafter_ranks) +
                                " -- train …` or torchrun, or set train.mode to colocated");
  const pipeline::Topology topology(settings, launch->world_size);
  const bool target = topology.role_of(launch->rank) == pipeline::Role::kTarget;
  train::RunOptions run_options;
  // The loss answers the drafter role's plan from an instance; a drafter
  // rank then trains with that same instance (its constructor runs once).
  auto loss = instantiate<host::LossInstance>(registry, resolved, DFLASH_KIND_LOSS,
                                              config::plugin_config_of(resolved, host::kind_section(DFLASH_KIND_LOSS)));
  // Every rank plans both roles, so that all refuse together before any joins.
  {
    const RolePlans plans = plan_roles(options, registry, resolved, loss.get());
    for (const auto& [plan, verdict] : plans.roles)
      for (const std::string& missing : plan.missing)
        if (launch->rank == 0) log::warn(std::string("memory plan (") + memory::role_name(plan.role) + ") incomplete: " + missing);
    if (!plans.fits()) {
      if (launch->rank == 0) print_role_plans(plans, settings, false, std::cerr);
      const memory::PlanRole short_role =
          plans.roles[0].second && !plans.roles[0].second->fits ? plans.roles[0].first.role : plans.roles[1].first.role;
      if (const auto refused = refuse_unless_skipped(options, "the run does not fit: a " + std::string(memory::role_name(short_role)) +
                                                                  " needs more than the " +
                                                                  memory::format_bytes(plans.capacity.free_bytes) +
                                                                  " available (" + plans.capacity.source + ")"))
        return *refused;
    }
    run_options.memory_plan = plans.roles[target ? 0 : 1].first;
  }
  log::info(pipeline::describe_rank(topology, launch->rank) + " of " + std::to_string(topology.target_ranks()) + " target + " +
            std::to_string(topology.drafter_ranks()) + " drafter ranks");
  run_options.resume_from = resume_step(options);
  run_options.stop_after = options.stop_after;
  run_options.allow_config_change = options.allow_config_change;
  memory::require_device(settings.device);
  if (launch->rank == 0) run_options.output_lock = train::claim_output_dir(settings.output_dir);
  const std::unique_ptr<dist::Collective> world = dist::join(*launch, settings.device, settings.collective_timeout_s);
  try {
    train::RunPlugins plugins;
    plugins.identities_elsewhere = registry_identities(registry, resolved);
    if (target) add_target_side(registry, resolved, plugins);
    else add_drafter_side(registry, resolved, plugins, std::move(loss));
    train::Run run(std::move(plugins), resolved.root);
    dist::check_ranks_agree(*world, dist::run_fingerprint(shared_config, run.plugin_identities()));
    pipeline::exchange_at_start(run, *world, topology);
    if (target) return pipeline::run_target_rank(run, run_options, *world, topology);
    const std::unique_ptr<dist::Collective> drafters = world->subgroup(topology.drafter_world_ranks(), "drafters");
    train::TrainingRanks ranks{*world, *drafters, [&](int64_t first_step) {
                                 return pipeline::make_drafter_feed(*world, topology, run.settings(), first_step);
                               }};
    return train::run_training(run, run_options, ranks);
  } catch (const std::exception& e) {
    world->announce_failure(e.what());
    throw;
  }
}

int train(const CliOptions& options) {
  require_run_config(options);
  // A rank of several (torchrun's environment, or `dflash-host launch`):
  // its lines say which from the first one on.
  const std::optional<dist::LaunchEnvironment> launch = dist::launch_environment();
  if (launch) log::set_rank(launch->rank, launch->world_size);
  const PluginRegistry registry = load_plugins(options);
  config::ResolvedConfig resolved = resolve(options, registry, all_sections());
  // What every rank must agree on is the config as resolved; this rank's
  // device ("cuda" → cuda:LOCAL_RANK) is its own.
  const nlohmann::json shared_config = resolved.root;
  if (launch) resolved.root["train"]["device"] = dist::rank_device(settings_of(resolved).device, *launch);
  const train::TrainSettings settings = settings_of(resolved);
  if (settings.disaggregated()) return train_disaggregated(options, registry, resolved, shared_config, launch);
  auto loss = instantiate<host::LossInstance>(registry, resolved, DFLASH_KIND_LOSS,
                                              config::plugin_config_of(resolved, host::kind_section(DFLASH_KIND_LOSS)));
  train::RunOptions run_options;
  if (const auto refused = check_memory(options, registry, resolved, *loss, launch ? launch->world_size : 1,
                                             run_options.memory_plan)) return *refused;
  run_options.resume_from = resume_step(options);
  run_options.stop_after = options.stop_after;
  run_options.allow_config_change = options.allow_config_change;
  memory::require_device(settings.device);  // also with --gpu-memory
  // The output directory is claimed before the plugins load (a large target
  // takes minutes): a second run on the same directory is refused at once.
  // Rank 0 writes there, and holds it.
  if (!launch || launch->rank == 0) run_options.output_lock = train::claim_output_dir(settings.output_dir);
  const std::unique_ptr<dist::Collective> group =
      launch ? dist::join(*launch, settings.device, settings.collective_timeout_s) : dist::single_process();
  try {
    const std::unique_ptr<train::Run> run = run_from(registry, resolved, std::move(loss));
    dist::check_ranks_agree(*group, dist::run_fingerprint(shared_config, run->plugin_identities()));
    return train::run_training(*run, run_options, *group);
  } catch (const std::exception& e) {
    group->announce_failure(e.what());
    throw;
  }
}

// eval's TensorBoard file, beside its report: the report's numbers except the
// per-prompt details, tagged eval/<key> as the periodic evaluation's are
// eval_<key> in training; at the step of the checkpoint evaluated
// (a step-N folder; 0 otherwise).
std::string eval_event_file(const std::string& report) {
  const std::filesystem::path path(report);
  return (path.parent_path() / ("events.out.tfevents.eval." + path.stem().string())).string();
}
std::vector<std::pair<std::string, float>> eval_scalars(const nlohmann::json& report, const std::string& prefix = "eval") {
  nlohmann::json numbers = report;
  numbers.erase("per_prompt");
  return metrics::scalars_of(numbers, prefix);
}
// Several arms: each arm's numbers under its own name, eval/chain/<key>,
// eval/tree16/<key>, so that TensorBoard draws the arms side by side.
std::vector<std::pair<std::string, float>> eval_scalars(const std::vector<nlohmann::json>& reports) {
  if (reports.size() == 1) return eval_scalars(reports.front());
  std::vector<std::pair<std::string, float>> scalars;
  for (const nlohmann::json& report : reports) {
    const auto arm = eval_scalars(report, "eval/" + eval::arm_tag(eval::verification_of(report)));
    scalars.insert(scalars.end(), arm.begin(), arm.end());
  }
  return scalars;
}
int64_t checkpoint_step(std::string checkpoint) {
  while (checkpoint.size() > 1 && checkpoint.back() == '/') checkpoint.pop_back();
  return checkpoint::step_of(std::filesystem::path(checkpoint).filename().string()).value_or(0);
}

int evaluate(const CliOptions& options) {
  if (!options.config_file) throw std::invalid_argument("eval needs a config with target and drafter sections: --config FILE.json");
  if (!options.prompts) throw std::invalid_argument("eval needs held-out prompts: --prompts FILE.jsonl");
  // A wrong path must not cost a model load and a whole evaluation first.
  eval::check_prompts_file(*options.prompts);
  if (options.report) eval::check_report_file(*options.report);
  PluginRegistry registry = load_plugins(options);
  const config::ResolvedConfig resolved = resolve(options, registry, {"target", "drafter"});
  memory::require_device(settings_of(resolved).device);
  train::RunPlugins plugins;
  plugins.target = instantiate<host::TargetModelInstance>(registry, resolved, DFLASH_KIND_TARGET_MODEL,
                                                          config::plugin_config_of(resolved, "target"));
  plugins.drafter = instantiate<host::DrafterInstance>(registry, resolved, DFLASH_KIND_DRAFTER,
                                                       config::plugin_config_of(resolved, "drafter"));
  train::Run run(std::move(plugins), resolved.root);
  run.bind();
  const nlohmann::json& target_info = run.target_info();
  run.drafter().set_training(false);
  eval::EvalSettings settings;
  settings.prompts_file = *options.prompts;
  settings.drafter_checkpoint = options.drafter_checkpoint.value_or("");
  settings.max_new_tokens = options.max_new_tokens;
  settings.max_length = options.max_length;
  settings.prompt_tokens = options.prompt_tokens;
  settings.max_prompts = options.max_prompts;
  settings.baseline = options.baseline;
  settings.warmup = options.warmup;
  settings.draft_tokens = options.draft_tokens;
  if (!settings.drafter_checkpoint.empty()) eval::load_drafter_checkpoint(settings.drafter_checkpoint, run.drafter(), target_info);
  const std::vector<eval::Prompt> prompts = eval::read_prompts(settings, target_info);
  const std::vector<nlohmann::json> reports = eval::evaluate_arms(run.target(), run.drafter(), run.drafter_facts(), prompts,
                                                                  settings, options.verifications, target_info);
  // One arm: the report as it always was. Several: each arm's, then the
  // comparison, and the file holds both.
  nlohmann::json document = reports.front();
  for (size_t i = 0; i < reports.size(); ++i) std::cout << (i > 0 ? "\n" : "") << eval::format_report(reports[i]);
  if (reports.size() > 1) {
    const nlohmann::json comparison = eval::compare_arms(reports);
    std::cout << "\n" << eval::format_comparison(comparison);
    document = {{"arms", reports}, {"comparison", comparison}};
  }
  if (options.report) {
    std::ofstream out(*options.report);
    if (!(out << document.dump(2) << "\n")) throw std::runtime_error(*options.report + ": cannot write the report");
    std::cout << "\nreport: " << *options.report << "\n";
    const std::string events = eval_event_file(*options.report);
    metrics::write_event_file(events, checkpoint_step(settings.drafter_checkpoint), eval_scalars(reports));
    std::cout << "TensorBoard: " << events << "\n";
  }
  return kExitOk;
}

}  // namespace

PluginRegistry find_plugins(const CliOptions& options) { return load_plugins(options); }

TargetOnly make_target(const CliOptions& options, const PluginRegistry& registry) {
  const config::ResolvedConfig resolved = resolve(options, registry, {"target"});
  const train::TrainSettings settings = settings_of(resolved);
  memory::require_device(settings.device);
  return {instantiate<host::TargetModelInstance>(registry, resolved, DFLASH_KIND_TARGET_MODEL,
                                                 config::plugin_config_of(resolved, "target")),
          settings};
}

nlohmann::json target_facts(const CliOptions& options, const PluginRegistry& registry) {
  const config::ResolvedConfig resolved = resolve(options, registry, {"target"});
  const PluginRecord& record =
      registry.find(DFLASH_KIND_TARGET_MODEL, resolved.root.at("target").at("plugin").get<std::string>());
  const host::InstanceOptions instance = train::instance_options(settings_of(resolved));
  const nlohmann::json batch{{"rows", 1}, {"row_length", 1}};
  return host::plan_memory(record, config::plugin_config_of(resolved, "target"), instance, batch).facts;
}

std::unique_ptr<host::DataSourceInstance> make_data_source(const CliOptions& options, const PluginRegistry& registry,
                                                           int64_t target_vocab, int64_t epochs) {
  const config::ResolvedConfig resolved = resolve(options, registry, {"data"});
  nlohmann::json data_config = data_config_for(resolved, {{"vocab_size", target_vocab}});
  if (epochs > 0) {
    const std::string plugin = resolved.root.at("data").at("plugin").get<std::string>();
    if (!data_config.contains("epochs"))
      throw std::invalid_argument(options.command + " reads the data for " + std::to_string(epochs) +
                                  " epoch(s), but data plugin '" + plugin +
                                  "' has no 'epochs' setting to end it there; use a data source that has one");
    data_config["epochs"] = epochs;
  }
  return instantiate<host::DataSourceInstance>(registry, resolved, DFLASH_KIND_DATA_SOURCE, data_config);
}

int run_command(const CliOptions& options) {
  if (options.command == "ab") return run_ab(options);
  if (options.command == "token-counts") return run_token_counts(options);
  if (options.command == "eval") return evaluate(options);
  if (options.command == "generate") return run_generate(options);
  if (options.command == "prepare") return run_prepare(options);
  if (options.command == "list") return list_plugins(options);
  if (options.command == "describe") return describe_plugin(options);
  if (options.command == "config") return print_config(options);
  if (options.command == "plan") return plan(options);
  return train(options);
}

}  // namespace dflash::cli
