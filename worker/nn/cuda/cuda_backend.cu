// The CUDA backend: cuDNN convolution (forward, backward data, backward filter; algorithms picked
// once per shape, deterministic ones for backward, workspace shared and grown), cuDNN pooling,
// activation and log-softmax, cuBLAS for dense layers, and small kernels for padding, bias
// gradients, the loss and the optimizers. All on the CUDA device's compute stream; every pointer
// is device memory, and nothing waits for the device, so a whole step can be recorded as a CUDA
// graph. Every handle is an RAII object (worker/mem/cuda/cuda_handles.h). The only file that calls
// cuDNN/cuBLAS.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/errors.h"
#include "worker/mem/cuda/cuda_check.h"
#include "worker/mem/cuda/cuda_device.h"
#include "worker/mem/cuda/cuda_handles.h"
#include "worker/nn/backend.h"
#include "worker/nn/cuda/conv_weight_grad.h"
#include "worker/nn/random.h"

namespace dtrain::nn {
namespace {

constexpr int kThreads = 256;
int blocks_for(size_t n) {
  return static_cast<int>((n + kThreads - 1) / kThreads);
}

cuda::TensorDescriptor tensor4d(int n, int c, int h, int w) {
  cudnnTensorDescriptor_t d{};
  DT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d));
  cuda::TensorDescriptor owned(d);
  DT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, h, w));
  return owned;
}

__global__ void pad_kernel(const float* x, float* out, int nc, int h, int w, int top, int left,
                           int ph, int pw) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<size_t>(nc) * ph * pw) return;
  int ox = static_cast<int>(i % pw), oy = static_cast<int>((i / pw) % ph);
  size_t plane = i / (static_cast<size_t>(ph) * pw);
  int ix = ox - left, iy = oy - top;
  out[i] = (ix >= 0 && ix < w && iy >= 0 && iy < h) ? x[(plane * h + iy) * w + ix] : 0.0f;
}

__global__ void crop_kernel(const float* padded, float* x, int nc, int h, int w, int top, int left,
                            int ph, int pw) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<size_t>(nc) * h * w) return;
  int ix = static_cast<int>(i % w), iy = static_cast<int>((i / w) % h);
  size_t plane = i / (static_cast<size_t>(h) * w);
  x[i] = padded[(plane * ph + iy + top) * pw + ix + left];
}

__global__ void bias_rows_kernel(float* y, const float* b, int n, int out) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < static_cast<size_t>(n) * out) y[i] += b[i % out];
}

__global__ void fill_kernel(float* x, size_t n, float value) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] = value;
}

// One thread per row: the row's gradient (unless dlogits is null), loss and hit.
__global__ void cross_entropy_kernel(const float* logp, const float* logits, const int32_t* labels,
                                     float* dlogits, float* row_loss, float* row_hit, int n,
                                     int classes) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float* lp = logp + static_cast<size_t>(i) * classes;
  const float* z = logits + static_cast<size_t>(i) * classes;
  int label = labels[i];
  label = label < 0 ? 0 : label >= classes ? classes - 1 : label;  // validated when loaded
  int best = 0;
  for (int j = 1; j < classes; ++j)
    if (z[j] > z[best]) best = j;
  if (dlogits) {
    float* d = dlogits + static_cast<size_t>(i) * classes;
    for (int j = 0; j < classes; ++j) d[j] = expf(lp[j]) / n;
    d[label] -= 1.0f / n;
  }
  row_loss[i] = -lp[label];
  row_hit[i] = best == label ? 1.0f : 0.0f;
}

// One block: each thread sums a strided set of rows, then a fixed tree: deterministic.
constexpr int kSumThreads = 256;
__global__ void add_row_sums_kernel(const float* row_loss, const float* row_hit, int n,
                                    float* totals) {
  __shared__ double loss[kSumThreads];
  __shared__ float hits[kSumThreads];
  double l = 0;
  float h = 0;
  for (int i = threadIdx.x; i < n; i += kSumThreads) l += row_loss[i], h += row_hit[i];
  loss[threadIdx.x] = l;
  hits[threadIdx.x] = h;
  __syncthreads();
  for (int half = kSumThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      loss[threadIdx.x] += loss[threadIdx.x + half];
      hits[threadIdx.x] += hits[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    totals[0] = static_cast<float>(totals[0] + loss[0]);
    totals[1] += hits[0];
    totals[2] += static_cast<float>(n);
  }
}

__global__ void add_kernel(const float* x, float* y, size_t n) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] += x[i];
}

