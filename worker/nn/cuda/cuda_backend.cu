// The CUDA backend: cuDNN convolution (forward, backward data, backward filter; algorithms picked
// once per shape, deterministic ones for backward, workspace shared and grown), cuDNN pooling,
// activation and log-softmax, cuBLAS for dense layers, and small kernels for padding, bias
// gradients, the loss and the optimizers. All on one stream; pointers are device memory, except
// the labels of softmax_cross_entropy (host). The only file that includes cuDNN and cuBLAS.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/errors.h"
#include "worker/nn/backend.h"
#include "worker/nn/cuda/cuda_check.h"

namespace dtrain::nn {
namespace {

constexpr int kThreads = 256;
int blocks_for(size_t n) {
  return static_cast<int>((n + kThreads - 1) / kThreads);
}

template <class T, class Destroy>
struct Handle {
  T value{};
  Destroy destroy;
  Handle(T v, Destroy d) : value(v), destroy(d) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { destroy(value); }
};

cudnnTensorDescriptor_t tensor4d(int n, int c, int h, int w) {
  cudnnTensorDescriptor_t d;
  DT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d));
  DT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, h, w));
  return d;
}

struct Tensor4d : Handle<cudnnTensorDescriptor_t, cudnnStatus_t (*)(cudnnTensorDescriptor_t)> {
  Tensor4d(int n, int c, int h, int w)
      : Handle(tensor4d(n, c, h, w), cudnnDestroyTensorDescriptor) {}
};

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

// Column sums in a fixed order (one thread per column): deterministic.
__global__ void column_sums_kernel(const float* dy, float* db, int n, int out) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= out) return;
  float sum = 0;
  for (int i = 0; i < n; ++i) sum += dy[static_cast<size_t>(i) * out + j];
  db[j] = sum;
}

// One thread per row; row results are summed by thread 0 in row order: deterministic.
__global__ void cross_entropy_kernel(const float* logp, const float* logits, const int32_t* labels,
                                     float* dlogits, float* row_loss, int* row_hit, int n,
                                     int classes, float* loss, int* correct) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    const float* lp = logp + static_cast<size_t>(i) * classes;
    const float* z = logits + static_cast<size_t>(i) * classes;
    float* d = dlogits + static_cast<size_t>(i) * classes;
    int best = 0;
    for (int j = 0; j < classes; ++j) {
      d[j] = expf(lp[j]) / n;
      if (z[j] > z[best]) best = j;
    }
    d[labels[i]] -= 1.0f / n;
    row_loss[i] = -lp[labels[i]];
    row_hit[i] = best == labels[i];
  }
  __syncthreads();
}

__global__ void sum_rows_kernel(const float* row_loss, const int* row_hit, int n, float* loss,
                                int* correct) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double total = 0;
  int hits = 0;
  for (int i = 0; i < n; ++i) total += row_loss[i], hits += row_hit[i];
  *loss = static_cast<float>(total / n);
  *correct = hits;
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

// A growable device buffer.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(data_); }
  void* at_least(size_t bytes) {
    if (bytes > size_) {
      cudaFree(data_);
      data_ = nullptr;
      DT_CUDA_CHECK(cudaMalloc(&data_, bytes));
      size_ = bytes;
    }
    return data_;
  }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

struct ConvPlan {
  ConvShape s;
  bool padded_copy = false;  // asymmetric padding: pad x explicitly, convolve without padding
  int ph = 0, pw = 0;        // padded input size when padded_copy
  std::unique_ptr<Tensor4d> x, y, bias;
  cudnnFilterDescriptor_t w{};
  cudnnConvolutionDescriptor_t conv{};
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
  size_t workspace = 0;
  ~ConvPlan() {
    if (w) cudnnDestroyFilterDescriptor(w);
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
  }
};

struct PoolPlan {
  std::unique_ptr<Tensor4d> x, y;
  cudnnPoolingDescriptor_t pool{};
  size_t x_bytes = 0, y_bytes = 0;
  ~PoolPlan() {
    if (pool) cudnnDestroyPoolingDescriptor(pool);
  }
};

