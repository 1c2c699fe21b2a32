// The CUDA backend against the reference backend, method by method, on random shapes (odd sizes,
// strides, valid and asymmetric same padding). Built only with CUDA; without a GPU every test
// says "no GPU" and passes without checking anything, so run it on a GPU machine.
#include <cuda_runtime.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "worker/gpu/gpu_info.h"
#include "worker/nn/backend.h"

using namespace dtrain::nn;

namespace {

bool have_gpu() {
  static const dtrain::gpu::GpuInfo info = dtrain::gpu::probe_gpu();
  if (info.device_count == 0)
    WARN("no GPU, CUDA backend tests skipped: " << dtrain::gpu::describe(info));
  return info.device_count > 0;
}

struct Gpu {
  explicit Gpu(const std::vector<float>& host) : count(host.size()) {
    REQUIRE(cudaMalloc(&ptr, std::max<size_t>(1, count) * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMemcpy(ptr, host.data(), count * sizeof(float), cudaMemcpyHostToDevice) ==
            cudaSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // the backend's stream does not wait
  }
  explicit Gpu(size_t n) : Gpu(std::vector<float>(n, 0.0f)) {}
  ~Gpu() { cudaFree(ptr); }
  std::vector<float> host() const {
    std::vector<float> out(count);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    REQUIRE(cudaMemcpy(out.data(), ptr, count * sizeof(float), cudaMemcpyDeviceToHost) ==
            cudaSuccess);
    return out;
  }
  float* ptr = nullptr;
  size_t count;
};

std::vector<float> random_vector(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

void check_close(const std::vector<float>& got, const std::vector<float>& want, float tolerance) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    CHECK(std::fabs(got[i] - want[i]) <= tolerance * (1.0f + std::fabs(want[i])));
  }
}

}  // namespace

TEST_CASE("CUDA convolution equals the reference (forward, backward data, backward weights)") {
  if (!have_gpu()) return;
  auto gpu = make_cuda_backend();
  auto ref = make_reference_backend();
  std::mt19937 rng(3);
  for (ConvShape s : {ConvShape{2, 3, 9, 11, 4, 3, 3, 1, 1, 0, 0, 0, 0},
                      ConvShape{3, 2, 8, 8, 5, 2, 2, 1, 1, 0, 1, 0, 1},
                      ConvShape{1, 4, 13, 7, 3, 3, 5, 2, 1, 1, 1, 2, 2},
                      ConvShape{2, 1, 28, 28, 8, 3, 3, 2, 2, 0, 1, 0, 1}}) {
    size_t xs = s.input_count(), ws = s.weight_count(), ys = s.output_count();
    auto x = random_vector(xs, rng), w = random_vector(ws, rng), b = random_vector(s.k, rng),
         dy = random_vector(ys, rng);
    std::vector<float> y(ys), dx(xs), dw(ws), db(s.k);
    ref->conv2d_forward(s, x.data(), w.data(), b.data(), y.data());
    ref->conv2d_backward_data(s, dy.data(), w.data(), dx.data());
    ref->conv2d_backward_weights(s, x.data(), dy.data(), dw.data(), db.data());
    Gpu gx(x), gw(w), gb(b), gdy(dy), gy(ys), gdx(xs), gdw(ws), gdb(size_t(s.k));
    gpu->conv2d_forward(s, gx.ptr, gw.ptr, gb.ptr, gy.ptr);
    gpu->conv2d_backward_data(s, gdy.ptr, gw.ptr, gdx.ptr);
    gpu->conv2d_backward_weights(s, gx.ptr, gdy.ptr, gdw.ptr, gdb.ptr);
    check_close(gy.host(), y, 1e-4f);
    check_close(gdx.host(), dx, 1e-4f);
    check_close(gdw.host(), dw, 1e-4f);
    check_close(gdb.host(), db, 1e-4f);
  }
}

TEST_CASE("CUDA dense, ReLU and max pooling equal the reference") {
  if (!have_gpu()) return;
  auto gpu = make_cuda_backend();
  auto ref = make_reference_backend();
  std::mt19937 rng(5);
  int n = 5, in = 37, out = 11;
  auto x = random_vector(size_t(n) * in, rng), w = random_vector(size_t(in) * out, rng),
       b = random_vector(out, rng);
  auto dy = random_vector(size_t(n) * out, rng);
  std::vector<float> y(size_t(n) * out), dx(size_t(n) * in), dw(size_t(in) * out), db(out);
  ref->dense_forward(n, in, out, x.data(), w.data(), b.data(), y.data());
  ref->dense_backward_data(n, in, out, dy.data(), w.data(), dx.data());
  ref->dense_backward_weights(n, in, out, x.data(), dy.data(), dw.data(), db.data());
  Gpu gx(x), gw(w), gb(b), gdy(dy), gy(y.size()), gdx(dx.size()), gdw(dw.size()), gdb(db.size());
  gpu->dense_forward(n, in, out, gx.ptr, gw.ptr, gb.ptr, gy.ptr);
  gpu->dense_backward_data(n, in, out, gdy.ptr, gw.ptr, gdx.ptr);
  gpu->dense_backward_weights(n, in, out, gx.ptr, gdy.ptr, gdw.ptr, gdb.ptr);
  check_close(gy.host(), y, 1e-4f);
  check_close(gdx.host(), dx, 1e-4f);
  check_close(gdw.host(), dw, 1e-4f);
  check_close(gdb.host(), db, 1e-4f);

  std::vector<float> r(y.size()), dr(y.size());
  ref->relu_forward(y.size(), y.data(), r.data());
  ref->relu_backward(y.size(), r.data(), dy.data(), dr.data());
  Gpu gr(y.size()), gdr(y.size());
  gpu->relu_forward(y.size(), gy.ptr, gr.ptr);
  gpu->relu_backward(y.size(), gr.ptr, gdy.ptr, gdr.ptr);
  check_close(gr.host(), r, 1e-4f);
  check_close(gdr.host(), dr, 1e-4f);

  PoolShape p{2, 3, 9, 9, 3, 3, 2, 2};
  std::vector<float> px(size_t(2) * 3 * 9 * 9);
  for (size_t i = 0; i < px.size(); ++i)
    px[i] = static_cast<float>((i * 7919) % px.size());  // no ties
  auto pdy = random_vector(size_t(2) * 3 * p.oh() * p.ow(), rng);
  std::vector<float> py(pdy.size()), pdx(px.size());
  std::vector<char> ref_ws(ref->maxpool_workspace_bytes(p));
  ref->maxpool_forward(p, px.data(), py.data(), ref_ws.data());
  ref->maxpool_backward(p, pdy.data(), ref_ws.data(), pdx.data());
  Gpu gpx(px), gpdy(pdy), gpy(py.size()), gpdx(px.size());
  void* gws = nullptr;
  REQUIRE(cudaMalloc(&gws, gpu->maxpool_workspace_bytes(p)) == cudaSuccess);
  gpu->maxpool_forward(p, gpx.ptr, gpy.ptr, gws);
  gpu->maxpool_backward(p, gpdy.ptr, gws, gpdx.ptr);
  check_close(gpy.host(), py, 1e-6f);
  check_close(gpdx.host(), pdx, 1e-6f);
  cudaFree(gws);
}

TEST_CASE("CUDA loss and optimizers equal the reference") {
  if (!have_gpu()) return;
  auto gpu = make_cuda_backend();
  auto ref = make_reference_backend();
  std::mt19937 rng(9);
  int n = 7, classes = 10;
  auto logits = random_vector(size_t(n) * classes, rng, 4.0f);
  std::vector<int32_t> labels = {0, 3, 9, 2, 2, 7, 5};
  std::vector<float> d(logits.size()), ref_totals = {1.5f, 2.0f, 3.0f};
  ref->softmax_cross_entropy(n, classes, logits.data(), labels.data(), d.data(), ref_totals.data());
  std::vector<float> label_bits(labels.size());
  std::memcpy(label_bits.data(), labels.data(), labels.size() * sizeof(int32_t));
  Gpu gl(logits), gd(d.size()), glabels(label_bits), gtotals(std::vector<float>{1.5f, 2.0f, 3.0f});
  auto* device_labels = reinterpret_cast<const int32_t*>(glabels.ptr);
  gpu->softmax_cross_entropy(n, classes, gl.ptr, device_labels, gd.ptr, gtotals.ptr);
  check_close(gtotals.host(), ref_totals, 1e-5f);  // the sums are ADDED to what was there
  check_close(gd.host(), d, 1e-5f);
  // Without dlogits (evaluation) only the totals move.
  Gpu untouched(std::vector<float>(d.size(), 7.0f));
  gpu->softmax_cross_entropy(n, classes, gl.ptr, device_labels, nullptr, gtotals.ptr);
  std::vector<float> twice = gtotals.host();
  CHECK(twice[2] == Approx(3.0f + 2 * n));
  CHECK(twice[1] == Approx(ref_totals[1] + (ref_totals[1] - 2.0f)));

  auto w = random_vector(1000, rng), g = random_vector(1000, rng);
  std::vector<float> w_ref = w, v_ref(1000, 0.0f), m_ref(1000, 0.0f), s_ref(1000, 0.0f);
  Gpu gw(w), gg(g), gv(1000), gm(1000), gs(1000);
  SgdParams sgd{0.1f, 0.9f, true};
  AdamParams adam;
  for (int step = 1; step <= 3; ++step) {
    ref->sgd_update(sgd, 1000, w_ref.data(), g.data(), v_ref.data());
    gpu->sgd_update(sgd, 1000, gw.ptr, gg.ptr, gv.ptr);
    ref->adam_update(adam, step, 1000, w_ref.data(), g.data(), m_ref.data(), s_ref.data());
    gpu->adam_update(adam, step, 1000, gw.ptr, gg.ptr, gm.ptr, gs.ptr);
  }
  check_close(gw.host(), w_ref, 1e-5f);
}

TEST_CASE("CUDA RMSprop (plain, momentum, centered) and AdamW equal the reference") {
  if (!have_gpu()) return;
  auto gpu = make_cuda_backend();
  auto ref = make_reference_backend();
  std::mt19937 rng(11);
  const size_t n = 1000;
  auto w = random_vector(n, rng), g = random_vector(n, rng);
  for (RmspropParams p : {RmspropParams{}, RmspropParams{0.01f, 0.8f, 0.5f, 1e-7f, false},
                          RmspropParams{0.01f, 0.9f, 0.5f, 1e-6f, true}}) {
    std::vector<float> w_ref = w, v_ref(n, 0.0f), mom_ref(n, 0.0f), avg_ref(n, 0.0f);
    Gpu gw(w), gg(g), gv(n), gmom(n), gavg(n);
    for (int step = 1; step <= 3; ++step) {
      ref->rmsprop_update(p, n, w_ref.data(), g.data(), v_ref.data(), mom_ref.data(),
                          avg_ref.data());
      gpu->rmsprop_update(p, n, gw.ptr, gg.ptr, gv.ptr, gmom.ptr, gavg.ptr);
    }
    check_close(gw.host(), w_ref, 1e-5f);
    check_close(gv.host(), v_ref, 1e-5f);
  }
  AdamWParams adamw;
  adamw.weight_decay = 0.1f;
  std::vector<float> w_ref = w, m_ref(n, 0.0f), s_ref(n, 0.0f);
  Gpu gw(w), gg(g), gm(n), gs(n);
  for (int step = 1; step <= 3; ++step) {
    ref->adamw_update(adamw, step, n, w_ref.data(), g.data(), m_ref.data(), s_ref.data());
    gpu->adamw_update(adamw, step, n, gw.ptr, gg.ptr, gm.ptr, gs.ptr);
  }
  check_close(gw.host(), w_ref, 1e-5f);
  check_close(gm.host(), m_ref, 1e-5f);
}

TEST_CASE("CUDA fused conv and dense + ReLU equal the op then ReLU, bit for bit, in fp32") {
  if (!have_gpu()) return;
  auto gpu = make_cuda_backend();
  std::mt19937 rng(13);
  for (ConvShape s : {ConvShape{2, 3, 9, 11, 4, 3, 3, 1, 1, 0, 0, 0, 0},
                      ConvShape{1, 4, 13, 7, 3, 3, 5, 2, 1, 1, 1, 2, 2}}) {
    auto x = random_vector(s.input_count(), rng), w = random_vector(s.weight_count(), rng),
         b = random_vector(s.k, rng);
    Gpu gx(x), gw(w), gb(b), fused(s.output_count()), apart(s.output_count());
    gpu->conv2d_relu_forward(s, gx.ptr, gw.ptr, gb.ptr, fused.ptr);
    gpu->conv2d_forward(s, gx.ptr, gw.ptr, gb.ptr, apart.ptr);
    gpu->relu_forward(s.output_count(), apart.ptr, apart.ptr);
    CHECK(fused.host() == apart.host());
  }
  int n = 6, in = 33, out = 9;
  Gpu gx(random_vector(size_t(n) * in, rng)), gw(random_vector(size_t(in) * out, rng)),
      gb(random_vector(out, rng)), fused(size_t(n) * out), apart(size_t(n) * out);
  gpu->dense_relu_forward(n, in, out, gx.ptr, gw.ptr, gb.ptr, fused.ptr);
  gpu->dense_forward(n, in, out, gx.ptr, gw.ptr, gb.ptr, apart.ptr);
  gpu->relu_forward(size_t(n) * out, apart.ptr, apart.ptr);
  CHECK(fused.host() == apart.host());
}

namespace {

std::vector<float> absolute(std::vector<float> v) {
  for (float& x : v) x = std::fabs(x);
  return v;
}

// |got - want| <= 2u * bound + 1e-4 (1 + |want|): each product's two inputs rounded to a unit
// roundoff u, where bound is the sum of the products' magnitudes (the same op on |inputs|).
// Returns how many elements differ from want by more than fp32 rounding would.
int check_rounded(const std::vector<float>& got, const std::vector<float>& want,
                  const std::vector<float>& bound, float u) {
  REQUIRE(got.size() == want.size());
  int differ = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": " << got[i] << " vs " << want[i] << ", bound " << bound[i]);
    float error = std::fabs(got[i] - want[i]);
    CHECK(error <= 2 * u * bound[i] + 1e-4f * (1.0f + std::fabs(want[i])));
    if (error > 1e-6f * (1.0f + bound[i])) ++differ;
  }
  return differ;
}

}  // namespace

