// Keras 3's weight_decay on sgd, adam and rmsprop (worker/train/optimizer.*, backend.h's
// decay_weights): before each update w = w - w * weight_decay * rate, in Keras's order of
// products, gated by a dynamic loss scale's skip as the update is; tensors named in
// exclude_from_weight_decay are left out, also by adamw, whose decay is its own; the keys parse
// and refuse what is wrong.
#include <catch2/catch.hpp>
#include <memory>
#include <vector>

#include "common/errors.h"
#include "common/json.h"
#include "worker/nn/backend.h"
#include "worker/train/optimizer.h"

using namespace dtrain;
using Floats = std::vector<float>;

namespace {

train::OptimizerSpec spec_of(const std::string& json) {
  common::JsonDocument doc = common::JsonDocument::parse(json, "optimizer");
  return train::parse_optimizer_spec(doc.root());
}

// Two tensors: "dense.kernel" (3 floats) then "dense.bias" (2).
const std::vector<nn::ParamInfo> kTensors = {{"dense.kernel", {3}, 0, 3},
                                             {"dense.bias", {2}, 3, 2}};

Floats step(const std::string& json, bool exclude_names, const float* skip = nullptr) {
  std::unique_ptr<nn::Backend> backend = nn::make_reference_backend();
  train::Optimizer optimizer(spec_of(json), 5, backend->device());
  if (exclude_names) optimizer.set_parameters(kTensors);
  nn::Buffer<float> w(backend->device(), 5), g(backend->device(), 5);
  w.from_host(Floats{1, -2, 4, 8, -0.5f});
  g.from_host(Floats{0.5f, 0.25f, -1, 0, 2});
  optimizer.begin_step();
  optimizer.apply(*backend, w, g, 0, 3, skip);  // two ranges, as two buckets would be
  optimizer.apply(*backend, w, g, 3, 2, skip);
  return w.to_host();
}

}  // namespace

TEST_CASE("sgd's weight decay comes before its update, in Keras's order", "[weight_decay]") {
  const std::string json =
      R"({"type": "sgd", "learning_rate": 0.5, "weight_decay": 0.1,
          "exclude_from_weight_decay": ["bias"]})";
  Floats w = step(json, false), want = {1, -2, 4, 8, -0.5f}, g = {0.5f, 0.25f, -1, 0, 2};
  for (size_t i = 0; i < 5; ++i) {
    float decayed = want[i] - want[i] * 0.1f * 0.5f;
    CHECK(w[i] == static_cast<float>(decayed - 0.5 * g[i]));
  }
  // With the model's tensor names, the bias is left out.
  Floats excluded = step(json, true);
  for (size_t i = 0; i < 3; ++i) CHECK(excluded[i] == w[i]);
  for (size_t i = 3; i < 5; ++i) CHECK(excluded[i] == static_cast<float>(want[i] - 0.5 * g[i]));
  // A step a dynamic loss scale skips changes nothing, the decay included.
  float raised = 1;
  CHECK(step(json, true, &raised) == want);
}

TEST_CASE("adam and rmsprop decay too; adamw leaves out the excluded tensors", "[weight_decay]") {
  for (const char* type : {"adam", "rmsprop"}) {
    INFO(type);
    std::string plain = std::string(R"({"type": ")") + type + R"(", "learning_rate": 0.1})";
    std::string decayed =
        std::string(R"({"type": ")") + type + R"(", "learning_rate": 0.1, "weight_decay": 0.2})";
    Floats a = step(plain, false), b = step(decayed, false);
    for (size_t i = 0; i < 5; ++i) CHECK(a[i] != b[i]);
  }
  Floats all = step(R"({"type": "adamw", "learning_rate": 0.1, "weight_decay": 0.2})", true);
  Floats some = step(R"({"type": "adamw", "learning_rate": 0.1, "weight_decay": 0.2,
                         "exclude_from_weight_decay": ["bias"]})",
                     true);
  Floats none = step(R"({"type": "adamw", "learning_rate": 0.1, "weight_decay": 0})", true);
  for (size_t i = 0; i < 3; ++i) CHECK(some[i] == all[i]);
  for (size_t i = 3; i < 5; ++i) CHECK(some[i] == none[i]);
  CHECK(all[3] != none[3]);
}

TEST_CASE("weight decay's keys parse, and mistakes are named", "[weight_decay]") {
  CHECK(spec_of(R"({"type": "sgd", "weight_decay": 0.0005})").weight_decay == 0.0005f);
  CHECK(spec_of(R"({"type": "rmsprop", "exclude_from_weight_decay": ["gamma", "beta"]})")
            .exclude_from_weight_decay == std::vector<std::string>{"gamma", "beta"});
  CHECK_THROWS_WITH(spec_of(R"({"type": "sgd", "weight_decay": 2})"),
                    Catch::StartsWith("weight_decay:"));
  CHECK_THROWS_WITH(spec_of(R"({"type": "adam", "exclude_from_weight_decay": [""]})"),
                    Catch::StartsWith("exclude_from_weight_decay[0]:"));
}
