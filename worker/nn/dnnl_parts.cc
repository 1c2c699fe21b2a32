// See dnnl_parts.h.
#include "worker/nn/dnnl_parts.h"

#include <omp.h>

#include <algorithm>
#include <unordered_map>

#include "common/errors.h"
#include "worker/nn/avx512_bf16.h"
#include "worker/nn/backend.h"
#include "worker/nn/bf16_rounding.h"
#include "worker/nn/bf16_weight_grad.h"

namespace dtrain::nn {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;

dnnl::reorder make_reorder(const dnnl::engine& e, const memory::desc& from,
                           const memory::desc& to) {
  return dnnl::reorder(dnnl::reorder::primitive_desc(e, from, e, to));
}

#if defined(__x86_64__) && defined(__GNUC__)
// Blocks [first, last) of 32 floats, one thread's share.
DT_TARGET_AVX512_BF16 void round_blocks_avx512_bf16(const float* in, int64_t first, int64_t last,
                                                    uint16_t* out) {
  for (int64_t b = first; b < last; ++b) {
    const float* from = in + b * 32;
    __m512bh pair = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(from + 16), _mm512_loadu_ps(from));
    _mm512_storeu_si512(out + b * 32, reinterpret_cast<__m512i>(pair));
  }
}

// 32 floats per instruction; the threads take whole blocks of 32, the last thread the tail
// through masks. Below a few blocks per thread the team costs more than it saves.
DT_TARGET_AVX512_BF16 void round_avx512_bf16(const float* in, size_t count, uint16_t* out) {
  const int64_t blocks = static_cast<int64_t>(count / 32);
#pragma omp parallel if (blocks >= 1024)
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    round_blocks_avx512_bf16(in, blocks * t / threads, blocks * (t + 1) / threads, out);
  }
  for (size_t i = static_cast<size_t>(blocks) * 32; i < count; i += 16) {
    const size_t left = count - i;
    const __mmask16 mask =
        left >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << left) - 1);
    __m256bh half = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, in + i));
    _mm256_mask_storeu_epi16(out + i, mask, reinterpret_cast<__m256i>(half));
  }
}

DT_AVX512_INTRINSICS_BEGIN
// BA16a64b2a for B (k x n): blocks of 32 k by 64 n, 2048 elements each, k-blocks innermost;
// inside a block, pairs of k (2a) for each n (64b), 16 pairs (16a). Element (k, n) lives at
// (k / 32 + (n / 64) * (K / 32)) * 2048 + (k % 32 / 2) * 128 + (n % 64) * 2 + k % 2. With B = w,
// two rows of w converted together and interleaved make 16 columns' pairs, one store; the same
// conversion, not interleaved, is the two rows' plain copy. This packs the 64 rows of row block
// rb (two k-blocks), one thread's share.
DT_TARGET_AVX512_BF16 void pack_row_block_avx512_bf16(const float* w, int64_t rows, int64_t cols,
                                                      int64_t rb, uint16_t* blocked,
                                                      uint16_t* plain) {
  alignas(64) static const uint16_t kInterleave[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                       21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                       11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i interleave = _mm512_load_si512(kInterleave);
  for (int64_t kb = 2 * rb; kb < 2 * rb + 2; ++kb) {
    for (int64_t nb = 0; nb < cols / 64; ++nb) {
      uint16_t* block = blocked ? blocked + (kb + nb * (rows / 32)) * 2048 : nullptr;
      for (int p = 0; p < 16; ++p) {
        const int64_t at = (kb * 32 + 2 * p) * cols + nb * 64;
        const float* even = w + at;
        const float* odd = even + cols;
        for (int c = 0; c < 4; ++c) {
          __m512i both = reinterpret_cast<__m512i>(
              _mm512_cvtne2ps_pbh(_mm512_loadu_ps(odd + 16 * c), _mm512_loadu_ps(even + 16 * c)));
          if (blocked)
            _mm512_storeu_si512(block + p * 128 + 32 * c,
                                _mm512_permutexvar_epi16(interleave, both));
          if (plain) {
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(plain + at + 16 * c),
                                _mm512_castsi512_si256(both));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(plain + at + cols + 16 * c),
                                _mm512_extracti64x4_epi64(both, 1));
          }
        }
      }
    }
  }
}
DT_AVX512_INTRINSICS_END

void pack_avx512_bf16(const float* w, int64_t rows, int64_t cols, uint16_t* blocked,
                      uint16_t* plain) {
  const int64_t row_blocks = rows / 64;
#pragma omp parallel for if (row_blocks >= 4)
  for (int64_t rb = 0; rb < row_blocks; ++rb)
    pack_row_block_avx512_bf16(w, rows, cols, rb, blocked, plain);
}
#endif

}  // namespace

