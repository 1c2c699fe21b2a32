// A worker for collective tests over the real TCP ring: reads TF_CONFIG, DTRAIN_TOKEN,
// DTRAIN_JOB and DTRAIN_ATTEMPT like dtrain-worker, then runs all-reduce, broadcast, barrier and
// all-gather for some iterations and checks every result. It can die, abort, or (--intruder)
// only try the client handshake, as a stray or misconfigured worker would. Prints one
// "iteration K checksum=X" line per iteration (equal on every rank when results are bit-identical).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/env_vars.h"
#include "common/errors.h"
#include "common/exit_codes.h"
#include "common/logging.h"
#include "common/tf_config.h"
#include "worker/comm/comm_factory.h"
#include "worker/comm/tcp/tcp_ring_link.h"

namespace {
using namespace dtrain;

struct Flags {
  int iterations = 3;
  size_t count = 100003;
  int die_rank = -1, die_iteration = -1;
  int abort_rank = -1, abort_iteration = -1;
  int pause_ms = 0;
  bool intruder = false;
  comm::CommOptions options;
};

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    double v = std::atof(argv[i + 1]);
    if (a == "--iterations")
      f.iterations = static_cast<int>(v);
    else if (a == "--count")
      f.count = static_cast<size_t>(v);
    else if (a == "--die")
      f.die_rank = static_cast<int>(v),
      f.die_iteration = std::atoi(argv[i + 1] + std::strcspn(argv[i + 1], ":") + 1);
    else if (a == "--abort")
      f.abort_rank = static_cast<int>(v),
      f.abort_iteration = std::atoi(argv[i + 1] + std::strcspn(argv[i + 1], ":") + 1);
    else if (a == "--pause-ms")
      f.pause_ms = static_cast<int>(v);
    else if (a == "--intruder")
      f.intruder = v != 0;
    else if (a == "--rendezvous-seconds")
      f.options.rendezvous_seconds = v;
    else if (a == "--handshake-seconds")
      f.options.handshake_seconds = v;
    else
      throw common::ConfigError("comm_worker: unknown flag " + a);
  }
  return f;
}

float value(int rank, size_t i, int iteration) {
  uint32_t x =
      static_cast<uint32_t>(rank * 7919 + i * 104729 + static_cast<size_t>(iteration) * 31);
  x ^= x >> 13;
  x *= 0x5bd1e995u;
  x ^= x >> 15;
  float unit = static_cast<float>(x % 2000001) / 1000000.0f - 1.0f;  // [-1, 1]
  return unit * std::pow(10.0f, static_cast<float>(static_cast<int>(x % 7) - 3));
}

uint64_t checksum(const void* data, size_t bytes) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < bytes; ++i)
    h = (h ^ static_cast<const unsigned char*>(data)[i]) * 1099511628211ULL;
  return h;
}

void check(bool ok, const std::string& what) {
  if (!ok) throw common::EnforceError("wrong result: " + what);
}

void one_iteration(comm::Communicator& c, const Flags& f, int it) {
  std::vector<float> data(f.count);
  for (size_t i = 0; i < f.count; ++i) data[i] = value(c.rank(), i, it);
  c.all_reduce(data.data(), data.size(), comm::ReduceOp::kSum);
  for (size_t i = 0; i < f.count; i += 97) {
    double expected = 0, magnitude = 0;
    for (int r = 0; r < c.size(); ++r)
      expected += value(r, i, it), magnitude += std::fabs(value(r, i, it));
    check(std::fabs(data[i] - expected) <= 4 * c.size() * 1.2e-7 * magnitude + 1e-30, "all_reduce");
  }
  std::vector<char> block(4099, static_cast<char>(c.rank() == it % c.size() ? 'a' + it % 26 : 0));
  c.broadcast(block.data(), block.size(), it % c.size());
  check(block[4098] == 'a' + it % 26, "broadcast");
  c.barrier();
  int32_t mine = c.rank() * 10 + it;
  std::vector<uint8_t> all = c.all_gather(&mine, sizeof mine);
  for (int r = 0; r < c.size(); ++r) {
    int32_t got;
    std::memcpy(&got, all.data() + r * sizeof got, sizeof got);
    check(got == r * 10 + it, "all_gather");
  }
  std::printf("iteration %d checksum=%016llx\n", it,
              static_cast<unsigned long long>(checksum(data.data(), data.size() * 4)));
  std::fflush(stdout);
}

int run(int argc, char** argv) {
  Flags f = parse(argc, argv);
  common::TfConfig tf = common::parse_tf_config(common::get_env(common::kEnvTfConfig).value_or(""));
  common::setup_logging(common::role_name(tf.task.type, tf.task.index));
  comm::RingIdentity id = comm::ring_identity_from_environment(tf, "dtrain");
  if (f.intruder) {  // only the client handshake, then report how it went
    comm::connect_to_next(id, f.options, comm::Deadline(f.options.rendezvous_seconds, "intrusion"));
    std::printf("intruder was accepted\n");
    return 0;
  }
  std::unique_ptr<comm::Communicator> c = comm::make_communicator(id, f.options);
  for (int it = 0; it < f.iterations; ++it) {
    if (c->rank() == f.die_rank && it == f.die_iteration) ::raise(SIGKILL);
    if (c->rank() == f.abort_rank && it == f.abort_iteration) {
      c->abort("injected failure");
      return 1;
    }
    try {
      one_iteration(*c, f, it);
    } catch (const common::IoError& e) {
      std::fprintf(stderr, "comm error: %s\n", e.what());
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(f.pause_ms));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return dtrain::common::run_main("comm_worker", [&] { return run(argc, argv); });
}
