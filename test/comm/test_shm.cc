// The shared-memory communicator: ranks as threads of this process (bit-identical all-reduce
// against a rank-order reference for 1-8 ranks, pieces larger than a slot, data in the windows
// and ranks that disagree about it, broadcast, all-gather,
// barrier, abort, time-out, and the set-up falling back to nullptr on every rank), and ranks as
// forked processes (a SIGKILLed rank is named by every survivor; nothing is left behind).
// Speeds are printed, never asserted.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/errors.h"
#include "worker/comm/shm/shm_communicator.h"
#include "worker/comm/shm/shm_handoff.h"

using namespace dtrain::comm;
using dtrain::common::IoError;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kTimeoutSeconds = 30;

// The collectives a bootstrap needs beyond all_gather, written on top of it (small data only).
class GatherOnly : public Communicator {
 public:
  void all_reduce(float* data, size_t count, ReduceOp op) override {
    std::vector<uint8_t> all = all_gather(data, count * sizeof(float));
    std::vector<float> sum(count, 0.0f);
    for (int r = 0; r < size(); ++r)
      for (size_t i = 0; i < count; ++i)
        sum[i] += reinterpret_cast<const float*>(all.data())[size_t(r) * count + i];
    for (size_t i = 0; i < count; ++i)
      data[i] = op == ReduceOp::kMean ? sum[i] / static_cast<float>(size()) : sum[i];
  }
  void broadcast(void* data, size_t bytes, int root) override {
    std::vector<uint8_t> all = all_gather(data, bytes);
    std::memcpy(data, all.data() + size_t(root) * bytes, bytes);
  }
  void barrier() override {
    const uint8_t token = 1;
    all_gather(&token, 1);
  }
  void abort(const std::string&) noexcept override {}
  void interrupt(const std::string&) noexcept override {}
};

// Ranks as threads: round k of rank r lands in rounds_[k][r]; the last reader drops the round.
struct GatherHub {
  explicit GatherHub(int n) : size(n) {}
  std::vector<uint8_t> gather(int rank, uint64_t round, const void* mine, size_t bytes) {
    std::unique_lock<std::mutex> lock(mutex);
    auto& entry = rounds[round];
    entry.parts.resize(size_t(size));
    entry.parts[size_t(rank)].assign(static_cast<const uint8_t*>(mine),
                                     static_cast<const uint8_t*>(mine) + bytes);
    ++entry.arrived;
    changed.notify_all();
    if (!changed.wait_for(lock, std::chrono::seconds(kTimeoutSeconds),
                          [&] { return entry.arrived == size; }))
      throw IoError("test bootstrap: timed out waiting for an all-gather");
    std::vector<uint8_t> result;
    for (const auto& part : entry.parts) result.insert(result.end(), part.begin(), part.end());
    if (++entry.departed == size) rounds.erase(round);
    return result;
  }
  struct Round {
    std::vector<std::vector<uint8_t>> parts;
    int arrived = 0;
    int departed = 0;
  };
  const int size;
  std::mutex mutex;
  std::condition_variable changed;
  std::map<uint64_t, Round> rounds;
};

class ThreadBootstrap final : public GatherOnly {
 public:
  ThreadBootstrap(GatherHub& hub, int rank) : hub_(hub), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return hub_.size; }
  std::vector<uint8_t> all_gather(const void* mine, size_t bytes) override {
    return hub_.gather(rank_, round_++, mine, bytes);
  }

 private:
  GatherHub& hub_;
  int rank_;
  uint64_t round_ = 0;
};

// Ranks as processes: one connected socket per pair of ranks (made before fork).
class MeshBootstrap final : public GatherOnly {
 public:
  MeshBootstrap(std::vector<int> peers, int rank) : peers_(std::move(peers)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(peers_.size()); }
  std::vector<uint8_t> all_gather(const void* mine, size_t bytes) override {
    std::vector<uint8_t> result(bytes * peers_.size());
    std::memcpy(result.data() + size_t(rank_) * bytes, mine, bytes);
    for (int fd : peers_)
      if (fd >= 0 && ::write(fd, mine, bytes) != static_cast<ssize_t>(bytes))
        throw IoError("test bootstrap: write failed");
    for (size_t r = 0; r < peers_.size(); ++r) {
      if (peers_[r] < 0) continue;
      pollfd entry{peers_[r], POLLIN, 0};
      if (::poll(&entry, 1, kTimeoutSeconds * 1000) != 1 ||
          ::recv(peers_[r], result.data() + r * bytes, bytes, MSG_WAITALL) !=
              static_cast<ssize_t>(bytes))
        throw IoError("test bootstrap: read failed");
    }
    return result;
  }

