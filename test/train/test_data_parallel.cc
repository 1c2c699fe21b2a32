// Data parallelism is exact up to rounding: N workers (threads over an in-process ring, each with
// its own backend, model, optimizer and TrainStep over ThreadedCommunicator(RingCommunicator))
// each taking 1/N of every global batch train like one worker on the whole batch, within a bound
// DERIVED from the float summation order (below), and bit-identically to each other; starting
// buckets during backward or after it gives the same bits. A wrong sub-batch or a sum instead of
// the mean must break the comparison by orders of magnitude. Not the TCP link or processes.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/errors.h"
#include "test/comm/in_process_link.h"
#include "worker/comm/ring_algorithms.h"
#include "worker/comm/ring_communicator.h"
#include "worker/comm/threaded_communicator.h"
#include "worker/nn/backend.h"
#include "worker/nn/model.h"
#include "worker/spec/train_config.h"
#include "worker/train/optimizer.h"
#include "worker/train/train_step.h"

using namespace dtrain;

namespace {

using Floats = std::vector<float>;
using Doubles = std::vector<double>;

// conv2d(relu) 8x8x1 -> 6x6x4, max_pooling2d -> 3x3x4, flatten, dense(relu) 16, dense 10. Every
// activation is >= 0 and so are the images, which local_pass(absolute) relies on.
constexpr int kExampleFloats = 8 * 8;
constexpr int kConvPositions = 6 * 6;
constexpr int kHidden = 16, kClasses = 10;
constexpr int kBatch = 4;  // per worker
constexpr int kSteps = 5;
const char* kConfig = R"({
  "model": {"input_shape": [8, 8, 1], "layers": [
    {"type": "conv2d", "filters": 4, "kernel_size": 3, "activation": "relu"},
    {"type": "max_pooling2d", "pool_size": 2},
    {"type": "flatten"},
    {"type": "dense", "units": 16, "activation": "relu"},
    {"type": "dense", "units": 10}]},
  "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
  "optimizer": OPTIMIZER,
  "data": {"source": "synthetic", "examples": 64, "classes": 10},
  "per_worker_batch_size": 4, "epochs": 1})";
const char* kSgd = R"({"type": "sgd", "learning_rate": 0.05, "momentum": 0.9})";
const char* kAdam = R"({"type": "adam", "learning_rate": 0.01})";

enum class Kind { kReference, kDnnl };
enum class Fault { kNone, kDuplicateRows, kSumNotMean };  // deliberate errors: the check must fail

train::TrainConfig config_with(const std::string& optimizer) {
  std::string text = kConfig;
  text.replace(text.find("OPTIMIZER"), 9, optimizer);
  return train::parse_train_config(text, "test");
}

