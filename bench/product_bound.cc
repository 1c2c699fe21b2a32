// How fast a training step of a model could be on this CPU if everything but its dense layers'
// matrix products, its optimizer's pass over the parameters and its convolutions' output passes
// were free: the bound that scripts/bench-bound.sh sets beside PyTorch's step (docs/benchmarks.md,
// issue 29's sixth session). For each dense layer at batch n, its three products (the forward
// x w, the input gradient dy w^T, except for a first layer, and the weight gradient x^T dy) are
// timed in every form oneDNN offers here, with the operands already in whichever layout that
// form wants, and the fastest form of each counts:
//   float32: sgemm on x or x^T stored, dy w^T as sgemm, as W dy^T (dx^T) and as the matmul
//            primitive (what dtrain's backend runs), x^T dy on x or x^T stored;
//   bf16:    the matmul primitive on inputs already rounded to bf16, weights plain or in the
//            blocked layout the primitive prefers (no packing in the call), float32 outputs.
// The optimizer is the oneDNN backend's own SGD-momentum update (read w, g, v; write w, v) over
// all the model's parameters: a memory-bound pass any step that stores its gradients pays.
// A convolution's least work, in a step that keeps each layer's output in memory, is taken as its
// output's passes alone, at memory speed, its arithmetic free: written once by the forward, read
// twice by the backward (the output for ReLU's mask, and its gradient), in float32 and, for bf16,
// in 16-bit elements. A convolution whose arithmetic is the step (a ResNet's) also has its three
// products timed apart, as oneDNN's convolution primitives compute them with every tensor already
// in the blocked layout each chose (no reorder), in float32 and on bf16 inputs; a convolution
// dtrain's direct loops take (direct_conv.h: a first layer's few channels) has its passes alone.
// Every figure is the faster of two medians of REPEATS timings, on cold caches and warm.
// A dense layer on a sequence multiplies batch x positions rows; an attention's scores and
// weighted sums count as their six batched products (attention_products_ms).
// Prints one row: "bound BATCH fp32_products_ms bf16_products_ms sgd_ms conv_fp32_ms
// conv_bf16_ms conv_products_fp32_ms conv_products_bf16_ms" (bf16 "n/a" where the CPU has no
// bf16 products). Threads come from OMP_NUM_THREADS. Asserts nothing.
//   product_bound JOB_FILE BATCH [REPEATS]   (default 15)
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <dnnl.hpp>
#include <functional>
#include <string>
#include <vector>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/exit_codes.h"
#include "common/json.h"
#include "worker/nn/backend.h"
#include "worker/nn/direct_conv.h"
#include "worker/nn/random.h"
#include "worker/spec/train_config.h"
using namespace dtrain;
namespace {

using Clock = std::chrono::steady_clock;
using dnnl::memory;
using Tag = memory::format_tag;
using Type = memory::data_type;

// Larger than any last-level cache these machines have: reading it evicts the operands (only
// reading it: dirty lines would charge their write-back to the next timing).
class ColdCache {
 public:
  ColdCache() : lines_(size_t{96} << 20, 1) {}
  void evict() {
    for (size_t i = 0; i < lines_.size(); i += 64) sink_ += lines_[i];
  }

 private:
  std::vector<unsigned char> lines_;
  volatile unsigned sink_ = 0;  // so the reads stay
};

// The faster of two medians of repeats timings of f, in ms: on cold caches, and right after a
// run (warm: operands a step has just used may still be in the cache). The bound must not
// exceed what either can do.
double median_ms(ColdCache& cold, int repeats, const std::function<void()>& f) {
  f();  // warm-up: the library's own set-up
  std::vector<double> cold_ms, warm_ms;
  auto timed = [&] {
    auto t = Clock::now();
    f();
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  };
  for (int r = 0; r < repeats; ++r) {
    cold.evict();
    cold_ms.push_back(timed());
    warm_ms.push_back(timed());
  }
  auto median = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  return std::min(median(cold_ms), median(warm_ms));
}

std::vector<float> random_floats(size_t count, uint64_t seed) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = 2.0f * nn::unit_float(nn::random_key(seed, i)) - 1.0f;
  return v;
}

void sgemm(char ta, char tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
           float* c, int ldc) {
  dnnl_status_t rc = dnnl_sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
  DT_ENFORCE(rc == dnnl_success, "dnnl_sgemm failed with status {}", static_cast<int>(rc));
}

