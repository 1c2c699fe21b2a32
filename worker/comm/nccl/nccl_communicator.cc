// NcclCommunicator: the gradient all-reduce as ncclAllReduce on a communication stream of its
// own, fenced against the device's compute stream by a ring of event pairs, so neither start
// nor finish ever blocks the host (and both can be captured into a CUDA graph). Host-memory
// collectives are the bootstrap communicator's. It does no bucketing, no rendezvous and no
// retries: the trainer picks buckets, the bootstrap was connected before, the group restarts.
#include "worker/comm/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>
#include <spdlog/spdlog.h>

#include <array>
#include <chrono>
#include <thread>
#include <utility>

#include "common/errors.h"
#include "worker/comm/nccl/nccl_check.h"
#include "worker/mem/cuda/cuda_check.h"
#include "worker/mem/cuda/cuda_handles.h"

namespace dtrain::comm {
namespace {

/// Started-but-unfinished all-reduces at once; each holds one pair of events.
constexpr size_t kEventPairs = 64;
/// How long the destructor lets the communication stream run dry before it aborts NCCL.
constexpr std::chrono::seconds kDrainTime{10};

/// Move-only owner of an ncclComm_t: ncclCommDestroy when it goes, unless abort() came first.
class NcclComm {
 public:
  NcclComm() = default;
  explicit NcclComm(ncclComm_t comm) : comm_(comm) {}
  NcclComm(NcclComm&& other) noexcept : comm_(std::exchange(other.comm_, nullptr)) {}
  NcclComm& operator=(NcclComm&& other) noexcept {
    std::swap(comm_, other.comm_);
    return *this;
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ~NcclComm() {
    if (comm_) ncclCommDestroy(comm_);
  }
  ncclComm_t get() const { return comm_; }
  /// Stops the communicator's kernels and frees it; the handle is empty afterwards.
  void abort() noexcept {
    if (comm_) ncclCommAbort(std::exchange(comm_, nullptr));
  }

 private:
  ncclComm_t comm_ = nullptr;
};

/// Non-blocking (never synchronises with the legacy default stream), at the highest priority so
/// that all-reduce kernels get SMs ahead of the backward pass they overlap with.
nn::cuda::StreamHandle make_comm_stream() {
  int least = 0, greatest = 0;
  DT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t stream = nullptr;
  DT_CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest));
  return nn::cuda::StreamHandle(stream);
}

cudaStream_t compute_stream_of(nn::Device& device) {
  if (device.kind() != nn::DeviceKind::kCuda) {
    throw common::ConfigError(fmt::format(
        "communication: \"nccl\" needs the model on a CUDA device; it is on {}", device.name()));
  }
  return static_cast<cudaStream_t>(device.native_stream());
}

/// Rank 0's ncclUniqueId, sent over the bootstrap's authenticated ring, then ncclCommInitRank on
/// the current device. Blocks until every rank has joined.
NcclComm join_nccl(Communicator& bootstrap) {
  ncclUniqueId id{};
  if (bootstrap.rank() == 0) DT_NCCL_CHECK(ncclGetUniqueId(&id));
  bootstrap.broadcast(&id, sizeof id, 0);
  ncclComm_t comm = nullptr;
  DT_NCCL_CHECK(ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank()));
  return NcclComm(comm);
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::unique_ptr<Communicator> bootstrap, nn::Device& device)
      : bootstrap_(std::move(bootstrap)), compute_(compute_stream_of(device)) {
    DT_ENFORCE(bootstrap_ != nullptr, "make_nccl_communicator needs a bootstrap communicator");
    comm_stream_ = make_comm_stream();
    for (Slot& slot : slots_) {
      slot.ready = nn::cuda::make_event();
      slot.done = nn::cuda::make_event();
    }
    comm_ = join_nccl(*bootstrap_);
    spdlog::info("NCCL {}: rank {} of {} on GPU {}", nccl_version_string(), rank(), size(),
                 device.name());
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  /// ncclCommDestroy when NCCL is healthy and its stream ran dry within kDrainTime (so it will
  /// not wait on a lost peer); otherwise ncclCommAbort.
  ~NcclCommunicator() override {
    if (comm_.get() && !drained()) comm_.abort();
  }

  int rank() const override { return bootstrap_->rank(); }
  int size() const override { return bootstrap_->size(); }

  // Host memory: the bootstrap's collectives. Started device all-reduces are already enqueued,
  // so from the host's point of view none is outstanding; these neither wait for nor order
  // against the device's streams. They do refuse to run on a communicator NCCL reported broken.
  void all_reduce(float* data, size_t count, ReduceOp op) override {
    throw_if_failed();
    bootstrap_->all_reduce(data, count, op);
  }
  void broadcast(void* data, size_t bytes, int root) override {
    throw_if_failed();
    bootstrap_->broadcast(data, bytes, root);
  }
  void barrier() override {
    throw_if_failed();
    bootstrap_->barrier();
  }
  std::vector<uint8_t> all_gather(const void* mine, size_t bytes) override {
    throw_if_failed();
    return bootstrap_->all_gather(mine, bytes);
  }

  void abort(const std::string& message) noexcept override {
    try {
      if (comm_.get()) abort_message_ = message;
    } catch (...) {  // out of memory for the message: abort all the same
    }
    comm_.abort();
    bootstrap_->abort(message);
  }
  /// The host collectives only (the bootstrap ring's): device all-reduces already enqueued are
  /// NCCL's, and GPU workers never re-form in place, so no notice is sent to them.
  void interrupt(const std::string& why) noexcept override { bootstrap_->interrupt(why); }

  ReduceTicket start_all_reduce(float* data, size_t count, ReduceOp op) override;
  void finish_all_reduce(ReduceTicket ticket) override;
  /// Events and ncclAllReduce on streams only: a CUDA graph may record them.
  bool stream_ordered() const override { return true; }

 private:
  /// The events of one started all-reduce: ready on the compute stream (its data is written),
  /// done on the communication stream (it is reduced).
  struct Slot {
    nn::cuda::EventHandle ready;
    nn::cuda::EventHandle done;
    uint64_t ticket = 0;  ///< the started, unfinished ticket holding the pair; 0 when free
  };

  ncclComm_t live_comm() const;
  void throw_if_failed() const;
  bool drained() noexcept;

  std::unique_ptr<Communicator> bootstrap_;
  cudaStream_t compute_;                 ///< the device's; not owned
  nn::cuda::StreamHandle comm_stream_;   ///< all NCCL work, in start order
  std::array<Slot, kEventPairs> slots_;  ///< ticket t uses slots_[t % kEventPairs]
  NcclComm comm_;                        ///< last member: freed before the stream and events
  std::string abort_message_;
};