namespace bf16_rounding {

bool vectorized() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool has =
      __builtin_cpu_supports("avx512bf16") && own_kernels_may_use(VectorIsa::kAvx512Bf16);
  return has;
#else
  return false;
#endif
}

bool round_vectorized(const float* in, size_t count, uint16_t* out) {
  if (!vectorized()) return false;
#if defined(__x86_64__) && defined(__GNUC__)
  round_avx512_bf16(in, count, out);
#endif
  return true;
}

void round_any(const float* in, size_t count, uint16_t* out) {
  if (!round_vectorized(in, count, out)) round_onednn(in, count, out);
}

void round_onednn(const float* in, size_t count, uint16_t* out) {
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  memory::dims dims = {static_cast<memory::dim>(count)};
  memory from(memory::desc(dims, Dt::f32, Tag::x), engine, const_cast<float*>(in));
  memory to(memory::desc(dims, Dt::bf16, Tag::x), engine, out);
  make_reorder(engine, from.get_desc(), to.get_desc()).execute(stream, from, to);
  stream.wait();
}

bool pack_vectorized(const float* w, int64_t rows, int64_t cols, uint16_t* blocked,
                     uint16_t* plain) {
  if (!vectorized() || rows % 64 != 0 || cols % 64 != 0) return false;
#if defined(__x86_64__) && defined(__GNUC__)
  pack_avx512_bf16(w, rows, cols, blocked, plain);
#endif
  return true;
}

void pack_onednn(const float* w, int64_t rows, int64_t cols, uint16_t* out) {
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  memory::desc plain({rows, cols}, Dt::f32, Tag::ab);
  memory::desc blocked({rows, cols}, Dt::bf16, Tag::BA16a64b2a);
  memory from(plain, engine, const_cast<float*>(w));
  memory to(blocked, engine, out);
  make_reorder(engine, plain, blocked).execute(stream, from, to);
  stream.wait();
}

}  // namespace bf16_rounding

