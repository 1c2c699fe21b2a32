// The NCCL communicator in a world of one (NCCL allows one rank per GPU, so a one-GPU machine can
// host no other): device all-reduces started and finished in order, after earlier work on the
// compute stream, inside a captured CUDA graph; host collectives go to the bootstrap; ticket
// misuse and use after abort are caught. Without a GPU the device tests say "no GPU" and check
// nothing; the version and the host-device refusal are checked everywhere.
#include <cuda_runtime.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <vector>

#include "common/errors.h"
#include "worker/comm/nccl/nccl_communicator.h"
#include "worker/comm/ring_communicator.h"
#include "worker/gpu/gpu_info.h"
#include "worker/mem/device.h"

using namespace dtrain;
using comm::ReduceOp;
using comm::ReduceTicket;

namespace {

bool have_gpu() {
  static const gpu::GpuInfo info = gpu::probe_gpu();
  if (info.device_count == 0) WARN("no GPU, NCCL tests skipped: " << gpu::describe(info));
  return info.device_count > 0;
}

/// A CUDA device and an NCCL communicator of one rank bootstrapped over a SoloCommunicator.
struct WorldOfOne {
  std::unique_ptr<nn::Device> device = nn::make_cuda_device();
  std::unique_ptr<comm::Communicator> comm =
      comm::make_nccl_communicator(std::make_unique<comm::SoloCommunicator>(), *device);
};

/// How many elements differ (CHECK(a == b) on vectors of millions would print them all).
size_t mismatches(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return std::max(got.size(), want.size());
  size_t count = 0;
  for (size_t i = 0; i < got.size(); ++i) count += got[i] != want[i];
  return count;
}

/// Distinct values, exact in float, different for every start.
std::vector<float> ramp(size_t n, float start) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + 0.25f * static_cast<float>(i % 100000);
  return v;
}

}  // namespace

TEST_CASE("NCCL: the build reports NCCL and its version") {
  CHECK(comm::nccl_available());
  CHECK(comm::nccl_version_string().rfind("2.", 0) == 0);
}

TEST_CASE("NCCL: a model on the host device is a ConfigError") {
  auto host = nn::make_host_device();
  CHECK_THROWS_AS(comm::make_nccl_communicator(std::make_unique<comm::SoloCommunicator>(), *host),
                  common::ConfigError);
}

TEST_CASE("NCCL: in a world of one, sum and mean leave a device buffer as it is") {
  if (!have_gpu()) return;
  WorldOfOne w;
  CHECK(w.comm->rank() == 0);
  CHECK(w.comm->size() == 1);
  std::vector<float> want = ramp(1001, -3.0f);
  nn::Buffer<float> data(*w.device, want.size());
  data.from_host(want);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
    ReduceTicket ticket = w.comm->start_all_reduce(data.data(), data.size(), op);
    w.comm->finish_all_reduce(ticket);
    CHECK(mismatches(data.to_host(), want) == 0);
  }
}

TEST_CASE("NCCL: several buckets started, then finished in order") {
  if (!have_gpu()) return;
  WorldOfOne w;
  const std::vector<size_t> buckets = {1, 4097, 0, 100000, 3};
  size_t total = 0;
  for (size_t b : buckets) total += b;
  std::vector<float> want = ramp(total, 7.5f);
  nn::Buffer<float> data(*w.device, total);
  data.from_host(want);
  std::vector<ReduceTicket> tickets;
  size_t offset = 0;
  for (size_t b : buckets) {
    ReduceOp op = tickets.size() % 2 ? ReduceOp::kMean : ReduceOp::kSum;
    tickets.push_back(w.comm->start_all_reduce(data.data() + offset, b, op));
    offset += b;
    if (tickets.size() > 1) CHECK(tickets.back().id > tickets[tickets.size() - 2].id);
  }
  for (ReduceTicket ticket : tickets) w.comm->finish_all_reduce(ticket);
  CHECK(mismatches(data.to_host(), want) == 0);
}

TEST_CASE("NCCL: a start sees the work enqueued before it, a finish orders the work after it") {
  if (!have_gpu()) return;
  WorldOfOne w;
  const size_t n = size_t(1) << 22;  // 16 MiB: an upload that takes a while
  nn::PinnedBuffer<float> pinned(*w.device, n);
  nn::Buffer<float> data(*w.device, n), out(*w.device, n);
  for (int round = 0; round < 3; ++round) {
    std::vector<float> want = ramp(n, 1000.0f * static_cast<float>(round));
    std::memcpy(pinned.data(), want.data(), n * sizeof(float));
    w.device->upload(data.data(), pinned.data(), n * sizeof(float));
    ReduceTicket ticket = w.comm->start_all_reduce(data.data(), n, ReduceOp::kMean);
    w.comm->finish_all_reduce(ticket);
    w.device->copy(out.data(), data.data(), n * sizeof(float));
    CHECK(mismatches(out.to_host(), want) == 0);  // waits for the compute stream, then copies
  }
}