// A memory of md's layout holding random values of its type (bf16: float32's upper halves).
memory filled_memory(const dnnl::engine& engine, const memory::desc& md, uint64_t seed) {
  memory m(md, engine);
  size_t bytes = md.get_size();
  bool f32 = md.data_type() == Type::f32;
  std::vector<float> values = random_floats(bytes / (f32 ? 4 : 2), seed);
  auto* out = static_cast<unsigned char*>(m.get_data_handle());
  if (f32) {
    std::memcpy(out, values.data(), bytes);
  } else {
    for (size_t i = 0; i < bytes / 2; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &values[i], 4);
      uint16_t half = static_cast<uint16_t>(bits >> 16);
      std::memcpy(out + 2 * i, &half, 2);
    }
  }
  return m;
}

// C (m x n, float32, row-major) = A (m x k) B (k x n) as one oneDNN matmul primitive, A and B of
// type `type` with the given strides (a view of a transposed operand has strides {1, rows}); B
// in the blocked layout the primitive prefers when packed_b.
class Product {
 public:
  Product(const dnnl::engine& engine, Type type, int m, int k, int n, memory::dims a_strides,
          memory::dims b_strides, bool packed_b)
      : engine_(engine), stream_(engine) {
    memory::desc a({m, k}, type, a_strides);
    memory::desc b =
        packed_b ? memory::desc({k, n}, type, Tag::any) : memory::desc({k, n}, type, b_strides);
    memory::desc c({m, n}, Type::f32, Tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), engine_);
    primitive_ = dnnl::matmul(pd);
    a_ = filled(pd.src_desc(), 1), b_ = filled(pd.weights_desc(), 2), c_ = memory(c, engine_);
  }
  void run() {
    primitive_.execute(stream_, {{DNNL_ARG_SRC, a_}, {DNNL_ARG_WEIGHTS, b_}, {DNNL_ARG_DST, c_}});
    stream_.wait();
  }

 private:
  memory filled(const memory::desc& md, uint64_t seed) { return filled_memory(engine_, md, seed); }
  dnnl::engine engine_;
  dnnl::stream stream_;
  dnnl::matmul primitive_;
  memory a_, b_, c_;
};

struct Dense {
  int in = 0, out = 0;
  bool first = false;  ///< the model's first layer: nobody needs its input gradient
  int rows = 1;        ///< rows per example: a sequence's positions
};

struct Conv {
  nn::ConvShape shape;  ///< one example's (n = 1)
  bool first = false;
};

// The model's dense layers, its convolutions and their outputs (elements per example), and how
// many parameters it has in all.
struct Shapes {
  std::vector<Dense> dense;
  std::vector<nn::AttentionShape> attention;  ///< one example's (n = 1)
  std::vector<Conv> convs;
  std::vector<size_t> conv_outputs;
  size_t parameters = 0;
};

Shapes shapes_of(const nn::ModelSpec& spec) {
  Shapes shapes;
  for (size_t i = 0; i < spec.nodes.size(); ++i) {
    const nn::NodeSpec& node = spec.nodes[i];
    std::vector<nn::Dims> in = spec.input_dims_of(i);
    nn::LayerCost cost = node.config->cost(in);
    bool first = node.inputs == std::vector<size_t>{nn::NodeSpec::kModelInput};
    if (cost.conv_output > 0) {
      // kernel k*c*kh*kw: its forward's multiply-adds over the output's pixels; bias k
      size_t pixels = static_cast<size_t>(node.out.h) * node.out.w;
      shapes.parameters += static_cast<size_t>(cost.macs) / pixels + node.out.c;
      shapes.conv_outputs.push_back(cost.conv_output);
      shapes.convs.push_back({cost.conv, first});
    } else if (cost.matmul_out > 0) {
      shapes.dense.push_back({cost.matmul_in, cost.matmul_out, first, cost.matmul_rows});
      shapes.parameters += static_cast<size_t>(cost.matmul_in) * cost.matmul_out + cost.matmul_out;
    }
    for (const auto& [in_features, out_features, rows] : cost.more_matmuls) {
      shapes.dense.push_back({in_features, out_features, first, rows});
      shapes.parameters += static_cast<size_t>(in_features) * out_features + out_features;
    }
    if (cost.attention.heads > 0) shapes.attention.push_back(cost.attention);
  }
  return shapes;
}

