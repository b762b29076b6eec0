// The in-tree data sources (jsonl, synthetic), loaded as dflash-host loads
// them: packing, shuffling, resuming, and every kind of bad line.
#include "config/config_schema.h"
#include "plugin/instances.h"
#include "plugin/registry.h"
#include "support/expect.h"
#include "support/temp_dir.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <fstream>
#include <map>
#include <set>

#include <signal.h>
#include <unistd.h>

namespace {
using namespace dflash::host;

class DataSources : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_.add_directory(DFLASH_INTREE_PLUGIN_DIR);
    temp_ = std::make_unique<dflash::test::TempDir>("dflash_data");
  }
  std::unique_ptr<DataSourceInstance> make(const std::string& name, const nlohmann::json& config, uint64_t seed = 7) {
    const PluginRecord& record = registry_.find(DFLASH_KIND_DATA_SOURCE, name);
    return std::make_unique<DataSourceInstance>(record, dflash::config::validate_and_fill(record.schema, config, "data", ""),
                                                InstanceOptions{"cpu", "float32", seed});
  }
  std::string write(const std::string& name, const std::vector<std::string>& lines) {
    const std::string path = temp_->path().string() + "/" + name;
    std::ofstream out(path);
    for (const auto& line : lines) out << line << "\n";
    return path;
  }
  // Exact bytes (NULs included), for the binary and NUL-byte cases.
  std::string write_bytes(const std::string& name, const std::string& bytes) {
    const std::string path = temp_->path().string() + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  PluginRegistry registry_;
  std::unique_ptr<dflash::test::TempDir> temp_;
};

// Bounds a call that used to loop forever: past `seconds`, the test process
// says so and exits non-zero instead of hanging CI (each test runs in its own
// process under ctest).
class Watchdog {
 public:
  explicit Watchdog(unsigned seconds) {
    ::signal(SIGALRM, [](int) {
      static const char message[] = "\nFAILED: the call did not return within the watchdog's time (an endless loop?)\n";
      (void)!::write(2, message, sizeof message - 1);
      ::_exit(1);
    });
    ::alarm(seconds);
  }
  ~Watchdog() { ::alarm(0); }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
};

torch::Tensor get(const NamedTensors& t, const std::string& name) {
  for (const auto& [n, tensor] : t)
    if (n == name) return tensor;
  ADD_FAILURE() << "missing " << name;
  return {};
}

// The documents of a batch, in row order, each as its token ids (padding,
// which starts with id 0 here, left out).
std::vector<std::vector<int64_t>> documents_of(const NamedTensors& batch) {
  const auto ids = get(batch, "input_ids"), docs = get(batch, "document_ids"), positions = get(batch, "position_ids");
  std::vector<std::vector<int64_t>> out;
  for (int64_t r = 0; r < ids.size(0); ++r) {
    int64_t current = -1;
    for (int64_t c = 0; c < ids.size(1); ++c) {
      const int64_t d = docs[r][c].item<int64_t>();
      if (d != current) {
        EXPECT_EQ(positions[r][c].item<int64_t>(), 0) << "positions restart at each document";
        out.emplace_back();
        current = d;
      } else {
        EXPECT_EQ(positions[r][c].item<int64_t>(), positions[r][c - 1].item<int64_t>() + 1);
      }
      out.back().push_back(ids[r][c].item<int64_t>());
    }
  }
  std::vector<std::vector<int64_t>> real;
  for (auto& d : out)
    if (d.front() != 0) real.push_back(d);
  return real;
}

std::string line(const std::vector<int64_t>& ids, const std::vector<int>& mask) {
  return nlohmann::json{{"input_ids", ids}, {"loss_mask", mask}}.dump();
}

// Sequence k: first token k + 1 (unique, never the pad id 0), length 3 + k % 7.
std::vector<std::string> good_lines(int count) {
  std::vector<std::string> lines;
  for (int k = 0; k < count; ++k) {
    std::vector<int64_t> ids = {k + 1};
    for (int i = 1; i < 3 + k % 7; ++i) ids.push_back((k * 7 + i) % 50 + 1);
    std::vector<int> mask(ids.size(), 1);
    mask[0] = 0;
    lines.push_back(line(ids, mask));
  }
  return lines;
}

