// Message helpers (util/text_util.hpp): text from a damaged plugin file reaches an error line
// printable, short and on one line.
#include <gtest/gtest.h>

#include <string>

#include "util/text_util.hpp"

namespace text_util_tests {

using hasten::detail::untrusted_text;

TEST(TextUtil, UntrustedTextIsOnePrintableShortLine) {
  EXPECT_EQ(untrusted_text(nullptr), "");
  EXPECT_EQ(untrusted_text("csv"), "csv");
  EXPECT_EQ(untrusted_text("a\nb\x1b[2Jc\xc0\x85\x7f"), "a?b?[2Jc???");
  const std::string long_name(100, 'x');
  EXPECT_EQ(untrusted_text(long_name.c_str()), std::string(64, 'x') + "...");
  EXPECT_EQ(untrusted_text(long_name.c_str(), 100), long_name);  // exactly the limit: not cut
  EXPECT_EQ(untrusted_text("abcdef", 3), "abc...");
}

}  // namespace text_util_tests
