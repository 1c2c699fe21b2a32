// The CUDA backend: cuDNN convolution (forward, backward data, backward filter; algorithms picked
// once per shape, deterministic ones for backward, workspace shared and grown), cuDNN pooling,
// activation and log-softmax, cuBLAS for dense layers; its own kernels live in layer_kernels.cu
// (padding, bias, loss) and elementwise_kernels.cu (add, dropout, optimizers, loss scaling). All
// on the CUDA device's compute stream; every pointer is device memory, and nothing waits for the
// device, so a whole step can be recorded as a CUDA graph. Every handle is an RAII object
// (worker/mem/cuda/cuda_handles.h). The only file that calls cuDNN/cuBLAS. Mixed precision
// (docs/design.md#mixed-precision): products read 16-bit (or TF32) inputs and accumulate in fp32;
// every buffer outside a call stays fp32.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

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
#include "worker/nn/cuda/elementwise_kernels.h"
#include "worker/nn/cuda/layer_kernels.h"
#include "worker/nn/cuda/precision_kernels.h"
#include "worker/nn/random.h"

namespace dtrain::nn {
namespace {

cuda::TensorDescriptor tensor4d(int n, int c, int h, int w,
                                cudnnDataType_t type = CUDNN_DATA_FLOAT) {
  cudnnTensorDescriptor_t d{};
  DT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d));
  cuda::TensorDescriptor owned(d);
  DT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, type, n, c, h, w));
  return owned;
}

cuda::FilterDescriptor filter4d(const ConvShape& s, cudnnDataType_t type) {
  cudnnFilterDescriptor_t filter{};
  DT_CUDNN_CHECK(cudnnCreateFilterDescriptor(&filter));
  cuda::FilterDescriptor owned(filter);
  DT_CUDNN_CHECK(cudnnSetFilter4dDescriptor(filter, type, CUDNN_TENSOR_NCHW, s.k, s.c, s.kh, s.kw));
  return owned;
}

cuda::ConvolutionDescriptor convolution(int pad_h, int pad_w, const ConvShape& s,
                                        cudnnMathType_t math) {
  cudnnConvolutionDescriptor_t conv{};
  DT_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv));
  cuda::ConvolutionDescriptor owned(conv);
  DT_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv, pad_h, pad_w, s.sh, s.sw, 1, 1,
                                                 CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  DT_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, math));
  return owned;
}

bool is_half(MathMode mode) {
  return mode == MathMode::kBfloat16 || mode == MathMode::kFloat16;
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
  // Mixed precision: forward and backward data on 16-bit copies (x16, w16, y16; compute fp32)
  // when cuDNN has an algorithm for the shape, else the fp32 descriptors above. The weight
  // gradient reads fp32 x and dy.
  bool half = false;
  cuda::TensorDescriptor x16, y16;
  cuda::FilterDescriptor w16;
  cuda::ConvolutionDescriptor conv16;
  cudnnConvolutionFwdAlgo_t fwd16{};
  cudnnConvolutionBwdDataAlgo_t bwd_data16{};
};

struct PoolPlan {
  cuda::TensorDescriptor x, y;
  cuda::PoolingDescriptor pool;
  size_t x_bytes = 0, y_bytes = 0;
};

class CudaBackend : public Backend {
 public:
  explicit CudaBackend(MathMode mode);
  ~CudaBackend() override;
  std::string name() const override {
    return mode_ == MathMode::kFloat32
               ? "cuda (cuDNN + cuBLAS)"
               : fmt::format("cuda (cuDNN + cuBLAS, {})", math_mode_name(mode_));
  }
  Device& device() override { return *device_; }
  uint64_t scratch_generation() const override { return generation_; }
  MathMode math_mode() const override { return mode_; }

