// All-reduce bus bandwidth, in the style of nccl-tests, for N processes started by `dtrain
// launch` (scripts/bench-allreduce.sh), over one transport: the TCP ring, shared memory, or what
// communication "auto" picks. Rank 0 also measures the machine's bounds in the same run:
// single-thread memcpy bandwidth and point-to-point loopback TCP throughput. Before each timed
// all-reduce every rank writes its buffer (untimed), as a training step does. With shm the data
// lives in the communicator's window; "shm-copy" keeps it in the rank's own memory. Prints a
// table; asserts nothing.
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "common/env_vars.h"
#include "common/errors.h"
#include "common/exit_codes.h"
#include "common/logging.h"
#include "common/tf_config.h"
#include "worker/comm/comm_factory.h"
#include "worker/comm/shm/shm_communicator.h"
#include "worker/comm/tcp/tcp_socket.h"

namespace {
using namespace dtrain;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double memcpy_gbps() {
  std::vector<char> a(64 << 20, 1), b(64 << 20, 2);
  double best = 1e9;
  for (int i = 0; i < 5; ++i) {
    auto t = Clock::now();
    std::memcpy(b.data(), a.data(), a.size());
    best = std::min(best, seconds_since(t));
  }
  return static_cast<double>(a.size()) / best / 1e9 + 0 * b[7];
}

// One thread streams 2 GiB over a loopback TCP connection to another, with the ring's socket
// settings: the point-to-point ceiling every ring step runs against.
double p2p_tcp_gbps() {
  common::UniqueFd listener = comm::listen_on("127.0.0.1", 0);
  sockaddr_in addr{};
  socklen_t length = sizeof addr;
  ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &length);
  std::string error;
  constexpr size_t kTotal = size_t{2} << 30, kChunk = 4 << 20;
  std::thread sender([&] {
    common::UniqueFd out = comm::connect_once("127.0.0.1", ntohs(addr.sin_port), 5, error);
    int flags = 0;
    ::fcntl(out.get(), F_SETFL, flags);  // blocking writes for the stream
    std::vector<char> chunk(kChunk, 'x');
    for (size_t sent = 0; sent < kTotal;) {
      ssize_t n = ::send(out.get(), chunk.data(), std::min(kChunk, kTotal - sent), MSG_NOSIGNAL);
      if (n <= 0) return;
      sent += static_cast<size_t>(n);
    }
  });
  int in_fd = -1;
  while ((in_fd = ::accept(listener.get(), nullptr, nullptr)) < 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  common::UniqueFd in(in_fd);
  comm::tune_socket(in.get());
  ::fcntl(in.get(), F_SETFL, 0);
  std::vector<char> buffer(kChunk);
  auto t = Clock::now();
  size_t got = 0;
  while (got < kTotal) {
    ssize_t n = ::recv(in.get(), buffer.data(), buffer.size(), 0);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  double gbps = static_cast<double>(got) / seconds_since(t) / 1e9;
  sender.join();
  return gbps;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int run(int argc, char** argv) {
  std::string out_path = argc > 1 ? argv[1] : "/dev/stdout";
  size_t max_bytes = argc > 2 ? std::stoul(argv[2]) : size_t{64} << 20;
  std::string transport = argc > 3 ? argv[3] : "tcp";
  common::TfConfig tf = common::parse_tf_config(common::get_env(common::kEnvTfConfig).value_or(""));
  common::setup_logging(common::role_name(tf.task.type, tf.task.index));
  comm::RingIdentity id = comm::ring_identity_from_environment(tf, "dtrain");
  std::unique_ptr<comm::Communicator> c = comm::make_communicator(id, {});
  std::string used = "tcp";
  if (transport != "tcp" && c->size() > 1) {
    std::string why;
    comm::ShmOptions options;
    // Data kept in the window is summed straight from the peers' windows; "shm-copy" measures
    // data in the caller's own memory, which goes through the slots.
    if (transport != "shm-copy") options.window_bytes = max_bytes;
    if (auto shm = comm::ShmCommunicator::create(*c, id, options, &why)) {
      c = std::move(shm);
      used = transport == "shm-copy" ? "shm-copy" : "shm";
    } else if (transport == "shm" || transport == "shm-copy") {
      throw common::ConfigError("--transport shm: shared memory cannot be set up: " + why);
    }
  }
  std::string table;
  if (c->rank() == 0) {
    table += fmt::format("# bounds (same run): memcpy_GBps {:.2f}  p2p_tcp_GBps {:.2f}\n",
                         memcpy_gbps(), p2p_tcp_gbps());
    table += fmt::format(
        "# transport {} (asked: {}), {} ranks, float32 sum, time = median over "
        "iterations, each on a freshly written buffer\n",
        used, transport, c->size());
    table += "size_bytes time_us algbw_GBps busbw_GBps\n";
  }
  c->barrier();
  for (size_t bytes = 4096; bytes <= max_bytes; bytes *= 2) {
    const size_t count = bytes / sizeof(float);
    std::vector<float> own(c->window().empty() ? count : 0);
    float* data = own.empty() ? c->window().data : own.data();
    std::fill(data, data + count, 1.0f);
    int iterations = static_cast<int>(std::clamp<size_t>((size_t{256} << 20) / bytes, 5, 200));
    for (int w = 0; w < 3; ++w) c->all_reduce(data, count, comm::ReduceOp::kSum);
    c->barrier();
    std::vector<double> times;
    for (int i = 0; i < iterations; ++i) {
      // Untimed: every rank writes its buffer first, as backward writes the gradients, so no
      // transport is timed on data a previous all-reduce left in a cache.
      std::fill(data, data + count, 1.0f);
      c->barrier();
      auto t = Clock::now();
      c->all_reduce(data, count, comm::ReduceOp::kSum);
      times.push_back(seconds_since(t));
    }
    double t = median(times);
    double algbw = static_cast<double>(bytes) / t / 1e9;
    double busbw = algbw * 2.0 * (c->size() - 1) / c->size();
    table += fmt::format("{} {:.1f} {:.3f} {:.3f}\n", bytes, t * 1e6, algbw, busbw);
  }
  if (c->rank() == 0) std::ofstream(out_path) << table;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return common::run_main("allreduce_bench", [&] { return run(argc, argv); });
}