// Forwards every call to inner; the faults below override what they change.
class Forwarding : public comm::Communicator {
 public:
  explicit Forwarding(std::unique_ptr<comm::Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  void all_reduce(float* d, size_t n, comm::ReduceOp op) override { inner_->all_reduce(d, n, op); }
  void broadcast(void* d, size_t n, int root) override { inner_->broadcast(d, n, root); }
  void barrier() override { inner_->barrier(); }
  std::vector<uint8_t> all_gather(const void* m, size_t n) override {
    return inner_->all_gather(m, n);
  }
  void abort(const std::string& message) noexcept override { inner_->abort(message); }
  void interrupt(const std::string& why) noexcept override { inner_->interrupt(why); }
  comm::ReduceTicket start_all_reduce(float* d, size_t n, comm::ReduceOp op) override {
    return inner_->start_all_reduce(d, n, op);
  }
  void finish_all_reduce(comm::ReduceTicket t) override { inner_->finish_all_reduce(t); }

 protected:
  std::unique_ptr<comm::Communicator> inner_;
};

// TrainStep asks for means; this asks the inner communicator for sums instead (Fault).
class SumNotMean final : public Forwarding {
 public:
  using Forwarding::Forwarding;
  void all_reduce(float* d, size_t n, comm::ReduceOp) override {
    inner_->all_reduce(d, n, comm::ReduceOp::kSum);
  }
  comm::ReduceTicket start_all_reduce(float* d, size_t n, comm::ReduceOp) override {
    return inner_->start_all_reduce(d, n, comm::ReduceOp::kSum);
  }
};

// One worker; members are destroyed bottom-up, so the step goes before what it uses.
struct Worker {
  std::unique_ptr<nn::Backend> backend;
  std::unique_ptr<nn::Model> model;
  std::unique_ptr<train::Optimizer> optimizer;
  std::unique_ptr<comm::Communicator> comm;
  std::unique_ptr<train::TrainStep> step;
};

Worker make_worker(const train::TrainConfig& c, Kind kind, std::unique_ptr<comm::Communicator> comm,
                   int max_batch, bool overlap, bool whole_steps = false,
                   const train::LossScaleSpec& loss_scale = {}) {
  Worker w;
  w.backend = kind == Kind::kDnnl ? nn::make_dnnl_backend() : nn::make_reference_backend();
  w.model = std::make_unique<nn::Model>(c.model, *w.backend, max_batch);
  w.model->initialize(7);
  w.optimizer = std::make_unique<train::Optimizer>(c.optimizer, w.model->parameters().size(),
                                                   w.backend->device());
  w.comm = std::move(comm);
  train::StepOptions options;
  options.overlap = overlap;
  options.min_bucket_floats = 64;  // three buckets: dense 10, dense 16, conv (+ a remainder)
  options.whole_steps = whole_steps;
  options.loss_scale = loss_scale;
  w.step = std::make_unique<train::TrainStep>(*w.model, *w.optimizer, *w.backend, *w.comm, options);
  return w;
}

std::vector<Worker> make_ring(const train::TrainConfig& c, Kind kind, int size, bool overlap,
                              Fault fault) {
  auto links = testing::make_in_process_ring(size);
  std::vector<Worker> ring;
  for (int r = 0; r < size; ++r) {
    std::unique_ptr<comm::Communicator> comm = std::make_unique<comm::ThreadedCommunicator>(
        std::make_unique<comm::RingCommunicator>(std::move(links[r]), r, size));
    if (fault == Fault::kSumNotMean) comm = std::make_unique<SumNotMean>(std::move(comm));
    ring.push_back(make_worker(c, kind, std::move(comm), kBatch, overlap));
  }
  return ring;
}

struct Batch {
  Floats images;  // in [0, 1)
  std::vector<int32_t> labels;
};

Batch make_batch(int examples, int step) {
  std::mt19937 rng(1000 + step);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  Batch b;
  for (int i = 0; i < examples * kExampleFloats; ++i) b.images.push_back(pixel(rng));
  for (int i = 0; i < examples; ++i) b.labels.push_back(static_cast<int32_t>(rng() % kClasses));
  return b;
}

// Weights, this step's gradient buffer, optimizer slots (SGD: m is the velocity) and iterations.
struct State {
  Floats w, g, m, v;
  int64_t t = 0;
};

State state_of(Worker& w) {
  State s;
  s.w = w.model->parameters().to_host();
  s.g = w.model->gradients().to_host();
  w.step->settle_loss_scale();  // a loss scale's skips, decided on the device, in the count
  s.t = w.optimizer->iterations();
  auto slots = w.optimizer->slots();
  if (!slots.empty()) s.m = slots[0].second->to_host();
  if (slots.size() > 1) s.v = slots[1].second->to_host();
  return s;
}

void restore(Worker& w, const State& s) {
  w.model->parameters().from_host(s.w);
  auto slots = w.optimizer->slots();
  if (!slots.empty()) slots[0].second->from_host(s.m);
  if (slots.size() > 1) slots[1].second->from_host(s.v);
  w.optimizer->set_iterations(s.t);
}

void run_step(Worker& w, const float* images, const int32_t* labels, int n, int step) {
  nn::Buffer<float> x(w.backend->device(), static_cast<size_t>(n) * kExampleFloats);
  x.from_host(images, x.size());
  nn::Buffer<int32_t> y(w.backend->device(), static_cast<size_t>(n));
  y.from_host(labels, y.size());
  w.step->run(x.data(), y.data(), n, {1, 0, step}, step % 2);
  w.step->stop_agreed(0);  // a sync; on the host everything has run already
}

struct RingRun {
  std::vector<std::vector<State>> states;      // per worker: before the first step, then after each
  std::vector<train::GradientBucket> buckets;  // worker 0's
};

// kSteps steps on every worker, each worker on ONE thread of its own for all of them (oneDNN
// built without concurrent execution requires a primitive to run on the thread that created it),
// over batches[t]. Worker r takes rows [r*b, (r+1)*b); under kDuplicateRows worker 1 takes
// worker 0's. Once all are done, each thread destroys its worker: oneDNN keeps a primitive's
// scratchpad in the creating thread's thread-local storage, and a primitive destroyed on another
// thread never frees it (LeakSanitizer).
RingRun run_ring(std::vector<Worker> ring, const std::vector<Batch>& batches, Fault fault) {
  RingRun run{std::vector<std::vector<State>>(ring.size()), {}};
  std::vector<std::vector<State>>& states = run.states;
  std::vector<std::exception_ptr> errors(ring.size());
  std::mutex mutex;
  std::condition_variable all_done;
  size_t done = 0;
  std::vector<std::thread> threads;
  for (size_t r = 0; r < ring.size(); ++r) {
    threads.emplace_back([&, r] {
      size_t rows = (fault == Fault::kDuplicateRows && r == 1) ? 0 : r * kBatch;
      try {
        states[r].push_back(state_of(ring[r]));
        for (size_t t = 0; t < batches.size(); ++t) {
          run_step(ring[r], batches[t].images.data() + rows * kExampleFloats,
                   batches[t].labels.data() + rows, kBatch, static_cast<int>(t));
          states[r].push_back(state_of(ring[r]));
        }
      } catch (const std::exception& e) {
        errors[r] = std::current_exception();
        ring[r].comm->abort(e.what());
      }
      std::unique_lock<std::mutex> lock(mutex);
      if (++done == ring.size()) all_done.notify_all();
      all_done.wait(lock, [&] { return done == ring.size(); });
      if (r == 0) run.buckets = ring[0].step->buckets();
      lock.unlock();
      Worker mine = std::move(ring[r]);  // destroyed here, step first
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  return run;
}

Floats download(nn::Device& d, const float* src, size_t n) {
  Floats host(n);
  d.download(host.data(), src, n * sizeof(float));
  return host;
}

// Forward, loss and backward at w's current weights, without the optimizer or a collective.
// absolute: backward instead runs with |weights| and |dlogits| over the forward's activations,
// relu masks and pool choices, giving per parameter the sum over every path of |term| (all
// activations and images are >= 0): the A of the derivation. Host memory (host backends only).
struct Pass {
  Floats logits, dlogits, g;
};
Pass local_pass(Worker& w, const float* images, const int32_t* labels, int n, bool absolute) {
  nn::Device& d = w.backend->device();
  nn::Buffer<float> x(d, static_cast<size_t>(n) * kExampleFloats), totals(d, 3);
  x.from_host(images, x.size());
  nn::Buffer<int32_t> y(d, static_cast<size_t>(n));
  y.from_host(labels, y.size());
  const size_t outputs = static_cast<size_t>(n) * kClasses;
  Pass p;
  const float* z = w.model->forward(x.data(), n, {1, 0, 0}, true);
  p.logits = download(d, z, outputs);
  w.backend->softmax_cross_entropy(n, kClasses, z, y.data(), w.model->logits_gradient(),
                                   totals.data());
  p.dlogits = download(d, w.model->logits_gradient(), outputs);
  Floats weights = w.model->parameters().to_host();
  if (absolute) {
    auto abs_of = [](Floats v) {
      for (float& e : v) e = std::fabs(e);
      return v;
    };
    Floats dz = abs_of(p.dlogits);
    d.upload(w.model->logits_gradient(), dz.data(), outputs * sizeof(float));
    w.model->parameters().from_host(abs_of(weights));
  }
  w.model->backward(n);
  p.g = w.model->gradients().to_host();
  w.model->parameters().from_host(weights);
  return p;
}

// The ring's arithmetic replayed on the host (ring_algorithms.h): per bucket, chunk c of every
// element is ((x_c + x_{c+1}) + ...) + x_{c-1} in float, then divided by (float)N.
Floats ring_mean(const std::vector<Floats>& local,
                 const std::vector<train::GradientBucket>& buckets) {
  const int n = static_cast<int>(local.size());
  Floats out(local[0].size());
  for (const train::GradientBucket& b : buckets)
    for (int c = 0; c < n; ++c) {
      comm::IndexRange range = comm::ring_chunk(b.count, n, c);
      for (size_t i = b.offset + range.begin; i < b.offset + range.end; ++i) {
        float sum = local[c][i];
        for (int k = 1; k < n; ++k) sum += local[(c + k) % n][i];
        out[i] = sum / static_cast<float>(n);
      }
    }
  return out;
}

// ---- The bound ---------------------------------------------------------------------------------
// u = 2^-24: float round-to-nearest, |fl(x) - x| <= u|fl(x)|. Per step, from one COMMON state:
// gk = worker k's float gradient of its b rows and gs = one worker's of all N*b rows (both
// observed with local_pass); A = per parameter, the sum of |every product| the backward forms
// (observed: local_pass(absolute)). A >= |g|, and no rounding in the backward exceeds u times
// its share of A.
// (a) Ring: g_ring = fl(R/N), R = the float sum of the gk in the ring's fixed order (replayed bit
//     for bit by ring_mean). |R - sum gk| <= (N-1) u sum|gk|; /N adds u|R/N|, nothing if N = 2^j.
// (b) Compute. The forward is per example (checked: logits rows are bit-identical across batch
//     sizes; for oneDNN this premise depends on the ISA, below). If N = 2^j the loss gradient
//     (softmax - onehot)/n scales exactly (checked), so with the reference backend (double sums,
//     one float store per output) every stored backward value of the big batch is exactly 1/N of
//     the worker's, and each weight gradient is fl(D) of a double sum, D_all = sum D_k / N up to 2
//     gamma_d A:
//       |sum gk/N - gs| <= u sum|gk|/N + u|gs| + 2 gamma_d A.
//     Otherwise (N = 3: 1/(3b) is no exact scaling of 1/b; oneDNN: its float GEMM order may
//     depend on n) both are float evaluations of one linear backward map on the same dlogits;
//     each stage adds at most gamma_M of the |terms| it sums, so to first order each is within
//     c u A of the exact value, c = the sum of M over the stages of the longest path (reference:
//     5 stores: dlogits, two dense dx, pool dx, conv dw; oneDNN: 10 + 16 + 1 + N*b*36 terms):
//       |sum gk/N - gs| <= 2 c u A.
//     Loose: the conv path's c serves every layer, and gamma_M assumes all roundings add up. A
//     bound of a few ulps of sum|gk| is NOT enough here: cancellation makes A >> sum|gk| for some
//     weights (measured: 68 times over it for N = 3).
//     oneDNN's AVX-512 kernels compute a batch's rows as they compute each row alone, and the
//     premise is required there. Its AVX2 kernels do not (they block the rows differently for
//     other batch sizes; docs/testing.md#a-smaller-cpu): there the two backward maps run on
//     different dlogits and activations. To first order each backward product then moves by at
//     most (rho + sigma) of itself: rho = the largest relative difference of a dlogit between
//     the batch and its part (observed), sigma = 2 kForwardChain u for the activations (each a
//     float sum of at most that many terms in each evaluation); so (b) gains (rho + sigma) A.
//     Neglected: a relu or pool choice that flips between the two (a difference of order u at a
//     kink).
// (c) Optimizer, elementwise (propagate), from bounds on |dw|, |dslots| before and E >= |dg|:
//     SGD  dv <= mu dv + lr E + stores;  dw <= dw + dv + u(|w_a| + |w_b|).
//     Adam dm <= b1 dm + (1-b1) E;  dv <= b2 dv + (1-b2) E (|g_a| + |g_b|)  (a^2-b^2 = (a-b)(a+b));
//          dw <= dw + lr_t (dm/(s+eps) + M ds/(s+eps)^2) + u(|w_a| + |w_b|), by the mean value
//          theorem for m/(sqrt(v)+eps) on the segment: s = min sqrt(v), M = max |m|,
//          ds <= min(sqrt(dv), dv/2s).
//     The weights' store rounding dominates: they may differ by ~1 ulp per step.
// Per step the check is rigorous: a shadow single worker restarted from the ring's state must
// match the ring's step within (a) + (b), then (c). Over K steps the differences also feed back
// through the network (H dw), which we do not bound: we observe it as |gs(ring's state) -
// gs(solo's state)| and add it to E, so the K-step bound is (a) + (b) + that observed drift,
// propagated by (c). Neglected terms are O(u^2) or double roundings, within kSlack.
constexpr double kU = 0x1p-24;
constexpr double kDoubleSum = 1024 * 0x1p-53;  // gamma of any double sum here (<= 432 terms)
constexpr double kSlack = 1.01;
constexpr double kForwardChain = 9 + 36 + 16;  // conv taps, dense 36 -> 16, dense 16 -> 10

// Whether the oneDNN backend's forward is per example on this machine's ISA (see (b)).
bool dnnl_forward_per_example() {
  return nn::own_kernels_may_use(nn::VectorIsa::kAvx512);
}

bool power_of_two(int n) {
  return (n & (n - 1)) == 0;
}

// c of (b); 0 where the scaling is exact (the reference backend and N = 2^j).
double rounding_chain(Kind kind, int workers) {
  if (kind == Kind::kDnnl) return kClasses + kHidden + 1 + workers * kBatch * kConvPositions;
  return power_of_two(workers) ? 0 : 5;
}

// (a) + (b), chain as rounding_chain().
Doubles gradient_bound(const std::vector<Floats>& local, const Floats& g_solo, const Floats& a,
                       double chain) {
  const int n = static_cast<int>(local.size());
  const double ring_roundings = (n - 1) + (power_of_two(n) ? 0 : 1);
  Doubles bound(g_solo.size());
  for (size_t i = 0; i < bound.size(); ++i) {
    double sum_abs = 0;
    for (const Floats& g : local) sum_abs += std::fabs(g[i]);
    double compute = chain > 0 ? 2 * chain * kU * a[i] : kU * (sum_abs / n + std::fabs(g_solo[i]));
    bound[i] = ring_roundings * kU * sum_abs / n + compute + 2 * kDoubleSum * a[i];
  }
  return bound;
}

struct Drift {  // elementwise bounds on |a - b|
  Doubles w, m, v;
};

// (c): one optimizer step of runs a (a0 -> a1) and b (b0 -> b1), with |g_a - g_b| <= e.
// float_update: the oneDNN updates round every intermediate in float (SGD only here).
Drift propagate(const train::OptimizerSpec& o, int64_t t, bool float_update, const Drift& before,
                const Doubles& e, const State& a0, const State& a1, const State& b0,
                const State& b1) {
  Drift d{Doubles(e.size()), Doubles(e.size()), Doubles(e.size())};
  const bool adam = o.type == train::OptimizerType::kAdam;
  REQUIRE_FALSE((adam && float_update));
  const double b1c = o.adam.beta_1, b2c = o.adam.beta_2, eps = o.adam.epsilon;
  const double lr_t = o.adam.learning_rate * std::sqrt(1 - std::pow(b2c, double(t))) /
                      (1 - std::pow(b1c, double(t)));
  const double mu = o.sgd.momentum, lr = o.sgd.learning_rate;
  for (size_t i = 0; i < e.size(); ++i) {
    double step;
    if (!adam) {
      d.m[i] = mu * before.m[i] + lr * e[i] + kU * (std::fabs(a1.m[i]) + std::fabs(b1.m[i]));
      if (float_update)
        d.m[i] += kU * (mu * (std::fabs(a0.m[i]) + std::fabs(b0.m[i])) +
                        lr * (std::fabs(a1.g[i]) + std::fabs(b1.g[i])));
      step = d.m[i];
    } else {
      double dm = b1c * before.m[i] + (1 - b1c) * e[i];
      double dv = b2c * before.v[i] + (1 - b2c) * e[i] * (std::fabs(a1.g[i]) + std::fabs(b1.g[i]));
      double sigma = std::sqrt(std::min(a1.v[i], b1.v[i])) * (1 - kU);
      double big_m = std::max(std::fabs(a1.m[i]), std::fabs(b1.m[i])) * (1 + kU);
      double ds = sigma > 0 ? std::min(std::sqrt(dv), dv / (2 * sigma)) : std::sqrt(dv);
      step = lr_t * (dm / (sigma + eps) + big_m * ds / ((sigma + eps) * (sigma + eps)));
      d.m[i] = dm + kU * (std::fabs(a1.m[i]) + std::fabs(b1.m[i]));
      d.v[i] = dv + kU * (std::fabs(a1.v[i]) + std::fabs(b1.v[i]));
    }
    d.w[i] = before.w[i] + step + kU * (std::fabs(a1.w[i]) + std::fabs(b1.w[i]));
  }
  return d;
}

// max over i of |a - b| / (kSlack * bound): <= 1 passes; infinite where bound is 0 but a != b.
double worst_ratio(const Floats& a, const Floats& b, const Doubles& bound) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double diff = std::fabs(double(a[i]) - double(b[i]));
    if (diff > 0)
      worst = std::max(worst, bound[i] > 0 ? diff / (kSlack * bound[i])
                                           : std::numeric_limits<double>::infinity());
  }
  return worst;
}

double max_diff(const Floats& a, const Floats& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(double(a[i]) - b[i]));
  return worst;
}

struct Measured {
  bool workers_identical = true;  // every worker's w, g and slots equal worker 0's, every step
  bool replay_exact = true;       // g_ring == ring_mean(gk), every step
  bool forward_per_example = true, dlogits_scaled = true;  // the premises of (b)
  bool premises_required = true;  // false: oneDNN on an ISA where they do not hold (see (b))
  double worst_rho = 0;           // the largest rho of (b) seen, where the premises failed
  double grad_ratio = 0, local_ratio = 0, global_ratio = 0;  // worst |d| / bound over all steps
  double step1_grad_diff = 0, step1_grad_bound = 0;          // max |dg|, max bound at step 1
  double final_w_diff = 0, final_w_bound = 0;                // ring vs solo after K steps
};

// Checks (b)'s premises on worker k's part; returns rho of (b) for it: the largest relative
// difference between a dlogit of the part and the batch's (scaled by N), 0 where they are equal.
double check_premises(const Pass& full, const Pass& part, int k, int workers, Measured& m) {
  const size_t rows = static_cast<size_t>(kBatch) * kClasses, at = static_cast<size_t>(k) * rows;
  double rho = 0;
  for (size_t i = 0; i < rows; ++i) {
    m.forward_per_example &= full.logits[at + i] == part.logits[i];
    if (power_of_two(workers))
      m.dlogits_scaled &= full.dlogits[at + i] == part.dlogits[i] / static_cast<float>(workers);
    const double scaled = double(full.dlogits[at + i]) * workers, own = part.dlogits[i];
    if (scaled != own) rho = std::max(rho, std::fabs(scaled - own) / std::fabs(own));
  }
  return rho;
}

bool same_states(const std::vector<State>& a, const std::vector<State>& b) {
  for (size_t t = 0; t < a.size(); ++t)
    if (a[t].w != b[t].w || a[t].g != b[t].g || a[t].m != b[t].m || a[t].v != b[t].v ||
        a[t].t != b[t].t)
      return false;
  return a.size() == b.size();
}

// The bound's observations at the ring's state before a step, from the shadow worker: each
// worker's local gradient gk, and A.
struct Probes {
  std::vector<Floats> local;
  Floats a;
  double rho = 0;  // (b)'s, over the parts
};
Probes probe(Worker& shadow, const State& ring0, const Batch& batch, int workers, Measured& m) {
  const int all = workers * kBatch;
  restore(shadow, ring0);
  Pass full = local_pass(shadow, batch.images.data(), batch.labels.data(), all, false);
  Probes p;
  p.a = local_pass(shadow, batch.images.data(), batch.labels.data(), all, true).g;
  for (int k = 0; k < workers; ++k) {
    size_t row = static_cast<size_t>(k) * kBatch;
    Pass part = local_pass(shadow, batch.images.data() + row * kExampleFloats,
                           batch.labels.data() + row, kBatch, false);
    p.rho = std::max(p.rho, check_premises(full, part, k, workers, m));
    p.local.push_back(part.g);
  }
  return p;
}

// Trains `workers` ring workers and one solo worker for kSteps from the same weights on the same
// global batches. Per step, a shadow solo worker restarted from the ring's state gives the
// rigorous step check; the solo worker's own trajectory the K-step one.
Measured train_and_compare(const char* optimizer, int workers, Kind kind, Fault fault) {
  REQUIRE((kind == Kind::kReference || power_of_two(workers)));  // (b) for oneDNN needs 2^j
  train::TrainConfig c = config_with(optimizer);
  const int all = workers * kBatch;
  const double chain = rounding_chain(kind, workers);
  const bool float_update = kind == Kind::kDnnl;
  Measured m;
  m.premises_required = kind == Kind::kReference || dnnl_forward_per_example();
  std::vector<Worker> ring = make_ring(c, kind, workers, true, fault);
  Worker solo = make_worker(c, kind, std::make_unique<comm::SoloCommunicator>(), all, true);
  Worker shadow = make_worker(c, kind, std::make_unique<comm::SoloCommunicator>(), all, true);
  std::vector<Batch> batches;
  for (int t = 0; t < kSteps; ++t) batches.push_back(make_batch(all, t));
  const RingRun run = run_ring(std::move(ring), batches, fault);
  const std::vector<std::vector<State>>& history = run.states;
  for (size_t r = 1; r < history.size(); ++r)
    m.workers_identical &= same_states(history[r], history[0]);
  const size_t params = solo.model->parameters().size();
  Drift global{Doubles(params), Doubles(params), Doubles(params)};
  const Drift none = global;
  State solo0 = state_of(solo);
  for (int t = 0; t < kSteps; ++t) {
    const Batch& batch = batches[static_cast<size_t>(t)];
    const State& ring0 = history[0][static_cast<size_t>(t)];
    const State& ring1 = history[0][static_cast<size_t>(t) + 1];
    Probes p = probe(shadow, ring0, batch, workers, m);
    restore(shadow, ring0);
    run_step(shadow, batch.images.data(), batch.labels.data(), all, t);
    const State shadow1 = state_of(shadow);
    run_step(solo, batch.images.data(), batch.labels.data(), all, t);
    const State solo1 = state_of(solo);

    m.replay_exact &= ring1.g == ring_mean(p.local, run.buckets);
    Doubles e = gradient_bound(p.local, shadow1.g, p.a, chain);
    if (!m.premises_required) {  // (b) without its premises: the forward's share
      const double forward = p.rho + 2 * kForwardChain * kU;
      for (size_t i = 0; i < e.size(); ++i) e[i] += forward * p.a[i];
      m.worst_rho = std::max(m.worst_rho, p.rho);
    }
    m.grad_ratio = std::max(m.grad_ratio, worst_ratio(ring1.g, shadow1.g, e));
    if (t == 0) {
      m.step1_grad_diff = max_diff(ring1.g, shadow1.g);
      m.step1_grad_bound = *std::max_element(e.begin(), e.end());
    }
    Drift step = propagate(c.optimizer, t + 1, float_update, none, e, ring0, ring1, ring0, shadow1);
    m.local_ratio = std::max({m.local_ratio, worst_ratio(ring1.w, shadow1.w, step.w),
                              worst_ratio(ring1.m, shadow1.m, step.m),
                              worst_ratio(ring1.v, shadow1.v, step.v)});
    for (size_t i = 0; i < params; ++i) e[i] += std::fabs(double(shadow1.g[i]) - solo1.g[i]);
    global = propagate(c.optimizer, t + 1, float_update, global, e, ring0, ring1, solo0, solo1);
    m.global_ratio = std::max({m.global_ratio, worst_ratio(ring1.w, solo1.w, global.w),
                               worst_ratio(ring1.m, solo1.m, global.m),
                               worst_ratio(ring1.v, solo1.v, global.v)});
    m.final_w_diff = max_diff(ring1.w, solo1.w);
    m.final_w_bound = *std::max_element(global.w.begin(), global.w.end());
    solo0 = solo1;
  }
  return m;
}

void require_equivalent(const Measured& m) {
  INFO("step 1 max |dg| " << m.step1_grad_diff << " (max bound " << m.step1_grad_bound
                          << "); after " << kSteps << " steps max |dw| " << m.final_w_diff
                          << " (max bound " << m.final_w_bound << "); worst |d|/bound: gradient "
                          << m.grad_ratio << ", step " << m.local_ratio << ", trajectory "
                          << m.global_ratio);
  CHECK(m.workers_identical);
  CHECK(m.replay_exact);
  if (m.premises_required) {
    CHECK(m.forward_per_example);
    CHECK(m.dlogits_scaled);
  } else {
    WARN("oneDNN's forward is not per example on this ISA ("
         << nn::cpu_isa_name() << "): (b) bounds it instead, worst rho " << m.worst_rho);
    CHECK(m.worst_rho < 1e-3);  // a few ulps of each dlogit, not a different batch
  }
  CHECK(m.grad_ratio <= 1);
  CHECK(m.local_ratio <= 1);
  CHECK(m.global_ratio <= 1);
}

// Trains `workers` ring workers for kSteps; worker 0's state after (all workers are equal).
State train_ring(const char* optimizer, int workers, bool overlap, size_t* buckets) {
  train::TrainConfig c = config_with(optimizer);
  std::vector<Worker> ring = make_ring(c, Kind::kReference, workers, overlap, Fault::kNone);
  std::vector<Batch> batches;
  for (int t = 0; t < kSteps; ++t) batches.push_back(make_batch(workers * kBatch, t));
  RingRun run = run_ring(std::move(ring), batches, Fault::kNone);
  const std::vector<std::vector<State>>& history = run.states;
  *buckets = run.buckets.size();
  for (size_t r = 1; r < history.size(); ++r) CHECK(same_states(history[r], history[0]));
  return history[0].back();
}

// Where rank 1 dies in cut_step: once both survivors have come back from their first bucket's
// finish (bucket by bucket, they have then applied it) and entered the second's.
struct CutPoint {
  std::atomic<int> survivors_in_second_finish{0};
};

class Survivor final : public Forwarding {
 public:
  Survivor(std::unique_ptr<comm::Communicator> inner, CutPoint& cut)
      : Forwarding(std::move(inner)), cut_(cut) {}
  void finish_all_reduce(comm::ReduceTicket t) override {
    if (++finishes_ == 2) ++cut_.survivors_in_second_finish;
    inner_->finish_all_reduce(t);
  }

