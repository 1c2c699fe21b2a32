// FreezeWatch (docs/design.md#frozen-workers) on hand-made looks at a three-member group: a
// stopped member, a member that never reaches the collective the others wait in (busy or idle),
// every member stuck inside one collective (a link down: nobody to blame), a slow but moving
// group (no verdict), the bound following the step time, and no verdict while a group re-forms.
// read_process() on real processes: this one, and a child stopped with SIGSTOP.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "launcher/freeze_watch.h"

using namespace dtrain;
using launcher::FreezeWatch;
using launcher::MemberObservation;

namespace {

MemberObservation member(int pid, uint64_t begun, uint64_t ended, uint64_t step,
                         double step_seconds = 0.01, char state = 'S', uint64_t cpu = 100) {
  MemberObservation m;
  common::ProgressSample s;
  s.pid = pid;
  s.begun = begun;
  s.ended = ended;
  s.global_step = step;
  s.step_seconds = step_seconds;
  m.record = s;
  m.process.state = state;
  m.process.cpu_ticks = cpu;
  m.process.readable = true;
  return m;
}

// A group that trained normally up to collective 100 (step 20), every member having ended one.
FreezeWatch trained(double& now) {
  FreezeWatch watch;
  for (uint64_t c = 96; c <= 100; c += 2, now += 0.5) {
    CHECK_FALSE(watch.observe(
        now, {member(10, c, c, c / 5), member(11, c, c, c / 5), member(12, c, c, c / 5)}));
  }
  return watch;
}

}  // namespace

TEST_CASE("a stopped member is named once the group has stalled past the bound") {
  double now = 0;
  FreezeWatch watch = trained(now);
  std::vector<MemberObservation> stuck = {
      member(10, 101, 100, 20), member(11, 100, 100, 20, 0.01, 'T'), member(12, 101, 100, 20)};
  CHECK_FALSE(watch.observe(now, stuck));  // the last change
  CHECK_FALSE(watch.observe(now + 1.9, stuck));
  std::optional<launcher::FreezeVerdict> v = watch.observe(now + 2.1, stuck);
  REQUIRE(v);
  REQUIRE(v->member);
  CHECK(*v->member == 1);
  CHECK(v->why.find("stopped (process state T") == 0);
  CHECK(v->bound_seconds == Approx(2));
  CHECK(v->stalled_seconds == Approx(2.1));
}

TEST_CASE("the member that never begins the collective the others wait in is named, busy or not") {
  for (bool busy : {true, false}) {
    INFO("busy " << busy);
    double now = 0;
    FreezeWatch watch = trained(now);
    CHECK_FALSE(watch.observe(
        now, {member(10, 103, 102, 20), member(11, 102, 102, 20), member(12, 103, 102, 20)}));
    std::optional<launcher::FreezeVerdict> v = watch.observe(
        now + 3, {member(10, 103, 102, 20), member(11, 102, 102, 20, 0.01, 'R', busy ? 400 : 100),
                  member(12, 103, 102, 20)});
    REQUIRE(v);
    REQUIRE(v->member);
    CHECK(*v->member == 1);
    CHECK(v->why.find(busy ? "busy outside the collectives" : "no CPU time") == 0);
    CHECK(v->why.find("collective 103") != std::string::npos);
  }
}

TEST_CASE("every member stuck inside one collective blames nobody; a moving group is not frozen") {
  double now = 0;
  FreezeWatch watch = trained(now);
  std::vector<MemberObservation> inside = {member(10, 101, 100, 20), member(11, 101, 100, 20),
                                           member(12, 101, 100, 20)};
  CHECK_FALSE(watch.observe(now, inside));
  std::optional<launcher::FreezeVerdict> v = watch.observe(now + 2.5, inside);
  REQUIRE(v);
  CHECK_FALSE(v->member);
  CHECK(v->why.find("a link is down") != std::string::npos);

  // Slow steps (1 s each, moving every look) never make a verdict, and the bound follows them.
  FreezeWatch slow;
  double t = 0;
  for (uint64_t c = 10; c < 40; c += 1, t += 0.9) {
    CHECK_FALSE(slow.observe(
        t, {member(10, c, c, c, 1.0), member(11, c, c, c, 1.0), member(12, c, c, c, 1.0)}));
  }
  CHECK(slow.bound_seconds() == Approx(20));
}

TEST_CASE("no verdict before training, nor while a re-formed group has not ended a collective") {
  FreezeWatch watch;
  std::vector<MemberObservation> loading = {member(10, 0, 0, 0), member(11, 0, 0, 0),
                                            member(12, 0, 0, 0)};
  CHECK_FALSE(watch.observe(0, loading));
  CHECK_FALSE(watch.observe(100, loading));  // no step yet: still loading data

  double now = 0;
  FreezeWatch reformed = trained(now);
  reformed.reset();  // a replacement started: survivors wait in its rendezvous
  std::vector<MemberObservation> waiting = {member(10, 100, 100, 20), member(13, 0, 0, 20),
                                            member(12, 100, 100, 20)};
  CHECK_FALSE(reformed.observe(now, waiting));
  CHECK_FALSE(reformed.observe(now + 30, waiting));
}

