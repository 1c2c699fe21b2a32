// Whole-model checks of the CUDA backend on a GPU: random convolution shapes and the elementwise
// operations against the reference backend, a Model training step (TrainStep: staged
// input, loss on the device, bucketed all-reduce in a world of one, optimizer) on the GPU against
// the same steps on the reference, a step replayed as a CUDA graph against the same step
// launched op by op, and loss scaling (its kernels, and steps with a dynamic and a fixed scale
// against unscaled ones). Without a GPU every test says "no GPU" and checks nothing.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "worker/comm/ring_communicator.h"
#include "worker/gpu/gpu_info.h"
#include "worker/nn/backend.h"
#include "worker/nn/model.h"
#include "worker/spec/train_config.h"
#include "worker/train/input_stager.h"
#include "worker/train/optimizer.h"
#include "worker/train/train_step.h"

using namespace dtrain;

namespace {

bool have_gpu() {
  static const int count = gpu::visible_gpu_count();
  if (count == 0)
    WARN("no GPU, CUDA training tests skipped: " << gpu::describe(gpu::probe_build()));
  return count > 0;
}

std::vector<float> random_vector(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

void check_close(const std::vector<float>& got, const std::vector<float>& want, float tolerance,
                 const char* what) {
  REQUIRE(got.size() == want.size());
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(got[i] - want[i]) <= tolerance * (1.0f + std::fabs(want[i])))) ++bad;
  INFO(what << ": " << bad << " of " << got.size() << " elements differ by more than "
            << tolerance);
  CHECK(bad == 0);
}

nn::Buffer<float> on(nn::Backend& b, const std::vector<float>& host) {
  nn::Buffer<float> buffer(b.device(), host.size());
  buffer.from_host(host);
  return buffer;
}

const char* kModel = R"({
  "model": {"input_shape": [12, 12, 1], "layers": [
    {"type": "conv2d", "filters": 6, "kernel_size": 3, "activation": "relu"},
    {"type": "max_pooling2d", "pool_size": 2},
    {"type": "conv2d", "filters": 4, "kernel_size": 2, "padding": "same"},
    {"type": "relu"},
    {"type": "flatten"},
    {"type": "dense", "units": 16, "activation": "relu"},
    {"type": "dense", "units": 10}]},
  "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
  "optimizer": OPTIMIZER,
  "data": {"source": "synthetic", "examples": 64, "classes": 10},
  "per_worker_batch_size": 16, "epochs": 1})";

train::TrainConfig config_with(const std::string& optimizer) {
  std::string text = kModel;
  text.replace(text.find("OPTIMIZER"), 9, optimizer);
  return train::parse_train_config(text, "test");
}

// Where a loss scale stands after train_steps, and the optimizer's count (settled).
struct ScaleOutcome {
  train::LossScaleState state;
  int64_t skipped = 0, iterations = 0;
};

// K steps of TrainStep on backend from the same initial weights and batches; the weights after.
// Step nan_step's images are all NaN. From step stop_step on, this worker asks to stop (the
// request rides in each step's statistics, copied from pinned memory by the step itself), and
// each step's read-back must say so.
std::vector<float> train_steps(nn::Backend& backend, const train::TrainConfig& c, int steps,
                               bool graphs, bool* graphed = nullptr,
                               const train::LossScaleSpec& loss_scale = {}, int nan_step = -1,
                               ScaleOutcome* outcome = nullptr, int stop_step = -1) {
  nn::Model model(c.model, backend, c.per_worker_batch_size);
  model.initialize(7);
  train::Optimizer optimizer(c.optimizer, model.parameters().size(), backend.device());
  comm::SoloCommunicator solo;
  train::StepOptions options;
  options.graphs = graphs;
  options.min_bucket_floats = 100;  // several buckets
  options.loss_scale = loss_scale;
  train::TrainStep step(model, optimizer, backend, solo, options);
  size_t per_example = model.input_dims().size(), n = c.per_worker_batch_size;
  train::InputStager stager(backend.device(), per_example, static_cast<int>(n));
  std::mt19937 rng(11);
  for (int s = 0; s < steps; ++s) {
    std::vector<float> images = random_vector(per_example * n, rng);
    if (s == nan_step) std::fill(images.begin(), images.end(), NAN);
    std::vector<int32_t> labels(n);
    for (size_t i = 0; i < n; ++i) labels[i] = static_cast<int32_t>((i * 7 + s) % 10);
    int slot = s % train::InputStager::kSlots;
    stager.stage(slot, images.data(), labels.data(), static_cast<int>(n));
    stager.ready();
    if (s == stop_step) step.request_stop();
    step.run(stager.images(slot), stager.labels(slot), static_cast<int>(n), {1, 0, s}, slot);
    INFO("step " << s);
    CHECK(step.stop_agreed(0) == (stop_step >= 0 && s >= stop_step));
  }
  train::EpochTotals totals = step.totals();
  CHECK(totals.seen == Approx(static_cast<double>(steps) * n));
  if (graphed) *graphed = step.graphed();
  if (outcome) {
    *outcome = {step.loss_scale().state(), step.skipped_steps(), optimizer.iterations()};
  }
  return model.parameters().to_host();
}

}  // namespace