 private:
  CutPoint& cut_;
  int finishes_ = 0;
};

// Rank 1 aborts instead of starting its third bucket, once the survivors are where CutPoint says
// (what its peers see of a SIGKILL there).
class DiesAtThirdStart final : public Forwarding {
 public:
  DiesAtThirdStart(std::unique_ptr<comm::Communicator> inner, CutPoint& cut)
      : Forwarding(std::move(inner)), cut_(cut) {}
  comm::ReduceTicket start_all_reduce(float* d, size_t n, comm::ReduceOp op) override {
    if (++starts_ == 3) {
      auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (cut_.survivors_in_second_finish < 2 && std::chrono::steady_clock::now() < give_up)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      inner_->abort("rank 1 died");
      throw common::IoError("rank 1 died");
    }
    return inner_->start_all_reduce(d, n, op);
  }

 private:
  CutPoint& cut_;
  int starts_ = 0;
};

struct CutStep {
  State before, after;
  bool failed = false;
  bool abandoned = false;  ///< abandon_step() said a step was cut short
};

// Three ring workers run one step on one thread each; rank 1 dies in it. Each survivor abandons
// the step when whole_steps is on.
std::vector<CutStep> cut_step(const char* optimizer, bool whole_steps) {
  train::TrainConfig c = config_with(optimizer);
  const int size = 3;
  auto links = testing::make_in_process_ring(size);
  CutPoint point;
  std::vector<Worker> ring;
  for (int r = 0; r < size; ++r) {
    std::unique_ptr<comm::Communicator> comm = std::make_unique<comm::ThreadedCommunicator>(
        std::make_unique<comm::RingCommunicator>(std::move(links[r]), r, size));
    if (r == 1) {
      comm = std::make_unique<DiesAtThirdStart>(std::move(comm), point);
    } else {
      comm = std::make_unique<Survivor>(std::move(comm), point);
    }
    ring.push_back(make_worker(c, Kind::kReference, std::move(comm), kBatch, true, whole_steps));
  }
  Batch batch = make_batch(size * kBatch, 0);
  std::vector<CutStep> cut(size);
  std::vector<std::thread> threads;
  for (size_t r = 0; r < ring.size(); ++r) {
    threads.emplace_back([&, r] {
      cut[r].before = state_of(ring[r]);
      try {
        run_step(ring[r], batch.images.data() + r * kBatch * kExampleFloats,
                 batch.labels.data() + r * kBatch, kBatch, 0);
      } catch (const common::IoError&) {
        cut[r].failed = true;
        ring[r].comm->abort("a peer died");
        if (whole_steps) cut[r].abandoned = ring[r].step->abandon_step();
      }
      cut[r].after = state_of(ring[r]);
      Worker mine = std::move(ring[r]);  // destroyed on its own thread (see run_ring)
    });
  }
  for (std::thread& t : threads) t.join();
  return cut;
}

}  // namespace