class CudaBackend : public Backend {
 public:
  CudaBackend();
  ~CudaBackend() override;
  std::string name() const override { return "cuda (cuDNN + cuBLAS)"; }

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
  void dense_backward_weights(int n, int in, int out, const float* x, const float* dy, float* dw,
                              float* db) override;
  void relu_forward(size_t count, const float* x, float* y) override;
  void relu_backward(size_t count, const float* y, const float* dy, float* dx) override;
  size_t maxpool_workspace_bytes(const PoolShape& s) override;
  void maxpool_forward(const PoolShape& s, const float* x, float* y, void* workspace) override;
  void maxpool_backward(const PoolShape& s, const float* dy, const void* workspace,
                        float* dx) override;
  float softmax_cross_entropy(int n, int classes, const float* logits, const int32_t* labels,
                              float* dlogits, int* correct) override;
  void sgd_update(const SgdParams& p, size_t count, float* w, const float* g,
                  float* velocity) override;
  void adam_update(const AdamParams& p, int64_t step, size_t count, float* w, const float* g,
                   float* m, float* v) override;

 private:
  ConvPlan& plan(const ConvShape& s);
  PoolPlan& pool(const PoolShape& s);
  const float* input_for(ConvPlan& p, const float* x);

  cudaStream_t stream_{};
  cudnnHandle_t cudnn_{};
  cublasHandle_t cublas_{};
  cudnnActivationDescriptor_t relu_{};
  DeviceBuffer workspace_, padded_, padded_grad_, labels_, scratch_;
  std::map<std::string, std::unique_ptr<ConvPlan>> convs_;
  std::map<std::string, std::unique_ptr<PoolPlan>> pools_;
};

template <class Shape>
std::string key_of(const Shape& s) {
  return std::string(reinterpret_cast<const char*>(&s), sizeof s);
}

CudaBackend::CudaBackend() {
  DT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  DT_CUDNN_CHECK(cudnnCreate(&cudnn_));
  DT_CUDNN_CHECK(cudnnSetStream(cudnn_, stream_));
  DT_CUBLAS_CHECK(cublasCreate(&cublas_));
  DT_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
  DT_CUDNN_CHECK(cudnnCreateActivationDescriptor(&relu_));
  DT_CUDNN_CHECK(
      cudnnSetActivationDescriptor(relu_, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
}

CudaBackend::~CudaBackend() {
  convs_.clear();
  pools_.clear();
  cudnnDestroyActivationDescriptor(relu_);
  cublasDestroy(cublas_);
  cudnnDestroy(cudnn_);
  cudaStreamDestroy(stream_);
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
  p->x = std::make_unique<Tensor4d>(s.n, s.c, xh, xw);
  p->y = std::make_unique<Tensor4d>(s.n, s.k, s.oh(), s.ow());
  p->bias = std::make_unique<Tensor4d>(1, s.k, 1, 1);
  DT_CUDNN_CHECK(cudnnCreateFilterDescriptor(&p->w));
  DT_CUDNN_CHECK(
      cudnnSetFilter4dDescriptor(p->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, s.k, s.c, s.kh, s.kw));
  DT_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&p->conv));
  DT_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(p->conv, pad_h, pad_w, s.sh, s.sw, 1, 1,
                                                 CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  DT_CUDNN_CHECK(
      cudnnSetConvolutionMathType(p->conv, CUDNN_FMA_MATH));  // no TF32: match the CPU in fp32
  int found = 0;
  cudnnConvolutionFwdAlgoPerf_t fwd[8];
  DT_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(cudnn_, p->x->value, p->w, p->conv,
                                                        p->y->value, 8, &found, fwd));
  p->fwd = fwd[0].algo;
  cudnnConvolutionBwdDataAlgoPerf_t bd[8];
  DT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnn_, p->w, p->y->value, p->conv,
                                                             p->x->value, 8, &found, bd));
  p->bwd_data = bd[0].algo;
  for (int i = found - 1; i >= 0; --i)
    if (bd[i].status == CUDNN_STATUS_SUCCESS && bd[i].determinism == CUDNN_DETERMINISTIC)
      p->bwd_data = bd[i].algo;
  cudnnConvolutionBwdFilterAlgoPerf_t bf[8];
  DT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnn_, p->x->value, p->y->value,
                                                               p->conv, p->w, 8, &found, bf));
  p->bwd_filter = bf[0].algo;
  for (int i = found - 1; i >= 0; --i)
    if (bf[i].status == CUDNN_STATUS_SUCCESS && bf[i].determinism == CUDNN_DETERMINISTIC)
      p->bwd_filter = bf[i].algo;
  size_t a = 0, b = 0, c = 0;
  DT_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(cudnn_, p->x->value, p->w, p->conv,
                                                         p->y->value, p->fwd, &a));
  DT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(cudnn_, p->w, p->y->value, p->conv,
                                                              p->x->value, p->bwd_data, &b));
  DT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnn_, p->x->value, p->y->value,
                                                                p->conv, p->w, p->bwd_filter, &c));
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
  DT_CUDNN_CHECK(cudnnConvolutionForward(cudnn_, &one, p.x->value, input_for(p, x), p.w, w, p.conv,
                                         p.fwd, ws, p.workspace, &zero, p.y->value, y));
  DT_CUDNN_CHECK(cudnnAddTensor(cudnn_, &one, p.bias->value, b, &one, p.y->value, y));
}