TEST_F(DataSources, JsonlCoversEveryGoodLineOncePerEpochAndCountsEachKindOfBadLine) {
  auto lines = good_lines(30);
  // One bad line of each kind, between the good ones.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{not json", "not a JSON object"},
      {R"({"loss_mask": [1, 1]})", "no input_ids array"},
      {R"({"input_ids": [1, 2]})", "no loss_mask array"},
      {R"({"input_ids": [1, 2, 3], "loss_mask": [1, 1]})", "lengths differ"},
      {R"({"input_ids": [1, 99], "loss_mask": [1, 1]})", "id outside the vocabulary"},
      {R"({"input_ids": [1, -2], "loss_mask": [1, 1]})", "id outside the vocabulary"},
      {R"({"input_ids": [1, 2.5], "loss_mask": [1, 1]})", "non-integer id"},
      {R"({"input_ids": [1, 2], "loss_mask": [1, 2]})", "loss_mask not 0/1"},
      {R"({"input_ids": [1, 2, 3], "loss_mask": [1, 0, 1]})", "no two consecutive supervised tokens"},
  };
  std::vector<std::string> all;
  for (size_t i = 0; i < lines.size(); ++i) {
    all.push_back(lines[i]);
    if (i < bad.size()) all.push_back(bad[i].first);
    if (i == 3) all.push_back("   ");  // blank: not a sequence
  }
  const std::string path = write("mixed.jsonl", all);
  auto data = make("jsonl", {{"path", path}, {"vocab_size", 60}, {"row_length", 16}, {"tokens_per_batch", 48}, {"epochs", 1}});
  std::multiset<int64_t> seen;
  int batches = 0;
  while (auto batch = data->next_batch()) {
    ++batches;
    EXPECT_LE(get(*batch, "input_ids").size(0), 3);
    EXPECT_EQ(get(*batch, "input_ids").size(1), 16);
    for (const auto& doc : documents_of(*batch)) seen.insert(doc.front());
  }
  EXPECT_GT(batches, 3);
  std::multiset<int64_t> expected;
  for (int k = 0; k < 30; ++k) expected.insert(k + 1);
  EXPECT_EQ(seen, expected) << "every good line exactly once";
  const nlohmann::json facts = *data->describe();
  EXPECT_EQ(facts.at("sequences"), 30 + bad.size());
  EXPECT_EQ(facts.at("blank_lines"), 1);
  EXPECT_EQ(facts.at("sequences_used"), 30);
  EXPECT_EQ(facts.at("bad_lines"), bad.size());
  std::map<std::string, int> by_reason;
  for (const auto& [text, reason] : bad) ++by_reason[reason];
  for (const auto& [reason, n] : by_reason) EXPECT_EQ(facts.at("bad_lines_by_reason").at(reason), n) << reason;
  EXPECT_FALSE(data->next_batch().has_value()) << "the data stays ended";
}

TEST_F(DataSources, JsonlStopPolicyNamesFileAndLine) {
  auto lines = good_lines(4);
  lines.insert(lines.begin() + 2, R"({"input_ids": [1, 99], "loss_mask": [1, 1]})");
  const std::string path = write("stop.jsonl", lines);
  auto data = make("jsonl", {{"path", path}, {"vocab_size", 60}, {"row_length", 16}, {"tokens_per_batch", 64},
                             {"shuffle", false}, {"on_bad_line", "stop"}});
  try {
    data->next_batch();
    FAIL() << "a bad line under on_bad_line = stop must fail";
  } catch (const PluginCallError& e) {
    EXPECT_CONTAINS(e.what(), path + ":3: input_ids[1] = 99 is outside the vocabulary [0, 60)");
    EXPECT_CONTAINS(e.what(), "on_bad_line is stop");
  }
}