TEST_CASE("N ring workers train like one worker on the combined batch", "[data_parallel]") {
  for (const char* optimizer : {kSgd, kAdam}) {
    for (int workers : {2, 3}) {
      INFO(optimizer << ", " << workers << " workers, reference backend");
      require_equivalent(train_and_compare(optimizer, workers, Kind::kReference, Fault::kNone));
    }
  }
}

TEST_CASE("N ring workers train like one worker on the oneDNN backend", "[data_parallel]") {
  require_equivalent(train_and_compare(kSgd, 2, Kind::kDnnl, Fault::kNone));
}

TEST_CASE("The data-parallel comparison fails on a wrong sub-batch or a sum", "[data_parallel]") {
  for (Fault fault : {Fault::kDuplicateRows, Fault::kSumNotMean}) {
    INFO("fault " << static_cast<int>(fault));
    Measured m = train_and_compare(kSgd, 3, Kind::kReference, fault);
    CHECK(m.workers_identical);  // they still agree with each other
    CHECK_FALSE(m.replay_exact);
    CHECK(m.grad_ratio > 1e3);  // and are far from one worker
    CHECK(m.global_ratio > 1e3);
  }
}

TEST_CASE("Overlapped and after-backward buckets give the same bits", "[data_parallel]") {
  for (const char* optimizer : {kSgd, kAdam}) {
    for (int workers : {2, 3}) {
      INFO(optimizer << ", " << workers << " workers");
      size_t overlapped_buckets = 0, serial_buckets = 0;
      State overlapped = train_ring(optimizer, workers, true, &overlapped_buckets);
      State serial = train_ring(optimizer, workers, false, &serial_buckets);
      CHECK(overlapped_buckets >= 3);
      CHECK(serial_buckets == overlapped_buckets);
      CHECK(overlapped.w == serial.w);
      CHECK(overlapped.m == serial.m);
      CHECK(overlapped.v == serial.v);
    }
  }
}

