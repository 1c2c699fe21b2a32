// The launcher's notice at the communicator (docs/design.md#in-place-recovery): three members,
// threads of this process, each a GroupCommunicator over what make_training_communicator builds
// for a CPU worker (a communication thread over the TCP ring on 127.0.0.1, or over shared
// memory). One member stops taking part without closing anything, as a peer cut off by the
// network does; interrupt(g + 1) from another thread makes the others' collectives fail at once,
// and the group re-forms. A notice for the current generation or an older one changes nothing;
// one that comes while left is kept, and an older generation can no longer be joined.
#include <spdlog/spdlog.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/ports.h"
#include "worker/comm/comm_factory.h"
#include "worker/comm/group_communicator.h"
#include "worker/comm/ring_communicator.h"
#include "worker/comm/tcp/tcp_socket.h"
#include "worker/mem/device.h"

using namespace dtrain::comm;
using namespace std::chrono_literals;

namespace {

constexpr size_t kCount = 100003;
// Bounds a test waits before it calls something hung; not what the code is expected to take.
constexpr auto kPrompt = 5s;

const char* name_of(Communication choice) {
  return choice == Communication::kShm ? "shared memory" : "TCP ring";
}

// Three members on 127.0.0.1 with OS-picked ports.
class Members {
 public:
  Members(int size, Communication choice) : choice_(choice), ports_(pick_ports(size)) {
    // spdlog's registry is made on first use; not from the members' threads at once (TSan).
    spdlog::default_logger();
    for (int r = 0; r < size; ++r) devices_.push_back(dtrain::nn::make_host_device());
    groups_.resize(static_cast<size_t>(size));
    // The TCP ring fails by itself long before the test would hang for good.
    options_.collective_seconds = 30;
    options_.rendezvous_seconds = 30;
  }
  int size() const { return static_cast<int>(ports_.size()); }
  GroupCommunicator& operator[](int r) { return *groups_[static_cast<size_t>(r)]; }

  /// Every member makes (the first time) or joins generation g, all at once.
  void form(int generation) {
    on_every_member([&](int r) {
      auto& group = groups_[static_cast<size_t>(r)];
      if (group)
        group->join(generation);
      else
        group = std::make_unique<GroupCommunicator>(factory(r), generation);
    });
  }
  void leave_all(const std::string& message) {
    for (auto& group : groups_) group->leave(message);
  }
  /// Every member sums (rank + 1) over the group; what each one threw, "" for a right sum.
  std::vector<std::string> all_reduce_everywhere() {
    std::vector<std::string> errors(groups_.size());
    on_every_member([&](int r) {
      std::vector<float> data(kCount, static_cast<float>(r + 1));
      try {
        (*this)[r].all_reduce(data.data(), data.size(), ReduceOp::kSum);
        const float want = static_cast<float>(size() * (size() + 1) / 2);
        if (data.front() != want || data.back() != want) errors[size_t(r)] = "a wrong sum";
      } catch (const GroupBroken& e) {
        errors[size_t(r)] = e.what();
      }
    });
    return errors;
  }