TEST_CASE("CUDA products in TF32, bf16 and fp16 stay within their rounding of the reference") {
  if (!have_gpu()) return;
  auto ref = make_reference_backend();
  struct Mode {
    MathMode mode;
    float u;  // unit roundoff of the inputs' format
  };
  for (Mode m : {Mode{MathMode::kTf32, 1.0f / 2048}, Mode{MathMode::kBfloat16, 1.0f / 256},
                 Mode{MathMode::kFloat16, 1.0f / 2048}}) {
    INFO("mode " << math_mode_name(m.mode));
    auto gpu = make_cuda_backend(m.mode);
    CHECK(gpu->math_mode() == m.mode);
    std::mt19937 rng(17);
    for (ConvShape s : {ConvShape{4, 8, 12, 12, 16, 3, 3, 1, 1, 1, 1, 1, 1},
                        ConvShape{2, 1, 28, 28, 32, 3, 3, 1, 1, 0, 0, 0, 0},
                        ConvShape{1, 4, 13, 7, 8, 3, 5, 2, 1, 1, 1, 2, 2}}) {
      size_t xs = s.input_count(), ws = s.weight_count(), ys = s.output_count();
      auto x = random_vector(xs, rng), w = random_vector(ws, rng), b = random_vector(s.k, rng),
           dy = random_vector(ys, rng);
      std::vector<float> zero(s.k, 0.0f), y(ys), y_bound(ys), dx(xs), dx_bound(xs), dw(ws),
          dw_bound(ws), db(s.k);
      ref->conv2d_forward(s, x.data(), w.data(), b.data(), y.data());
      ref->conv2d_forward(s, absolute(x).data(), absolute(w).data(), zero.data(), y_bound.data());
      ref->conv2d_backward_data(s, dy.data(), w.data(), dx.data());
      ref->conv2d_backward_data(s, absolute(dy).data(), absolute(w).data(), dx_bound.data());
      ref->conv2d_backward_weights(s, x.data(), dy.data(), dw.data(), db.data());
      ref->conv2d_backward_weights(s, absolute(x).data(), absolute(dy).data(), dw_bound.data(),
                                   db.data());
      Gpu gx(x), gw(w), gb(b), gdy(dy), gy(ys), gdx(xs), gdw(ws), gdb(size_t(s.k));
      gpu->conv2d_forward(s, gx.ptr, gw.ptr, gb.ptr, gy.ptr);
      gpu->conv2d_backward_data(s, gdy.ptr, gw.ptr, gdx.ptr);
      gpu->conv2d_backward_weights(s, gx.ptr, gdy.ptr, gdw.ptr, gdb.ptr);
      check_rounded(gy.host(), y, y_bound, m.u);
      check_rounded(gdx.host(), dx, dx_bound, m.u);
      check_rounded(gdw.host(), dw, dw_bound, m.u);
      // ReLU fused into the 16-bit epilogue: the same values, clipped.
      Gpu gr(ys);
      gpu->conv2d_relu_forward(s, gx.ptr, gw.ptr, gb.ptr, gr.ptr);
      std::vector<float> relu = gy.host();
      for (float& v : relu) v = std::max(v, 0.0f);
      CHECK(gr.host() == relu);
    }
    int n = 64, in = 512, out = 128;  // large enough for cuBLAS to pick tensor cores
    auto x = random_vector(size_t(n) * in, rng), w = random_vector(size_t(in) * out, rng),
         b = random_vector(out, rng), dy = random_vector(size_t(n) * out, rng);
    std::vector<float> zero(out, 0.0f), y(size_t(n) * out), y_bound(y.size()), dx(x.size()),
        dx_bound(x.size()), dw(w.size()), dw_bound(w.size()), db(out);
    ref->dense_forward(n, in, out, x.data(), w.data(), b.data(), y.data());
    ref->dense_forward(n, in, out, absolute(x).data(), absolute(w).data(), zero.data(),
                       y_bound.data());
    ref->dense_backward_data(n, in, out, dy.data(), w.data(), dx.data());
    ref->dense_backward_data(n, in, out, absolute(dy).data(), absolute(w).data(), dx_bound.data());
    ref->dense_backward_weights(n, in, out, x.data(), dy.data(), dw.data(), db.data());
    ref->dense_backward_weights(n, in, out, absolute(x).data(), absolute(dy).data(),
                                dw_bound.data(), db.data());
    Gpu gx(x), gw(w), gb(b), gdy(dy), gy(y.size()), gdx(dx.size()), gdw(dw.size()), gdb(db.size());
    gpu->dense_forward(n, in, out, gx.ptr, gw.ptr, gb.ptr, gy.ptr);
    gpu->dense_backward_data(n, in, out, gdy.ptr, gw.ptr, gdx.ptr);
    gpu->dense_backward_weights(n, in, out, gx.ptr, gdy.ptr, gdw.ptr, gdb.ptr);
    // The products really ran in the narrower format: most elements differ from fp32's.
    CHECK(check_rounded(gy.host(), y, y_bound, m.u) > static_cast<int>(y.size()) / 2);
    CHECK(check_rounded(gdx.host(), dx, dx_bound, m.u) > static_cast<int>(dx.size()) / 2);
    CHECK(check_rounded(gdw.host(), dw, dw_bound, m.u) > static_cast<int>(dw.size()) / 2);
  }
}