namespace dnnl_parts {

namespace {

// Whether wanted is plain (float32) with bf16 values: the same layout, element i rounded.
bool retyped_to_bf16(const memory::desc& plain, const memory::desc& wanted) {
  if (plain.data_type() != Dt::f32 || wanted.data_type() != Dt::bf16) return false;
  dnnl_memory_desc_t retyped = plain.data;
  retyped.data_type = dnnl_bf16;
  return memory::desc(retyped) == wanted;
}

// Whether wanted is plain with bf16 values, and this CPU rounds a buffer faster than oneDNN's
// reorder does: bf16_rounding's AVX512_BF16 loops on several threads (one thread's are level with
// the reorder; two threads' took half its time on the ResNet's activations,
// docs/design.md#rounding-to-bf16). The bits are the reorder's.
bool rounds_in_place(const memory::desc& plain, const memory::desc& wanted) {
  return retyped_to_bf16(plain, wanted) && bf16_rounding::vectorized() &&
         omp_get_max_threads() >= 2;
}

}  // namespace

Staged::Staged(const memory::desc& plain, const memory::desc& wanted, const dnnl::engine& engine)
    : engine_(engine), plain_(plain), same_(plain == wanted) {
  if (same_) return;
  inner_ = memory(wanted, engine);
  rounds_ = rounds_in_place(plain, wanted);
  to_inner_ = make_reorder(engine, plain, wanted);
  to_plain_ = make_reorder(engine, wanted, plain);
}

memory Staged::in(const void* data, dnnl::stream& stream) {
  if (same_) return memory(plain_, engine_, const_cast<void*>(data));
  fill(data, inner_, stream);
  return inner_;
}

void Staged::fill(const void* data, memory& into, dnnl::stream& stream) {
  if (same_) return;
  if (rounds_ && bf16_rounding::round_vectorized(static_cast<const float*>(data),
                                                 plain_.get_size() / sizeof(float),
                                                 static_cast<uint16_t*>(into.get_data_handle())))
    return;
  memory user(plain_, engine_, const_cast<void*>(data));
  to_inner_.execute(stream, user, into);
}

memory Staged::out(void* data) {
  return same_ ? memory(plain_, engine_, data) : inner_;
}

void Staged::store(void* data, dnnl::stream& stream) {
  if (same_) return;
  memory user(plain_, engine_, data);
  to_plain_.execute(stream, inner_, user);
}

dnnl::reorder& Rounder::converter(size_t count) {
  auto found = converters_.find(count);
  if (found != converters_.end()) return found->second;
  memory::dims dims = {static_cast<memory::dim>(count)};
  return converters_[count] = make_reorder(engine_, memory::desc(dims, Dt::f32, Tag::x),
                                           memory::desc(dims, Dt::bf16, Tag::x));
}

uint16_t* Rounder::slot(const float* source, size_t count) {
  Copy& copy = copies_[source];
  copy.count = count;
  // Not zero-filled: the caller writes every element.
  if (copy.capacity < count) copy.bits.reset(new uint16_t[count]), copy.capacity = count;
  return copy.bits.get();
}

const uint16_t* Rounder::round(const float* source, size_t count, dnnl::stream& stream) {
  uint16_t* bits = slot(source, count);
  if (bf16_rounding::round_vectorized(source, count, bits)) return bits;
  memory::dims dims = {static_cast<memory::dim>(count)};
  memory from(memory::desc(dims, Dt::f32, Tag::x), engine_, const_cast<float*>(source));
  memory to(memory::desc(dims, Dt::bf16, Tag::x), engine_, bits);
  converter(count).execute(stream, from, to);
  stream.wait();
  return bits;
}

const uint16_t* Rounder::reuse(const float* source, size_t count, dnnl::stream& stream) {
  auto found = copies_.find(source);
  if (found != copies_.end() && found->second.count == count) return found->second.bits.get();
  return round(source, count, stream);
}

void Rounder::drop(const float* begin, size_t count) {
  const float* end = begin + count;
  for (auto it = copies_.begin(); it != copies_.end();) {
    bool overlaps = it->first < end && begin < it->first + it->second.count;
    it = overlaps ? copies_.erase(it) : std::next(it);
  }
}

Conv::Conv(const ConvShape& s, MathMode mode, const dnnl::engine& engine) : engine_(engine) {
  const Dt in = mode == MathMode::kBfloat16 ? Dt::bf16 : Dt::f32;
  const memory::dims src_dims = {s.n, s.c, s.h, s.w}, weight_dims = {s.k, s.c, s.kh, s.kw},
                     dst_dims = {s.n, s.k, s.oh(), s.ow()};
  // The callers' layouts: x and dx, y and dy each plain NCHW or in blocks of 16 channels (the
  // model's choice, docs/design.md#blocked-activations); where oneDNN wants the same, Staged
  // hands it the caller's memory and nothing is reordered.
  auto layout = [](Layout l) { return l == Layout::kBlocked ? Tag::nChw16c : Tag::nchw; };
  const memory::desc plain_src(src_dims, Dt::f32, layout(s.x_layout)),
      plain_weights(weight_dims, Dt::f32, Tag::oihw),
      plain_dst(dst_dims, Dt::f32, layout(s.y_layout));
  // Without a bias neither the forward adds one nor the weight gradient sums dy for it (a few
  // per cent of a bf16 weight gradient).
  if (s.bias) bias_ = memory::desc({s.k}, Dt::f32, Tag::x);
  // A few input channels stay plain: blocking them would pad each to 16 (oneDNN's first-layer
  // kernels read NCHW directly). Everything else is left to oneDNN's choice.
  const Tag src_tag = s.c % 8 == 0 ? Tag::any : Tag::nchw;
  const memory::desc src(src_dims, in, src_tag), weights(weight_dims, in, Tag::any),
      dst(dst_dims, Dt::f32, Tag::any), diff_dst(dst_dims, in, Tag::any),
      diff_src(src_dims, Dt::f32, src_tag), diff_weights(weight_dims, Dt::f32, Tag::any);
  const memory::dims strides = {s.sh, s.sw}, pad_l = {s.pad_top, s.pad_left},
                     pad_r = {s.pad_bottom, s.pad_right};
  const auto direct = dnnl::algorithm::convolution_direct;
  auto make_forward = [&](bool relu) {
    dnnl::primitive_attr attr;
    if (relu) {
      dnnl::post_ops ops;
      ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
      attr.set_post_ops(ops);
    }
    const auto training = dnnl::prop_kind::forward_training;
    dnnl::convolution_forward::primitive_desc pd(
        !bias_.is_zero() ? dnnl::convolution_forward::desc(training, direct, src, weights, bias_,
                                                           dst, strides, pad_l, pad_r)
                         : dnnl::convolution_forward::desc(training, direct, src, weights, dst,
                                                           strides, pad_l, pad_r),
        attr, engine);
    implementations_.push_back(pd.impl_info_str());
    return std::make_pair(
        pd, Forward{dnnl::convolution_forward(pd), Staged(plain_src, pd.src_desc(), engine),
                    Staged(plain_weights, pd.weights_desc(), engine),
                    Staged(plain_dst, pd.dst_desc(), engine)});
  };
  auto [hint, plain] = make_forward(false);
  plain_ = std::move(plain);
  auto [relu_pd, relu] = make_forward(true);
  relu_ = std::move(relu);
  const memory::desc relu_src = relu_pd.src_desc();
  dnnl::convolution_backward_data::primitive_desc bd(
      {direct, diff_src, weights, diff_dst, strides, pad_l, pad_r}, engine, hint);
  backward_data_ = dnnl::convolution_backward_data(bd);
  bd_diff_dst_ = Staged(plain_dst, bd.diff_dst_desc(), engine);
  bd_weights_ = Staged(plain_weights, bd.weights_desc(), engine);
  bd_diff_src_ = Staged(plain_src, bd.diff_src_desc(), engine);
  dnnl::convolution_backward_weights::primitive_desc bw(
      !bias_.is_zero() ? dnnl::convolution_backward_weights::desc(direct, src, diff_weights, bias_,
                                                                  diff_dst, strides, pad_l, pad_r)
                       : dnnl::convolution_backward_weights::desc(direct, src, diff_weights,
                                                                  diff_dst, strides, pad_l, pad_r),
      engine, hint);
  backward_weights_ = dnnl::convolution_backward_weights(bw);
  bw_src_ = Staged(plain_src, bw.src_desc(), engine);
  bw_diff_dst_ = Staged(plain_dst, bw.diff_dst_desc(), engine);
  bw_diff_weights_ = Staged(plain_weights, bw.diff_weights_desc(), engine);
  implementations_.push_back(bd.impl_info_str());
  implementations_.push_back(bw.impl_info_str());
  keep_src_ = !plain_.src.same() && !relu_.src.same() && hint.src_desc() == bw.src_desc() &&
              relu_src == bw.src_desc();
  share_dy_ = bd.diff_dst_desc() == bw.diff_dst_desc();
  kept_desc_ = bw.src_desc();
  if (retyped_to_bf16(plain_src, hint.src_desc()) && hint.src_desc() == bw.src_desc() &&
      relu_src == bw.src_desc())
    rounded_src_ = bw.src_desc();
  if (share_dy_ && retyped_to_bf16(plain_dst, bw.diff_dst_desc())) rounded_dy_ = bw.diff_dst_desc();
  shape_ = s;
  // Where oneDNN runs on AMX's tile units, its own weight gradient is kept: the tiles do many
  // times vdpbf16ps's products a cycle (docs/design.md#the-bf16-weight-gradient).
  own_weights_ = mode == MathMode::kBfloat16 && bf16_weight_grad::suits(s) &&
                 dnnl::get_effective_cpu_isa() != dnnl::cpu_isa::avx512_core_amx &&
                 retyped_to_bf16(plain_src, bw.src_desc()) &&
                 retyped_to_bf16(plain_dst, bw.diff_dst_desc());
  if (own_weights_) implementations_.push_back("bf16_weight_grad:avx512_core_bf16");
}

void Conv::forward(dnnl::stream& st, const float* x, const float* w, const float* b, float* y,
                   bool relu, const uint16_t* x16) {
  Forward& f = relu ? relu_ : plain_;
  memory src;
  if (x16 && rounded_src_ != memory::desc()) {
    src = memory(rounded_src_, engine_, const_cast<uint16_t*>(x16));
    if (keep_src_) kept_src_[x] = {src, true};
  } else if (keep_src_) {
    Kept& kept = kept_src_[x];
    if (!kept.copy || kept.borrowed) kept = {memory(kept_desc_, engine_), false};
    f.src.fill(x, kept.copy, st);
    src = kept.copy;
  } else {
    src = f.src.in(x, st);
  }
  std::unordered_map<int, memory> args = {
      {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, f.weights.in(w, st)}, {DNNL_ARG_DST, f.dst.out(y)}};
  if (!bias_.is_zero()) args[DNNL_ARG_BIAS] = memory(bias_, engine_, const_cast<float*>(b));
  f.primitive.execute(st, args);
  f.dst.store(y, st);
  st.wait();
}

void Conv::backward_data(dnnl::stream& st, const float* dy, const float* w, float* dx) {
  run_backward_data(st, bd_diff_dst_.in(dy, st), w, dx);
}

void Conv::backward_weights(dnnl::stream& st, const float* x, const float* dy, float* dw,
                            float* db) {
  run_backward_weights(st, bw_src_.in(x, st), bw_diff_dst_.in(dy, st), dw, db);
}

void Conv::backward(dnnl::stream& st, const float* x, const float* dy, const float* w, float* dx,
                    float* dw, float* db, const std::function<void()>& weights_done,
                    const uint16_t* dy16) {
  auto kept = keep_src_ ? kept_src_.find(x) : kept_src_.end();
  const memory diff_dst = dy16 && rounded_dy_ != memory::desc()
                              ? memory(rounded_dy_, engine_, const_cast<uint16_t*>(dy16))
                              : bw_diff_dst_.in(dy, st);
  run_backward_weights(st, kept != kept_src_.end() ? kept->second.copy : bw_src_.in(x, st),
                       diff_dst, dw, db);
  if (weights_done) weights_done();
  if (dx) run_backward_data(st, share_dy_ ? diff_dst : bd_diff_dst_.in(dy, st), w, dx);
}

void Conv::run_backward_data(dnnl::stream& st, const memory& diff_dst, const float* w, float* dx) {
  backward_data_.execute(st, {{DNNL_ARG_DIFF_DST, diff_dst},
                              {DNNL_ARG_WEIGHTS, bd_weights_.in(w, st)},
                              {DNNL_ARG_DIFF_SRC, bd_diff_src_.out(dx)}});
  bd_diff_src_.store(dx, st);
  st.wait();
}

void Conv::run_backward_weights(dnnl::stream& st, const memory& src, const memory& diff_dst,
                                float* dw, float* db) {
  if (own_weights_) {  // no bias: db is not read (ConvShape::bias)
    st.wait();         // src and diff_dst may have just been staged
    bf16_weight_grad::compute(shape_, static_cast<const uint16_t*>(src.get_data_handle()),
                              static_cast<const uint16_t*>(diff_dst.get_data_handle()), dw,
                              weights_scratch_);
    return;
  }
  std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, src},
                                          {DNNL_ARG_DIFF_DST, diff_dst},
                                          {DNNL_ARG_DIFF_WEIGHTS, bw_diff_weights_.out(dw)}};
  if (!bias_.is_zero()) args[DNNL_ARG_DIFF_BIAS] = memory(bias_, engine_, db);
  backward_weights_.execute(st, args);
  bw_diff_weights_.store(dw, st);
  st.wait();
}