TEST_CASE("NCCL: start and finish captured into a CUDA graph, launched twice") {
  if (!have_gpu()) return;
  WorldOfOne w;
  const size_t n = 4099, half = n / 2, bytes = n * sizeof(float);
  nn::Buffer<float> source(*w.device, n), data(*w.device, n), out(*w.device, n);
  ReduceTicket warm = w.comm->start_all_reduce(data.data(), n, ReduceOp::kSum);
  w.comm->finish_all_reduce(warm);
  w.device->synchronize();

  auto stream = static_cast<cudaStream_t>(w.device->native_stream());
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  w.device->copy(data.data(), source.data(), bytes);
  ReduceTicket first = w.comm->start_all_reduce(data.data(), half, ReduceOp::kSum);
  ReduceTicket second = w.comm->start_all_reduce(data.data() + half, n - half, ReduceOp::kMean);
  w.comm->finish_all_reduce(first);
  w.comm->finish_all_reduce(second);
  w.device->copy(out.data(), data.data(), bytes);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);

  for (int launch = 0; launch < 2; ++launch) {
    std::vector<float> want = ramp(n, -500.0f + 100.0f * static_cast<float>(launch));
    source.from_host(want);  // waits until copied
    REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
    CHECK(mismatches(out.to_host(), want) == 0);
  }
  // Eager all-reduces still work after the capture.
  std::vector<float> want = ramp(n, 42.0f);
  data.from_host(want);
  w.comm->finish_all_reduce(w.comm->start_all_reduce(data.data(), n, ReduceOp::kSum));
  CHECK(mismatches(data.to_host(), want) == 0);
  CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
  CHECK(cudaGraphDestroy(graph) == cudaSuccess);
}

TEST_CASE("NCCL: host-memory collectives are the bootstrap's") {
  if (!have_gpu()) return;
  WorldOfOne w;
  std::vector<float> host = {1.5f, -2.0f, 3.25f};
  w.comm->all_reduce(host.data(), host.size(), ReduceOp::kMean);
  CHECK(host == std::vector<float>{1.5f, -2.0f, 3.25f});
  uint64_t step = 1234;
  w.comm->broadcast(&step, sizeof step, 0);
  CHECK(step == 1234);
  // SoloCommunicator refuses a root other than 0: proof that the call reached it.
  CHECK_THROWS_AS(w.comm->broadcast(&step, sizeof step, 1), common::EnforceError);
  std::vector<uint8_t> gathered = w.comm->all_gather(&step, sizeof step);
  REQUIRE(gathered.size() == sizeof step);
  CHECK(std::memcmp(gathered.data(), &step, sizeof step) == 0);
  w.comm->barrier();
}

TEST_CASE("NCCL: ticket misuse is an EnforceError") {
  if (!have_gpu()) return;
  WorldOfOne w;
  nn::Buffer<float> data(*w.device, 64);
  CHECK_THROWS_AS(w.comm->finish_all_reduce(ReduceTicket{999}), common::EnforceError);
  CHECK_THROWS_AS(w.comm->start_all_reduce(nullptr, 4, ReduceOp::kSum), common::EnforceError);
  ReduceTicket once = w.comm->start_all_reduce(data.data(), 64, ReduceOp::kSum);
  w.comm->finish_all_reduce(once);
  CHECK_THROWS_AS(w.comm->finish_all_reduce(once), common::EnforceError);

  std::vector<ReduceTicket> outstanding;
  for (int i = 0; i < 64; ++i)
    outstanding.push_back(w.comm->start_all_reduce(data.data() + i, 1, ReduceOp::kSum));
  CHECK_THROWS_AS(w.comm->start_all_reduce(data.data(), 1, ReduceOp::kSum), common::EnforceError);
  for (ReduceTicket ticket : outstanding) w.comm->finish_all_reduce(ticket);
  w.comm->finish_all_reduce(w.comm->start_all_reduce(data.data(), 64, ReduceOp::kSum));
  w.device->synchronize();
}

TEST_CASE("NCCL: after abort every collective is an IoError naming the abort") {
  if (!have_gpu()) return;
  WorldOfOne w;
  nn::Buffer<float> data(*w.device, 8);
  w.comm->abort("rank 3 lost its disk");
  w.comm->abort("twice is harmless");
  CHECK_THROWS_WITH(w.comm->start_all_reduce(data.data(), 8, ReduceOp::kSum),
                    Catch::Contains("aborted") && Catch::Contains("rank 3 lost its disk"));
  CHECK_THROWS_AS(w.comm->barrier(), common::IoError);
}