  void conv2d_forward(const ConvShape& s, const float* x, const float* w, const float* b,
                      float* y) override;
  void conv2d_relu_forward(const ConvShape& s, const float* x, const float* w, const float* b,
                           float* y) override;
  void conv2d_backward_data(const ConvShape& s, const float* dy, const float* w,
                            float* dx) override;
  void conv2d_backward_weights(const ConvShape& s, const float* x, const float* dy, float* dw,
                               float* db) override;
  void conv2d_relu_backward_weights(const ConvShape& s, const float* x, const float* y,
                                    const float* dy, float* dw, float* db, float* scratch) override;
  void dense_forward(int n, int in, int out, const float* x, const float* w, const float* b,
                     float* y) override;
  void dense_relu_forward(int n, int in, int out, const float* x, const float* w, const float* b,
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
  void rmsprop_update(const RmspropParams& p, size_t count, float* w, const float* g,
                      float* velocity, float* momentum_slot, float* average_gradient) override;
  void adamw_update(const AdamWParams& p, int64_t step, size_t count, float* w, const float* g,
                    float* m, float* v) override;
  void scale(size_t count, const float* factor, float* x) override;
  void unscale_gradients(size_t count, const float* scale, float* g, float* nonfinite) override;
  void update_loss_scale(float* state, int64_t growth_steps) override;

 private:
  ConvPlan& plan(const ConvShape& s);
  void choose_algorithms(ConvPlan& p);
  void plan_half(ConvPlan& p, int pad_h, int pad_w);
  void half_forward(ConvPlan& p, const float* x, const float* w, const float* b, float* y,
                    bool relu);
  void* to_half(DeviceBuffer& buffer, const float* x, size_t count);
  void conv_forward(ConvPlan& p, const float* x, const float* w, float* y);
  // C (m x n, column-major) = op(A) op(B) in this backend's math mode.
  void gemm(cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k, const float* a,
            int lda, const float* b, int ldb, float* c, int ldc);
  const float* ones(int n);
  PoolPlan& pool(const PoolShape& s);
  const float* input_for(ConvPlan& p, const float* x);

  MathMode mode_;
  cuda::Half half_ = cuda::Half::kBfloat16;  ///< the 16-bit format when is_half(mode_)
  std::unique_ptr<Device> device_;
  cudaStream_t stream_{};  ///< device_'s compute stream
  cuda::CudnnHandle cudnn_;
  cuda::CublasHandle cublas_;
  cuda::ActivationDescriptor relu_;
  uint64_t generation_ = 0;
  DeviceBuffer workspace_{&generation_}, padded_{&generation_}, padded_grad_{&generation_},
      scratch_{&generation_}, cublas_workspace_{&generation_}, ones_{&generation_},
      wgrad_scratch_{&generation_}, half_x_{&generation_}, half_w_{&generation_},
      half_y_{&generation_};
  int ones_count_ = 0;
  std::map<std::string, std::unique_ptr<ConvPlan>> convs_;
  std::map<std::string, std::unique_ptr<PoolPlan>> pools_;
};

template <class Shape>
std::string key_of(const Shape& s) {
  return std::string(reinterpret_cast<const char*>(&s), sizeof s);
}

CudaBackend::CudaBackend(MathMode mode)
    : mode_(mode),
      half_(mode == MathMode::kFloat16 ? cuda::Half::kFloat16 : cuda::Half::kBfloat16),
      device_(make_cuda_device()) {
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
  // fp32 without TF32; the other modes pick their compute type per call (gemm).
  DT_CUBLAS_CHECK(cublasSetMathMode(cublas_.get(), CUBLAS_DEFAULT_MATH));
  cudnnActivationDescriptor_t relu{};
  DT_CUDNN_CHECK(cudnnCreateActivationDescriptor(&relu));
  relu_ = cuda::ActivationDescriptor(relu);
  DT_CUDNN_CHECK(
      cudnnSetActivationDescriptor(relu, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
}

// Plans and buffers go before the handles and the device (members in reverse order).
CudaBackend::~CudaBackend() = default;

namespace {

// FMA (no TF32) results only unless tensor cores are allowed: the CPU and GPU agree in fp32.
template <class Perf>
bool usable(const Perf& perf, bool tensor_cores) {
  return perf.status == CUDNN_STATUS_SUCCESS &&
         (tensor_cores || (perf.mathType != CUDNN_TENSOR_OP_MATH &&
                           perf.mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION));
}

// The first usable result (deterministic when asked), else null.
template <class Perf>
const Perf* first_usable(const Perf* perf, int found, bool deterministic, bool tensor_cores) {
  for (int i = 0; i < found; ++i)
    if (usable(perf[i], tensor_cores) &&
        (!deterministic || perf[i].determinism == CUDNN_DETERMINISTIC))
      return &perf[i];
  return nullptr;
}

// As first_usable, else the first result.
template <class Perf>
const Perf& preferred(const Perf* perf, int found, bool deterministic, bool tensor_cores) {
  const Perf* best = first_usable(perf, found, deterministic, tensor_cores);
  return best ? *best : perf[0];
}

cudnnDataType_t cudnn_type(cuda::Half half) {
  return half == cuda::Half::kFloat16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
}

}  // namespace

// cuDNN's heuristic ranking of the algorithms for the shape (cudnnGet*_v7), not timings: the
// choice depends only on the shape, the GPU and cuDNN's version, so every worker, every
// replacement and every run computes the same bits (timed choices, cudnnFind*, differ from one
// process to the next, and different algorithms round differently). PyTorch with
// cudnn.benchmark off and TensorFlow with op determinism choose the same way. Takes the first
// fp32 forward, and the first deterministic fp32 backward ones, in cuDNN's order. Runs when a
// shape is first seen: a training step's first, unrecorded, run.
void CudaBackend::choose_algorithms(ConvPlan& p) {
  int found = 0;
  cudnnConvolutionFwdAlgoPerf_t fwd[16];
  DT_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(cudnn_.get(), p.x.get(), p.w.get(),
                                                        p.conv.get(), p.y.get(), 16, &found, fwd));
  bool tf32 = mode_ == MathMode::kTf32;
  p.fwd = preferred(fwd, found, false, tf32).algo;
  cudnnConvolutionBwdDataAlgoPerf_t bd[16];
  DT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
      cudnn_.get(), p.w.get(), p.y.get(), p.conv.get(), p.x.get(), 16, &found, bd));
  p.bwd_data = preferred(bd, found, true, tf32).algo;
  cudnnConvolutionBwdFilterAlgoPerf_t bf[16];
  DT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
      cudnn_.get(), p.x.get(), p.y.get(), p.conv.get(), p.w.get(), 16, &found, bf));
  p.bwd_filter = preferred(bf, found, true, tf32).algo;
}