 private:
  std::vector<int> peers_;
  int rank_;
};

RingIdentity identity(int rank, int size, const std::string& job) {
  RingIdentity id;
  id.job = job;
  id.rank = rank;
  id.size = size;
  id.token = "0123abcd";
  for (int r = 0; r < size; ++r) id.names.push_back("worker:" + std::to_string(r));
  return id;
}

// Runs body(rank, bootstrap) on one thread per rank; rethrows the first error.
template <typename Body>
void run_ranks(int size, Body body) {
  GatherHub hub(size);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        ThreadBootstrap bootstrap(hub, rank);
        body(rank, bootstrap);
      } catch (...) {
        errors[size_t(rank)] = std::current_exception();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const std::exception_ptr& error : errors)
    if (error) std::rethrow_exception(error);
}

std::unique_ptr<ShmCommunicator> make(Communicator& bootstrap, int rank, int size,
                                      const ShmOptions& options = {}) {
  std::string why;
  auto comm = ShmCommunicator::create(bootstrap, identity(rank, size, "shmtest"), options, &why);
  if (!comm) throw std::runtime_error("no shared memory: " + why);
  return comm;
}

// Rank r's input: magnitudes from 1e-3 to 1e3, so the order of additions changes the bits.
std::vector<float> input(int rank, size_t count) {
  std::vector<float> x(count);
  uint32_t state = 2654435761u * uint32_t(rank + 1);
  const float scales[] = {1e-3f, 1.0f, 1e3f};
  for (size_t i = 0; i < count; ++i) {
    state = state * 1664525u + 1013904223u;
    x[i] = (static_cast<float>(state >> 8) / 16777216.0f - 0.5f) * scales[(state >> 3) % 3];
  }
  return x;
}

// ((x_0 + x_1) + x_2) + ..., then / size for kMean: the order the communicator documents.
std::vector<float> reference(int size, size_t count, ReduceOp op, bool reverse = false) {
  std::vector<float> sum = input(reverse ? size - 1 : 0, count);
  for (int k = 1; k < size; ++k) {
    std::vector<float> x = input(reverse ? size - 1 - k : k, count);
    for (size_t i = 0; i < count; ++i) sum[i] += x[i];
  }
  if (op == ReduceOp::kMean)
    for (float& v : sum) v /= static_cast<float>(size);
  return sum;
}

// Catch2 v2 assertions are not thread-safe: rank threads call this, and run_ranks rethrows.
void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("expectation failed: " + what);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

std::set<std::string> dev_shm() {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm"))
    names.insert(entry.path().filename().string());
  return names;
}

// Abstract UNIX sockets with our prefix that exist now (in this network namespace).
int our_abstract_sockets() {
  std::ifstream table("/proc/net/unix");
  int found = 0;
  for (std::string line; std::getline(table, line);)
    if (line.find("@dtrain-shm-") != std::string::npos) ++found;
  return found;
}

}  // namespace

TEST_CASE("shm all-reduce of 1 to 8 ranks is bit-identical to the rank-order reference") {
  const size_t over_a_slot = (size_t{4} << 20) / sizeof(float) * 2 + 5;  // three pieces
  const std::vector<size_t> lengths = {0, 1, 7, 1000003, over_a_slot};
  for (int size = 1; size <= 8; ++size) {
    std::map<std::pair<size_t, int>, std::vector<std::vector<float>>> results;
    std::mutex mutex;
    run_ranks(size, [&](int rank, Communicator& bootstrap) {
      auto comm = make(bootstrap, rank, size);
      for (size_t count : lengths) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
          std::vector<float> data = input(rank, count);
          comm->all_reduce(data.data(), count, op);
          std::lock_guard<std::mutex> lock(mutex);
          results[{count, int(op)}].push_back(std::move(data));
        }
      }
    });
    for (auto& [key, per_rank] : results) {
      INFO(size << " ranks, " << key.first << " floats, op " << key.second);
      const std::vector<float> expected = reference(size, key.first, ReduceOp(key.second));
      REQUIRE(per_rank.size() == size_t(size));
      for (const auto& got : per_rank) CHECK(same_bits(got, expected));
    }
  }
  // The oracle is sensitive to the order: summing backwards gives other bits.
  CHECK_FALSE(same_bits(reference(5, 1000003, ReduceOp::kSum),
                        reference(5, 1000003, ReduceOp::kSum, /*reverse=*/true)));
}