__global__ void multiply_kernel(const float* a, const float* b, float* y, size_t n) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = a[i] * b[i];
}

__global__ void dropout_kernel(const float* x, float* y, float* mask, size_t n, float rate,
                               uint64_t key) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  float keep = unit_float(mix64(key ^ i)) >= rate ? 1.0f / (1.0f - rate) : 0.0f;
  mask[i] = keep;
  y[i] = x[i] * keep;
}

__global__ void sgd_kernel(float* w, const float* g, float* v, size_t n, float lr, float mu,
                           bool nesterov) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  if (v == nullptr) {
    w[i] -= lr * g[i];
    return;
  }
  v[i] = mu * v[i] - lr * g[i];
  w[i] += nesterov ? mu * v[i] - lr * g[i] : v[i];
}

__global__ void adam_kernel(float* w, const float* g, float* m, float* v, size_t n, float lr,
                            float b1, float b2, float eps) {
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  m[i] += (g[i] - m[i]) * (1.0f - b1);
  v[i] += (g[i] * g[i] - v[i]) * (1.0f - b2);
  w[i] -= lr * m[i] / (sqrtf(v[i]) + eps);
}

// A growable device buffer; each growth bumps *generation (recorded graphs point into it).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(uint64_t* generation) : generation_(generation) {}
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(data_); }
  void* at_least(size_t bytes) {
    if (bytes > size_) {
      cudaFree(data_);
      data_ = nullptr;
      DT_CUDA_CHECK(cudaMalloc(&data_, bytes));
      size_ = bytes;
      ++*generation_;
    }
    return data_;
  }

 private:
  uint64_t* generation_;
  void* data_ = nullptr;
  size_t size_ = 0;
};

struct ConvPlan {
  ConvShape s;
  bool padded_copy = false;  // asymmetric padding: pad x explicitly, convolve without padding
  int ph = 0, pw = 0;        // padded input size when padded_copy
  cuda::TensorDescriptor x, y, bias;
  cuda::FilterDescriptor w;
  cuda::ConvolutionDescriptor conv;
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
  size_t workspace = 0;
};

struct PoolPlan {
  cuda::TensorDescriptor x, y;
  cuda::PoolingDescriptor pool;
  size_t x_bytes = 0, y_bytes = 0;
};

class CudaBackend : public Backend {
 public:
  CudaBackend();
  ~CudaBackend() override;
  std::string name() const override { return "cuda (cuDNN + cuBLAS)"; }
  Device& device() override { return *device_; }
  uint64_t scratch_generation() const override { return generation_; }

  void conv2d_forward(const ConvShape& s, const float* x, const float* w, const float* b,
                      float* y) override;
  void conv2d_backward_data(const ConvShape& s, const float* dy, const float* w,
                            float* dx) override;
  void conv2d_backward_weights(const ConvShape& s, const float* x, const float* dy, float* dw,
                               float* db) override;
  void dense_forward(int n, int in, int out, const float* x, const float* w, const float* b,
                     float* y) override;
  void dense_backward_data(int n, int in, int out, const float* dy, const float* w,
                           float* dx) override;
  void dense_backward_weight_rows(int n, int in, int out, const float* x, const float* dy,
                                  float* dw, int row_begin, int row_end) override;
  void dense_backward_bias(int n, int out, const float* dy, float* db) override;
  void dense_backward_weights(int n, int in, int out, const float* x, const float* dy, float* dw,
                              float* db) override;
  void relu_forward(size_t count, const float* x, float* y) override;
  void relu_backward(size_t count, const float* y, const float* dy, float* dx) override;
  size_t maxpool_workspace_bytes(const PoolShape& s) override;
  void maxpool_forward(const PoolShape& s, const float* x, float* y, void* workspace) override;
  void maxpool_backward(const PoolShape& s, const float* dy, const void* workspace,
                        float* dx) override;
  void softmax_cross_entropy(int n, int classes, const float* logits, const int32_t* labels,
                             float* dlogits, float* totals) override;
  void add(size_t count, const float* x, float* y) override;
  void dropout_forward(size_t count, float rate, uint64_t key, const float* x, float* y,
                       float* mask) override;
  void multiply(size_t count, const float* a, const float* b, float* y) override;
  void sgd_update(const SgdParams& p, size_t count, float* w, const float* g,
                  float* velocity) override;
  void adam_update(const AdamParams& p, int64_t step, size_t count, float* w, const float* g,
                   float* m, float* v) override;

