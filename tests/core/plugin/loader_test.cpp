// Every loader failure mode, each against a real broken shared object built
// by tests/fixtures/plugins/broken: the message must name the file and say what to do.
#include "plugin/instances.h"
#include "plugin/registry.h"

#include "support/expect.h"

#include <gtest/gtest.h>
#include <torch/version.h>

#include <filesystem>
#include <regex>

#include <signal.h>

namespace fs = std::filesystem;
using dflash::host::PluginLookupError;
using dflash::host::PluginRegistry;

namespace {

const std::string kHostAbi = std::to_string(DFLASH_ABI_MAJOR) + "." + std::to_string(DFLASH_ABI_MINOR);

fs::path broken(const std::string& name) {
  return fs::path(DFLASH_BROKEN_PLUGIN_DIR) / name / ("lib" + name + ".so");
}

// The plugins that crash the process, kept apart from the broken ones.
fs::path crashing(const std::string& name) {
  return fs::weakly_canonical(fs::path(DFLASH_CRASHING_PLUGIN_DIR) / name / ("lib" + name + ".so"));
}

// Literal text as a death test's (POSIX extended) regular expression.
std::string literally(const std::string& text) {
  return std::regex_replace(text, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)");
}

// Loads one broken library alone and returns its single problem message.
std::string problem_of(const std::string& name) {
  PluginRegistry registry;
  registry.add_library(broken(name));
  EXPECT_TRUE(registry.plugins().empty()) << name;
  EXPECT_EQ(registry.problems().size(), 1u) << name;
  if (registry.problems().empty()) return "";
  const std::string& message = registry.problems().front().message;
  EXPECT_NE(message.find(fs::weakly_canonical(broken(name)).string()), std::string::npos)
      << "the message must name the file: " << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << "one line: " << message;
  return message;
}


TEST(Loader, NotASharedObject) {
  const std::string m = problem_of("not_elf");
  EXPECT_CONTAINS(m, "not a shared object");
  EXPECT_CONTAINS(m, "remove it from the plugin directory");
}

TEST(Loader, NoEntrySymbol) {
  const std::string m = problem_of("no_entry");
  EXPECT_CONTAINS(m, "no entry symbol 'dflash_plugin_entry_v1'");
  EXPECT_CONTAINS(m, "DFLASH_PLUGINS");
}

TEST(Loader, AbiMajorMismatchNamesBothVersions) {
  const std::string m = problem_of("abi_major");
  EXPECT_CONTAINS(m, "built for plugin ABI 2.x");
  EXPECT_CONTAINS(m, "dflash_plugin_entry_v2");
  EXPECT_CONTAINS(m, "this host speaks ABI " + kHostAbi);
  EXPECT_CONTAINS(m, "rebuild the plugin against dflash-sdk 1.x");
}

TEST(Loader, MajorFieldDisagreeingWithSymbol) {
  const std::string m = problem_of("major_field");
  EXPECT_CONTAINS(m, "declares ABI 7." + std::to_string(DFLASH_ABI_MINOR));
  EXPECT_CONTAINS(m, "this host speaks ABI " + kHostAbi);
}

TEST(Loader, NewerMinorThanHost) {
  const std::string m = problem_of("newer_minor");
  EXPECT_CONTAINS(m, "built against plugin ABI 1." + std::to_string(DFLASH_ABI_MINOR + 5) + ", newer than this host's ABI " +
                        kHostAbi);
  EXPECT_CONTAINS(m, "upgrade dflash-host");
}

TEST(Loader, StructSizeTooSmall) {
  const std::string m = problem_of("small_struct");
  EXPECT_CONTAINS(m, "plugin descriptor struct_size is 8 bytes, smaller than the");
  EXPECT_CONTAINS(m, "rebuild it");
}

TEST(Loader, UnknownKind) {
  const std::string m = problem_of("unknown_kind");
  EXPECT_CONTAINS(m, "plugin 'unknown_kind' declares unknown kind 42");
  EXPECT_CONTAINS(m, "known: 1 data source");
}

TEST(Loader, MissingRequiredVtableSlot) {
  const std::string m = problem_of("missing_slot");
  EXPECT_CONTAINS(m, "loss plugin 'missing_slot' leaves required vtable slot 'compute' NULL");
}

TEST(Loader, LibTorchBuildMismatch) {
  const std::string m = problem_of("torch_mismatch");
  EXPECT_CONTAINS(m, "built against LibTorch 0.4.1 (CUDA 9.2, C++11 ABI 0)");
  EXPECT_CONTAINS(m, "but this host uses LibTorch " TORCH_VERSION);
  EXPECT_CONTAINS(m, "rebuild the plugin against the host's LibTorch");
}

TEST(Loader, PartOfAnOptionalGroup) {
  const std::string m = problem_of("partial_decode");
  EXPECT_CONTAINS(m, "target model plugin 'partial_decode' implements part of the optional decoding group");
  EXPECT_CONTAINS(m, "'decode_extend', 'decode_truncate', 'decode_end' NULL");
  EXPECT_CONTAINS(m, "set all of its slots or none");
}

TEST(Loader, BatchedDecodingWithoutTheDecodingGroup) {
  const std::string m = problem_of("batch_without_decode");
  EXPECT_CONTAINS(m, "target model plugin 'batch_without_decode' sets 'decode_extend_batch' without the decoding group");
  EXPECT_CONTAINS(m, "set the group too, or leave decode_extend_batch NULL");
}

TEST(Loader, TreeVerificationSlotsComeInPairsBesideTheirGroups) {
  std::string m = problem_of("half_tree");
  EXPECT_CONTAINS(m, "target model plugin 'half_tree' implements part of the optional tree verification group");
  EXPECT_CONTAINS(m, "'decode_accept_path' NULL; set all of its slots or none");
  m = problem_of("tree_without_decode");
  EXPECT_CONTAINS(m, "target model plugin 'tree_without_decode' sets 'decode_verify_tree' and 'decode_accept_path' without the "
                     "decoding group");
  m = problem_of("topk_without_draft");
  EXPECT_CONTAINS(m, "drafter plugin 'topk_without_draft' sets 'draft_propose_topk' without the drafting group");
  EXPECT_CONTAINS(m, "set the group too, or leave draft_propose_topk NULL");
}

// export_config became required in ABI 1.5: a drafter of this ABI without it
// is refused at load, naming the slot and the version; one built for 1.4,
// when it was optional, still loads (and is refused only where a run needs
// the facts, as before).
TEST(Loader, ADrafterOfAbi15WithoutExportConfigIsRefusedOneOf14Loads) {
  const std::string m = problem_of("no_export_config");
  EXPECT_CONTAINS(m, "drafter plugin 'no_export_config' (ABI " + kHostAbi +
                         ") leaves vtable slot 'export_config' NULL, required since ABI 1.5");
  EXPECT_CONTAINS(m, "block_size and target_layer_ids");
  PluginRegistry registry;
  registry.add_library(broken("no_export_config_1_4"));
  EXPECT_TRUE(registry.problems().empty()) << registry.problems().front().message;
  ASSERT_EQ(registry.plugins().size(), 1u);
  EXPECT_EQ(registry.plugins().front().abi_minor, 4u);
}

TEST(Loader, InvalidConfigSchema) {
  const std::string m = problem_of("bad_schema");
  EXPECT_CONTAINS(m, "loss plugin 'bad_schema' has an invalid config schema");
  EXPECT_CONTAINS(m, "\"x\"");
}

TEST(Loader, DuplicateNamesBothFilesAndNeitherWins) {
  PluginRegistry registry;
  registry.add_library(broken("twin_a"));
  registry.add_library(broken("twin_b"));
  ASSERT_EQ(registry.problems().size(), 1u);
  const std::string& m = registry.problems().front().message;
  EXPECT_CONTAINS(m, "duplicate loss plugin 'twin'");
  EXPECT_CONTAINS(m, fs::weakly_canonical(broken("twin_a")).string());
  EXPECT_CONTAINS(m, fs::weakly_canonical(broken("twin_b")).string());
  EXPECT_TRUE(registry.plugins().empty());
  try {
    registry.find(DFLASH_KIND_LOSS, "twin");
    FAIL() << "an ambiguous plugin must not be chosen";
  } catch (const PluginLookupError& e) {
    EXPECT_CONTAINS(std::string(e.what()), "defined twice");
    EXPECT_CONTAINS(std::string(e.what()), "libtwin_a.so");
    EXPECT_CONTAINS(std::string(e.what()), "libtwin_b.so");
  }
}

TEST(Loader, CreateReturningAnErrorIsReportedWithThePluginAndFile) {
  PluginRegistry registry;
  registry.add_library(broken("create_error"));
  ASSERT_TRUE(registry.problems().empty());
  const auto& record = registry.find(DFLASH_KIND_LOSS, "create_error");
  try {
    dflash::host::LossInstance instance(record, nlohmann::json::object(), {});
    FAIL() << "create must fail";
  } catch (const dflash::host::PluginCallError& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.code(), DFLASH_ERR_INVALID_CONFIG);
    EXPECT_CONTAINS(m, "loss plugin 'create_error'");
    EXPECT_CONTAINS(m, "libcreate_error.so");
    EXPECT_CONTAINS(m, "failed to create (invalid config)");
    EXPECT_CONTAINS(m, "/nonexistent/w.bin");
  }
}

