// TokenTable, the tokenizers' spelling → id table: what a map must do, at the
// sizes of real vocabularies and through its growth.
#include "text/token_table.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using dflash::text::TokenTable;

TEST(TokenTable, FindsWhatWasAddedAndNothingElse) {
  TokenTable table;
  EXPECT_EQ(table.find("a"), nullptr);  // empty, never sized
  std::string a = "a", empty, nul("x\0y", 3);
  ASSERT_TRUE(table.insert(a, 7));
  ASSERT_TRUE(table.insert(empty, 0));
  ASSERT_TRUE(table.insert(nul, 9));
  ASSERT_NE(table.find("a"), nullptr);
  EXPECT_EQ(*table.find("a"), 7);
  EXPECT_EQ(*table.find(""), 0);
  EXPECT_EQ(*table.find(std::string("x\0y", 3)), 9);
  EXPECT_EQ(table.find("x"), nullptr);
  EXPECT_EQ(table.find("ab"), nullptr);
  EXPECT_EQ(table.size(), 3u);
}

TEST(TokenTable, ASecondInsertOfASpellingChangesNothingAndKeepsTheArgument) {
  TokenTable table;
  std::string first = "Ġthe", again = "Ġthe";
  ASSERT_TRUE(table.insert(first, 1));
  EXPECT_FALSE(table.insert(again, 2));
  EXPECT_EQ(again, "Ġthe");  // not moved from: the caller names it in its message
  EXPECT_EQ(*table.find("Ġthe"), 1);
  EXPECT_EQ(table.size(), 1u);
  table.assign("Ġthe", 5);
  table.assign("<|im_start|>", 6);
  EXPECT_EQ(*table.find("Ġthe"), 5);
  EXPECT_EQ(*table.find("<|im_start|>"), 6);
  EXPECT_EQ(table.size(), 2u);
}

TEST(TokenTable, HoldsAVocabularyThroughItsGrowthInTheOrderGiven) {
  for (const std::size_t reserved : {std::size_t{0}, std::size_t{300000}}) {
    TokenTable table;
    table.reserve(reserved);
    const int n = 200000;
    for (int i = 0; i < n; ++i) {
      std::string spelling = "t" + std::to_string(i * 7919 % n);
      ASSERT_TRUE(table.insert(spelling, i));
    }
    ASSERT_EQ(table.size(), static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      const int32_t* id = table.find("t" + std::to_string(i * 7919 % n));
      ASSERT_NE(id, nullptr);
      ASSERT_EQ(*id, i);
    }
    EXPECT_EQ(table.find("t" + std::to_string(n)), nullptr);
    int expected = 0;
    for (const auto& [spelling, id] : table) {
      ASSERT_EQ(id, expected);
      ASSERT_EQ(spelling, "t" + std::to_string(expected * 7919 % n));
      ++expected;
    }
  }
}
