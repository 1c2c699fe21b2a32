// Attention and the learned positions (docs/design.md#attention): multi_head_attention
// (worker/nn/layers/multi_head_attention.cc), position_embedding and
// token_and_position_embedding. The oneDNN backend's attention matches the reference's, with
// the same bits at one thread and two and at every vector width; a causal mask keeps every
// position from the ones after it; a GPT block's gradients match finite differences; the keys
// and weights are Keras's; mistakes are ConfigErrors naming the key. q, k and v side by side (the
// layer's one projection) give the separate tensors' bits, and the small products
// (worker/nn/small_gemm.h) match a product in double.
#include <omp.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/json.h"
#include "worker/nn/host_attention.h"
#include "worker/nn/model.h"

using namespace dtrain;
using namespace dtrain::nn;
using Catch::Matchers::Contains;

namespace {

using Floats = std::vector<float>;

Floats random_floats(size_t count, uint32_t seed, float lo = -1, float hi = 1) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  Floats out(count);
  for (float& v : out) v = d(engine);
  return out;
}

double worst_relative(const Floats& a, const Floats& b, double floor = 1e-3) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst =
        std::max(worst, std::abs(double(a[i]) - b[i]) / std::max(floor, std::abs(double(b[i]))));
  return worst;
}

ModelSpec spec_of(const std::string& json) {
  common::JsonDocument doc = common::JsonDocument::parse(json, "model");
  return parse_model_spec(doc.root().at("model"));
}

std::string error_of(const std::string& json) {
  try {
    spec_of(json);
  } catch (const common::ConfigError& e) {
    return e.what();
  }
  return "accepted";
}

struct AttentionRun {
  Floats probs, y, dq, dk, dv;
};

struct AttentionInputs {
  Floats q, k, v, dy;
  explicit AttentionInputs(const AttentionShape& s) {
    const size_t qk = size_t(s.n) * s.t * s.heads * s.key_dim,
                 vy = size_t(s.n) * s.t * s.heads * s.value_dim;
    q = random_floats(qk, 1, -2, 2), k = random_floats(qk, 2, -2, 2);
    v = random_floats(vy, 3), dy = random_floats(vy, 4);
  }
};

template <typename Forward, typename Backward>
AttentionRun run_attention(const AttentionShape& s, const AttentionInputs& in, Forward forward,
                           Backward backward) {
  AttentionRun r{Floats(size_t(s.n) * s.heads * s.t * s.t, 7.0f), Floats(in.v.size()),
                 Floats(in.q.size(), 7.0f), Floats(in.k.size(), 7.0f), Floats(in.v.size(), 7.0f)};
  forward(s, in.q.data(), in.k.data(), in.v.data(), r.probs.data(), r.y.data());
  backward(s, in.q.data(), in.k.data(), in.v.data(), r.probs.data(), in.dy.data(), r.dq.data(),
           r.dk.data(), r.dv.data());
  return r;
}

AttentionRun run_attention(Backend& b, const AttentionShape& s, const AttentionInputs& in) {
  return run_attention(
      s, in,
      [&](const AttentionShape& sh, const float* q, const float* k, const float* v, float* p,
          float* y) { b.attention_forward(sh, q, k, v, p, y); },
      [&](const AttentionShape& sh, const float* q, const float* k, const float* v, const float* p,
          const float* dy, float* dq, float* dk,
          float* dv) { b.attention_backward(sh, q, k, v, p, dy, dq, dk, dv); });
}

AttentionShape shape(int n, int t, int heads, int key_dim, int value_dim, bool causal) {
  AttentionShape s;
  s.n = n, s.t = t, s.heads = heads, s.key_dim = key_dim, s.value_dim = value_dim;
  s.causal = causal;
  s.scale = 1.0f / std::sqrt(float(key_dim));
  return s;
}

/// A GPT block on ids of length 6: embeddings, then x + attention(norm(x)), x + mlp(norm(x)),
/// norm, logits.
const char* kGptBlock = R"({"model": {"input_shape": [6], "layers": [
  {"name": "embed", "type": "token_and_position_embedding", "vocabulary_size": 7,
   "sequence_length": 8, "embedding_dim": 8},
  {"name": "norm1", "type": "layer_normalization", "inputs": ["embed"]},
  {"name": "attention", "type": "multi_head_attention", "num_heads": 2, "key_dim": 4,
   "causal": true, "dropout": 0.2, "inputs": ["norm1"]},
  {"name": "res1", "type": "add", "inputs": ["embed", "attention"]},
  {"name": "norm2", "type": "layer_normalization", "inputs": ["res1"]},
  {"name": "up", "type": "dense", "units": 16, "activation": "gelu", "inputs": ["norm2"]},
  {"name": "down", "type": "dense", "units": 8, "inputs": ["up"]},
  {"name": "res2", "type": "add", "inputs": ["res1", "down"]},
  {"name": "norm3", "type": "layer_normalization", "inputs": ["res2"]},
  {"name": "logits", "type": "dense", "units": 7, "inputs": ["norm3"]}]}})";

}  // namespace