TEST_F(DataSources, JsonlShufflesBySeedAndResumesExactly) {
  const std::string path = write("many.jsonl", good_lines(200));
  const nlohmann::json config = {{"path", path}, {"vocab_size", 300}, {"row_length", 32}, {"tokens_per_batch", 64}};
  auto order = [&](uint64_t seed, bool shuffle) {
    nlohmann::json c = config;
    c["shuffle"] = shuffle;
    auto data = make("jsonl", c, seed);
    std::vector<int64_t> firsts;
    for (int i = 0; i < 5; ++i)
      for (const auto& doc : documents_of(*data->next_batch())) firsts.push_back(doc.front());
    return firsts;
  };
  EXPECT_EQ(order(1, true), order(1, true)) << "same seed, same order";
  EXPECT_NE(order(1, true), order(2, true));
  // Unshuffled, the first batches hold exactly the file's first lines (rows
  // are filled first-fit, so within a batch the order may differ).
  auto plain = order(1, false);
  std::sort(plain.begin(), plain.end());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(plain[i], static_cast<int64_t>(i) + 1) << "file order";

  // Uninterrupted: 40 batches (several epochs of 200 lines). Interrupted after 17.
  auto whole = make("jsonl", config, 3);
  std::vector<NamedTensors> expected;
  for (int i = 0; i < 40; ++i) expected.push_back(*whole->next_batch());
  auto first = make("jsonl", config, 3);
  for (int i = 0; i < 17; ++i) first->next_batch();
  const std::string state = first->save_state();
  auto resumed = make("jsonl", config, 3);
  resumed->load_state(state);
  for (int i = 17; i < 40; ++i) {
    const NamedTensors got = *resumed->next_batch();
    for (const char* name : {"input_ids", "loss_mask", "position_ids", "document_ids"})
      EXPECT_TRUE(torch::equal(get(got, name), get(expected[i], name))) << name << " of batch " << i;
  }
  EXPECT_GT(nlohmann::json::parse(resumed->save_state()).at("epoch").get<int64_t>(), 1);

  // A position saved on other data is refused.
  const std::string shorter = write("shorter.jsonl", good_lines(150));
  nlohmann::json other = config;
  other["path"] = shorter;
  auto changed = make("jsonl", other, 3);
  try {
    changed->load_state(state);
    FAIL();
  } catch (const PluginCallError& e) {
    EXPECT_CONTAINS(e.what(), "the saved position is for 200 lines but");
  }
}

TEST_F(DataSources, JsonlLongSequencesAreTruncatedOrSkippedAndCounted) {
  std::vector<int64_t> long_ids(40, 5);
  long_ids[0] = 9;
  const std::string path = write("long.jsonl", {line(long_ids, std::vector<int>(40, 1)), good_lines(2)[0], good_lines(2)[1]});
  for (const std::string policy : {"truncate", "skip"}) {
    auto data = make("jsonl", {{"path", path}, {"vocab_size", 60}, {"row_length", 16}, {"tokens_per_batch", 64},
                               {"epochs", 1}, {"shuffle", false}, {"long_sequences", policy}});
    std::vector<std::vector<int64_t>> docs;
    while (auto batch = data->next_batch())
      for (auto& d : documents_of(*batch)) docs.push_back(d);
    const nlohmann::json facts = *data->describe();
    if (policy == "truncate") {
      ASSERT_EQ(docs.size(), 3u);
      EXPECT_EQ(docs[0].size(), 16u);
      EXPECT_EQ(facts.at("truncated"), 1);
    } else {
      EXPECT_EQ(docs.size(), 2u);
      EXPECT_EQ(facts.at("skipped_too_long"), 1);
    }
  }
}