Matmul::Matmul(const MatmulShape& s, const dnnl::engine& engine) : engine_(engine), shape_(s) {
  const Dt in = s.bf16 ? Dt::bf16 : Dt::f32;
  a_ = memory::desc({s.m, s.k}, in, memory::dims{s.a_row, s.a_col});
  b_ = s.packed_b ? memory::desc({s.k, s.n}, in, Tag::any)
                  : memory::desc({s.k, s.n}, in, memory::dims{s.b_row, s.b_col});
  c_ = memory::desc({s.m, s.n}, Dt::f32, memory::dims{s.ldc, 1});
  dnnl::primitive_attr attr;
  if (s.relu) {
    dnnl::post_ops ops;
    ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(ops);
  }
  if (s.bias) bias_ = memory::desc({1, s.n}, Dt::f32, Tag::ab);
  dnnl::matmul::primitive_desc pd(
      s.bias ? dnnl::matmul::desc(a_, b_, bias_, c_) : dnnl::matmul::desc(a_, b_, c_), attr,
      engine);
  primitive_ = dnnl::matmul(pd);
  implementation_ = pd.impl_info_str();
  if (s.packed_b) b_ = pd.weights_desc();
}

bool Matmul::b_blocked_64() const {
  return shape_.packed_b && shape_.bf16 &&
         b_ == memory::desc({shape_.k, shape_.n}, Dt::bf16, Tag::BA16a64b2a);
}

void Matmul::run(dnnl::stream& st, const void* a, const void* b, const float* bias, float* c) {
  std::unordered_map<int, memory> args = {
      {DNNL_ARG_SRC, memory(a_, engine_, const_cast<void*>(a))},
      {DNNL_ARG_WEIGHTS, memory(b_, engine_, const_cast<void*>(b))},
      {DNNL_ARG_DST, memory(c_, engine_, c)}};
  if (bias) args[DNNL_ARG_BIAS] = memory(bias_, engine_, const_cast<float*>(bias));
  primitive_.execute(st, args);
  st.wait();
}

}  // namespace dnnl_parts
}  // namespace dtrain::nn