TEST_CASE("oneDNN's attention matches the reference, at one thread and two", "[attention]") {
  std::unique_ptr<Backend> dnnl = make_dnnl_backend(), ref = make_reference_backend();
  const int threads = omp_get_max_threads();
  for (bool causal : {true, false}) {
    for (AttentionShape s : {shape(1, 1, 1, 1, 1, causal), shape(2, 5, 3, 4, 2, causal),
                             shape(3, 33, 2, 16, 16, causal)}) {
      INFO("n " << s.n << " t " << s.t << " heads " << s.heads << " key_dim " << s.key_dim
                << " value_dim " << s.value_dim << (causal ? " causal" : ""));
      AttentionInputs in(s);
      AttentionRun want = run_attention(*ref, s, in);
      omp_set_num_threads(2);
      AttentionRun two = run_attention(*dnnl, s, in);
      omp_set_num_threads(1);
      AttentionRun one = run_attention(*dnnl, s, in);
      omp_set_num_threads(threads);
      CHECK(worst_relative(two.probs, want.probs, 1e-2) < 1e-5);
      CHECK(worst_relative(two.y, want.y, 1e-2) < 1e-5);
      CHECK(worst_relative(two.dq, want.dq, 1e-2) < 1e-4);
      CHECK(worst_relative(two.dk, want.dk, 1e-2) < 1e-4);
      CHECK(worst_relative(two.dv, want.dv, 1e-2) < 1e-4);
      CHECK(one.probs == two.probs);
      CHECK(one.y == two.y);
      CHECK(one.dq == two.dq);
      CHECK(one.dk == two.dk);
      CHECK(one.dv == two.dv);
      if (causal) {  // position i sees nothing after it
        for (int b = 0; b < s.n * s.heads; ++b)
          for (int i = 0; i < s.t; ++i)
            for (int j = i + 1; j < s.t; ++j)
              CHECK(two.probs[(size_t(b) * s.t + i) * s.t + j] == 0);
      }
    }
  }
}

TEST_CASE("attention dropout drops probabilities by the Dropout layer's rule, both ways",
          "[attention]") {
  std::unique_ptr<Backend> dnnl = make_dnnl_backend(), ref = make_reference_backend();
  AttentionShape s = shape(2, 9, 2, 4, 3, true);
  AttentionInputs in(s);
  AttentionRun plain = run_attention(*ref, s, in);
  s.dropout = 0.3f, s.stream = 12345;
  AttentionRun want = run_attention(*ref, s, in);
  AttentionRun got = run_attention(*dnnl, s, in);
  CHECK(worst_relative(got.y, want.y, 1e-2) < 1e-5);
  CHECK(worst_relative(got.dq, want.dq, 1e-2) < 1e-4);
  CHECK(worst_relative(got.dk, want.dk, 1e-2) < 1e-4);
  CHECK(worst_relative(got.dv, want.dv, 1e-2) < 1e-4);
  CHECK(worst_relative(got.probs, plain.probs, 1e-2) < 1e-5);  // the undropped softmax
  CHECK(got.y != plain.y);
  int dropped = 0, kept = 0;
  for (size_t index = 0; index < got.probs.size(); ++index) {
    const float keep = attention_keep(s, index);
    CHECK((keep == 0.0f || keep == 1.0f / 0.7f));
    (keep == 0.0f ? dropped : kept) += 1;
  }
  CHECK(dropped > 0.2 * (dropped + kept));
  CHECK(dropped < 0.4 * (dropped + kept));
}

