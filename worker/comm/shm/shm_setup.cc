// ShmCommunicator::create: the one place the bootstrap communicator is used. Three steps, each
// closed by an all-gather of ok flags so every rank returns the same answer: (1) host identities
// and pids; (2) rank 0 makes the memfd and listens, peers connect; (3) rank 0 hands the
// descriptor out, peers map it. Failures become nullptr, never exceptions (bootstrap's aside).
#include <fmt/format.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <optional>

#include "common/errors.h"
#include "worker/comm/shm/shm_communicator.h"
#include "worker/comm/shm/shm_handoff.h"

namespace dtrain::comm {
namespace {

struct HostRecord {
  char host[248];  ///< boot id and host name, NUL-terminated
  int64_t pid;
};

HostRecord this_host(const ShmOptions& options) {
  std::string host = options.host_identity_override;
  if (host.empty()) {
    std::ifstream boot("/proc/sys/kernel/random/boot_id");
    std::string boot_id;
    std::getline(boot, boot_id);
    char name[128] = {};
    ::gethostname(name, sizeof name - 1);
    host = boot_id + "/" + name;
  }
  HostRecord record{};
  std::strncpy(record.host, host.c_str(), sizeof record.host - 1);
  record.pid = ::getpid();
  return record;
}

// Every rank's ok; true when all are. Otherwise *why_not names the first rank that failed
// (with this rank's own reason when it is this one).
bool all_ok(Communicator& bootstrap, const RingIdentity& id, bool ok, const std::string& reason,
            const char* step, std::string* why_not) {
  const uint8_t mine = ok ? 1 : 0;
  const std::vector<uint8_t> all = bootstrap.all_gather(&mine, 1);
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r] == 1) continue;
    if (why_not != nullptr) {
      *why_not = static_cast<int>(r) == id.rank
                     ? reason
                     : fmt::format("{} could not {}", id.describe(static_cast<int>(r)), step);
    }
    return false;
  }
  return true;
}

// Runs step, turning any exception into false and its message into reason.
template <typename Step>
bool attempt(std::string& reason, Step step) {
  try {
    step();
    return true;
  } catch (const std::exception& e) {
    reason = e.what();
    return false;
  }
}

}  // namespace

std::unique_ptr<ShmCommunicator> ShmCommunicator::create(Communicator& bootstrap,
                                                         const RingIdentity& id,
                                                         const ShmOptions& options,
                                                         std::string* why_not) {
  DT_ENFORCE(bootstrap.size() == id.size && bootstrap.rank() == id.rank,
             "bootstrap is rank {} of {}, identity rank {} of {}", bootstrap.rank(),
             bootstrap.size(), id.rank, id.size);
  const HostRecord mine = this_host(options);
  const std::vector<uint8_t> gathered = bootstrap.all_gather(&mine, sizeof mine);
  std::vector<pid_t> pids;
  std::vector<std::string> hosts;
  for (int r = 0; r < id.size; ++r) {
    HostRecord record;
    std::memcpy(&record, gathered.data() + size_t(r) * sizeof record, sizeof record);
    pids.push_back(static_cast<pid_t>(record.pid));
    hosts.emplace_back(record.host, strnlen(record.host, sizeof record.host));
  }
  for (int r = 1; r < id.size; ++r) {
    if (hosts[size_t(r)] == hosts[0]) continue;
    if (why_not != nullptr) {
      *why_not = fmt::format("{} runs on another host than {}", id.describe(r), id.describe(0));
    }
    return nullptr;
  }
  const ShmLayout layout = ShmLayout::for_world(id.size, options.slot_bytes, options.window_bytes);
  const std::string name = shm_socket_name(id, pids[0]);
  std::string reason;
  common::UniqueFd segment_fd;
  std::optional<MappedSegment> segment;
  std::optional<FdServer> server;
  bool ok = attempt(reason, [&] {
    if (id.rank != 0) return;
    segment_fd = create_segment_fd(layout.segment_bytes);
    segment.emplace(segment_fd.get(), layout);
    segment->init_header();
    server.emplace(name, id.size - 1);
  });
  if (!all_ok(bootstrap, id, ok, reason, "create the segment", why_not)) return nullptr;

  common::UniqueFd connection;
  ok = attempt(reason, [&] {
    if (id.rank != 0) connection = connect_to_fd_server(name, id.rank);
  });
  if (!all_ok(bootstrap, id, ok, reason, "reach rank 0's socket", why_not)) return nullptr;

  ok = attempt(reason, [&] {
    if (id.rank == 0) {
      server->hand_out(segment_fd.get(), pids, id, options.setup_seconds);
      return;
    }
    segment_fd = receive_segment_fd(connection.get(), pids[0], options.setup_seconds);
    segment.emplace(segment_fd.get(), layout);
    segment->check_header();
  });
  server.reset();  // the abstract name is gone from here on
  if (!all_ok(bootstrap, id, ok, reason, "map the segment", why_not)) return nullptr;
  return std::unique_ptr<ShmCommunicator>(
      new ShmCommunicator(id, options, std::move(*segment), pids));
}

}  // namespace dtrain::comm