TEST_CASE("shm all-reduce in many pieces of a small slot gives the same bits") {
  ShmOptions options;
  options.slot_bytes = 4096;  // 1024 floats: 98 pieces
  for (int size : {2, 3}) {
    run_ranks(size, [&](int rank, Communicator& bootstrap) {
      auto comm = make(bootstrap, rank, size, options);
      std::vector<float> data = input(rank, 100003);
      comm->all_reduce(data.data(), data.size(), ReduceOp::kMean);
      expect(same_bits(data, reference(size, 100003, ReduceOp::kMean)), "pieces change no bits");
    });
  }
}

TEST_CASE("shm all-reduce in the windows matches the reference, mixed with the copy path") {
  const std::vector<size_t> lengths = {1, 7, 1000003};
  ShmOptions options;
  options.window_bytes = (1000003 + 16) * sizeof(float);
  for (int size = 1; size <= 8; ++size) {
    run_ranks(size, [&](int rank, Communicator& bootstrap) {
      auto comm = make(bootstrap, rank, size, options);
      const Window window = comm->window();
      expect(window.floats >= 1000003 + 16, "the window holds what was asked");
      for (size_t count : lengths) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
          const std::string what = std::to_string(size) + " ranks, " + std::to_string(count) +
                                   " floats, op " + std::to_string(int(op));
          // At an odd offset, so chunks start anywhere; then through the slots, then again.
          float* data = window.data + 3;
          const std::vector<float> x = input(rank, count);
          std::copy(x.begin(), x.end(), data);
          comm->all_reduce(data, count, op);
          const std::vector<float> expected = reference(size, count, op);
          expect(same_bits(std::vector<float>(data, data + count), expected), "window, " + what);
          // The caller owns its window once all_reduce returns: no peer still writes into it.
          std::fill(data, data + count, -1.0f);
          std::vector<float> own = x;
          comm->all_reduce(own.data(), count, op);
          expect(same_bits(own, expected), "copy after window, " + what);
          std::copy(x.begin(), x.end(), data);
          comm->all_reduce(data, count, op);
          expect(same_bits(std::vector<float>(data, data + count), expected),
                 "window after copy, " + what);
        }
      }
    });
  }
}

TEST_CASE("ranks that all-reduce different places fail at once, naming each other") {
  ShmOptions options;
  options.window_bytes = 4096;
  auto disagree = [&](auto place) {
    std::vector<std::string> errors(2);
    run_ranks(2, [&](int rank, Communicator& bootstrap) {
      auto comm = make(bootstrap, rank, 2, options);
      std::vector<float> own(100, 1.0f);
      try {
        comm->all_reduce(place(rank, *comm, own), 100, ReduceOp::kSum);
      } catch (const IoError& e) {
        errors[size_t(rank)] = e.what();
      }
    });
    return errors;
  };
  SECTION("one in its window, one in its own memory") {
    auto errors = disagree([](int rank, Communicator& comm, std::vector<float>& own) {
      return rank == 0 ? comm.window().data : own.data();
    });
    CHECK_THAT(errors[0], Catch::Contains("worker:1 (rank 1) all-reduces 100 floats of its own "
                                          "memory in all-reduce but worker:0 (rank 0) "
                                          "all-reduces 100 floats at offset 0 of its window"));
    CHECK_THAT(errors[1], Catch::Contains("worker:0 (rank 0) all-reduces 100 floats at offset 0"));
  }
  SECTION("both in their windows, at other offsets") {
    auto errors = disagree([](int rank, Communicator& comm, std::vector<float>&) {
      return comm.window().data + rank;
    });
    CHECK_THAT(errors[0], Catch::Contains("100 floats at offset 1 of its window"));
    CHECK_THAT(errors[1], Catch::Contains("100 floats at offset 0 of its window"));
  }
}

