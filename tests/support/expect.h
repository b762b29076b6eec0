// Assertions on messages, shared by the test suites.
#pragma once

#include <gtest/gtest.h>

#include <string>

#define EXPECT_CONTAINS(haystack, needle)                                                     \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos)                            \
      << "expected to find: " << (needle) << "\n                in: " << (haystack)
#define EXPECT_NOT_CONTAINS(haystack, needle)                                                 \
  EXPECT_EQ(std::string(haystack).find(needle), std::string::npos)                            \
      << "expected not to find: " << (needle) << "\n                    in: " << (haystack)

// `statement` throws `type` whose what() contains `needle`.
#define EXPECT_THROW_WITH(statement, type, needle)                                            \
  do {                                                                                        \
    try {                                                                                     \
      statement;                                                                              \
      ADD_FAILURE() << #statement " did not throw";                                           \
    } catch (const type& e) {                                                                 \
      EXPECT_CONTAINS(std::string(e.what()), needle);                                         \
    }                                                                                         \
  } while (0)