TEST_CASE("CUDA convolution equals the reference on random shapes (small-filter kernel too)") {
  if (!have_gpu()) return;
  auto gpu = nn::make_cuda_backend();
  auto ref = nn::make_reference_backend();
  std::mt19937 rng(21);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 25; ++trial) {
    nn::ConvShape s;
    s.n = pick(1, 4), s.c = pick(1, 5), s.h = pick(4, 17), s.w = pick(4, 17), s.k = pick(1, 6);
    s.kh = pick(1, std::min(4, s.h)), s.kw = pick(1, std::min(4, s.w));
    if (trial % 3 == 0)
      s.kh = s.kw = std::min({(trial / 3) % 4 == 3 ? 5 : (trial / 3) % 4 + 1, s.h,
                              s.w});  // the small-filter kernel's sizes
    s.sh = pick(1, 2), s.sw = pick(1, 2);
    if (trial % 2)
      s.pad_top = pick(0, 1), s.pad_bottom = pick(0, 1), s.pad_left = pick(0, 1),
      s.pad_right = pick(0, 1);
    INFO("trial " << trial << ": n" << s.n << " c" << s.c << " " << s.h << "x" << s.w << " k" << s.k
                  << " " << s.kh << "x" << s.kw << " stride " << s.sh << "x" << s.sw);
    auto x = random_vector(s.input_count(), rng), w = random_vector(s.weight_count(), rng),
         b = random_vector(s.k, rng), dy = random_vector(s.output_count(), rng);
    std::vector<float> y(s.output_count()), dx(s.input_count()), dw(s.weight_count()), db(s.k);
    ref->conv2d_forward(s, x.data(), w.data(), b.data(), y.data());
    ref->conv2d_backward_data(s, dy.data(), w.data(), dx.data());
    ref->conv2d_backward_weights(s, x.data(), dy.data(), dw.data(), db.data());
    auto gx = on(*gpu, x), gw = on(*gpu, w), gb = on(*gpu, b), gdy = on(*gpu, dy);
    nn::Buffer<float> gy(gpu->device(), y.size()), gdx(gpu->device(), dx.size()),
        gdw(gpu->device(), dw.size()), gdb(gpu->device(), db.size());
    gpu->conv2d_forward(s, gx.data(), gw.data(), gb.data(), gy.data());
    gpu->conv2d_backward_data(s, gdy.data(), gw.data(), gdx.data());
    gpu->conv2d_backward_weights(s, gx.data(), gdy.data(), gdw.data(), gdb.data());
    check_close(gy.to_host(), y, 1e-4f, "conv forward");
    check_close(gdx.to_host(), dx, 1e-4f, "conv backward data");
    check_close(gdw.to_host(), dw, 1e-4f, "conv backward weights");
    check_close(gdb.to_host(), db, 1e-4f, "conv bias gradient");
  }
}