TEST_CASE("Whole steps give the same bits as bucket-by-bucket steps", "[data_parallel]") {
  for (const char* optimizer : {kSgd, kAdam}) {
    INFO(optimizer);
    train::TrainConfig c = config_with(optimizer);
    std::vector<Batch> batches;
    for (int t = 0; t < kSteps; ++t) batches.push_back(make_batch(3 * kBatch, t));
    std::vector<State> ends;
    for (bool whole : {false, true}) {
      auto links = testing::make_in_process_ring(3);
      std::vector<Worker> ring;
      for (int r = 0; r < 3; ++r) {
        ring.push_back(make_worker(
            c, Kind::kReference,
            std::make_unique<comm::ThreadedCommunicator>(std::make_unique<comm::RingCommunicator>(
                std::move(links[static_cast<size_t>(r)]), r, 3)),
            kBatch, true, whole));
      }
      ends.push_back(run_ring(std::move(ring), batches, Fault::kNone).states[0].back());
    }
    CHECK(ends[0].w == ends[1].w);
    CHECK(ends[0].m == ends[1].m);
    CHECK(ends[0].v == ends[1].v);
    CHECK(ends[0].t == ends[1].t);
  }
}

TEST_CASE("With whole steps, a step cut short by a peer's death changes nothing",
          "[data_parallel]") {
  for (const char* optimizer : {kSgd, kAdam}) {
    INFO(optimizer);
    std::vector<CutStep> whole = cut_step(optimizer, true);
    for (size_t r : {size_t{0}, size_t{2}}) {
      INFO("survivor rank " << r);
      REQUIRE(whole[r].failed);
      CHECK(whole[r].abandoned);
      CHECK(whole[r].after.w == whole[r].before.w);
      CHECK(whole[r].after.m == whole[r].before.m);
      CHECK(whole[r].after.v == whole[r].before.v);
      CHECK(whole[r].after.t == whole[r].before.t);
    }
    // Bucket by bucket, the same death leaves each survivor with part of the step applied: what
    // whole steps exist for.
    std::vector<CutStep> partial = cut_step(optimizer, false);
    for (size_t r : {size_t{0}, size_t{2}}) {
      INFO("survivor rank " << r);
      REQUIRE(partial[r].failed);
      CHECK(partial[r].after.w != partial[r].before.w);
    }
  }
}