TEST(Loader, CreateThrowingIsCaughtByTheSdkAndReported) {
  PluginRegistry registry;
  registry.add_directory(DFLASH_GOOD_PLUGIN_DIR);
  const auto& record = registry.find(DFLASH_KIND_LOSS, "throwing_loss");
  try {
    dflash::host::LossInstance instance(record, nlohmann::json::object(), {});
    FAIL() << "create must fail";
  } catch (const dflash::host::PluginCallError& e) {
    EXPECT_EQ(e.code(), DFLASH_ERR_INTERNAL);
    EXPECT_CONTAINS(std::string(e.what()), "loss plugin 'throwing_loss'");
    EXPECT_CONTAINS(std::string(e.what()), "cannot open /nonexistent/table.bin");
  }
}

// A plugin runs in the host's process and can take it down; the guard's line
// names it. Death tests fork (threadsafe style: LibTorch may have threads).
TEST(LoaderDeathTest, CrashWhileLoadingNamesTheLibrary) {
  testing::GTEST_FLAG(death_test_style) = "threadsafe";
  const fs::path abort_at_load = crashing("abort_at_load");
  EXPECT_EXIT({ PluginRegistry().add_library(abort_at_load); }, testing::KilledBySignal(SIGABRT),
              literally("dflash-host: crashed while loading plugin library " + abort_at_load.string() +
                        " (SIGABRT, aborted); in-process plugins can crash the host"));
  const fs::path crash_in_entry = crashing("crash_in_entry");
  EXPECT_EXIT({ PluginRegistry().add_library(crash_in_entry); }, testing::KilledBySignal(SIGSEGV),
              literally("dflash-host: crashed while loading plugin library " + crash_in_entry.string() +
                        " (SIGSEGV, segmentation fault)"));
}