TEST_CASE("read_process sees this process running and a SIGSTOPped child stopped") {
  launcher::ProcessSample self = launcher::read_process(::getpid());
  REQUIRE(self.readable);
  CHECK(self.state == 'R');
  pid_t child = ::fork();
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  REQUIRE(child > 0);
  ::kill(child, SIGSTOP);
  launcher::ProcessSample s;
  for (int i = 0; i < 500 && s.state != 'T'; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    s = launcher::read_process(child);
  }
  CHECK(s.state == 'T');
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  CHECK_FALSE(launcher::read_process(child).readable);
}

// A stopped process is named even while its group forms again (it would hold the rendezvous).
TEST_CASE("a stopped member is named while a re-formed group waits for it") {
  double now = 0;
  FreezeWatch reformed = trained(now);
  reformed.reset();
  std::vector<MemberObservation> waiting = {
      member(10, 100, 100, 20), member(13, 0, 0, 20, 0.01, 'T'), member(12, 100, 100, 20)};
  CHECK_FALSE(reformed.observe(now, waiting));
  std::optional<launcher::FreezeVerdict> v = reformed.observe(now + 2.5, waiting);
  REQUIRE(v);
  REQUIRE(v->member);
  CHECK(*v->member == 1);
}

// A remote member whose agent went quiet is the one a stalled group waits for (its link or host
// is down), the quietest if several, even while a member has no record yet (a replacement still
// loading); a quiet member of a moving group is not blamed, nor are all members quiet at once.
TEST_CASE("the member whose agent stopped reporting is named once the group stalls") {
  double now = 0;
  FreezeWatch watch = trained(now);
  std::vector<MemberObservation> stuck = {member(10, 101, 100, 20), member(11, 101, 100, 20),
                                          member(12, 101, 100, 20)};
  stuck[2].silent_seconds = 1.0;
  CHECK_FALSE(watch.observe(now, stuck));
  stuck[1].silent_seconds = 3.2;
  stuck[2].silent_seconds = 3.5;
  std::optional<launcher::FreezeVerdict> v = watch.observe(now + 2.5, stuck);
  REQUIRE(v);
  REQUIRE(v->member);
  CHECK(*v->member == 2);
  CHECK(v->why == "no word from it for 3.5 s (its host is cut off or gone)");

  FreezeWatch forming = trained(now);
  forming.reset();
  std::vector<MemberObservation> loading = {member(10, 100, 100, 20), member(13, 0, 0, 0),
                                            member(12, 100, 100, 20)};
  loading[1].record.reset();
  CHECK_FALSE(forming.observe(now, loading));
  loading[2].silent_seconds = 4;
  std::optional<launcher::FreezeVerdict> quiet = forming.observe(now + 2.5, loading);
  REQUIRE(quiet);
  REQUIRE(quiet->member);
  CHECK(*quiet->member == 2);

  FreezeWatch everyone = trained(now);
  for (MemberObservation& m : stuck) m.silent_seconds = 5;  // this launcher did not read
  CHECK_FALSE(everyone.observe(now, stuck));
  std::optional<launcher::FreezeVerdict> nobody = everyone.observe(now + 5, stuck);
  CHECK_FALSE((nobody && nobody->member));  // at most the stall with nobody to blame

  FreezeWatch moving;
  double t = 0;
  for (uint64_t c = 10; c < 20; c += 1, t += 0.5) {
    std::vector<MemberObservation> looks = {member(10, c, c, c), member(11, c, c, c),
                                            member(12, c, c, c)};
    looks[0].silent_seconds = 5;  // a quiet agent, a group that moves: nothing to judge
    CHECK_FALSE(moving.observe(t, looks));
  }
}

// A stopped process is named even before the group has a record to judge (the others wait in
// its rendezvous, a replacement still loads), once it has been stopped for longer than the bound.
TEST_CASE("a member stopped while the group forms is named after the bound") {
  FreezeWatch watch;
  std::vector<MemberObservation> forming = {member(10, 100, 100, 20),
                                            member(11, 0, 0, 0, 0.01, 'T'), member(12, 0, 0, 0)};
  forming[2].record.reset();
  CHECK_FALSE(watch.observe(0, forming));
  CHECK_FALSE(watch.observe(1.9, forming));
  std::optional<launcher::FreezeVerdict> v = watch.observe(2.1, forming);
  REQUIRE(v);
  REQUIRE(v->member);
  CHECK(*v->member == 1);
  CHECK(v->why.rfind("stopped", 0) == 0);
  forming[1].process.state = 'S';  // continued: the count starts again
  CHECK_FALSE(watch.observe(2.6, forming));
  forming[1].process.state = 'T';
  CHECK_FALSE(watch.observe(3.0, forming));
  CHECK_FALSE(watch.observe(4.9, forming));
  CHECK(watch.observe(5.1, forming));
}
