// The two halves of a kind of layer agree: every kind of the spec registry
// (worker/spec/layer_registry.h) has a builder in worker/nn/layer_builders.cc, and a node whose
// type has none is an EnforceError (a bug in dtrain, not a person's mistake) naming the type.
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/json.h"
#include "worker/nn/layer_builders.h"
#include "worker/spec/layer_registry.h"
#include "worker/spec/model_spec.h"

using namespace dtrain;
using namespace dtrain::nn;
using Catch::Matchers::Contains;

TEST_CASE("every kind of the spec registry has a builder", "[nn][layers]") {
  const std::vector<const LayerKind*> kinds = layer_kinds();
  REQUIRE(kinds.size() >= 20);
  for (const LayerKind* kind : kinds) {
    INFO("type " << kind->type);
    CHECK(has_layer_builder(kind->type));
  }
  CHECK_FALSE(has_layer_builder("no_such_kind"));
}

TEST_CASE("a node whose type has no builder is an EnforceError", "[nn][layers]") {
  common::JsonDocument doc = common::JsonDocument::parse(
      R"({"model": {"input_shape": [4], "layers": [{"type": "dense", "units": 2}]}})", "model");
  ModelSpec spec = parse_model_spec(doc.root().at("model"));
  NodeSpec node = spec.nodes[0];
  node.type = "no_such_kind";
  std::unique_ptr<Backend> backend = make_reference_backend();
  const std::vector<Dims> in = spec.input_dims_of(0);
  try {
    make_layer(node, in, {0, 1, *backend});
    FAIL("built a layer of an unknown type");
  } catch (const common::EnforceError& e) {
    CHECK_THAT(e.what(), Contains("no_such_kind"));
  }
  node.type = "dense";  // the same node with its own type builds
  CHECK(make_layer(node, in, {0, 1, *backend}) != nullptr);
}