// A convolution's output passes at memory speed, on OpenMP's threads: one write and two reads of
// `bytes`, in ms.
double conv_passes_ms(ColdCache& cold, int repeats, size_t bytes) {
  const int64_t words = static_cast<int64_t>(bytes / 8 + 1);
  std::vector<uint64_t> y(static_cast<size_t>(words)), dy(static_cast<size_t>(words));
  volatile uint64_t sink = 0;
  double write = median_ms(cold, repeats, [&] {
#pragma omp parallel
    {
      int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
      int64_t begin = words * t / threads, end = words * (t + 1) / threads;
      std::memset(y.data() + begin, 1, static_cast<size_t>(end - begin) * 8);
    }
  });
  double read = median_ms(cold, repeats, [&] {
    uint64_t sum = 0;
#pragma omp parallel for reduction(+ : sum)
    for (int64_t i = 0; i < words; ++i)
      sum += y[static_cast<size_t>(i)] ^ dy[static_cast<size_t>(i)];
    sink = sink + sum;
  });
  return write + read;
}

// A convolution's products as oneDNN's primitives compute them, every tensor already in the
// layout the primitive chose (no reorder in the timing), inputs of `type` (float32, or bf16 with
// float32 outputs): the forward, the input gradient (unless first) and the weight gradient with
// the bias's, summed, in ms.
double conv_products_ms(ColdCache& cold, int repeats, const dnnl::engine& engine,
                        const nn::ConvShape& s, bool first, Type type) {
  dnnl::stream stream(engine);
  const memory::dims src_dims = {s.n, s.c, s.h, s.w}, weight_dims = {s.k, s.c, s.kh, s.kw},
                     dst_dims = {s.n, s.k, s.oh(), s.ow()};
  const memory::desc src(src_dims, type, Tag::any), weights(weight_dims, type, Tag::any),
      dst(dst_dims, Type::f32, Tag::any), diff_dst(dst_dims, type, Tag::any),
      diff_src(src_dims, Type::f32, Tag::any), diff_weights(weight_dims, Type::f32, Tag::any),
      bias({s.k}, Type::f32, Tag::x);
  const memory::dims strides = {s.sh, s.sw}, pad_l = {s.pad_top, s.pad_left},
                     pad_r = {s.pad_bottom, s.pad_right};
  const auto direct = dnnl::algorithm::convolution_direct;
  dnnl::convolution_forward::primitive_desc forward(
      {dnnl::prop_kind::forward_training, direct, src, weights, bias, dst, strides, pad_l, pad_r},
      engine);
  dnnl::convolution_forward forward_primitive(forward);
  memory x = filled_memory(engine, forward.src_desc(), 1);
  memory w = filled_memory(engine, forward.weights_desc(), 2);
  memory b = filled_memory(engine, bias, 3);
  memory y(forward.dst_desc(), engine);
  double ms = median_ms(cold, repeats, [&] {
    forward_primitive.execute(
        stream, {{DNNL_ARG_SRC, x}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_BIAS, b}, {DNNL_ARG_DST, y}});
    stream.wait();
  });
  if (!first) {
    dnnl::convolution_backward_data::primitive_desc data(
        {direct, diff_src, weights, diff_dst, strides, pad_l, pad_r}, engine, forward);
    dnnl::convolution_backward_data data_primitive(data);
    memory dy = filled_memory(engine, data.diff_dst_desc(), 4);
    memory wd = filled_memory(engine, data.weights_desc(), 5);
    memory dx(data.diff_src_desc(), engine);
    ms += median_ms(cold, repeats, [&] {
      data_primitive.execute(
          stream, {{DNNL_ARG_DIFF_DST, dy}, {DNNL_ARG_WEIGHTS, wd}, {DNNL_ARG_DIFF_SRC, dx}});
      stream.wait();
    });
  }
  dnnl::convolution_backward_weights::primitive_desc grads(
      {direct, src, diff_weights, bias, diff_dst, strides, pad_l, pad_r}, engine, forward);
  dnnl::convolution_backward_weights grads_primitive(grads);
  memory xs = filled_memory(engine, grads.src_desc(), 6);
  memory dy = filled_memory(engine, grads.diff_dst_desc(), 7);
  memory dw(grads.diff_weights_desc(), engine), db(bias, engine);
  ms += median_ms(cold, repeats, [&] {
    grads_primitive.execute(stream, {{DNNL_ARG_SRC, xs},
                                     {DNNL_ARG_DIFF_DST, dy},
                                     {DNNL_ARG_DIFF_WEIGHTS, dw},
                                     {DNNL_ARG_DIFF_BIAS, db}});
    stream.wait();
  });
  return ms;
}

