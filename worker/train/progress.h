// Keras-style progress: "Epoch 1/3", then "70/70 [==============================] - 1s 13ms/step
// - loss: 2.2843 - accuracy: 0.1598", redrawn in place on a terminal (at most every 50 ms).
// Otherwise (a log file) a whole line at a steady pace inside the epoch (every 5 s by default)
// and one at its end, so a log never goes quiet for a whole epoch. Writes to one FILE only; the
// caller supplies the time, so tests drive it with a fake clock.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace dtrain::train {

/// "70/70 [==============================] - 1s 13ms/step - loss: 2.2843 - accuracy: 0.1598"
/// followed by any extra " - name: value" pairs. ms/step is seconds over the steps after
/// first_step (where this run entered the epoch: a resume, or a re-formation in place).
std::string format_progress(int64_t step, int64_t steps, double seconds,
                            const std::vector<std::pair<std::string, double>>& values,
                            int64_t first_step = 0);

class ProgressBar {
 public:
  /// Default pace of the lines inside an epoch when the output is not a terminal.
  static constexpr double kLineSeconds = 5.0;

  /// out is not owned; interactive redraws with '\r' (a terminal), else prints a line when
  /// line_seconds have passed since the epoch began or since the last line (<= 0: none inside
  /// an epoch), and one at its end.
  ProgressBar(std::FILE* out, bool interactive, double line_seconds = kLineSeconds)
      : out_(out), interactive_(interactive), line_seconds_(line_seconds) {}
  static ProgressBar for_stdout(double line_seconds = kLineSeconds);

  /// first_step: the step this run starts the epoch at (0, or where it resumed).
  void begin_epoch(int epoch, int epochs, int64_t first_step = 0);
  /// seconds: since the epoch began.
  void update(int64_t step, int64_t steps, double seconds,
              const std::vector<std::pair<std::string, double>>& values);
  void end_epoch(int64_t steps, double seconds,
                 const std::vector<std::pair<std::string, double>>& values);

 private:
  std::FILE* out_;
  bool interactive_;
  double line_seconds_;
  double last_draw_ = -1;  ///< seconds of the last redraw or line in this epoch
  int64_t first_step_ = 0;
};

}  // namespace dtrain::train