TEST_CASE("CUDA add, multiply and dropout equal the reference exactly") {
  if (!have_gpu()) return;
  auto gpu = nn::make_cuda_backend();
  auto ref = nn::make_reference_backend();
  std::mt19937 rng(23);
  const size_t n = 100003;
  auto x = random_vector(n, rng), y = random_vector(n, rng);
  std::vector<float> sum = y, product(n), dropped(n), mask(n);
  ref->add(n, x.data(), sum.data());
  ref->multiply(n, x.data(), y.data(), product.data());
  ref->dropout_forward(n, 0.3f, 0xfeedULL, x.data(), dropped.data(), mask.data());
  auto gx = on(*gpu, x), gy = on(*gpu, y);
  nn::Buffer<float> gp(gpu->device(), n), gd(gpu->device(), n), gm(gpu->device(), n);
  gpu->multiply(n, gx.data(), gy.data(), gp.data());
  gpu->add(n, gx.data(), gy.data());
  gpu->dropout_forward(n, 0.3f, 0xfeedULL, gx.data(), gd.data(), gm.data());
  CHECK(gy.to_host() == sum);
  CHECK(gp.to_host() == product);
  CHECK(gm.to_host() == mask);  // the same counter-based draws on both
  CHECK(gd.to_host() == dropped);
  size_t kept = 0;
  for (float m : mask) kept += m > 0;
  CHECK(std::fabs(double(kept) / n - 0.7) < 0.01);
}

TEST_CASE("A training step on the GPU equals the same steps on the reference backend") {
  if (!have_gpu()) return;
  for (const char* optimizer : {R"({"type": "sgd", "learning_rate": 0.05, "momentum": 0.9})",
                                R"({"type": "adam", "learning_rate": 0.01})"}) {
    INFO(optimizer);
    train::TrainConfig c = config_with(optimizer);
    auto gpu = nn::make_cuda_backend();
    auto ref = nn::make_reference_backend();
    bool graphed = false;
    std::vector<float> on_gpu = train_steps(*gpu, c, 6, true, &graphed);
    std::vector<float> on_ref = train_steps(*ref, c, 6, false);
    check_close(on_gpu, on_ref, 2e-4f, "weights after 6 steps");
    CHECK(graphed == (c.optimizer.type ==
                      train::OptimizerType::kSgd));  // Adam's rate changes per step: no graph
  }
}

TEST_CASE("A stop asked for before a replayed step reaches that step's read-back") {
  // The request is a float in pinned memory that each step copies into its statistics: in a
  // recorded step the copy must read it when the graph runs, not when it was recorded (steps 1
  // and 2 record; 4 and 5 replay).
  if (!have_gpu()) return;
  train::TrainConfig c = config_with(R"({"type": "sgd", "learning_rate": 0.05, "momentum": 0.9})");
  auto gpu = nn::make_cuda_backend();
  bool graphed = false;
  train_steps(*gpu, c, 6, true, &graphed, {}, -1, nullptr, 4);
  CHECK(graphed);
}

TEST_CASE("A step replayed as a CUDA graph equals the step launched op by op, bit for bit") {
  if (!have_gpu()) return;
  train::TrainConfig c = config_with(R"({"type": "sgd", "learning_rate": 0.05, "momentum": 0.9})");
  auto a = nn::make_cuda_backend();
  bool graphed = false;
  std::vector<float> with_graphs = train_steps(*a, c, 7, true, &graphed);
  CHECK(graphed);
  auto b = nn::make_cuda_backend();
  bool eager_graphed = true;
  std::vector<float> eager = train_steps(*b, c, 7, false, &eager_graphed);
  CHECK_FALSE(eager_graphed);
  CHECK(with_graphs == eager);
}

