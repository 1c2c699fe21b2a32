// Keras-style progress: "Epoch 1/3", then "70/70 [==============================] - 1s 13ms/step
// - loss: 2.2843 - accuracy: 0.1598", redrawn in place on a terminal (at most every 50 ms), one
// line per epoch otherwise. Writes to stdout only; formatting is separate so tests can read it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace dtrain::train {

/// "70/70 [==============================] - 1s 13ms/step - loss: 2.2843 - accuracy: 0.1598"
/// followed by any extra " - name: value" pairs.
std::string format_progress(int64_t step, int64_t steps, double seconds,
                            const std::vector<std::pair<std::string, double>>& values);

class ProgressBar {
 public:
  /// out is not owned; interactive redraws with '\r' (a terminal), else prints once per epoch.
  ProgressBar(std::FILE* out, bool interactive) : out_(out), interactive_(interactive) {}
  static ProgressBar for_stdout();

  void begin_epoch(int epoch, int epochs);
  void update(int64_t step, int64_t steps, double seconds,
              const std::vector<std::pair<std::string, double>>& values);
  void end_epoch(int64_t steps, double seconds,
                 const std::vector<std::pair<std::string, double>>& values);

 private:
  std::FILE* out_;
  bool interactive_;
  double last_draw_ = -1;
};

}  // namespace dtrain::train