 private:
  ConvPlan& plan(const ConvShape& s);
  void choose_algorithms(ConvPlan& p);
  const float* ones(int n);
  PoolPlan& pool(const PoolShape& s);
  const float* input_for(ConvPlan& p, const float* x);

  std::unique_ptr<Device> device_;
  cudaStream_t stream_{};  ///< device_'s compute stream
  cuda::CudnnHandle cudnn_;
  cuda::CublasHandle cublas_;
  cuda::ActivationDescriptor relu_;
  uint64_t generation_ = 0;
  DeviceBuffer workspace_{&generation_}, padded_{&generation_}, padded_grad_{&generation_},
      scratch_{&generation_}, cublas_workspace_{&generation_}, ones_{&generation_},
      wgrad_scratch_{&generation_};
  int ones_count_ = 0;
  std::map<std::string, std::unique_ptr<ConvPlan>> convs_;
  std::map<std::string, std::unique_ptr<PoolPlan>> pools_;
};

template <class Shape>
std::string key_of(const Shape& s) {
  return std::string(reinterpret_cast<const char*>(&s), sizeof s);
}

CudaBackend::CudaBackend() : device_(make_cuda_device()) {
  stream_ = cuda::compute_stream(*device_);
  cudnnHandle_t cudnn{};
  DT_CUDNN_CHECK(cudnnCreate(&cudnn));
  cudnn_ = cuda::CudnnHandle(cudnn);
  DT_CUDNN_CHECK(cudnnSetStream(cudnn_.get(), stream_));
  cublasHandle_t cublas{};
  DT_CUBLAS_CHECK(cublasCreate(&cublas));
  cublas_ = cuda::CublasHandle(cublas);
  DT_CUBLAS_CHECK(cublasSetStream(cublas_.get(), stream_));
  // A workspace of our own, so cuBLAS allocates nothing while a step is recorded as a graph.
  constexpr size_t kCublasWorkspace = 32u << 20;
  DT_CUBLAS_CHECK(cublasSetWorkspace(cublas_.get(), cublas_workspace_.at_least(kCublasWorkspace),
                                     kCublasWorkspace));
  DT_CUBLAS_CHECK(cublasSetMathMode(cublas_.get(), CUBLAS_DEFAULT_MATH));  // fp32, no TF32
  cudnnActivationDescriptor_t relu{};
  DT_CUDNN_CHECK(cudnnCreateActivationDescriptor(&relu));
  relu_ = cuda::ActivationDescriptor(relu);
  DT_CUDNN_CHECK(
      cudnnSetActivationDescriptor(relu, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
}

// Plans and buffers go before the handles and the device (members in reverse order).
CudaBackend::~CudaBackend() = default;

namespace {

// FMA (no TF32) results only: the CPU and GPU agree in fp32.
template <class Perf>
bool fp32_math(const Perf& perf) {
  return perf.status == CUDNN_STATUS_SUCCESS && perf.mathType != CUDNN_TENSOR_OP_MATH &&
         perf.mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

// The fastest measured result that is fp32 (and deterministic when asked), else the first.
template <class Perf>
const Perf& fastest(const Perf* perf, int found, bool deterministic) {
  for (int i = 0; i < found; ++i)
    if (fp32_math(perf[i]) && (!deterministic || perf[i].determinism == CUDNN_DETERMINISTIC))
      return perf[i];
  return perf[0];
}

}  // namespace

// Times every algorithm once per shape (cudnnFind*): the fastest fp32 forward, and the fastest
// deterministic fp32 backward ones, so a run's gradients do not depend on scheduling. Runs when
// a shape is first seen: a training step's first, unrecorded, run.
void CudaBackend::choose_algorithms(ConvPlan& p) {
  int found = 0;
  cudnnConvolutionFwdAlgoPerf_t fwd[16];
  DT_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithm(cudnn_.get(), p.x.get(), p.w.get(),
                                                      p.conv.get(), p.y.get(), 16, &found, fwd));
  p.fwd = fastest(fwd, found, false).algo;
  cudnnConvolutionBwdDataAlgoPerf_t bd[16];
  DT_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(
      cudnn_.get(), p.w.get(), p.y.get(), p.conv.get(), p.x.get(), 16, &found, bd));
  p.bwd_data = fastest(bd, found, true).algo;
  cudnnConvolutionBwdFilterAlgoPerf_t bf[16];
  DT_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(
      cudnn_.get(), p.x.get(), p.y.get(), p.conv.get(), p.w.get(), 16, &found, bf));
  p.bwd_filter = fastest(bf, found, true).algo;
}