TEST_CASE("CUDA conv weight gradient with ReLU's mask fused equals ReLU's gradient, then it") {
  if (!have_gpu()) return;
  auto gpu = make_cuda_backend();
  std::mt19937 rng(19);
  for (ConvShape s : {ConvShape{8, 1, 28, 28, 32, 3, 3, 1, 1, 0, 0, 0, 0},
                      ConvShape{3, 2, 9, 9, 5, 5, 5, 2, 2, 1, 2, 1, 2},
                      ConvShape{2, 3, 8, 7, 4, 7, 7, 1, 1, 3, 3, 3, 3}}) {  // 7x7: cuDNN's path
    auto x = random_vector(s.input_count(), rng), dy = random_vector(s.output_count(), rng);
    auto y = random_vector(s.output_count(), rng);
    for (size_t i = 0; i < y.size(); i += 7) y[i] = 0.0f;  // ReLU's exact zeros
    for (float& v : y) v = std::max(v, 0.0f);
    Gpu gx(x), gy(y), gdy(dy), scratch(s.output_count()), dz(s.output_count());
    Gpu fused_w(s.weight_count()), fused_b(size_t(s.k)), apart_w(s.weight_count()),
        apart_b(size_t(s.k));
    gpu->conv2d_relu_backward_weights(s, gx.ptr, gy.ptr, gdy.ptr, fused_w.ptr, fused_b.ptr,
                                      scratch.ptr);
    gpu->relu_backward(s.output_count(), gy.ptr, gdy.ptr, dz.ptr);
    gpu->conv2d_backward_weights(s, gx.ptr, dz.ptr, apart_w.ptr, apart_b.ptr);
    CHECK(fused_w.host() == apart_w.host());
    CHECK(fused_b.host() == apart_b.host());
  }
}