TEST_CASE("shm broadcast from every root, all-gather and barrier") {
  ShmOptions options;
  options.slot_bytes = 4096;
  const int size = 4;
  std::atomic<int> entered[3] = {};
  run_ranks(size, [&](int rank, Communicator& bootstrap) {
    auto comm = make(bootstrap, rank, size, options);
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{13}, size_t{4096 * 3 + 3}}) {
      for (int root = 0; root < size; ++root) {
        std::vector<uint8_t> data(bytes, uint8_t(rank == root ? 0 : 0xee));
        for (size_t i = 0; i < bytes && rank == root; ++i) data[i] = uint8_t(i * 7 + root);
        comm->broadcast(data.data(), bytes, root);
        for (size_t i = 0; i < bytes; ++i) expect(data[i] == uint8_t(i * 7 + root), "broadcast");
      }
      std::vector<uint8_t> mine(bytes);
      for (size_t i = 0; i < bytes; ++i) mine[i] = uint8_t(i + 31 * rank);
      std::vector<uint8_t> all = comm->all_gather(mine.data(), bytes);
      expect(all.size() == bytes * size, "all-gather size");
      for (int r = 0; r < size; ++r)
        for (size_t i = 0; i < bytes; ++i)
          expect(all[r * bytes + i] == uint8_t(i + 31 * r), "all-gather bytes");
    }
    for (auto& counter : entered) {
      if (rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the late one
      ++counter;
      comm->barrier();
      expect(counter.load() == size, "nobody leaves the barrier early");
    }
  });
}

TEST_CASE("shm abort and time-out fail every waiting rank, naming whom") {
  SECTION("abort") {
    std::vector<std::string> errors(3);
    run_ranks(3, [&](int rank, Communicator& bootstrap) {
      auto comm = make(bootstrap, rank, 3);
      std::vector<float> data(1000, 1.0f);
      if (rank == 1) {
        comm->all_reduce(data.data(), data.size(), ReduceOp::kSum);
        return comm->abort("injected failure");
      }
      try {  // the abort may come as early as the end of the first all-reduce
        for (;;) comm->all_reduce(data.data(), data.size(), ReduceOp::kSum);
      } catch (const IoError& e) {
        errors[size_t(rank)] = e.what();
      }
      try {
        comm->barrier();
      } catch (const IoError& e) {
        expect(e.what() == errors[size_t(rank)], "the same error again");  // sticky, at once
        return;
      }
      expect(false, "a barrier after a failure throws");
    });
    for (int r : {0, 2})
      CHECK_THAT(errors[size_t(r)], Catch::Contains("worker:1 (rank 1) aborted: injected failure"));
  }
  SECTION("time-out") {
    ShmOptions options;
    options.collective_seconds = 0.2;
    std::string error;
    run_ranks(2, [&](int rank, Communicator& bootstrap) {
      auto comm = make(bootstrap, rank, 2, options);
      if (rank == 1) return;  // never comes
      try {
        comm->barrier();
      } catch (const IoError& e) {
        error = e.what();
      }
    });
    CHECK_THAT(error,
               Catch::Contains("timed out after 0.2 s in barrier waiting for worker:1 (rank 1)"));
  }
}

TEST_CASE("shm set-up returns nullptr on every rank when a rank cannot join") {
  std::vector<std::string> why(3);
  std::atomic<int> made{0};
  SECTION("another host") {
    run_ranks(3, [&](int rank, Communicator& bootstrap) {
      ShmOptions options;
      options.host_identity_override = rank == 2 ? "elsewhere" : "here";
      auto comm = ShmCommunicator::create(bootstrap, identity(rank, 3, "shmtest"), options,
                                          &why[size_t(rank)]);
      if (comm) ++made;
    });
    for (const std::string& reason : why)
      CHECK(reason == "worker:2 (rank 2) runs on another host than worker:0 (rank 0)");
  }
  SECTION("the socket name is taken (as by a squatter in this network namespace)") {
    int squatter = ::socket(AF_UNIX, SOCK_STREAM, 0);
    const std::string name = shm_socket_name(identity(0, 3, "shmtest"), ::getpid());
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path + 1, name.data(), name.size());
    REQUIRE(::bind(squatter, reinterpret_cast<sockaddr*>(&address),
                   socklen_t(offsetof(sockaddr_un, sun_path) + 1 + name.size())) == 0);
    run_ranks(3, [&](int rank, Communicator& bootstrap) {
      auto comm =
          ShmCommunicator::create(bootstrap, identity(rank, 3, "shmtest"), {}, &why[size_t(rank)]);
      if (comm) ++made;
    });
    ::close(squatter);
    CHECK_THAT(why[0], Catch::Contains("bind to abstract socket @" + name));
    CHECK(why[1] == "worker:0 (rank 0) could not create the segment");
  }
  CHECK(made.load() == 0);
}