ConvPlan& CudaBackend::plan(const ConvShape& s) {
  auto& slot = convs_[key_of(s)];
  if (slot) return *slot;
  auto p = std::make_unique<ConvPlan>();
  p->s = s;
  p->padded_copy = s.pad_top != s.pad_bottom || s.pad_left != s.pad_right;
  p->ph = s.h + s.pad_top + s.pad_bottom;
  p->pw = s.w + s.pad_left + s.pad_right;
  int xh = p->padded_copy ? p->ph : s.h, xw = p->padded_copy ? p->pw : s.w;
  int pad_h = p->padded_copy ? 0 : s.pad_top, pad_w = p->padded_copy ? 0 : s.pad_left;
  p->x = tensor4d(s.n, s.c, xh, xw);
  p->y = tensor4d(s.n, s.k, s.oh(), s.ow());
  p->bias = tensor4d(1, s.k, 1, 1);
  cudnnFilterDescriptor_t filter{};
  DT_CUDNN_CHECK(cudnnCreateFilterDescriptor(&filter));
  p->w = cuda::FilterDescriptor(filter);
  DT_CUDNN_CHECK(cudnnSetFilter4dDescriptor(filter, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, s.k, s.c,
                                            s.kh, s.kw));
  cudnnConvolutionDescriptor_t conv{};
  DT_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv));
  p->conv = cuda::ConvolutionDescriptor(conv);
  DT_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv, pad_h, pad_w, s.sh, s.sw, 1, 1,
                                                 CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  DT_CUDNN_CHECK(
      cudnnSetConvolutionMathType(conv, CUDNN_FMA_MATH));  // no TF32: match the CPU in fp32
  choose_algorithms(*p);
  size_t a = 0, b = 0, c = 0;
  DT_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(cudnn_.get(), p->x.get(), p->w.get(),
                                                         p->conv.get(), p->y.get(), p->fwd, &a));
  DT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(
      cudnn_.get(), p->w.get(), p->y.get(), p->conv.get(), p->x.get(), p->bwd_data, &b));
  DT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
      cudnn_.get(), p->x.get(), p->y.get(), p->conv.get(), p->w.get(), p->bwd_filter, &c));
  p->workspace = std::max(a, std::max(b, c));
  slot = std::move(p);
  return *slot;
}

const float* CudaBackend::input_for(ConvPlan& p, const float* x) {
  if (!p.padded_copy) return x;
  size_t count = static_cast<size_t>(p.s.n) * p.s.c * p.ph * p.pw;
  auto* out = static_cast<float*>(padded_.at_least(count * sizeof(float)));
  pad_kernel<<<blocks_for(count), kThreads, 0, stream_>>>(x, out, p.s.n * p.s.c, p.s.h, p.s.w,
                                                          p.s.pad_top, p.s.pad_left, p.ph, p.pw);
  DT_CUDA_CHECK(cudaGetLastError());
  return out;
}