TEST_F(DataSources, JsonlReadsADirectoryInNameOrderAndRejectsBadPaths) {
  const std::string dir = temp_->path().string() + "/shards";
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  auto lines = good_lines(6);
  { std::ofstream(dir + "/b.jsonl") << lines[3] << "\n" << lines[4] << "\n" << lines[5]; }  // no final newline
  { std::ofstream(dir + "/a.jsonl") << lines[0] << "\n" << lines[1] << "\n" << lines[2] << "\n"; }
  { std::ofstream(dir + "/notes.txt") << "not data\n"; }
  auto data = make("jsonl", {{"path", dir}, {"vocab_size", 60}, {"row_length", 16}, {"tokens_per_batch", 160},
                             {"shuffle", false}, {"epochs", 1}});
  std::vector<int64_t> firsts;
  while (auto batch = data->next_batch())
    for (const auto& doc : documents_of(*batch)) firsts.push_back(doc.front());
  std::sort(firsts.begin(), firsts.end());
  EXPECT_EQ(firsts, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(data->describe()->at("files"), 2);
  try {
    make("jsonl", {{"path", temp_->path().string() + "/missing.jsonl"}, {"vocab_size", 60}});
    FAIL();
  } catch (const PluginCallError& e) {
    EXPECT_CONTAINS(e.what(), "data.jsonl.path: " + temp_->path().string() + "/missing.jsonl: cannot read");
  }
  try {
    make("jsonl", {{"path", write("ok.jsonl", good_lines(1))}});
    FAIL();
  } catch (const PluginCallError& e) {
    EXPECT_CONTAINS(e.what(), "data.jsonl.vocab_size: must be at least 2");
  }
}

TEST_F(DataSources, SyntheticIsDeterministicPackedAndResumable) {
  const nlohmann::json config = {{"vocab_size", 100}, {"sequences", 20}, {"min_length", 8}, {"max_length", 40},
                                 {"row_length", 64}, {"tokens_per_batch", 256}, {"prompt_fraction", 0.25}};
  auto a = make("synthetic", config, 5), b = make("synthetic", config, 5), c = make("synthetic", config, 6);
  const NamedTensors first = *a->next_batch();
  EXPECT_TRUE(torch::equal(get(first, "input_ids"), get(*b->next_batch(), "input_ids")));
  EXPECT_FALSE(torch::equal(get(first, "input_ids"), get(*c->next_batch(), "input_ids")));
  EXPECT_EQ(get(first, "input_ids").size(0), 4);
  EXPECT_LT(get(first, "input_ids").max().item<int64_t>(), 100);
  // The prompt part of every document is unsupervised; the rest supervised.
  const auto mask = get(first, "loss_mask"), positions = get(first, "position_ids"), docs = get(first, "document_ids");
  EXPECT_EQ(mask.select(1, 0).sum().item<int64_t>(), 0) << "position 0 is always prompt";
  EXPECT_GT(mask.sum().item<int64_t>(), 0);

  for (int i = 0; i < 3; ++i) a->next_batch();
  const std::string state = a->save_state();
  auto resumed = make("synthetic", config, 5);
  resumed->load_state(state);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(torch::equal(get(*a->next_batch(), "input_ids"), get(*resumed->next_batch(), "input_ids")));

  nlohmann::json one_epoch = config;
  one_epoch["epochs"] = 1;
  auto finite = make("synthetic", one_epoch, 5);
  int64_t documents = 0;
  while (auto batch = finite->next_batch()) documents += static_cast<int64_t>(documents_of(*batch).size());
  EXPECT_EQ(documents, 20) << "an epoch is `sequences` documents";
}

// Issue 14, point 9: all-bad data used to spin forever in next_batch with the
// default epochs = 0, and end silently (nothing trained) with epochs = 1.
// Each way of having no usable sequence must fail fast with the data report.
TEST_F(DataSources, JsonlAnEpochWithNoUsableSequenceFailsWithTheDataReport) {
  struct Case {
    std::string name;
    std::string bytes;
    nlohmann::json settings;
    std::vector<std::string> expected;  // in the message, besides the common part
  };
  std::string gzip_like("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03", 10);  // a gzip header: NULs and binary
  gzip_like += std::string("\xcb\x48\xcd\xc9\xc9\x57\x00\x02\n\x93\x00\x45\x12\x00\n\xff\xfe\x00\x01", 19);
  std::string out_of_vocabulary, unsupervised_after_truncation, too_long;
  for (int k = 0; k < 3; ++k) {
    out_of_vocabulary += line({1, 70 + k, 2}, {1, 1, 1}) + "\n";
    unsupervised_after_truncation += line({1, 2, 3, 4}, {0, 1, 1, 1}) + "\n";  // [0, 1] once cut to 2 tokens
    too_long += line(std::vector<int64_t>(20, 3), std::vector<int>(20, 1)) + "\n";
  }
  const std::vector<Case> cases = {
      {"vocab.jsonl", out_of_vocabulary, {{"epochs", 0}}, {"3 id outside the vocabulary", "The vocabulary size in use is 60"}},
      {"archive.jsonl", gzip_like, {{"epochs", 0}}, {"3 NUL bytes", "is the file compressed", "archive.jsonl is compressed: gzip (gunzip it)."}},
      {"short_rows.jsonl", unsupervised_after_truncation, {{"epochs", 1}, {"row_length", 2}},
       {"3 no two consecutive supervised tokens", "after truncation to row_length (2)"}},
      {"too_long.jsonl", too_long, {{"epochs", 1}, {"long_sequences", "skip"}},
       {"3 longer than row_length (16)", "set long_sequences to truncate"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = write_bytes(c.name, c.bytes);
    nlohmann::json config = {{"path", path}, {"vocab_size", 60}, {"row_length", 16}, {"tokens_per_batch", 64}};
    config.update(c.settings);
    auto data = make("jsonl", config);
    for (int call = 0; call < 2; ++call) {  // and it stays failed: no "end of data" on a second call
      Watchdog watchdog(20);
      try {
        data->next_batch();
        FAIL() << "data with no usable sequence must fail, not " << (call == 0 ? "end" : "recover");
      } catch (const PluginCallError& e) {
        EXPECT_EQ(e.code(), DFLASH_ERR_DATA);
        EXPECT_CONTAINS(e.what(), "data.jsonl: " + path + ": a whole epoch gave no usable sequence");
        EXPECT_CONTAINS(e.what(), "Data report: 3 lines in 1 file(s)");
        for (const auto& text : c.expected) EXPECT_CONTAINS(e.what(), text);
      }
    }
  }
}

// The check is per epoch, not per run of bad lines: one good line among many
// bad ones keeps the endless data going, whatever the shuffle puts at the
// end of one epoch and the start of the next.
TEST_F(DataSources, JsonlOneUsableLineAmongManyBadOnesKeepsTheDataGoing) {
  std::vector<std::string> lines(40, R"({"input_ids": [1, 99], "loss_mask": [1, 1]})");
  lines[17] = good_lines(1)[0];
  const std::string path = write("one_good.jsonl", lines);
  auto data = make("jsonl", {{"path", path}, {"vocab_size", 60}, {"row_length", 16}, {"tokens_per_batch", 16},
                             {"log_bad_lines", 0}});
  Watchdog watchdog(20);
  for (int i = 0; i < 30; ++i) {  // 5 copies of the 3-token line fill a 16-token row: 150 epochs in all
    const auto batch = data->next_batch();
    ASSERT_TRUE(batch.has_value());
    EXPECT_EQ(documents_of(*batch), std::vector<std::vector<int64_t>>(5, {1, 2, 3})) << "batch " << i;
  }
}

// Resumed mid-epoch on all-bad data, the partial epoch is not judged (its
// earlier lines were read before the save) but the next whole one is.
TEST_F(DataSources, JsonlAllBadDataResumedMidEpochStillFails) {
  const std::string path =
      write("bad_resumed.jsonl", {R"({"input_ids": [1, 99], "loss_mask": [1, 1]})", "{not json", R"({"loss_mask": [1]})"});
  auto data = make("jsonl", {{"path", path}, {"vocab_size", 60}, {"row_length", 16}, {"tokens_per_batch", 64}});
  data->load_state(nlohmann::json{{"epoch", 3}, {"cursor", 2}, {"counts", {{"bad: not a JSON object", 7}}}, {"lines", 3}}.dump());
  Watchdog watchdog(20);
  try {
    data->next_batch();
    FAIL() << "all-bad data must fail after a resume too";
  } catch (const PluginCallError& e) {
    // The report counts the judged epoch only, not the totals carried in the state.
    EXPECT_CONTAINS(e.what(), "1 id outside the vocabulary, 1 no input_ids array, 1 not a JSON object.");
  }
}

// A saved position outside the data is refused, not used as an index.
TEST_F(DataSources, DamagedSavedPositionsAreRefused) {
  const std::string path = write("three.jsonl", good_lines(3));
  auto data = make("jsonl", {{"path", path}, {"vocab_size", 60}});
  try {
    data->load_state(nlohmann::json{{"epoch", 0}, {"cursor", 1000000000}, {"counts", nlohmann::json::object()}, {"lines", 3}}.dump());
    FAIL();
  } catch (const PluginCallError& e) {
    EXPECT_CONTAINS(e.what(), "the saved position (epoch 0, cursor 1000000000) is outside the 3 lines of " + path);
  }
  auto synthetic = make("synthetic", {{"vocab_size", 50}, {"sequences", 20}, {"min_length", 8}, {"max_length", 16},
                                      {"row_length", 16}, {"tokens_per_batch", 64}, {"epochs", 1}});
  try {
    synthetic->load_state(nlohmann::json{{"epoch", 0}, {"index", 25}}.dump());
    FAIL();
  } catch (const PluginCallError& e) {
    EXPECT_CONTAINS(e.what(), "the saved position (epoch 0, index 25) is outside the 20 sequences per epoch");
  }
}

// The synthetic source can generate nothing trainable only through its
// settings: refused when made, not trained on.
TEST_F(DataSources, SyntheticRefusesSettingsThatLeaveNothingSupervised) {
  try {
    make("synthetic", {{"vocab_size", 50}, {"min_length", 2}, {"max_length", 2}, {"row_length", 16},
                       {"tokens_per_batch", 64}, {"prompt_fraction", 0.5}});
    FAIL();
  } catch (const PluginCallError& e) {
    EXPECT_CONTAINS(e.what(), "data.synthetic.prompt_fraction: 0.5");
    EXPECT_CONTAINS(e.what(), "fewer than 2 supervised tokens even in the longest sequence (max_length 2)");
  }
  // At 0.9, 20 tokens leave 2 supervised: accepted.
  EXPECT_NO_THROW(make("synthetic", {{"vocab_size", 50}, {"min_length", 2}, {"max_length", 20}, {"row_length", 32},
                                     {"tokens_per_batch", 64}, {"prompt_fraction", 0.9}}));
}

// Issue 14, point 10: a line was read with fgets, so a NUL byte ended it as a
// C string and the read ran on into the next line (a NUL-only line became a
// second copy of the next one). Lines are read by length; NUL bytes make a
// bad line.
TEST_F(DataSources, JsonlLinesWithNulBytesAreBadLines) {
  const auto good = good_lines(4);
  const std::string bytes = good[0] + "\n" + std::string(1, '\0') + "\n" + good[1] + "\n" + good[2] +
                            std::string(1, '\0') + "tail\n" + good[3] + "\r\n";
  const std::string path = write_bytes("nul.jsonl", bytes);
  const nlohmann::json config = {{"path", path}, {"vocab_size", 60}, {"row_length", 16}, {"tokens_per_batch", 160},
                                 {"shuffle", false}, {"epochs", 1}};
  auto data = make("jsonl", config);
  std::multiset<int64_t> seen;
  while (auto batch = data->next_batch())
    for (const auto& doc : documents_of(*batch)) seen.insert(doc.front());
  EXPECT_EQ(seen, (std::multiset<int64_t>{1, 2, 4})) << "each good line once; the NUL lines used for nothing";
  const nlohmann::json facts = *data->describe();
  EXPECT_EQ(facts.at("sequences"), 5);
  EXPECT_EQ(facts.at("sequences_used"), 3);
  EXPECT_EQ(facts.at("bad_lines"), 2);
  EXPECT_EQ(facts.at("bad_lines_by_reason"), (nlohmann::json{{"NUL bytes", 2}}));

  nlohmann::json stop = config;
  stop["on_bad_line"] = "stop";
  auto stopping = make("jsonl", stop);
  try {
    stopping->next_batch();
    FAIL() << "a NUL line under on_bad_line = stop must fail";
  } catch (const PluginCallError& e) {
    EXPECT_CONTAINS(e.what(), path + ":2: a NUL byte at column 1: binary data, not a JSON line");
    EXPECT_CONTAINS(e.what(), "on_bad_line is stop");
  }
}

}  // namespace