TEST_CASE("shm 4 KiB all-reduce latency with 2 threads (printed, not asserted)") {
  constexpr int kIterations = 5000;
  double micros = 0;
  run_ranks(2, [&](int rank, Communicator& bootstrap) {
    auto comm = make(bootstrap, rank, 2);
    std::vector<float> data(1024, 1.0f);
    comm->barrier();
    const auto start = Clock::now();
    for (int i = 0; i < kIterations; ++i) comm->all_reduce(data.data(), 1024, ReduceOp::kMean);
    if (rank == 0) micros = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    expect(data[0] == 1.0f, "the mean of ones");
  });
  WARN("4 KiB all-reduce, 2 ranks as threads: " << micros / kIterations << " us");
}

namespace {

// A forked rank: all-reduces until that fails; writes "R" to report after the first one and
// "E<message>" on failure. Never returns; an alarm ends it if the test goes wrong.
[[noreturn]] void run_child_rank(int rank, std::vector<int> peers, int report) {
  int code = 0;
  try {
    ::alarm(60);
    const int size = static_cast<int>(peers.size());
    MeshBootstrap bootstrap(std::move(peers), rank);
    auto comm = make(bootstrap, rank, size);
    std::vector<float> data(1000, 1.0f);
    for (bool first = true;; first = false) {
      comm->all_reduce(data.data(), data.size(), ReduceOp::kMean);
      if (first && ::write(report, "R", 1) != 1) ::_exit(3);
    }
  } catch (const std::exception& e) {
    const std::string message = std::string("E") + e.what();
    code = ::write(report, message.data(), message.size()) < 0 ? 3 : 1;
  }
  ::_exit(code);
}

// Up to 4000 bytes from fd, waiting at most timeout_ms; "" on time-out.
std::string read_report(int fd, int timeout_ms) {
  pollfd entry{fd, POLLIN, 0};
  if (::poll(&entry, 1, timeout_ms) != 1) return "";
  char buffer[4000];
  const ssize_t n = ::read(fd, buffer, sizeof buffer);
  return n > 0 ? std::string(buffer, size_t(n)) : "";
}

}  // namespace

TEST_CASE("a SIGKILLed rank process is named by every survivor, and nothing is left behind") {
  const int size = 4;
  const int victim = 2;
  const std::set<std::string> shm_before = dev_shm();
  std::vector<std::vector<int>> mesh(size, std::vector<int>(size, -1));
  for (int i = 0; i < size; ++i) {
    for (int j = i + 1; j < size; ++j) {
      int pair[2];
      REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0);
      mesh[i][j] = pair[0];
      mesh[j][i] = pair[1];
    }
  }
  std::vector<int> reports(size);
  std::vector<pid_t> pids(size);
  for (int r = 0; r < size; ++r) {
    int pipe_fds[2];
    REQUIRE(::pipe2(pipe_fds, O_CLOEXEC) == 0);
    pids[r] = ::fork();
    REQUIRE(pids[r] >= 0);
    if (pids[r] == 0) run_child_rank(r, mesh[r], pipe_fds[1]);
    ::close(pipe_fds[1]);
    reports[r] = pipe_fds[0];
  }
  for (auto& row : mesh)
    for (int fd : row)
      if (fd >= 0) ::close(fd);
  for (int r = 0; r < size; ++r) REQUIRE(read_report(reports[r], kTimeoutSeconds * 1000) == "R");
  CHECK(our_abstract_sockets() == 0);  // the set-up is over: its socket is gone

  ::kill(pids[victim], SIGKILL);
  const auto killed_at = Clock::now();
  for (int r = 0; r < size; ++r) {
    if (r == victim) continue;
    const std::string report = read_report(reports[r], kTimeoutSeconds * 1000);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - killed_at).count();
    INFO("rank " << r << " reported: " << report);
    CHECK_THAT(report, Catch::StartsWith("E") && Catch::Contains("worker:2 (rank 2) died"));
    WARN("rank " << r << " failed " << ms << " ms after the kill");
  }
  for (int r = 0; r < size; ++r) {
    int status = 0;
    ::waitpid(pids[r], &status, 0);
    CHECK((r == victim ? WIFSIGNALED(status) : WIFEXITED(status) && WEXITSTATUS(status) == 1));
    ::close(reports[r]);
  }
  CHECK(dev_shm() == shm_before);
  CHECK(our_abstract_sockets() == 0);
}