// Loss scaling (docs/design.md#loss-scaling) decides on the reduced gradients, which every worker
// holds: when one worker's batch overflows under the scale, every worker skips that step.
TEST_CASE("With loss scaling every ring worker skips the step one worker's batch overflows",
          "[data_parallel]") {
  train::TrainConfig c = config_with(kAdam);
  constexpr int kWorkers = 2;
  std::vector<Batch> batches;
  for (int t = 0; t < 3; ++t) batches.push_back(make_batch(kWorkers * kBatch, t));
  // Under the largest power-of-two scale [0, 1) images do not overflow; worker 1's images of
  // step 1, a million times brighter, do.
  for (size_t i = kBatch * kExampleFloats; i < batches[1].images.size(); ++i)
    batches[1].images[i] *= 1e6f;
  train::LossScaleSpec huge;
  huge.enabled = true;
  huge.initial_scale = 0x1p127f;
  auto ring_of = [&](const train::LossScaleSpec& scale) {
    auto links = testing::make_in_process_ring(kWorkers);
    std::vector<Worker> ring;
    for (int r = 0; r < kWorkers; ++r) {
      ring.push_back(make_worker(
          c, Kind::kReference,
          std::make_unique<comm::ThreadedCommunicator>(std::make_unique<comm::RingCommunicator>(
              std::move(links[static_cast<size_t>(r)]), r, kWorkers)),
          kBatch, true, false, scale));
    }
    return ring;
  };
  RingRun scaled = run_ring(ring_of(huge), batches, Fault::kNone);
  RingRun plain = run_ring(ring_of({}), {batches[0], batches[2]}, Fault::kNone);  // no step 1
  for (size_t r = 0; r < kWorkers; ++r) {
    INFO("rank " << r);
    const std::vector<State>& s = scaled.states[r];  // before, then after steps 0, 1, 2
    const std::vector<State>& p = plain.states[r];   // before, then after steps 0 and 2
    REQUIRE(s.size() == 4);
    REQUIRE(p.size() == 3);
    CHECK((s[1].w == p[1].w && s[1].m == p[1].m && s[1].v == p[1].v && s[1].t == p[1].t));
    CHECK((s[2].w == s[1].w && s[2].m == s[1].m && s[2].v == s[1].v));  // skipped
    CHECK(s[2].t == 1);                                                 // not counted
    CHECK((s[3].w == p[2].w && s[3].m == p[2].m && s[3].v == p[2].v && s[3].t == p[2].t));
  }
}