void CudaBackend::conv2d_forward(const ConvShape& s, const float* x, const float* w, const float* b,
                                 float* y) {
  ConvPlan& p = plan(s);
  const float one = 1, zero = 0;
  void* ws = workspace_.at_least(p.workspace + 1);
  DT_CUDNN_CHECK(cudnnConvolutionForward(cudnn_.get(), &one, p.x.get(), input_for(p, x), p.w.get(),
                                         w, p.conv.get(), p.fwd, ws, p.workspace, &zero, p.y.get(),
                                         y));
  DT_CUDNN_CHECK(cudnnAddTensor(cudnn_.get(), &one, p.bias.get(), b, &one, p.y.get(), y));
}

void CudaBackend::conv2d_backward_data(const ConvShape& s, const float* dy, const float* w,
                                       float* dx) {
  ConvPlan& p = plan(s);
  const float one = 1, zero = 0;
  void* ws = workspace_.at_least(p.workspace + 1);
  size_t count = static_cast<size_t>(s.n) * s.c * p.ph * p.pw;
  float* target =
      p.padded_copy ? static_cast<float*>(padded_grad_.at_least(count * sizeof(float))) : dx;
  DT_CUDNN_CHECK(cudnnConvolutionBackwardData(cudnn_.get(), &one, p.w.get(), w, p.y.get(), dy,
                                              p.conv.get(), p.bwd_data, ws, p.workspace, &zero,
                                              p.x.get(), target));
  if (p.padded_copy) {
    size_t out = s.input_count();
    crop_kernel<<<blocks_for(out), kThreads, 0, stream_>>>(target, dx, s.n * s.c, s.h, s.w,
                                                           s.pad_top, s.pad_left, p.ph, p.pw);
    DT_CUDA_CHECK(cudaGetLastError());
  }
}

void CudaBackend::conv2d_backward_weights(const ConvShape& s, const float* x, const float* dy,
                                          float* dw, float* db) {
  if (cuda::has_small_filter_kernel(s)) {  // faster than cuDNN's deterministic algorithms
    auto* partials = static_cast<float*>(
        wgrad_scratch_.at_least(sizeof(float) * cuda::conv_weight_grad_scratch_floats(s)));
    cuda::conv_weight_grad(s, x, dy, dw, db, partials, stream_);
    return;
  }
  ConvPlan& p = plan(s);
  const float one = 1, zero = 0;
  const float* input = input_for(p, x);
  void* ws = workspace_.at_least(p.workspace + 1);
  DT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(cudnn_.get(), &one, p.x.get(), input, p.y.get(), dy,
                                                p.conv.get(), p.bwd_filter, ws, p.workspace, &zero,
                                                p.w.get(), dw));
  DT_CUDNN_CHECK(
      cudnnConvolutionBackwardBias(cudnn_.get(), &one, p.y.get(), dy, &zero, p.bias.get(), db));
}

// n ones on the device, grown (outside any recording: first use of a batch size) as needed.
const float* CudaBackend::ones(int n) {
  if (n > ones_count_) {
    auto* data = static_cast<float*>(ones_.at_least(sizeof(float) * static_cast<size_t>(n)));
    fill_kernel<<<blocks_for(static_cast<size_t>(n)), kThreads, 0, stream_>>>(data, n, 1.0f);
    DT_CUDA_CHECK(cudaGetLastError());
    ones_count_ = n;
  }
  return static_cast<const float*>(ones_.at_least(0));
}

// Row-major (n x in) . (in x out) through column-major cuBLAS: y^T = w^T x^T.
void CudaBackend::dense_forward(int n, int in, int out, const float* x, const float* w,
                                const float* b, float* y) {
  const float one = 1, zero = 0;
  DT_CUBLAS_CHECK(cublasSgemm(cublas_.get(), CUBLAS_OP_N, CUBLAS_OP_N, out, n, in, &one, w, out, x,
                              in, &zero, y, out));
  size_t count = static_cast<size_t>(n) * out;
  bias_rows_kernel<<<blocks_for(count), kThreads, 0, stream_>>>(y, b, n, out);
  DT_CUDA_CHECK(cudaGetLastError());
}