TEST_CASE("attention's loops give the same bits at every vector width", "[attention]") {
  using direct_conv::Vectors;
  int widths = 0;
  for (Vectors vectors : {Vectors::kAvx512, Vectors::kAvx2}) {
    if (!direct_conv::runs(vectors)) {
      WARN("this CPU does not run the " << direct_conv::vectors_name(vectors) << " loops");
      continue;
    }
    ++widths;
    for (AttentionShape s : {shape(2, 7, 2, 3, 5, true), shape(1, 40, 2, 32, 16, false)}) {
      AttentionInputs in(s);
      auto at = [&](Vectors v) {
        return run_attention(
            s, in,
            [&](const AttentionShape& sh, const float* q, const float* k, const float* vv, float* p,
                float* y) { host_attention_forward(sh, q, k, vv, p, y, v); },
            [&](const AttentionShape& sh, const float* q, const float* k, const float* vv,
                const float* p, const float* dy, float* dq, float* dk,
                float* dv) { host_attention_backward(sh, q, k, vv, p, dy, dq, dk, dv, v); });
      };
      AttentionRun plain = at(Vectors::kPlain), wide = at(vectors);
      CHECK(wide.probs == plain.probs);
      CHECK(wide.y == plain.y);
      CHECK(wide.dq == plain.dq);
      CHECK(wide.dk == plain.dk);
      CHECK(wide.dv == plain.dv);
    }
  }
  if (widths == 0) WARN("only the plain loops run here: nothing to compare");
}

TEST_CASE("q, k and v side by side in one tensor give the separate tensors' bits", "[attention]") {
  std::unique_ptr<Backend> dnnl = make_dnnl_backend(), ref = make_reference_backend();
  for (AttentionShape s :
       {shape(2, 5, 3, 4, 2, true), shape(2, 64, 4, 32, 32, true), shape(1, 33, 2, 16, 8, false)}) {
    INFO("t " << s.t << " heads " << s.heads << " key_dim " << s.key_dim << " value_dim "
              << s.value_dim);
    AttentionInputs in(s);
    const size_t hk = size_t(s.heads) * s.key_dim, hv = size_t(s.heads) * s.value_dim;
    const size_t width = 2 * hk + hv, rows = size_t(s.n) * s.t;
    // The three inputs as one projection writes them: each row q | k | v.
    Floats qkv(rows * width, 9.0f);
    for (size_t r = 0; r < rows; ++r) {
      std::copy_n(in.q.begin() + r * hk, hk, qkv.begin() + r * width);
      std::copy_n(in.k.begin() + r * hk, hk, qkv.begin() + r * width + hk);
      std::copy_n(in.v.begin() + r * hv, hv, qkv.begin() + r * width + 2 * hk);
    }
    AttentionShape side = s;
    side.qkv_row = static_cast<int>(width);
    for (Backend* b : {dnnl.get(), ref.get()}) {
      INFO(b->name());
      AttentionRun apart = run_attention(*b, s, in);
      Floats probs(apart.probs.size()), y(apart.y.size()), d(rows * width, 7.0f);
      b->attention_forward(side, qkv.data(), qkv.data() + hk, qkv.data() + 2 * hk, probs.data(),
                           y.data());
      b->attention_backward(side, qkv.data(), qkv.data() + hk, qkv.data() + 2 * hk, probs.data(),
                            in.dy.data(), d.data(), d.data() + hk, d.data() + 2 * hk);
      CHECK(probs == apart.probs);
      CHECK(y == apart.y);
      Floats dq, dk, dv;
      for (size_t r = 0; r < rows; ++r) {
        dq.insert(dq.end(), d.begin() + r * width, d.begin() + r * width + hk);
        dk.insert(dk.end(), d.begin() + r * width + hk, d.begin() + r * width + 2 * hk);
        dv.insert(dv.end(), d.begin() + r * width + 2 * hk, d.begin() + (r + 1) * width);
      }
      CHECK(dq == apart.dq);
      CHECK(dk == apart.dk);
      CHECK(dv == apart.dv);
    }
  }
}

