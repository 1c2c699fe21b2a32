// `dtrain evaluate RUN_DIR` and `dtrain predict RUN_DIR` (docs/cli.md): a run's final model on
// this machine's CPU, as Keras's model.evaluate and model.predict. The model is rebuilt from the
// train object the run recorded in spec.json and loaded from RUN_DIR/model/model.safetensors;
// the data is the run's own validation data or a file or folder named on the command line, read
// by the same readers training uses (worker/data/), so the same file gives the same examples.
// Evaluation sums each batch of per_worker_batch_size examples from zero and adds the batches in
// order, as the run's validation does (evaluator.h), so on the run's validation data it prints
// the val_loss and val_accuracy of the run's last epoch.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::train {

struct EvaluateOptions {
  std::string run_dir;
  /// Empty: the run's validation data. Otherwise an .npz archive (the run's x_test and y_test
  /// keys, else "x" and "y"), an .npy file of inputs with labels_path beside it, a folder of
  /// IDX files (t10k-images-idx3-ubyte[.gz] and its labels) or a folder of class folders.
  std::string data;
  std::string labels;  ///< an .npy of labels, for an .npy data file
};

struct Evaluation {
  std::string data;  ///< what was evaluated, in words ("the run's validation data (...)", a path)
  int64_t examples = 0;
  double loss = 0;
  /// Keras's names and values, in the order Keras prints them ("accuracy", ...).
  std::vector<std::pair<std::string, double>> metrics;
};

/// Evaluates the run's final model. ConfigError (exit 2) naming what is wrong: no final model,
/// a spec.json without a train object, data that does not fit the model, labels outside its
/// classes, a run with no validation data and no --data.
Evaluation evaluate_run(const EvaluateOptions& options);

struct PredictOptions {
  std::string run_dir;
  /// An .npy of inputs ((N, H, W), (N, H, W, C), or (N, F) for a model of input_shape [F]), an
  /// .npz (key x_test, else x, else its only member), an IDX images file, one PNG or JPEG file,
  /// or a folder of them (class folders or plain: every image found, in sorted path order).
  std::string input;
  /// .npy (float32, (N, outputs)) or .csv (a header, then per input its name, the predicted
  /// class's name and each output).
  std::string output;
};

struct Prediction {
  int64_t examples = 0;
  int outputs = 0;  ///< values per example
};

/// Writes the model's outputs for every input to options.output (atomically: a failed run leaves
/// no file). The outputs are what Keras's predict returns: softmax probabilities when the last
/// layer has a softmax activation, else its values as they are (logits for "from_logits": true).
Prediction predict_run(const PredictOptions& options);

}  // namespace dtrain::train