// An attention's six batched products over n examples' heads (forward: the scores q k^T and the
// weighted sum p v; backward: dp = dy v^T, dv = p^T dy, dq = ds k, dk = ds^T q), each one
// oneDNN matmul over the n x heads pairs with operands of `type` already in place (transposes as
// strided views), float32 outputs, summed, in ms. The mask, the softmax and the rest are free.
double attention_products_ms(ColdCache& cold, int repeats, const dnnl::engine& engine, int n,
                             const nn::AttentionShape& a, Type type) {
  dnnl::stream stream(engine);
  const memory::dim pairs = static_cast<memory::dim>(n) * a.heads, t = a.t, kd = a.key_dim,
                    vd = a.value_dim;
  // One product (pairs x m x k) (pairs x k x n); transposed_b: b stored as (pairs x n x k).
  auto product_ms = [&](memory::dim m, memory::dim k, memory::dim cols, bool transposed_a,
                        bool transposed_b) {
    memory::desc a_md({pairs, m, k}, type,
                      transposed_a ? memory::dims{m * k, 1, m} : memory::dims{m * k, k, 1});
    memory::desc b_md(
        {pairs, k, cols}, type,
        transposed_b ? memory::dims{k * cols, 1, k} : memory::dims{k * cols, cols, 1});
    memory::desc c_md({pairs, m, cols}, Type::f32, Tag::abc);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), engine);
    dnnl::matmul primitive(pd);
    memory am = filled_memory(engine, a_md, 11), bm = filled_memory(engine, b_md, 12);
    memory cm(c_md, engine);
    return median_ms(cold, repeats, [&] {
      primitive.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
      stream.wait();
    });
  };
  return product_ms(t, kd, t, false, true) +   // scores = q k^T
         product_ms(t, t, vd, false, false) +  // y = p v
         product_ms(t, vd, t, false, true) +   // dp = dy v^T
         product_ms(t, t, vd, true, false) +   // dv = p^T dy
         product_ms(t, t, kd, false, false) +  // dq = ds k
         product_ms(t, t, kd, true, false);    // dk = ds^T q
}

// The fastest float32 form of each product of one dense layer, summed, in ms.
double fp32_products_ms(ColdCache& cold, int repeats, const dnnl::engine& engine, int n,
                        const Dense& d) {
  const int in = d.in, out = d.out;
  std::vector<float> x = random_floats(static_cast<size_t>(n) * in, 1);
  std::vector<float> xt = random_floats(static_cast<size_t>(n) * in, 2);
  std::vector<float> w = random_floats(static_cast<size_t>(in) * out, 3);
  std::vector<float> dy = random_floats(static_cast<size_t>(n) * out, 4);
  std::vector<float> y(static_cast<size_t>(n) * out), dx(static_cast<size_t>(n) * in);
  std::vector<float> dw(static_cast<size_t>(in) * out);
  auto best = [&](std::vector<std::function<void()>> forms) {
    double ms = 1e30;
    for (auto& f : forms) ms = std::min(ms, median_ms(cold, repeats, f));
    return ms;
  };
  double total = best({
      [&] { sgemm('N', 'N', n, out, in, x.data(), in, w.data(), out, y.data(), out); },
      [&] { sgemm('T', 'N', n, out, in, xt.data(), n, w.data(), out, y.data(), out); },
  });
  if (!d.first) {
    Product primitive(engine, Type::f32, n, out, in, {out, 1}, {1, out}, false);
    total += best({
        [&] { sgemm('N', 'T', n, in, out, dy.data(), out, w.data(), out, dx.data(), in); },
        [&] { sgemm('N', 'T', in, n, out, w.data(), out, dy.data(), out, dx.data(), n); },
        [&] { primitive.run(); },
    });
  }
  total += best({
      [&] { sgemm('T', 'N', in, out, n, x.data(), in, dy.data(), out, dw.data(), out); },
      [&] { sgemm('N', 'N', in, out, n, xt.data(), n, dy.data(), out, dw.data(), out); },
  });
  return total;
}