void CudaBackend::conv2d_backward_data(const ConvShape& s, const float* dy, const float* w,
                                       float* dx) {
  ConvPlan& p = plan(s);
  const float one = 1, zero = 0;
  void* ws = workspace_.at_least(p.workspace + 1);
  size_t count = static_cast<size_t>(s.n) * s.c * p.ph * p.pw;
  float* target =
      p.padded_copy ? static_cast<float*>(padded_grad_.at_least(count * sizeof(float))) : dx;
  DT_CUDNN_CHECK(cudnnConvolutionBackwardData(cudnn_, &one, p.w, w, p.y->value, dy, p.conv,
                                              p.bwd_data, ws, p.workspace, &zero, p.x->value,
                                              target));
  if (p.padded_copy) {
    size_t out = s.input_count();
    crop_kernel<<<blocks_for(out), kThreads, 0, stream_>>>(target, dx, s.n * s.c, s.h, s.w,
                                                           s.pad_top, s.pad_left, p.ph, p.pw);
    DT_CUDA_CHECK(cudaGetLastError());
  }
}

void CudaBackend::conv2d_backward_weights(const ConvShape& s, const float* x, const float* dy,
                                          float* dw, float* db) {
  ConvPlan& p = plan(s);
  const float one = 1, zero = 0;
  const float* input = input_for(p, x);
  void* ws = workspace_.at_least(p.workspace + 1);
  DT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(cudnn_, &one, p.x->value, input, p.y->value, dy,
                                                p.conv, p.bwd_filter, ws, p.workspace, &zero, p.w,
                                                dw));
  DT_CUDNN_CHECK(
      cudnnConvolutionBackwardBias(cudnn_, &one, p.y->value, dy, &zero, p.bias->value, db));
}

// Row-major (n x in) . (in x out) through column-major cuBLAS: y^T = w^T x^T.
void CudaBackend::dense_forward(int n, int in, int out, const float* x, const float* w,
                                const float* b, float* y) {
  const float one = 1, zero = 0;
  DT_CUBLAS_CHECK(cublasSgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, out, n, in, &one, w, out, x, in,
                              &zero, y, out));
  size_t count = static_cast<size_t>(n) * out;
  bias_rows_kernel<<<blocks_for(count), kThreads, 0, stream_>>>(y, b, n, out);
  DT_CUDA_CHECK(cudaGetLastError());
}

void CudaBackend::dense_backward_data(int n, int in, int out, const float* dy, const float* w,
                                      float* dx) {
  const float one = 1, zero = 0;
  DT_CUBLAS_CHECK(cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, in, n, out, &one, w, out, dy, out,
                              &zero, dx, in));
}

void CudaBackend::dense_backward_weights(int n, int in, int out, const float* x, const float* dy,
                                         float* dw, float* db) {
  const float one = 1, zero = 0;
  DT_CUBLAS_CHECK(cublasSgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_T, out, in, n, &one, dy, out, x, in,
                              &zero, dw, out));
  column_sums_kernel<<<blocks_for(static_cast<size_t>(out)), kThreads, 0, stream_>>>(dy, db, n,
                                                                                     out);
  DT_CUDA_CHECK(cudaGetLastError());
}