TEST_CASE(
    "CUDA dense layers, ReLU, max pooling and the loss equal the reference on random shapes") {
  if (!have_gpu()) return;
  auto gpu = nn::make_cuda_backend();
  auto ref = nn::make_reference_backend();
  std::mt19937 rng(29);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 12; ++trial) {
    int n = pick(1, 70), in = pick(1, 300), out = pick(1, 40);
    INFO("trial " << trial << ": dense n" << n << " in" << in << " out" << out);
    auto x = random_vector(size_t(n) * in, rng), w = random_vector(size_t(in) * out, rng),
         b = random_vector(out, rng), dy = random_vector(size_t(n) * out, rng);
    std::vector<float> y(size_t(n) * out), dx(x.size()), dw(w.size()), db(out), r(y.size()),
        dr(y.size());
    ref->dense_forward(n, in, out, x.data(), w.data(), b.data(), y.data());
    ref->dense_backward_data(n, in, out, dy.data(), w.data(), dx.data());
    ref->dense_backward_weights(n, in, out, x.data(), dy.data(), dw.data(), db.data());
    ref->relu_forward(y.size(), y.data(), r.data());
    ref->relu_backward(y.size(), r.data(), dy.data(), dr.data());
    auto gx = on(*gpu, x), gw = on(*gpu, w), gb = on(*gpu, b), gdy = on(*gpu, dy);
    nn::Buffer<float> gy(gpu->device(), y.size()), gdx(gpu->device(), dx.size()),
        gdw(gpu->device(), dw.size()), gdb(gpu->device(), db.size()), gr(gpu->device(), y.size()),
        gdr(gpu->device(), y.size());
    gpu->dense_forward(n, in, out, gx.data(), gw.data(), gb.data(), gy.data());
    gpu->dense_backward_data(n, in, out, gdy.data(), gw.data(), gdx.data());
    int split = pick(0, in);  // the weight gradient in two row blocks, as the layer makes it
    gpu->dense_backward_weight_rows(n, in, out, gx.data(), gdy.data(), gdw.data(), split, in);
    gpu->dense_backward_weight_rows(n, in, out, gx.data(), gdy.data(), gdw.data(), 0, split);
    gpu->dense_backward_bias(n, out, gdy.data(), gdb.data());
    auto gy_ref = on(*gpu, y);  // the reference's y, so ReLU is compared exactly
    gpu->relu_forward(y.size(), gy_ref.data(), gr.data());
    gpu->relu_backward(y.size(), gr.data(), gdy.data(), gdr.data());
    check_close(gy.to_host(), y, 1e-4f, "dense forward");
    check_close(gdx.to_host(), dx, 1e-4f, "dense backward data");
    check_close(gdw.to_host(), dw, 1e-4f, "dense weight gradient");
    check_close(gdb.to_host(), db, 1e-4f, "dense bias gradient");
    check_close(gr.to_host(), r, 0.0f, "relu forward");
    check_close(gdr.to_host(), dr, 0.0f, "relu backward");

    nn::PoolShape p;
    p.n = pick(1, 4), p.c = pick(1, 5), p.h = pick(2, 15), p.w = pick(2, 15);
    p.kh = pick(1, std::min(3, p.h)), p.kw = pick(1, std::min(3, p.w));
    p.sh = pick(1, 3), p.sw = pick(1, 3);
    INFO("pool " << p.n << "x" << p.c << "x" << p.h << "x" << p.w << " window " << p.kh << "x"
                 << p.kw << " stride " << p.sh << "x" << p.sw);
    std::vector<float> px(p.input_count());
    std::iota(px.begin(), px.end(), 0.0f);
    std::shuffle(px.begin(), px.end(), rng);  // distinct values: one arg-max per window
    auto pdy = random_vector(p.output_count(), rng);
    std::vector<float> py(p.output_count()), pdx(px.size());
    std::vector<unsigned char> ref_ws(ref->maxpool_workspace_bytes(p));
    ref->maxpool_forward(p, px.data(), py.data(), ref_ws.data());
    ref->maxpool_backward(p, pdy.data(), ref_ws.data(), pdx.data());
    auto gpx = on(*gpu, px), gpdy = on(*gpu, pdy);
    nn::Buffer<float> gpy(gpu->device(), py.size()), gpdx(gpu->device(), pdx.size());
    nn::Buffer<unsigned char> gws(gpu->device(), gpu->maxpool_workspace_bytes(p));
    gpu->maxpool_forward(p, gpx.data(), gpy.data(), gws.data());
    gpu->maxpool_backward(p, gpdy.data(), gws.data(), gpdx.data());
    check_close(gpy.to_host(), py, 0.0f, "max pool forward");
    check_close(gpdx.to_host(), pdx, 1e-6f, "max pool backward");

    int classes = pick(2, 12);
    auto logits = random_vector(size_t(n) * classes, rng, 5.0f);
    std::vector<int32_t> labels(n);
    for (int32_t& l : labels) l = pick(0, classes - 1);
    std::vector<float> dlogits(logits.size()), totals = {0, 0, 0};
    ref->softmax_cross_entropy(n, classes, logits.data(), labels.data(), dlogits.data(),
                               totals.data());
    auto glogits = on(*gpu, logits);
    nn::Buffer<int32_t> glabels(gpu->device(), labels.size());
    glabels.from_host(labels);
    nn::Buffer<float> gd(gpu->device(), dlogits.size()), gt(gpu->device(), 3);
    gpu->softmax_cross_entropy(n, classes, glogits.data(), glabels.data(), gd.data(), gt.data());
    check_close(gd.to_host(), dlogits, 1e-5f, "loss gradient");
    check_close(gt.to_host(), totals, 1e-5f, "loss sum, correct, examples");
  }
}