// The 16-bit descriptors and algorithms (tensor cores, deterministic backward data). A shape
// cuDNN has no such algorithm for keeps the fp32 path, said once.
void CudaBackend::plan_half(ConvPlan& p, int pad_h, int pad_w) {
  const ConvShape& s = p.s;
  cudnnDataType_t type = cudnn_type(half_);
  int xh = p.padded_copy ? p.ph : s.h, xw = p.padded_copy ? p.pw : s.w;
  p.x16 = tensor4d(s.n, s.c, xh, xw, type);
  p.y16 = tensor4d(s.n, s.k, s.oh(), s.ow(), type);
  p.w16 = filter4d(s, type);
  p.conv16 = convolution(pad_h, pad_w, s, CUDNN_TENSOR_OP_MATH);
  int found = 0;
  cudnnConvolutionFwdAlgoPerf_t fwd[16];
  cudnnConvolutionBwdDataAlgoPerf_t bd[16];
  const cudnnConvolutionFwdAlgoPerf_t* f = nullptr;
  const cudnnConvolutionBwdDataAlgoPerf_t* d = nullptr;
  if (cudnnGetConvolutionForwardAlgorithm_v7(cudnn_.get(), p.x16.get(), p.w16.get(), p.conv16.get(),
                                             p.y16.get(), 16, &found, fwd) == CUDNN_STATUS_SUCCESS)
    f = first_usable(fwd, found, false, true);
  if (f && cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnn_.get(), p.w16.get(), p.y16.get(),
                                                       p.conv16.get(), p.x16.get(), 16, &found,
                                                       bd) == CUDNN_STATUS_SUCCESS)
    d = first_usable(bd, found, true, true);
  if (!f || !d) {
    spdlog::warn(
        "cuDNN has no {} algorithm for the convolution {}x{}x{}x{} * {}x{}x{}x{}: it "
        "computes in fp32",
        math_mode_name(mode_), s.n, s.c, s.h, s.w, s.k, s.c, s.kh, s.kw);
    return;
  }
  p.fwd16 = f->algo;
  p.bwd_data16 = d->algo;
  size_t a = 0, b = 0;
  DT_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(cudnn_.get(), p.x16.get(), p.w16.get(),
                                                         p.conv16.get(), p.y16.get(), p.fwd16, &a));
  DT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(
      cudnn_.get(), p.w16.get(), p.y16.get(), p.conv16.get(), p.x16.get(), p.bwd_data16, &b));
  p.workspace = std::max(p.workspace, std::max(a, b));
  p.half = true;
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
  p->w = filter4d(s, CUDNN_DATA_FLOAT);
  // FMA without TF32 (the CPU's fp32) unless TF32 is allowed.
  p->conv =
      convolution(pad_h, pad_w, s, mode_ == MathMode::kTf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH);
  choose_algorithms(*p);
  size_t a = 0, b = 0, c = 0;
  DT_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(cudnn_.get(), p->x.get(), p->w.get(),
                                                         p->conv.get(), p->y.get(), p->fwd, &a));
  DT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(
      cudnn_.get(), p->w.get(), p->y.get(), p->conv.get(), p->x.get(), p->bwd_data, &b));
  DT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
      cudnn_.get(), p->x.get(), p->y.get(), p->conv.get(), p->w.get(), p->bwd_filter, &c));
  p->workspace = std::max(a, std::max(b, c));
  // Tensor cores take channels in multiples of 8; cuDNN's 16-bit kernels for fewer (an image's
  // 1 or 3) are generic ones, slower than fp32's, so such a convolution stays fp32.
  if (is_half(mode_) && s.c % 8 == 0) plan_half(*p, pad_h, pad_w);
  slot = std::move(p);
  return *slot;
}