void CudaBackend::relu_forward(size_t count, const float* x, float* y) {
  const float one = 1, zero = 0;
  Tensor4d d(1, 1, 1, static_cast<int>(count));
  DT_CUDNN_CHECK(cudnnActivationForward(cudnn_, relu_, &one, d.value, x, &zero, d.value, y));
}

void CudaBackend::relu_backward(size_t count, const float* y, const float* dy, float* dx) {
  const float one = 1, zero = 0;
  Tensor4d d(1, 1, 1, static_cast<int>(count));
  // For ReLU the output stands in for the input: y > 0 exactly where x > 0.
  DT_CUDNN_CHECK(cudnnActivationBackward(cudnn_, relu_, &one, d.value, y, d.value, dy, d.value, y,
                                         &zero, d.value, dx));
}

PoolPlan& CudaBackend::pool(const PoolShape& s) {
  auto& slot = pools_[key_of(s)];
  if (slot) return *slot;
  auto p = std::make_unique<PoolPlan>();
  p->x = std::make_unique<Tensor4d>(s.n, s.c, s.h, s.w);
  p->y = std::make_unique<Tensor4d>(s.n, s.c, s.oh(), s.ow());
  DT_CUDNN_CHECK(cudnnCreatePoolingDescriptor(&p->pool));
  DT_CUDNN_CHECK(cudnnSetPooling2dDescriptor(p->pool, CUDNN_POOLING_MAX_DETERMINISTIC,
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
  DT_CUDNN_CHECK(cudnnPoolingForward(cudnn_, p.pool, &one, p.x->value, x, &zero, p.y->value, y));
  auto* keep = static_cast<char*>(workspace);
  DT_CUDA_CHECK(cudaMemcpyAsync(keep, x, p.x_bytes, cudaMemcpyDeviceToDevice, stream_));
  DT_CUDA_CHECK(cudaMemcpyAsync(keep + p.x_bytes, y, p.y_bytes, cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::maxpool_backward(const PoolShape& s, const float* dy, const void* workspace,
                                   float* dx) {
  PoolPlan& p = pool(s);
  const float one = 1, zero = 0;
  auto* keep = static_cast<const char*>(workspace);
  DT_CUDNN_CHECK(cudnnPoolingBackward(cudnn_, p.pool, &one, p.y->value, keep + p.x_bytes,
                                      p.y->value, dy, p.x->value, keep, &zero, p.x->value, dx));
}

float CudaBackend::softmax_cross_entropy(int n, int classes, const float* logits,
                                         const int32_t* labels, float* dlogits, int* correct) {
  const float one = 1, zero = 0;
  Tensor4d d(n, classes, 1, 1);
  size_t elements = static_cast<size_t>(n) * classes;
  auto* base = static_cast<char*>(
      scratch_.at_least(elements * sizeof(float) + n * (sizeof(float) + sizeof(int)) + 16));
  auto* logp = reinterpret_cast<float*>(base);
  auto* row_loss = logp + elements;
  auto* row_hit = reinterpret_cast<int*>(row_loss + n);
  auto* device_labels = static_cast<int32_t*>(labels_.at_least(sizeof(int32_t) * (n + 2)));
  auto* totals = reinterpret_cast<float*>(device_labels + n);
  DT_CUDA_CHECK(
      cudaMemcpyAsync(device_labels, labels, sizeof(int32_t) * n, cudaMemcpyHostToDevice, stream_));
  DT_CUDNN_CHECK(cudnnSoftmaxForward(cudnn_, CUDNN_SOFTMAX_LOG, CUDNN_SOFTMAX_MODE_INSTANCE, &one,
                                     d.value, logits, &zero, d.value, logp));
  cross_entropy_kernel<<<blocks_for(static_cast<size_t>(n)), kThreads, 0, stream_>>>(
      logp, logits, device_labels, dlogits, row_loss, row_hit, n, classes, nullptr, nullptr);
  sum_rows_kernel<<<1, 1, 0, stream_>>>(row_loss, row_hit, n, totals,
                                        reinterpret_cast<int*>(totals + 1));
  DT_CUDA_CHECK(cudaGetLastError());
  float host[2];
  DT_CUDA_CHECK(cudaMemcpyAsync(host, totals, sizeof host, cudaMemcpyDeviceToHost, stream_));
  DT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::memcpy(correct, &host[1], sizeof(int));
  return host[0];
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