ReduceTicket NcclCommunicator::start_all_reduce(float* data, size_t count, ReduceOp op) {
  DT_ENFORCE(data != nullptr || count == 0, "all-reduce of {} floats from a null buffer", count);
  ncclComm_t comm = live_comm();
  uint64_t id = next_ticket_;
  Slot& slot = slots_[id % kEventPairs];
  DT_ENFORCE(slot.ticket == 0,
             "all-reduce {} started while all-reduce {} is unfinished: at most {} may be "
             "outstanding",
             id, slot.ticket, kEventPairs);
  cudaStream_t stream = comm_stream_.get();
  DT_CUDA_CHECK(cudaEventRecord(slot.ready.get(), compute_));
  DT_CUDA_CHECK(cudaStreamWaitEvent(stream, slot.ready.get(), 0));
  if (count > 0) {  // every rank starts the same sequence, so every rank skips it alike
    ncclRedOp_t nccl_op = op == ReduceOp::kMean ? ncclAvg : ncclSum;
    DT_NCCL_CHECK(ncclAllReduce(data, data, count, ncclFloat32, nccl_op, comm, stream));
  }
  DT_CUDA_CHECK(cudaEventRecord(slot.done.get(), stream));
  slot.ticket = id;
  ++next_ticket_;
  return {id};
}

void NcclCommunicator::finish_all_reduce(ReduceTicket ticket) {
  DT_ENFORCE(ticket.id != 0 && ticket.id < next_ticket_,
             "finish of all-reduce {}, which was never started", ticket.id);
  Slot& slot = slots_[ticket.id % kEventPairs];
  DT_ENFORCE(slot.ticket == ticket.id, "all-reduce {} finished twice", ticket.id);
  DT_CUDA_CHECK(cudaStreamWaitEvent(compute_, slot.done.get(), 0));
  slot.ticket = 0;
  throw_if_failed();  // cheap: reads a flag NCCL's proxy thread sets
}

ncclComm_t NcclCommunicator::live_comm() const {
  if (!comm_.get()) {
    throw common::IoError(
        fmt::format("NCCL communicator of rank {} was aborted: {}", rank(), abort_message_));
  }
  return comm_.get();
}

void NcclCommunicator::throw_if_failed() const {
  ncclComm_t comm = live_comm();
  ncclResult_t async_error = ncclSuccess;
  DT_NCCL_CHECK(ncclCommGetAsyncError(comm, &async_error));
  if (async_error != ncclSuccess && async_error != ncclInProgress) {
    throw common::IoError(fmt::format("NCCL communicator of rank {} of {} failed: {} ({})", rank(),
                                      size(), ncclGetErrorString(async_error),
                                      ncclGetLastError(comm)));
  }
}

bool NcclCommunicator::drained() noexcept {
  const auto deadline = std::chrono::steady_clock::now() + kDrainTime;
  for (;;) {
    ncclResult_t async_error = ncclSuccess;
    if (ncclCommGetAsyncError(comm_.get(), &async_error) != ncclSuccess ||
        async_error != ncclSuccess)
      return false;
    cudaError_t rc = cudaStreamQuery(comm_stream_.get());
    if (rc == cudaSuccess) return true;
    if (rc != cudaErrorNotReady || std::chrono::steady_clock::now() >= deadline) {
      try {
        spdlog::warn("NCCL: communication stream not idle at shutdown ({}); aborting NCCL",
                     rc == cudaErrorNotReady ? "still running" : cudaGetErrorString(rc));
      } catch (...) {
      }
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> bootstrap,
                                                     nn::Device& device) {
  return std::make_unique<NcclCommunicator>(std::move(bootstrap), device);
}

bool nccl_available() {
  return true;
}

std::string nccl_version_string() {
  int code = 0;
  if (ncclGetVersion(&code) != ncclSuccess) return "(version unknown)";
  // NCCL_VERSION(): major*10000 + minor*100 + patch since 2.9, major*1000 + minor*100 before.
  if (code >= 10000) return fmt::format("{}.{}.{}", code / 10000, code / 100 % 100, code % 100);
  return fmt::format("{}.{}.{}", code / 1000, code / 100 % 10, code % 100);
}

}  // namespace dtrain::comm