const float* CudaBackend::input_for(ConvPlan& p, const float* x) {
  if (!p.padded_copy) return x;
  size_t count = static_cast<size_t>(p.s.n) * p.s.c * p.ph * p.pw;
  auto* out = static_cast<float*>(padded_.at_least(count * sizeof(float)));
  cuda::launch_pad(x, out, p.s.n * p.s.c, p.s.h, p.s.w, p.s.pad_top, p.s.pad_left, p.ph, p.pw,
                   stream_);
  return out;
}

void* CudaBackend::to_half(DeviceBuffer& buffer, const float* x, size_t count) {
  void* out = buffer.at_least(count * 2);
  cuda::launch_to_half(x, out, count, half_, stream_);
  return out;
}

// y = conv(x, w) in fp32, without the bias.
void CudaBackend::conv_forward(ConvPlan& p, const float* x, const float* w, float* y) {
  const float one = 1, zero = 0;
  void* ws = workspace_.at_least(p.workspace + 1);
  DT_CUDNN_CHECK(cudnnConvolutionForward(cudnn_.get(), &one, p.x.get(), input_for(p, x), p.w.get(),
                                         w, p.conv.get(), p.fwd, ws, p.workspace, &zero, p.y.get(),
                                         y));
}

// x and w rounded to 16 bits, convolved into a 16-bit y16 (fp32 accumulation), then one epilogue
// pass: y = y16 + b (and ReLU).
void CudaBackend::half_forward(ConvPlan& p, const float* x, const float* w, const float* b,
                               float* y, bool relu) {
  const ConvShape& s = p.s;
  const float* input = input_for(p, x);
  size_t x_count = static_cast<size_t>(s.n) * s.c * (p.padded_copy ? p.ph * p.pw : s.h * s.w);
  void* x16 = to_half(half_x_, input, x_count);
  void* w16 = to_half(half_w_, w, s.weight_count());
  void* y16 = half_y_.at_least(s.output_count() * 2);
  const float one = 1, zero = 0;
  void* ws = workspace_.at_least(p.workspace + 1);
  DT_CUDNN_CHECK(cudnnConvolutionForward(cudnn_.get(), &one, p.x16.get(), x16, p.w16.get(), w16,
                                         p.conv16.get(), p.fwd16, ws, p.workspace, &zero,
                                         p.y16.get(), y16));
  cuda::launch_conv_epilogue(y16, b, y, s.n, s.k, s.oh() * s.ow(), relu, half_, stream_);
}

void CudaBackend::conv2d_forward(const ConvShape& s, const float* x, const float* w, const float* b,
                                 float* y) {
  ConvPlan& p = plan(s);
  if (p.half) return half_forward(p, x, w, b, y, false);
  conv_forward(p, x, w, y);
  const float one = 1;
  DT_CUDNN_CHECK(cudnnAddTensor(cudnn_.get(), &one, p.bias.get(), b, &one, p.y.get(), y));
}

// The convolution, then its bias and ReLU in one pass of our own (cuDNN's fused
// conv-bias-activation call is deprecated in cuDNN 9; see docs/design.md#mixed-precision).
void CudaBackend::conv2d_relu_forward(const ConvShape& s, const float* x, const float* w,
                                      const float* b, float* y) {
  ConvPlan& p = plan(s);
  if (p.half) return half_forward(p, x, w, b, y, true);
  conv_forward(p, x, w, y);
  cuda::launch_bias_planes_relu(y, b, s.n, s.k, s.oh() * s.ow(), stream_);
}