// The fastest bf16 form of each product of one dense layer, summed, in ms.
double bf16_products_ms(ColdCache& cold, int repeats, const dnnl::engine& engine, int n,
                        const Dense& d) {
  const int in = d.in, out = d.out;
  auto best = [&](std::vector<Product> forms) {
    double ms = 1e30;
    for (Product& p : forms) ms = std::min(ms, median_ms(cold, repeats, [&] { p.run(); }));
    return ms;
  };
  const Type bf16 = Type::bf16;
  std::vector<Product> forward;
  forward.emplace_back(engine, bf16, n, in, out, memory::dims{in, 1}, memory::dims{out, 1}, false);
  forward.emplace_back(engine, bf16, n, in, out, memory::dims{in, 1}, memory::dims{out, 1}, true);
  double total = best(std::move(forward));
  if (!d.first) {
    std::vector<Product> data;  // dx = dy w^T: w^T a view of w, or packed
    data.emplace_back(engine, bf16, n, out, in, memory::dims{out, 1}, memory::dims{1, out}, false);
    data.emplace_back(engine, bf16, n, out, in, memory::dims{out, 1}, memory::dims{1, out}, true);
    total += best(std::move(data));
  }
  std::vector<Product> weights;  // dw = x^T dy: x^T a view of x, or stored transposed
  weights.emplace_back(engine, bf16, in, n, out, memory::dims{1, in}, memory::dims{out, 1}, false);
  weights.emplace_back(engine, bf16, in, n, out, memory::dims{n, 1}, memory::dims{out, 1}, false);
  total += best(std::move(weights));
  return total;
}

int run(int argc, char** argv) {
  if (argc < 3 || argc > 4)
    throw common::ConfigError("usage: product_bound JOB_FILE BATCH [REPEATS]");
  const std::string job_file = argv[1];
  const int batch = std::stoi(argv[2]);
  const int repeats = argc > 3 ? std::stoi(argv[3]) : 15;
  if (batch < 1 || repeats < 1) throw common::ConfigError("product_bound: BATCH and REPEATS >= 1");
  auto doc = common::JsonDocument::parse(common::read_file(job_file), job_file);
  train::TrainConfig config = train::parse_train_config(doc.root().at("train").dump(), job_file);
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  ColdCache cold;

  double fp32 = 0, bf16 = 0;
  const bool has_bf16 = nn::cpu_supports(nn::MathMode::kBfloat16);
  Shapes shapes = shapes_of(config.model);
  const size_t parameters = shapes.parameters;
  for (const Dense& d : shapes.dense) {
    fp32 += fp32_products_ms(cold, repeats, engine, batch * d.rows, d);
    if (has_bf16) bf16 += bf16_products_ms(cold, repeats, engine, batch * d.rows, d);
  }
  for (const nn::AttentionShape& a : shapes.attention) {
    fp32 += attention_products_ms(cold, repeats, engine, batch, a, Type::f32);
    if (has_bf16) bf16 += attention_products_ms(cold, repeats, engine, batch, a, Type::bf16);
  }

  // The optimizer's pass: SGD with momentum over every parameter, as the backend runs it.
  auto backend = nn::make_dnnl_backend();
  std::vector<float> w = random_floats(parameters, 5), g = random_floats(parameters, 6);
  std::vector<float> v(parameters, 0.0f);
  nn::SgdParams sgd;
  sgd.learning_rate = 1e-6f, sgd.momentum = 0.9f;
  double sgd_ms = median_ms(
      cold, repeats, [&] { backend->sgd_update(sgd, parameters, w.data(), g.data(), v.data()); });
  double conv_fp32 = 0, conv_bf16 = 0;
  for (size_t per_example : shapes.conv_outputs) {
    size_t elements = per_example * static_cast<size_t>(batch);
    conv_fp32 += conv_passes_ms(cold, repeats, elements * 4);
    conv_bf16 += conv_passes_ms(cold, repeats, elements * 2);
  }
  // The convolutions' own arithmetic, where dtrain runs oneDNN's primitives for them: a
  // convolution its direct loops take (a first layer's few channels) counts its passes alone.
  double conv_products_fp32 = 0, conv_products_bf16 = 0;
  for (const Conv& c : shapes.convs) {
    nn::ConvShape s = c.shape;
    s.n = batch;
    if (nn::direct_conv::suits(s)) continue;
    conv_products_fp32 += conv_products_ms(cold, repeats, engine, s, c.first, Type::f32);
    if (has_bf16)
      conv_products_bf16 += conv_products_ms(cold, repeats, engine, s, c.first, Type::bf16);
  }
  std::string bf16_cell = has_bf16 ? fmt::format("{:.3f}", bf16) : "n/a";
  std::string conv_bf16_cell = has_bf16 ? fmt::format("{:.3f}", conv_products_bf16) : "n/a";
  std::printf("bound %d %.3f %s %.3f %.3f %.3f %.3f %s\n", batch, fp32, bf16_cell.c_str(), sgd_ms,
              conv_fp32, conv_bf16, conv_products_fp32, conv_bf16_cell.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return common::run_main("product_bound", [&] { return run(argc, argv); });
}