TEST(LoaderDeathTest, CrashInCreateNamesThePlugin) {
  testing::GTEST_FLAG(death_test_style) = "threadsafe";
  const fs::path file = crashing("crash_in_create");
  PluginRegistry registry;
  registry.add_library(file);  // loading it is harmless ...
  const auto& record = registry.find(DFLASH_KIND_LOSS, "crash_in_create");
  // ... creating an instance is not.
  EXPECT_EXIT({ dflash::host::LossInstance loss(record, nlohmann::json::object(), {}); }, testing::KilledBySignal(SIGSEGV),
              literally("dflash-host: crashed while creating loss plugin 'crash_in_create' (" + file.string() +
                        ") (SIGSEGV, segmentation fault); in-process plugins can crash the host"));
}

// Outside a guard the host's own handlers (or the defaults) are in force.
TEST(Loader, CrashGuardPutsBackTheHandlersItReplaced) {
  struct sigaction mine {};
  mine.sa_handler = [](int) {};
  sigemptyset(&mine.sa_mask);
  struct sigaction saved {};
  ASSERT_EQ(::sigaction(SIGFPE, &mine, &saved), 0);
  {
    const dflash::host::PluginCrashGuard outer("loading a");
    {
      const dflash::host::PluginCrashGuard inner("loading b");
    }
    struct sigaction during {};
    ::sigaction(SIGFPE, nullptr, &during);
    EXPECT_NE(during.sa_handler, mine.sa_handler) << "the guard's handler is installed";
  }
  struct sigaction after {};
  ::sigaction(SIGFPE, nullptr, &after);
  EXPECT_EQ(after.sa_handler, mine.sa_handler);
  ::sigaction(SIGFPE, &saved, nullptr);
  struct sigaction before_load {};
  ::sigaction(SIGSEGV, nullptr, &before_load);
  PluginRegistry registry;
  registry.add_library(broken("twin_a"));  // a sound library: the guard comes and goes
  ::sigaction(SIGSEGV, nullptr, &after);
  EXPECT_EQ(after.sa_handler, before_load.sa_handler);
}