void CudaBackend::conv2d_backward_data(const ConvShape& s, const float* dy, const float* w,
                                       float* dx) {
  ConvPlan& p = plan(s);
  const float one = 1, zero = 0;
  void* ws = workspace_.at_least(p.workspace + 1);
  size_t count = static_cast<size_t>(s.n) * s.c * p.ph * p.pw;
  float* target =
      p.padded_copy ? static_cast<float*>(padded_grad_.at_least(count * sizeof(float))) : dx;
  if (p.half) {  // target holds count values (padded) or s.input_count() (dx itself)
    size_t target_count = p.padded_copy ? count : s.input_count();
    void* dy16 = to_half(half_y_, dy, s.output_count());
    void* w16 = to_half(half_w_, w, s.weight_count());
    void* dx16 = half_x_.at_least(target_count * 2);
    DT_CUDNN_CHECK(cudnnConvolutionBackwardData(cudnn_.get(), &one, p.w16.get(), w16, p.y16.get(),
                                                dy16, p.conv16.get(), p.bwd_data16, ws, p.workspace,
                                                &zero, p.x16.get(), dx16));
    cuda::launch_from_half(dx16, target, target_count, half_, stream_);
  } else {
    DT_CUDNN_CHECK(cudnnConvolutionBackwardData(cudnn_.get(), &one, p.w.get(), w, p.y.get(), dy,
                                                p.conv.get(), p.bwd_data, ws, p.workspace, &zero,
                                                p.x.get(), target));
  }
  if (p.padded_copy) {
    cuda::launch_crop(target, dx, s.n * s.c, s.h, s.w, s.pad_top, s.pad_left, p.ph, p.pw, stream_);
  }
}