TEST_CASE("CUDA loss scaling equals the reference and flags a non-finite gradient") {
  if (!have_gpu()) return;
  auto gpu = nn::make_cuda_backend();
  auto ref = nn::make_reference_backend();
  std::mt19937 rng(31);
  const size_t n = 100003;
  auto x = random_vector(n, rng);
  std::vector<float> scaled = x, unscaled = x;
  const float big = 1024.0f, three = 3.0f;
  ref->scale(n, &big, scaled.data());
  float ref_flag = 0;
  ref->unscale_gradients(n, &three, unscaled.data(), &ref_flag);
  auto gs = on(*gpu, x), gu = on(*gpu, x);
  nn::Buffer<float> flag(gpu->device(), 1);
  auto scales = on(*gpu, {1024.0f, 3.0f, 2.0f});  // the scale lives in device memory
  gpu->scale(n, scales.data(), gs.data());
  gpu->unscale_gradients(n, scales.data() + 1, gu.data(), flag.data());
  CHECK(gs.to_host() == scaled);
  CHECK(gu.to_host() == unscaled);
  CHECK(ref_flag == 0.0f);
  CHECK(flag.to_host()[0] == 0.0f);

  x[n / 2] = INFINITY;
  x[n - 1] = NAN;
  auto bad = on(*gpu, x);
  gpu->unscale_gradients(n, scales.data() + 2, bad.data(), flag.data());
  CHECK(flag.to_host()[0] == 1.0f);
  gpu->unscale_gradients(n, scales.data() + 2, gu.data(), flag.data());  // finite: stays raised
  CHECK(flag.to_host()[0] == 1.0f);
  gpu->unscale_gradients(n, scales.data() + 2, gu.data(), nullptr);  // no check asked for
}

TEST_CASE("CUDA applies the loss-scale rule and skips SGD and RMSprop as the host does") {
  if (!have_gpu()) return;
  auto gpu = nn::make_cuda_backend();
  auto ref = nn::make_reference_backend();
  std::vector<float> host_state = {0x1p125f, 0, 0, 0, 0};
  auto state = on(*gpu, host_state);
  std::mt19937 rng(5);
  for (int step = 0; step < 60; ++step) {
    bool finite = rng() % 4 != 0;
    host_state[nn::Backend::kNonfinite] = finite ? 0.0f : 1.0f;
    state.from_host(&host_state[nn::Backend::kNonfinite], 1, nn::Backend::kNonfinite);
    ref->update_loss_scale(host_state.data(), 3);
    gpu->update_loss_scale(state.data(), 3);
    INFO("step " << step);
    REQUIRE(state.to_host() == host_state);
  }
  CHECK(host_state[nn::Backend::kSkipped] > 5);

  const size_t n = 4099;
  auto w0 = random_vector(n, rng), g = random_vector(n, rng), v0 = random_vector(n, rng);
  auto raised = on(*gpu, {1.0f});
  auto w = on(*gpu, w0), gg = on(*gpu, g), v = on(*gpu, v0), m = on(*gpu, v0), a = on(*gpu, w0);
  gpu->sgd_update({0.1f, 0.9f, false, {raised.data()}}, n, w.data(), gg.data(), v.data());
  gpu->rmsprop_update({0.01f, 0.9f, 0.5f, 1e-7f, true, {raised.data()}}, n, w.data(), gg.data(),
                      v.data(), m.data(), a.data());
  CHECK(w.to_host() == w0);
  CHECK(v.to_host() == v0);
  CHECK(m.to_host() == v0);
  CHECK(a.to_host() == w0);
  auto lowered = on(*gpu, {0.0f});
  gpu->sgd_update({0.1f, 0.9f, false, {lowered.data()}}, n, w.data(), gg.data(), v.data());
  CHECK(w.to_host() != w0);

  // The step before skipped: the rate of a count one lower, and Adam's step - 1. (Adam's second
  // moment is never negative.)
  std::vector<float> second = v0;
  for (float& x : second) x = std::fabs(x);
  auto wa = on(*gpu, w0), ma = on(*gpu, v0), va = on(*gpu, second);
  auto wb = on(*gpu, w0), mb = on(*gpu, v0), vb = on(*gpu, second);
  gpu->adamw_update({0.01f, 0.004f, 0.9f, 0.999f, 1e-7f, {lowered.data(), raised.data(), 0.02f}}, 5,
                    n, wa.data(), gg.data(), ma.data(), va.data());
  gpu->adamw_update({0.02f, 0.004f, 0.9f, 0.999f, 1e-7f}, 4, n, wb.data(), gg.data(), mb.data(),
                    vb.data());
  CHECK(wa.to_host() == wb.to_host());
  CHECK(va.to_host() == vb.to_host());
  CHECK(wa.to_host() != w0);
  gpu->sgd_update({0.1f, 0.9f, false, {lowered.data(), raised.data(), 0.05f}}, n, wa.data(),
                  gg.data(), ma.data());
  gpu->sgd_update({0.05f, 0.9f, false}, n, wb.data(), gg.data(), mb.data());
  CHECK(wa.to_host() == wb.to_host());
}