TEST(Loader, RequestedPluginNotFoundListsWhatExists) {
  PluginRegistry registry;
  registry.add_directory(DFLASH_GOOD_PLUGIN_DIR);
  try {
    registry.find(DFLASH_KIND_LOSS, "fused_ckpt_kl");
    FAIL() << "must not be found";
  } catch (const PluginLookupError& e) {
    const std::string m = e.what();
    EXPECT_CONTAINS(m, "no loss plugin named 'fused_ckpt_kl'");
    EXPECT_CONTAINS(m, "test_loss (libtest_plugins.so)");
    EXPECT_CONTAINS(m, "throwing_loss");
    EXPECT_CONTAINS(m, fs::weakly_canonical(DFLASH_GOOD_PLUGIN_DIR).string());
    EXPECT_EQ(m.find("c_data"), std::string::npos) << "only plugins of the asked kind are listed";
  }
}

TEST(Loader, BrokenLibrariesNeverStopTheOthers) {
  PluginRegistry registry;
  registry.add_directory(DFLASH_BROKEN_PLUGIN_DIR);
  registry.add_directory(DFLASH_GOOD_PLUGIN_DIR);
  // Every broken library is skipped with its own line ...
  EXPECT_GE(registry.problems().size(), 10u);
  // ... and the sound ones all load: create_error loads (it fails later, at create).
  EXPECT_NO_THROW(registry.find(DFLASH_KIND_LOSS, "create_error"));
  EXPECT_NO_THROW(registry.find(DFLASH_KIND_LOSS, "test_loss"));
  EXPECT_NO_THROW(registry.find(DFLASH_KIND_DATA_SOURCE, "c_data"));
  EXPECT_NO_THROW(registry.find(DFLASH_KIND_DRAFTER, "test_drafter"));
}

TEST(Loader, OverlappingSearchPathsLoadEachLibraryOnce) {
  PluginRegistry registry;
  registry.add_directory(DFLASH_GOOD_PLUGIN_DIR);
  registry.add_directory(fs::path(DFLASH_GOOD_PLUGIN_DIR) / "..");  // the parent holds the same files
  registry.add_library(fs::path(DFLASH_GOOD_PLUGIN_DIR) / "libtest_plugins.so");
  EXPECT_NO_THROW(registry.find(DFLASH_KIND_LOSS, "test_loss")) << "not mistaken for a duplicate";
  for (const auto& problem : registry.problems())
    EXPECT_EQ(problem.message.find("test_plugins.so: duplicate"), std::string::npos) << problem.message;
}

TEST(Loader, MissingPluginDirectoryIsAClearError) {
  PluginRegistry registry;
  try {
    registry.add_directory("/nonexistent/plugins");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_CONTAINS(std::string(e.what()), "plugin directory '/nonexistent/plugins' does not exist");
  }
}

TEST(Loader, RecordsWhatTheListingShows) {
  PluginRegistry registry;
  registry.add_directory(DFLASH_GOOD_PLUGIN_DIR);
  const auto& loss = registry.find(DFLASH_KIND_LOSS, "test_loss");
  EXPECT_EQ(loss.version, "2.3.4");
  EXPECT_EQ(loss.abi_major, 1u);
  EXPECT_EQ(loss.abi_minor, static_cast<uint32_t>(DFLASH_ABI_MINOR));
  EXPECT_CONTAINS(loss.torch_build, "LibTorch " TORCH_VERSION);
  EXPECT_EQ(loss.schema.at("properties").at("scale").at("default").get<double>(), 1.0);
  const auto& c_data = registry.find(DFLASH_KIND_DATA_SOURCE, "c_data");
  EXPECT_CONTAINS(c_data.torch_build, "no LibTorch");
}

}  // namespace