TEST_CASE("the attention's small products match a product in double, and skip only what may be",
          "[attention]") {
  using direct_conv::Vectors;
  const Vectors widest = direct_conv::widest();
  const int width = widest == Vectors::kAvx512 ? 16 : widest == Vectors::kAvx2 ? 8 : 0;
  if (width == 0) {
    CHECK_FALSE(small_gemm(false, false, 4, 16, 4, nullptr, 4, nullptr, 16, nullptr, 16));
    return;
  }
  CHECK_FALSE(small_gemm(false, false, 4, width + 1, 4, nullptr, 4, nullptr, 16, nullptr, 16));
  for (int t : {width, 3 * width, 64}) {
    for (int dim : {width, 2 * width}) {
      for (Causal causal :
           {Causal::kNone, Causal::kColumnsToRow, Causal::kDepthToRow, Causal::kDepthFromRow}) {
        for (bool ta : {false, true}) {
          for (bool tb : {false, true}) {
            // Products of the attention's kinds: t x t from a depth of dim (scores), or t x dim
            // from a depth of t (weighted sums), with A triangular where the hint says so.
            const bool square = causal == Causal::kColumnsToRow || causal == Causal::kNone;
            const int m = t, n = square ? t : dim, k = square ? dim : t;
            INFO("t " << t << " dim " << dim << " causal " << int(causal) << " ta " << ta << " tb "
                      << tb);
            const int lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 5, ldc = n + width;
            Floats a = random_floats(size_t(ta ? k : m) * lda, 11),
                   b = random_floats(size_t(tb ? n : k) * ldb, 12);
            auto a_at = [&](int i, int d) -> float& {
              return ta ? a[size_t(d) * lda + i] : a[size_t(i) * lda + d];
            };
            auto b_at = [&](int d, int j) {
              return tb ? b[size_t(j) * ldb + d] : b[size_t(d) * ldb + j];
            };
            for (int i = 0; i < m; ++i)  // the zeros the hint promises
              for (int d = 0; d < k; ++d)
                if ((causal == Causal::kDepthToRow && d > i) ||
                    (causal == Causal::kDepthFromRow && d < i))
                  a_at(i, d) = 0.0f;
            Floats c(size_t(m) * ldc, 7.0f);
            REQUIRE(
                small_gemm(ta, tb, m, n, k, a.data(), lda, b.data(), ldb, c.data(), ldc, causal));
            double worst = 0;
            for (int i = 0; i < m; ++i) {
              for (int j = 0; j < ldc; ++j) {
                const float got = c[size_t(i) * ldc + j];
                if (j >= n) {
                  CHECK(got == 7.0f);  // past n: untouched
                  continue;
                }
                if (causal == Causal::kColumnsToRow && j > i) continue;  // not wanted
                double want = 0;
                for (int d = 0; d < k; ++d) want += double(a_at(i, d)) * b_at(d, j);
                worst = std::max(worst, std::abs(got - want));
              }
            }
            CHECK(worst < 1e-4 * k);
          }
        }
      }
    }
  }
}

TEST_CASE("a GPT block: Keras's weights, and gradients that match finite differences",
          "[attention]") {
  std::unique_ptr<Backend> backend = make_reference_backend();
  const int n = 3, positions = 6, classes = 7;
  Model model(spec_of(kGptBlock), *backend, n);
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  for (const ParamInfo& p : model.parameter_infos()) {
    names.push_back(p.name);
    shapes.push_back(p.shape);
  }
  CHECK(std::vector<std::string>(names.begin(), names.begin() + 10) ==
        std::vector<std::string>{"embed.token_embedding.embeddings",
                                 "embed.position_embedding.embeddings", "norm1.gamma", "norm1.beta",
                                 "attention.query.kernel", "attention.query.bias",
                                 "attention.key.kernel", "attention.key.bias",
                                 "attention.value.kernel", "attention.value.bias"});
  CHECK(shapes[1] == std::vector<int64_t>{8, 8});
  CHECK(shapes[4] == std::vector<int64_t>{8, 2, 4});
  CHECK(shapes[5] == std::vector<int64_t>{2, 4});
  CHECK(names[10] == "attention.attention_output.kernel");
  CHECK(shapes[10] == std::vector<int64_t>{2, 4, 8});
  CHECK(shapes[11] == std::vector<int64_t>{8});
  model.initialize(3);
  Floats initial = model.parameters().to_host();
  // Keras's glorot_uniform for the (8, 2, 4) query kernel: fans 8 x 2 and 8 x 4.
  const ParamInfo& query = model.parameter_infos()[4];
  const float limit = std::sqrt(6.0f / (16 + 32));
  for (size_t i = 0; i < query.count; ++i) CHECK(std::abs(initial[query.offset + i]) <= limit);

  Floats params = random_floats(initial.size(), 9, -0.5f, 0.5f);
  for (const ParamInfo& p : model.parameter_infos())
    if (p.name.find("gamma") != std::string::npos)
      for (size_t i = 0; i < p.count; ++i) params[p.offset + i] += 1.0f;
  model.parameters().from_host(params);
  Floats ids(size_t(n) * positions);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = float((i * 5 + 1) % classes);
  std::vector<int32_t> labels(ids.size());
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = int32_t((i * 3) % classes);
  const int rows = n * positions;
  auto loss = [&](Floats* grads) {
    const float* logits = model.forward(ids.data(), n, StepKey{1, 0, 0}, true);
    Floats totals(3, 0.0f);
    backend->softmax_cross_entropy(rows, classes, logits, labels.data(),
                                   grads ? model.logits_gradient() : nullptr, totals.data());
    if (grads) {
      model.backward(n);
      *grads = model.gradients().to_host();
    }
    return double(totals[0]) / rows;
  };
  Floats grads;
  loss(&grads);
  // Positions 6 and 7 of the position table are never used.
  const ParamInfo& table = model.parameter_infos()[1];
  for (size_t i = 6 * 8; i < 8 * 8; ++i) CHECK(grads[table.offset + i] == 0.0f);
  const float h = 1e-3f;
  for (size_t i = 0; i < params.size(); ++i) {
    Floats moved = params;
    moved[i] = params[i] + h;
    model.parameters().from_host(moved);
    const double up = loss(nullptr);
    moved[i] = params[i] - h;
    model.parameters().from_host(moved);
    const double down = loss(nullptr);
    const double numeric = (up - down) / (2 * h);
    INFO("parameter " << i << ": backward " << grads[i] << ", finite difference " << numeric);
    CHECK(std::abs(numeric - grads[i]) / std::max(1e-2, std::abs(numeric)) < 0.05);
  }

  // The oneDNN backend: the same gradients to rounding, the same bits at one thread and two.
  std::unique_ptr<Backend> dnnl = make_dnnl_backend();
  Model fast(spec_of(kGptBlock), *dnnl, n);
  auto gradients_at = [&](int threads) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    fast.parameters().from_host(params);
    const float* logits = fast.forward(ids.data(), n, StepKey{1, 0, 0}, true);
    Floats totals(3, 0.0f);
    dnnl->softmax_cross_entropy(rows, classes, logits, labels.data(), fast.logits_gradient(),
                                totals.data());
    fast.backward(n);
    omp_set_num_threads(saved);
    return fast.gradients().to_host();
  };
  Floats one = gradients_at(1), two = gradients_at(2);
  CHECK(one == two);
  CHECK(worst_relative(two, grads, 1e-2) < 1e-3);
}

