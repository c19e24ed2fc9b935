// hasten::ProgressBar: the plain-line form that CI logs and files get, exactly; the in-place
// form's control characters; silence when disabled.
#include <hasten/progress.hpp>

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

struct FakeClock {
  double t = 100.0;  // any origin: the bar measures from its construction
  std::function<double()> fn() {
    return [this] { return t; };
  }
};

TEST(ProgressBar, PlainLinesEveryTenthWithValuesRateAndTimes) {
  std::ostringstream out;
  FakeClock clock;
  hasten::ProgressOptions o;
  o.description = "epoch 1/2";
  o.enabled = true;
  o.stream = &out;
  o.in_place = false;
  o.clock = clock.fn();
  {
    hasten::ProgressBar bar(20, o);
    for (int i = 0; i < 20; ++i) {
      clock.t += 0.5;
      bar.set("loss", 2.0 - 0.1 * i);
      bar.update(1, 32);
    }
    EXPECT_EQ(bar.step(), 20);
  }  // the destructor closes: no extra line, the last one was at 20/20
  const auto lines = lines_of(out.str());
  ASSERT_EQ(lines.size(), 10u) << out.str();
  EXPECT_EQ(lines[0], "epoch 1/2  2/20 (10%)  loss 1.9  64 samples/s  elapsed 00:01  remaining 00:09");
  EXPECT_EQ(lines[4], "epoch 1/2  10/20 (50%)  loss 1.1  64 samples/s  elapsed 00:05  remaining 00:05");
  EXPECT_EQ(lines[9], "epoch 1/2  20/20 (100%)  loss 0.1  64 samples/s  elapsed 00:10");
  EXPECT_EQ(out.str().find('\r'), std::string::npos);
}

TEST(ProgressBar, PlainLinesByTimeWhenTheTotalIsUnknownAndAFinalLineOnClose) {
  std::ostringstream out;
  FakeClock clock;
  hasten::ProgressOptions o;
  o.enabled = true;
  o.stream = &out;
  o.in_place = false;
  o.line_interval_s = 10;
  o.clock = clock.fn();
  hasten::ProgressBar bar(0, o);
  for (int i = 0; i < 25; ++i) {
    clock.t += 1;
    bar.update();
  }
  bar.close();
  bar.update();  // after close: counted, never printed
  const auto lines = lines_of(out.str());
  ASSERT_EQ(lines.size(), 3u) << out.str();
  EXPECT_EQ(lines[0], "10  elapsed 00:10");
  EXPECT_EQ(lines[1], "20  elapsed 00:20");
  EXPECT_EQ(lines[2], "25  elapsed 00:25");
}

TEST(ProgressBar, ValuesKeepTheOrderFirstSetAndTheLatestValue) {
  std::ostringstream out;
  hasten::ProgressOptions o;
  o.enabled = true;
  o.stream = &out;
  o.in_place = false;
  FakeClock clock;
  o.clock = clock.fn();
  hasten::ProgressBar bar(4, o);
  bar.set("loss", 1.0);
  bar.set("acc", 0.5);
  bar.set("loss", 0.25);
  EXPECT_EQ(bar.line(), "0/4 (0%)  loss 0.25  acc 0.5  elapsed 00:00  remaining --:--");
}

TEST(ProgressBar, DisabledPrintsNothing) {
  std::ostringstream out;
  hasten::ProgressOptions o;
  o.enabled = false;
  o.stream = &out;
  o.in_place = false;
  hasten::ProgressBar bar(3, o);
  for (int i = 0; i < 3; ++i) bar.update(1, 8);
  bar.close();
  EXPECT_EQ(out.str(), "");
  EXPECT_FALSE(bar.enabled());
  EXPECT_EQ(bar.step(), 3);
}

TEST(ProgressBar, InPlaceRedrawsOneLineAndEndsItOnClose) {
  std::ostringstream out;
  FakeClock clock;
  hasten::ProgressOptions o;
  o.enabled = true;
  o.stream = &out;
  o.in_place = true;
  o.clock = clock.fn();
  hasten::ProgressBar bar(4, o);
  for (int i = 0; i < 4; ++i) {
    clock.t += 1;
    bar.update();
  }
  bar.close();
  const std::string s = out.str();
  EXPECT_EQ(s.front(), '\r');
  EXPECT_EQ(s.back(), '\n');
  EXPECT_EQ(lines_of(s).size(), 1u);  // one line, redrawn
  EXPECT_NE(s.find("[########################] 4/4 (100%)"), std::string::npos) << s;
  EXPECT_NE(s.find("[######..................] 1/4 (25%)"), std::string::npos) << s;
}

TEST(ProgressBar, Durations) {
  EXPECT_EQ(hasten::format_duration(0), "00:00");
  EXPECT_EQ(hasten::format_duration(61.4), "01:01");
  EXPECT_EQ(hasten::format_duration(3723), "1:02:03");
  EXPECT_EQ(hasten::format_duration(-1), "--:--");
}

}  // namespace