TEST_CASE("On the GPU a power-of-two loss scale gives the unscaled steps' bits") {
  if (!have_gpu()) return;
  train::TrainConfig c = config_with(R"({"type": "sgd", "learning_rate": 0.05, "momentum": 0.9})");
  train::LossScaleSpec dynamic;
  dynamic.enabled = true;
  dynamic.initial_scale = 1024;
  train::LossScaleSpec fixed = dynamic;
  fixed.dynamic = false;
  auto a = nn::make_cuda_backend();
  std::vector<float> plain = train_steps(*a, c, 5, false);
  auto b = nn::make_cuda_backend();
  bool graphed = true;
  CHECK(train_steps(*b, c, 5, true, &graphed, dynamic) == plain);
  CHECK(graphed);  // SGD: the device decides a skip, so nothing is read back mid-step
  auto d = nn::make_cuda_backend();
  CHECK(train_steps(*d, c, 5, true, &graphed, fixed) == plain);
  CHECK(graphed);  // a fixed scale changes no argument and reads nothing back
}

TEST_CASE("On the GPU a step skipped inside a replayed graph changes nothing, as on the host") {
  if (!have_gpu()) return;
  train::LossScaleSpec dynamic;
  dynamic.enabled = true;
  dynamic.initial_scale = 1024;
  dynamic.growth_steps = 2;
  for (const char* optimizer : {R"({"type": "sgd", "learning_rate": 0.05, "momentum": 0.9})",
                                R"({"type": "adam", "learning_rate": 0.01})"}) {
    INFO(optimizer);
    train::TrainConfig c = config_with(optimizer);
    // Step 3 of 6 has NaN images: skipped; the scale doubles after steps 1 and 5 and halves at 3.
    ScaleOutcome replayed, eager, host;
    bool graphed = false;
    auto a = nn::make_cuda_backend();
    std::vector<float> w_graph = train_steps(*a, c, 6, true, &graphed, dynamic, 3, &replayed);
    const bool sgd = std::string(optimizer).find("sgd") != std::string::npos;
    CHECK(graphed == sgd);  // Adam's rate is an argument: the host decides its skips
    auto b = nn::make_cuda_backend();
    CHECK(train_steps(*b, c, 6, false, nullptr, dynamic, 3, &eager) == w_graph);
    auto ref = nn::make_reference_backend();
    std::vector<float> w_host = train_steps(*ref, c, 6, false, nullptr, dynamic, 3, &host);
    // Adam's first steps move each weight by about its rate whatever the gradient's size, so
    // near-zero gradients computed two ways differ by that much: its counts are compared alone.
    if (sgd) check_close(w_graph, w_host, 1e-3f, "weights after a skipped step");
    for (const ScaleOutcome* o : {&replayed, &eager, &host}) {
      CHECK(o->skipped == 1);
      CHECK(o->iterations == 5);  // the skipped step did not count (Keras)
      CHECK(o->state.scale == 2048);
      CHECK(o->state.good_steps == 0);
    }
  }
}