TEST_CASE("a causal model's outputs at a position do not depend on later tokens", "[attention]") {
  std::unique_ptr<Backend> backend = make_dnnl_backend();
  Model model(spec_of(kGptBlock), *backend, 1);
  model.initialize(5);
  Floats ids = {1, 2, 3, 4, 5, 6}, changed = {1, 2, 3, 0, 0, 0};
  const float* y = model.forward(ids.data(), 1, {}, false);
  Floats first(y, y + 6 * 7);
  y = model.forward(changed.data(), 1, {}, false);
  Floats second(y, y + 6 * 7);
  CHECK(Floats(first.begin(), first.begin() + 21) == Floats(second.begin(), second.begin() + 21));
  CHECK(Floats(first.begin() + 21, first.end()) != Floats(second.begin() + 21, second.end()));
}

TEST_CASE("attention and position keys: mistakes are ConfigErrors naming the key", "[attention]") {
  auto model = [](const std::string& layer, const std::string& input = "[6]") {
    return R"({"model": {"input_shape": )" + input +
           R"(, "layers": [{"type": "embedding", "input_dim": 7, "output_dim": 8}, )" + layer +
           "]}}";
  };
  CHECK_THAT(error_of(model(R"({"type": "multi_head_attention", "key_dim": 4})")),
             Contains("num_heads"));
  CHECK_THAT(
      error_of(
          model(R"({"type": "multi_head_attention", "num_heads": 2, "key_dim": 4, "dropout": 1})")),
      Contains("dropout: expected a rate in [0, 1)"));
  CHECK_THAT(error_of(model(R"({"type": "position_embedding", "sequence_length": 4})")),
             Contains("6 positions, more than its sequence_length 4"));
  CHECK_THAT(
      error_of(
          R"({"model": {"input_shape": [28, 28, 1], "layers": [{"type": "multi_head_attention", "num_heads": 2, "key_dim": 4}]}})"),
      Contains("multi_head_attention takes a sequence"));
  CHECK_THAT(
      error_of(
          R"({"model": {"input_shape": [6], "layers": [{"type": "token_and_position_embedding", "vocabulary_size": 7, "sequence_length": 6, "embedding_dim": 4, "tie_weights": false}]}})"),
      Contains("tie_weights: false is not supported"));
  CHECK(error_of(model(R"({"type": "multi_head_attention", "num_heads": 2, "key_dim": 4,
                           "value_dim": 3, "use_bias": false})")) == "accepted");
}