void CudaBackend::dense_backward_data(int n, int in, int out, const float* dy, const float* w,
                                      float* dx) {
  const float one = 1, zero = 0;
  DT_CUBLAS_CHECK(cublasSgemm(cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, in, n, out, &one, w, out, dy,
                              out, &zero, dx, in));
}

void CudaBackend::dense_backward_weights(int n, int in, int out, const float* x, const float* dy,
                                         float* dw, float* db) {
  dense_backward_weight_rows(n, in, out, x, dy, dw, 0, in);
  dense_backward_bias(n, out, dy, db);
}

void CudaBackend::dense_backward_weight_rows(int n, int in, int out, const float* x,
                                             const float* dy, float* dw, int row_begin,
                                             int row_end) {
  DT_ENFORCE(0 <= row_begin && row_begin <= row_end && row_end <= in, "rows {}..{} of {}",
             row_begin, row_end, in);
  if (row_begin == row_end) return;
  const float one = 1, zero = 0;
  DT_CUBLAS_CHECK(cublasSgemm(cublas_.get(), CUBLAS_OP_N, CUBLAS_OP_T, out, row_end - row_begin, n,
                              &one, dy, out, x + row_begin, in, &zero,
                              dw + static_cast<size_t>(row_begin) * out, out));
}

void CudaBackend::dense_backward_bias(int n, int out, const float* dy, float* db) {
  const float one = 1, zero = 0;
  // db = dy^T 1: cuBLAS's gemv sums in a fixed order (deterministic).
  DT_CUBLAS_CHECK(
      cublasSgemv(cublas_.get(), CUBLAS_OP_N, out, n, &one, dy, out, ones(n), 1, &zero, db, 1));
}

void CudaBackend::relu_forward(size_t count, const float* x, float* y) {
  const float one = 1, zero = 0;
  cuda::TensorDescriptor d = tensor4d(1, 1, 1, static_cast<int>(count));
  DT_CUDNN_CHECK(
      cudnnActivationForward(cudnn_.get(), relu_.get(), &one, d.get(), x, &zero, d.get(), y));
}

void CudaBackend::relu_backward(size_t count, const float* y, const float* dy, float* dx) {
  const float one = 1, zero = 0;
  cuda::TensorDescriptor d = tensor4d(1, 1, 1, static_cast<int>(count));
  // For ReLU the output stands in for the input: y > 0 exactly where x > 0.
  DT_CUDNN_CHECK(cudnnActivationBackward(cudnn_.get(), relu_.get(), &one, d.get(), y, d.get(), dy,
                                         d.get(), y, &zero, d.get(), dx));
}

PoolPlan& CudaBackend::pool(const PoolShape& s) {
  auto& slot = pools_[key_of(s)];
  if (slot) return *slot;
  auto p = std::make_unique<PoolPlan>();
  p->x = tensor4d(s.n, s.c, s.h, s.w);
  p->y = tensor4d(s.n, s.c, s.oh(), s.ow());
  cudnnPoolingDescriptor_t pooling{};
  DT_CUDNN_CHECK(cudnnCreatePoolingDescriptor(&pooling));
  p->pool = cuda::PoolingDescriptor(pooling);
  DT_CUDNN_CHECK(cudnnSetPooling2dDescriptor(pooling, CUDNN_POOLING_MAX_DETERMINISTIC,
                                             CUDNN_NOT_PROPAGATE_NAN, s.kh, s.kw, 0, 0, s.sh,
                                             s.sw));
  p->x_bytes = sizeof(float) * s.input_count();
  p->y_bytes = sizeof(float) * s.output_count();
  slot = std::move(p);
  return *slot;
}

// cuDNN's max-pooling backward needs the forward's input and output: the workspace keeps both.
size_t CudaBackend::maxpool_workspace_bytes(const PoolShape& s) {
  PoolPlan& p = pool(s);
  return p.x_bytes + p.y_bytes;
}

