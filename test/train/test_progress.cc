// Progress output when stdout is not a terminal, driven by a fake clock: a Keras-style line at a
// steady pace inside the epoch (never more often than asked, none when the epoch is short), and
// the epoch's own line at its end; on a terminal, redraws with '\r' instead.
#include <stdio.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "worker/train/progress.h"

using namespace dtrain;

namespace {

// What a ProgressBar wrote, through a memory stream.
class Captured {
 public:
  Captured() : file_(::open_memstream(&data_, &size_)) { REQUIRE(file_ != nullptr); }
  ~Captured() {
    std::fclose(file_);
    std::free(data_);
  }
  std::FILE* file() { return file_; }
  std::string text() {
    std::fflush(file_);
    return std::string(data_, size_);
  }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
  std::FILE* file_;
};

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// One epoch of `steps` steps taking step_seconds each, every step reported.
std::string run_epoch(train::ProgressBar& bar, Captured& out, int64_t steps, double step_seconds) {
  bar.begin_epoch(1, 1);
  for (int64_t s = 1; s <= steps; ++s)
    bar.update(s, steps, double(s) * step_seconds, {{"loss", 1.0}});
  bar.end_epoch(steps, double(steps) * step_seconds, {{"loss", 1.0}});
  return out.text();
}

}  // namespace

TEST_CASE("not a terminal: a progress line every 5 s inside the epoch, and one at its end") {
  Captured out;
  train::ProgressBar bar(out.file(), false);
  // 100 steps of 0.26 s: 26 s, lines at 5.2, 10.4, 15.6, 20.8 and 26 (the end).
  std::string text = run_epoch(bar, out, 100, 0.26);
  CHECK(count_of(text, "\n") == 6);  // "Epoch 1/1" and five progress lines
  CHECK(count_of(text, "\r") == 0);
  CHECK(text.find("Epoch 1/1\n20/100 [======>.......................] - 5s 260ms/step - loss: "
                  "1.0000\n40/100 ") != std::string::npos);
  CHECK(text.find("\n100/100 [==============================] - 26s") != std::string::npos);
}

TEST_CASE("not a terminal: a short epoch prints its end line only; the pace is configurable") {
  Captured quick;
  train::ProgressBar bar(quick.file(), false);
  CHECK(count_of(run_epoch(bar, quick, 10, 0.4), "\n") == 2);  // 4 s: no line inside

  Captured paced;
  train::ProgressBar every_second(paced.file(), false, 1.0);
  CHECK(count_of(run_epoch(every_second, paced, 10, 0.4), "\n") == 1 + 3 + 1);  // 1.2 2.4 3.6

  Captured off;
  train::ProgressBar epoch_only(off.file(), false, 0.0);
  CHECK(count_of(run_epoch(epoch_only, off, 100, 0.26), "\n") == 2);
}

TEST_CASE("a terminal gets redraws with a carriage return, not lines") {
  Captured out;
  train::ProgressBar bar(out.file(), true);
  std::string text = run_epoch(bar, out, 10, 0.1);
  CHECK(count_of(text, "\n") == 2);
  CHECK(count_of(text, "\r") == 11);  // every step (0.1 s apart > 50 ms) and the end
}

TEST_CASE("an epoch entered mid-way counts ms/step over the steps run here") {
  Captured out;
  train::ProgressBar bar(out.file(), false);
  bar.begin_epoch(2, 3, 60);  // resumed (or re-formed in place) at step 60
  bar.update(111, 200, 5.1, {});
  bar.end_epoch(200, 14.0, {});
  std::string text = out.text();
  CHECK(text.find("111/200 [================>.............] - 5s 100ms/step") != std::string::npos);
  CHECK(text.find("200/200 [==============================] - 14s 100ms/step") !=
        std::string::npos);
  CHECK(train::format_progress(10, 70, 1.0, {}, 70) ==
        "10/70 [====>.........................] - 1s 0ms/step");
}