 private:
  static std::vector<int> pick_ports(int size) { return dtrain::common::pick_free_ports(size); }
  GroupCommunicator::Factory factory(int rank) {
    return [this, rank](int generation) {
      RingIdentity id;
      id.job = "interrupt";
      id.generation = static_cast<uint32_t>(generation);
      id.rank = rank;
      id.size = size();
      id.token = "0123abcd";
      for (int r = 0; r < size(); ++r) {
        id.names.push_back("worker:" + std::to_string(r));
        id.addresses.push_back("127.0.0.1:" + std::to_string(ports_[size_t(r)]));
      }
      return make_training_communicator(id, options_, *devices_[size_t(rank)], choice_);
    };
  }
  // Runs body(rank) on one thread per member; rethrows the first error (after all joined).
  void on_every_member(const std::function<void(int)>& body) {
    std::vector<std::exception_ptr> errors(groups_.size());
    std::vector<std::thread> threads;
    for (int r = 0; r < size(); ++r) {
      threads.emplace_back([&, r] {
        try {
          body(r);
        } catch (...) {
          errors[size_t(r)] = std::current_exception();
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (const std::exception_ptr& e : errors)
      if (e) std::rethrow_exception(e);
  }

  Communication choice_;
  std::vector<int> ports_;
  CommOptions options_;
  std::vector<std::unique_ptr<dtrain::nn::Device>> devices_;
  std::vector<std::unique_ptr<GroupCommunicator>> groups_;
};

// Runs call on its own thread: what it threw, or "returned" when it did not throw.
std::future<std::string> in_background(std::function<void()> call) {
  return std::async(std::launch::async, [call = std::move(call)]() -> std::string {
    try {
      call();
      return "returned";
    } catch (const std::exception& e) {
      return e.what();
    }
  });
}

bool ready_within(std::future<std::string>& f, std::chrono::milliseconds bound) {
  return f.wait_for(bound) == std::future_status::ready;
}

}  // namespace

TEST_CASE("a notice interrupts collectives blocked on a member that stopped taking part") {
  const Communication choice = GENERATE(Communication::kRing, Communication::kShm);
  INFO(name_of(choice));
  Members members(3, choice);
  members.form(0);
  REQUIRE(members.all_reduce_everywhere() == std::vector<std::string>(3));

  // Member 2 stops taking part: it closes nothing, it just never calls again. Member 0 waits in
  // a blocking all-reduce; member 1 in a started one (the communication thread's, as in a step).
  std::vector<float> a(kCount, 1.0f), b(kCount, 2.0f);
  auto blocking = in_background([&] { members[0].all_reduce(a.data(), kCount, ReduceOp::kSum); });
  auto started = in_background([&] {
    ReduceTicket ticket = members[1].start_all_reduce(b.data(), kCount, ReduceOp::kSum);
    members[1].finish_all_reduce(ticket);
  });
  std::this_thread::sleep_for(300ms);
  REQUIRE_FALSE(ready_within(blocking, 0ms));
  REQUIRE_FALSE(ready_within(started, 0ms));

  // A notice for the generation they are in changes nothing.
  CHECK_FALSE(members[0].interrupt(0));
  CHECK_FALSE(members[1].interrupt(0));
  CHECK_FALSE(ready_within(blocking, 300ms));
  CHECK_FALSE(ready_within(started, 0ms));

  // The launcher re-forms the group as generation 1: member 1's started all-reduce fails now,
  // not at the link time-out.
  const auto noticed = std::chrono::steady_clock::now();
  CHECK(members[1].interrupt(1));
  REQUIRE(ready_within(started, kPrompt));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - noticed).count();
  INFO("interrupted after " << seconds << " s");  // milliseconds; asserted only as returned
  CHECK_THAT(started.get(), Catch::Contains("worker:1 (rank 1) interrupted: the launcher "
                                            "re-forms the group as generation 1"));
  // Member 0 too, by its own notice; over TCP perhaps first by member 1's shut link.
  CHECK(members[0].interrupt(1));
  REQUIRE(ready_within(blocking, kPrompt));
  const std::string failed = blocking.get();
  const std::string own =
      "worker:0 (rank 0) interrupted: the launcher re-forms the group as "
      "generation 1";
  if (choice == Communication::kShm)  // an interrupt tells the segment nothing
    CHECK_THAT(failed, Catch::Contains(own));
  else
    CHECK_THAT(failed, Catch::Contains(own) || Catch::Contains("worker:1 (rank 1)"));
  CHECK(members[0].interrupt(2));  // still joined to generation 0: a later notice is taken too

  // Every later call fails at once with the same error, and leaving returns promptly: nothing
  // waits on member 2.
  std::vector<float> c(kCount, 1.0f);
  auto later = in_background([&] { members[0].all_reduce(c.data(), kCount, ReduceOp::kSum); });
  REQUIRE(ready_within(later, kPrompt));
  CHECK(later.get() == failed);
  auto left = in_background([&] { members.leave_all("the group re-forms"); });
  REQUIRE(ready_within(left, kPrompt));
  CHECK(left.get() == "returned");

  // The normal path goes on: all three join generation 2 (member 0's newest notice rules out
  // generation 1 for it) and sum right.
  members.form(2);
  CHECK(members.all_reduce_everywhere() == std::vector<std::string>(3));
}

TEST_CASE("a notice for this generation or an older one changes nothing") {
  const Communication choice = GENERATE(Communication::kRing, Communication::kShm);
  INFO(name_of(choice));
  Members members(3, choice);
  members.form(2);
  for (int r = 0; r < 3; ++r) {
    CHECK_FALSE(members[r].interrupt(2));
    CHECK_FALSE(members[r].interrupt(1));
    CHECK_FALSE(members[r].interrupt(-1));
  }
  CHECK(members.all_reduce_everywhere() == std::vector<std::string>(3));

  members.leave_all("re-forming");
  members.form(3);
  CHECK(members.all_reduce_everywhere() == std::vector<std::string>(3));

  // A notice between collectives: the next one fails at once, on every member.
  for (int r = 0; r < 3; ++r) CHECK(members[r].interrupt(4));
  std::vector<std::string> errors = members.all_reduce_everywhere();
  for (const std::string& e : errors)
    CHECK_THAT(e, Catch::Contains("the launcher re-forms the group as generation 4"));
}

// A notice that comes while a member is between generations (left, or in a rendezvous) is kept:
// a generation older than it can no longer form, so joining one fails at once instead of waiting
// out the rendezvous for a member that will never come; the notice's own generation forms.
TEST_CASE("a notice while left is kept for the next join") {
  const Communication choice = GENERATE(Communication::kRing, Communication::kShm);
  INFO(name_of(choice));
  Members members(3, choice);
  members.form(1);
  members.leave_all("re-forming");
  for (int r = 0; r < 3; ++r) CHECK(members[r].interrupt(3));  // kept, not ignored
  for (int r = 0; r < 3; ++r) {
    try {
      members[r].join(2);
      FAIL("joined generation 2 after the notice of generation 3");
    } catch (const GroupBroken& e) {
      CHECK_THAT(e.what(), Catch::Contains("the launcher re-forms the group as generation 3"));
    }
  }
  members.form(3);
  CHECK(members.all_reduce_everywhere() == std::vector<std::string>(3));
}

// A rendezvous for a generation a notice has superseded (a member of it was replaced meanwhile,
// so it can never complete) gives up at once instead of after its time-out.
TEST_CASE("a superseded rendezvous gives up at once") {
  std::vector<int> ports = dtrain::common::pick_free_ports(2);
  RingIdentity id;
  id.job = "superseded";
  id.generation = 1;
  id.rank = 0;
  id.size = 2;
  id.token = "0123abcd";
  for (int r = 0; r < 2; ++r) {
    id.names.push_back("worker:" + std::to_string(r));
    id.addresses.push_back("127.0.0.1:" + std::to_string(ports[size_t(r)]));
  }
  std::atomic<bool> notice{false};
  CommOptions options;
  options.rendezvous_seconds = 30;  // member 1 never comes
  options.superseded = [&notice] { return notice.load(); };
  auto device = dtrain::nn::make_host_device();
  auto forming = in_background([&] {
    GroupCommunicator group(
        [&](int) { return make_training_communicator(id, options, *device, Communication::kRing); },
        1);
  });
  std::this_thread::sleep_for(300ms);
  REQUIRE_FALSE(ready_within(forming, 0ms));  // waiting for member 1
  notice = true;
  REQUIRE(ready_within(forming, kPrompt));
  CHECK_THAT(forming.get(), Catch::Contains(kSuperseded));
}

TEST_CASE("a group of one hears the notice and re-forms, as a larger group does") {
  // An elastic group that shrank to one member must grow again when its hosts come back: its
  // solo communicator never waits for a peer, but the notice still breaks its next collective.
  GroupCommunicator group([](int) { return std::make_unique<dtrain::comm::SoloCommunicator>(); },
                          3);
  std::vector<float> data = {1.0f, 2.0f};
  group.all_reduce(data.data(), data.size(), dtrain::comm::ReduceOp::kSum);
  CHECK(group.interrupt(4));
  try {
    group.all_reduce(data.data(), data.size(), dtrain::comm::ReduceOp::kSum);
    FAIL("the collective after the notice went on");
  } catch (const dtrain::comm::GroupBroken& e) {
    CHECK_THAT(e.what(), Catch::Contains("generation 4"));
  }
  CHECK_THROWS_AS(group.barrier(), dtrain::comm::GroupBroken);  // and every later one
  group.leave("re-forming");
  group.join(4);
  group.all_reduce(data.data(), data.size(), dtrain::comm::ReduceOp::kSum);  // a fresh one
  CHECK(data == std::vector<float>{1.0f, 2.0f});
}