void CudaBackend::maxpool_forward(const PoolShape& s, const float* x, float* y, void* workspace) {
  PoolPlan& p = pool(s);
  const float one = 1, zero = 0;
  DT_CUDNN_CHECK(
      cudnnPoolingForward(cudnn_.get(), p.pool.get(), &one, p.x.get(), x, &zero, p.y.get(), y));
  auto* keep = static_cast<char*>(workspace);
  DT_CUDA_CHECK(cudaMemcpyAsync(keep, x, p.x_bytes, cudaMemcpyDeviceToDevice, stream_));
  DT_CUDA_CHECK(cudaMemcpyAsync(keep + p.x_bytes, y, p.y_bytes, cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::maxpool_backward(const PoolShape& s, const float* dy, const void* workspace,
                                   float* dx) {
  PoolPlan& p = pool(s);
  const float one = 1, zero = 0;
  auto* keep = static_cast<const char*>(workspace);
  DT_CUDNN_CHECK(cudnnPoolingBackward(cudnn_.get(), p.pool.get(), &one, p.y.get(), keep + p.x_bytes,
                                      p.y.get(), dy, p.x.get(), keep, &zero, p.x.get(), dx));
}

void CudaBackend::softmax_cross_entropy(int n, int classes, const float* logits,
                                        const int32_t* labels, float* dlogits, float* totals) {
  const float one = 1, zero = 0;
  cuda::TensorDescriptor d = tensor4d(n, classes, 1, 1);
  size_t elements = static_cast<size_t>(n) * classes;
  auto* logp = static_cast<float*>(
      scratch_.at_least((elements + 2 * static_cast<size_t>(n)) * sizeof(float)));
  float* row_loss = logp + elements;
  float* row_hit = row_loss + n;
  DT_CUDNN_CHECK(cudnnSoftmaxForward(cudnn_.get(), CUDNN_SOFTMAX_LOG, CUDNN_SOFTMAX_MODE_INSTANCE,
                                     &one, d.get(), logits, &zero, d.get(), logp));
  cross_entropy_kernel<<<blocks_for(static_cast<size_t>(n)), kThreads, 0, stream_>>>(
      logp, logits, labels, dlogits, row_loss, row_hit, n, classes);
  add_row_sums_kernel<<<1, kSumThreads, 0, stream_>>>(row_loss, row_hit, n, totals);
  DT_CUDA_CHECK(cudaGetLastError());
}

void CudaBackend::add(size_t count, const float* x, float* y) {
  if (count == 0) return;
  add_kernel<<<blocks_for(count), kThreads, 0, stream_>>>(x, y, count);
  DT_CUDA_CHECK(cudaGetLastError());
}

void CudaBackend::dropout_forward(size_t count, float rate, uint64_t key, const float* x, float* y,
                                  float* mask) {
  if (count == 0) return;
  dropout_kernel<<<blocks_for(count), kThreads, 0, stream_>>>(x, y, mask, count, rate, key);
  DT_CUDA_CHECK(cudaGetLastError());
}

void CudaBackend::multiply(size_t count, const float* a, const float* b, float* y) {
  if (count == 0) return;
  multiply_kernel<<<blocks_for(count), kThreads, 0, stream_>>>(a, b, y, count);
  DT_CUDA_CHECK(cudaGetLastError());
}

void CudaBackend::sgd_update(const SgdParams& p, size_t count, float* w, const float* g,
                             float* velocity) {
  sgd_kernel<<<blocks_for(count), kThreads, 0, stream_>>>(
      w, g, p.momentum == 0.0f ? nullptr : velocity, count, p.learning_rate, p.momentum,
      p.nesterov);
  DT_CUDA_CHECK(cudaGetLastError());
}

void CudaBackend::adam_update(const AdamParams& p, int64_t step, size_t count, float* w,
                              const float* g, float* m, float* v) {
  DT_ENFORCE(step >= 1, "Adam step {} (counts from 1)", step);
  double t = static_cast<double>(step);
  float lr = static_cast<float>(p.learning_rate * std::sqrt(1.0 - std::pow(p.beta_2, t)) /
                                (1.0 - std::pow(p.beta_1, t)));
  adam_kernel<<<blocks_for(count), kThreads, 0, stream_>>>(w, g, m, v, count, lr, p.beta_1,
                                                           p.beta_2, p.epsilon);
  DT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend() {
  return std::make_unique<CudaBackend>();
}

}  // namespace dtrain::nn