void CudaBackend::conv2d_backward_weights(const ConvShape& s, const float* x, const float* dy,
                                          float* dw, float* db) {
  if (cuda::has_small_filter_kernel(s)) {  // faster than cuDNN's deterministic algorithms
    auto* partials = static_cast<float*>(
        wgrad_scratch_.at_least(sizeof(float) * cuda::conv_weight_grad_scratch_floats(s)));
    cuda::conv_weight_grad(s, x, dy, nullptr, dw, db, partials, stream_);
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

void CudaBackend::conv2d_relu_backward_weights(const ConvShape& s, const float* x, const float* y,
                                               const float* dy, float* dw, float* db,
                                               float* scratch) {
  if (!cuda::has_small_filter_kernel(s))
    return Backend::conv2d_relu_backward_weights(s, x, y, dy, dw, db, scratch);
  auto* partials = static_cast<float*>(
      wgrad_scratch_.at_least(sizeof(float) * cuda::conv_weight_grad_scratch_floats(s)));
  cuda::conv_weight_grad(s, x, dy, y, dw, db, partials, stream_);
}

// n ones on the device, grown (outside any recording: first use of a batch size) as needed.
const float* CudaBackend::ones(int n) {
  if (n > ones_count_) {
    auto* data = static_cast<float*>(ones_.at_least(sizeof(float) * static_cast<size_t>(n)));
    cuda::launch_fill(data, static_cast<size_t>(n), 1.0f, stream_);
    ones_count_ = n;
  }
  return static_cast<const float*>(ones_.at_least(0));
}

// fp32: cuBLAS's sgemm (FMA). The other modes let cuBLAS round the fp32 inputs to TF32, bf16
// or fp16 for the tensor cores, accumulating in fp32 (its *_FAST_* compute types).
void CudaBackend::gemm(cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k,
                       const float* a, int lda, const float* b, int ldb, float* c, int ldc) {
  const float one = 1, zero = 0;
  if (mode_ == MathMode::kFloat32) {
    DT_CUBLAS_CHECK(
        cublasSgemm(cublas_.get(), op_a, op_b, m, n, k, &one, a, lda, b, ldb, &zero, c, ldc));
    return;
  }
  cublasComputeType_t compute = mode_ == MathMode::kTf32       ? CUBLAS_COMPUTE_32F_FAST_TF32
                                : mode_ == MathMode::kBfloat16 ? CUBLAS_COMPUTE_32F_FAST_16BF
                                                               : CUBLAS_COMPUTE_32F_FAST_16F;
  DT_CUBLAS_CHECK(cublasGemmEx(cublas_.get(), op_a, op_b, m, n, k, &one, a, CUDA_R_32F, lda, b,
                               CUDA_R_32F, ldb, &zero, c, CUDA_R_32F, ldc, compute,
                               CUBLAS_GEMM_DEFAULT));
}

// Row-major (n x in) . (in x out) through column-major cuBLAS: y^T = w^T x^T.
void CudaBackend::dense_forward(int n, int in, int out, const float* x, const float* w,
                                const float* b, float* y) {
  gemm(CUBLAS_OP_N, CUBLAS_OP_N, out, n, in, w, out, x, in, y, out);
  cuda::launch_bias_rows(y, b, n, out, stream_);
}

void CudaBackend::dense_relu_forward(int n, int in, int out, const float* x, const float* w,
                                     const float* b, float* y) {
  gemm(CUBLAS_OP_N, CUBLAS_OP_N, out, n, in, w, out, x, in, y, out);
  cuda::launch_bias_rows_relu(y, b, n, out, stream_);
}

void CudaBackend::dense_backward_data(int n, int in, int out, const float* dy, const float* w,
                                      float* dx) {
  gemm(CUBLAS_OP_T, CUBLAS_OP_N, in, n, out, w, out, dy, out, dx, in);
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
  gemm(CUBLAS_OP_N, CUBLAS_OP_T, out, row_end - row_begin, n, dy, out, x + row_begin, in,
       dw + static_cast<size_t>(row_begin) * out, out);
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
  cuda::launch_cross_entropy(logp, logits, labels, dlogits, row_loss, row_hit, n, classes, totals,
                             stream_);
}

void CudaBackend::add(size_t count, const float* x, float* y) {
  cuda::launch_add(count, x, y, stream_);
}

void CudaBackend::dropout_forward(size_t count, float rate, uint64_t key, const float* x, float* y,
                                  float* mask) {
  cuda::launch_dropout(count, rate, key, x, y, mask, stream_);
}

void CudaBackend::multiply(size_t count, const float* a, const float* b, float* y) {
  cuda::launch_multiply(count, a, b, y, stream_);
}

void CudaBackend::scale(size_t count, const float* factor, float* x) {
  cuda::launch_scale(count, factor, x, stream_);
}

void CudaBackend::unscale_gradients(size_t count, const float* scale, float* g, float* nonfinite) {
  cuda::launch_unscale(count, scale, g, nonfinite, stream_);
}

void CudaBackend::update_loss_scale(float* state, int64_t growth_steps) {
  cuda::launch_update_loss_scale(state, growth_steps, stream_);
}

void CudaBackend::sgd_update(const SgdParams& p, size_t count, float* w, const float* g,
                             float* velocity) {
  cuda::launch_sgd(p, count, w, g, velocity, stream_);
}

// Keras's bias-corrected Adam rate for step t (the same on the host backends).
float adam_rate(float lr, float beta_1, float beta_2, int64_t step) {
  DT_ENFORCE(step >= 1, "Adam step {} (counts from 1)", step);
  double t = static_cast<double>(step);
  return static_cast<float>(lr * std::sqrt(1.0 - std::pow(beta_2, t)) /
                            (1.0 - std::pow(beta_1, t)));
}

void CudaBackend::adam_update(const AdamParams& p, int64_t step, size_t count, float* w,
                              const float* g, float* m, float* v) {
  // After a skip the count is one lower: the rate of step - 1 (step >= 2 whenever the gate can
  // say so, since the host counted the skipped step).
  const bool gated = p.gate.previous != nullptr;
  cuda::launch_adam(
      adam_rate(p.learning_rate, p.beta_1, p.beta_2, step),
      gated ? adam_rate(p.gate.learning_rate_after_skip, p.beta_1, p.beta_2, step - 1) : 0.0f, p,
      count, w, g, m, v, stream_);
}

void CudaBackend::rmsprop_update(const RmspropParams& p, size_t count, float* w, const float* g,
                                 float* velocity, float* momentum_slot, float* average_gradient) {
  cuda::launch_rmsprop(p, count, w, g, velocity, momentum_slot, average_gradient, stream_);
}

void CudaBackend::adamw_update(const AdamWParams& p, int64_t step, size_t count, float* w,
                               const float* g, float* m, float* v) {
  const bool gated = p.gate.previous != nullptr;
  const float after_skip = p.gate.learning_rate_after_skip;
  cuda::launch_adamw(p.weight_decay * p.learning_rate,
                     adam_rate(p.learning_rate, p.beta_1, p.beta_2, step),
                     gated ? p.weight_decay * after_skip : 0.0f,
                     gated ? adam_rate(after_skip, p.beta_1, p.beta_2, step - 1) : 0.0f, p, count,
                     w, g, m, v, stream_);
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(MathMode mode) {
  return std::make_unique<CudaBackend>(mode);
}

}  // namespace dtrain::nn
