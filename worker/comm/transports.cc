// The transport table (transports.h): NCCL, shared memory and the TCP ring, each a usable() and a
// make() over the transport's own library (nccl/, shm/, tcp/). Choosing and wrapping is
// comm_factory.cc's.
#include "worker/comm/transports.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstring>
#include <set>

#include "worker/comm/comm_factory.h"
#include "worker/comm/nccl/nccl_communicator.h"
#include "worker/comm/shm/shm_communicator.h"

namespace dtrain::comm {

Communicator& TransportContext::bootstrap() {
  if (!bootstrap_) bootstrap_ = make_communicator(id, options);
  return *bootstrap_;
}

std::unique_ptr<Communicator> TransportContext::take_bootstrap() {
  bootstrap();
  return std::move(bootstrap_);
}

namespace {

// True when two ranks train on the same GPU (same host name and PCI bus id): NCCL refuses that.
bool ranks_share_a_gpu(Communicator& ring, const nn::Device& device) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string where = std::string(host) + "/" + device.location();
  char mine[320] = {};
  std::strncpy(mine, where.c_str(), sizeof mine - 1);
  std::vector<uint8_t> all = ring.all_gather(mine, sizeof mine);
  std::set<std::string> places;
  for (size_t r = 0; r < all.size() / sizeof mine; ++r) {
    places.insert(std::string(reinterpret_cast<const char*>(all.data() + r * sizeof mine)));
  }
  return places.size() < all.size() / sizeof mine;
}

// A CPU worker is refused before any rendezvous; "auto" asks its peers whether GPUs are shared.
bool nccl_usable(TransportContext& ctx, std::string* why_not) {
  if (ctx.device.kind() != nn::DeviceKind::kCuda) {
    *why_not = nccl_available() ? "this worker trains on the CPU (train.device)"
                                : "this dtrain-worker is a CPU-only build, without NCCL";
    return false;
  }
  if (ctx.choice == Communication::kAuto && ctx.id.size > 1 &&
      ranks_share_a_gpu(ctx.bootstrap(), ctx.device)) {
    *why_not = fmt::format("workers share GPU {}, and NCCL refuses two ranks on one GPU",
                           ctx.device.location());
    return false;
  }
  return true;
}

std::unique_ptr<Communicator> make_nccl(TransportContext& ctx, std::string*) {
  spdlog::info("communication: NCCL {} ({} rank(s))", nccl_version_string(), ctx.id.size);
  return make_nccl_communicator(ctx.take_bootstrap(), ctx.device);
}

// Whether every rank is on this host is itself a collective, so make() finds out.
bool always_usable(TransportContext&, std::string*) {
  return true;
}

// A CPU trainer keeps its gradients in the window (Trainer), where peers sum them in place; a GPU
// worker stages through the slots. The ring is closed once the segment is set up.
std::unique_ptr<Communicator> make_shm(TransportContext& ctx, std::string* why_not) {
  ShmOptions options;
  options.window_bytes = ctx.device.kind() == nn::DeviceKind::kHost ? kTrainingWindowBytes : 0;
  return ShmCommunicator::create(ctx.bootstrap(), ctx.id, options, why_not);
}

std::unique_ptr<Communicator> make_ring(TransportContext& ctx, std::string*) {
  return ctx.take_bootstrap();
}

}  // namespace

const std::vector<Transport>& transports() {
  static const std::vector<Transport> table = {
      {Communication::kNccl, "NCCL", /*on_device=*/true, nccl_usable, make_nccl},
      {Communication::kShm, "shared memory", /*on_device=*/false, always_usable, make_shm},
      {Communication::kRing, "TCP ring", /*on_device=*/false, always_usable, make_ring},
  };
  return table;
}

}  // namespace dtrain::comm
