// FreezeWatch (docs/design.md#frozen-workers) on hand-made looks at a three-member group: a
// stopped member, a member that never reaches the collective the others wait in (busy or idle),
// every member stuck inside one collective (a link down: nobody to blame), a slow but moving
// group (no verdict), the bound following the step time, and no verdict while a group re-forms.
// Healthy members are never named: one short of CPU (its run-queue wait), in I/O (state D), in
// a busy phase (saving, validating), or stopped for less than the bound; a first verdict is a
// warning and only one that persists is confirmed. read_process() on real processes: this one,
// a child sleeping in its main thread while another thread spins, a child stopped with SIGSTOP,
// and a child kept waiting for the CPU. Times are simulated.
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "launcher/process/freeze_watch.h"

using namespace dtrain;
using launcher::FreezeSettings;
using launcher::FreezeVerdict;
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
  m.process.runnable = state == 'R';
  m.process.cpu_ticks = cpu;
  m.process.readable = true;
  return m;
}

// The tests' bound: a floor of 2 s (kConfirmFactor: confirmed past 3 s).
const FreezeSettings kTwoSeconds{2, 20};

// A group that trained normally up to collective 100 (step 20), every member having ended one.
FreezeWatch trained(double& now, FreezeSettings settings = kTwoSeconds) {
  FreezeWatch watch(settings);
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
  std::optional<FreezeVerdict> v = watch.observe(now + 2.1, stuck);
  REQUIRE(v);
  REQUIRE(v->member);
  CHECK(*v->member == 1);
  CHECK(v->why.find("stopped (process state T") == 0);
  CHECK(v->bound_seconds == Approx(2));
  CHECK(v->stalled_seconds == Approx(2.1));
  CHECK_FALSE(v->confirmed);  // a warning first, once
  CHECK_FALSE(watch.observe(now + 2.5, stuck));
  CHECK_FALSE(watch.observe(now + 2.9, stuck));
  std::optional<FreezeVerdict> kill = watch.observe(now + 3.1, stuck);
  REQUIRE(kill);
  CHECK(kill->confirmed);
  CHECK(*kill->member == 1);
}

TEST_CASE("the member that never begins the collective the others wait in is named, busy or not") {
  for (bool busy : {true, false}) {
    INFO("busy " << busy);
    double now = 0;
    FreezeWatch watch = trained(now);
    CHECK_FALSE(watch.observe(
        now, {member(10, 103, 102, 20), member(11, 102, 102, 20), member(12, 103, 102, 20)}));
    std::optional<FreezeVerdict> v = watch.observe(
        // Not busy: blocked (S). A runnable member without CPU time waits for a CPU (below).
        now + 3.1, {member(10, 103, 102, 20),
                    member(11, 102, 102, 20, 0.01, busy ? 'R' : 'S', busy ? 400 : 100),
                    member(12, 103, 102, 20)});
    REQUIRE(v);
    CHECK(v->confirmed);  // past 1.5 x the bound at its first look: no warning to wait for
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
  std::optional<FreezeVerdict> v = watch.observe(now + 2.5, inside);
  REQUIRE(v);
  CHECK_FALSE(v->confirmed);
  CHECK_FALSE(v->member);
  CHECK(v->why.find("a link is down") != std::string::npos);

  // Slow steps (1 s each, moving every look) never make a verdict, and the bound follows them.
  FreezeWatch slow(kTwoSeconds);
  double t = 0;
  for (uint64_t c = 10; c < 40; c += 1, t += 0.9) {
    CHECK_FALSE(slow.observe(
        t, {member(10, c, c, c, 1.0), member(11, c, c, c, 1.0), member(12, c, c, c, 1.0)}));
  }
  CHECK(slow.bound_seconds() == Approx(20));
}

TEST_CASE("no verdict before training, nor while a re-formed group has not ended a collective") {
  FreezeWatch watch(kTwoSeconds);
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

// A process whose main thread sleeps (joining a thread) while another thread spins is runnable:
// the letter of /proc/<pid>/stat is the main thread's alone.
TEST_CASE("read_process sees a thread runnable behind a sleeping main thread") {
  pid_t child = ::fork();
  if (child == 0) {
    std::thread spinner([] {
      for (volatile uint64_t spin = 0;; spin = spin + 1) {
      }
    });
    spinner.join();
    ::_exit(0);
  }
  REQUIRE(child > 0);
  launcher::ProcessSample s;
  for (int i = 0; i < 500 && !(s.state == 'S' && s.runnable); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    s = launcher::read_process(child);
  }
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  CHECK(s.state == 'S');
  CHECK(s.runnable);
}

// A stopped process is named even while its group forms again (it would hold the rendezvous).
TEST_CASE("a stopped member is named while a re-formed group waits for it") {
  double now = 0;
  FreezeWatch reformed = trained(now);
  reformed.reset();
  std::vector<MemberObservation> waiting = {
      member(10, 100, 100, 20), member(13, 0, 0, 20, 0.01, 'T'), member(12, 100, 100, 20)};
  CHECK_FALSE(reformed.observe(now, waiting));
  std::optional<FreezeVerdict> v = reformed.observe(now + 2.5, waiting);
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
  std::optional<FreezeVerdict> v = watch.observe(now + 2.5, stuck);
  REQUIRE(v);
  REQUIRE(v->member);
  CHECK(*v->member == 2);
  CHECK(v->why == "no word from it for 3.5 s (its host is cut off or gone)");
  CHECK_FALSE(v->confirmed);
  stuck[2].silent_seconds = 4.5;
  std::optional<FreezeVerdict> confirmed = watch.observe(now + 3.5, stuck);
  REQUIRE(confirmed);
  CHECK(confirmed->confirmed);
  CHECK(*confirmed->member == 2);

  FreezeWatch forming = trained(now);
  forming.reset();
  std::vector<MemberObservation> loading = {member(10, 100, 100, 20), member(13, 0, 0, 0),
                                            member(12, 100, 100, 20)};
  loading[1].record.reset();
  CHECK_FALSE(forming.observe(now, loading));
  loading[2].silent_seconds = 4;
  std::optional<FreezeVerdict> quiet = forming.observe(now + 2.5, loading);
  REQUIRE(quiet);
  REQUIRE(quiet->member);
  CHECK(*quiet->member == 2);

  FreezeWatch everyone = trained(now);
  for (MemberObservation& m : stuck) m.silent_seconds = 5;  // this launcher did not read
  CHECK_FALSE(everyone.observe(now, stuck));
  std::optional<FreezeVerdict> nobody = everyone.observe(now + 5, stuck);
  CHECK_FALSE((nobody && nobody->member));  // at most the stall with nobody to blame

  FreezeWatch moving(kTwoSeconds);
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
  FreezeWatch watch(kTwoSeconds);
  std::vector<MemberObservation> forming = {member(10, 100, 100, 20),
                                            member(11, 0, 0, 0, 0.01, 'T'), member(12, 0, 0, 0)};
  forming[2].record.reset();
  CHECK_FALSE(watch.observe(0, forming));
  CHECK_FALSE(watch.observe(1.9, forming));
  std::optional<FreezeVerdict> v = watch.observe(2.1, forming);
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

namespace {

MemberObservation sched(MemberObservation m, double run_seconds, double wait_seconds) {
  m.process.run_ns = static_cast<uint64_t>(run_seconds * 1e9);
  m.process.wait_ns = static_cast<uint64_t>(wait_seconds * 1e9);
  return m;
}

// Worker 1 lags outside the collectives for `looks` half-second looks while the others wait in
// collective 103; each look, its threads run `run` and wait for a CPU `wait` seconds (summed over
// threads), its state is `state` and its record's phase `phase`. The first verdict, if any.
// schedstat false: a kernel without schedstat (both counters always 0); its CPU time still grows
// by `run` a look.
std::optional<FreezeVerdict> lag(int looks, double run, double wait, char state = 'R',
                                 common::ProgressPhase phase = common::ProgressPhase::kStepping,
                                 bool schedstat = true) {
  double now = 0;
  FreezeWatch watch = trained(now);
  double ran = 1, waited = 0;  // seconds of CPU time it had before
  for (int i = 0; i <= looks; ++i, now += 0.5, ran += run, waited += wait) {
    MemberObservation laggard = sched(
        member(11, 102, 102, 20, 0.01, state, 100 + static_cast<uint64_t>(ran * 100)), ran, waited);
    if (!schedstat) laggard = sched(laggard, 0, 0);
    laggard.record->phase = phase;
    std::optional<FreezeVerdict> v =
        watch.observe(now, {member(10, 103, 102, 20), laggard, member(12, 103, 102, 20)});
    if (v) return v;
  }
  return std::nullopt;
}

}  // namespace

// docs/design.md#frozen-workers: a member is judged on the time it could have used. One that
// spends nine tenths of its time waiting for a CPU (a machine kept busy by others) has a tenth
// of each second counted: 10 s of wall time are 1 s of its own, under the 2 s bound; the same
// member running alone is named once it has been stuck 2 s.
TEST_CASE("a member short of CPU is judged on the time it got, not on wall time") {
  std::optional<FreezeVerdict> starved = lag(20, 0.05, 0.45);  // 10 s, 1 s of its own
  CHECK_FALSE(starved);
  // Runnable and never run (a CPU quota spent): the kernel counts the wait once it runs again.
  CHECK_FALSE(lag(40, 0, 0, 'R'));
  std::optional<FreezeVerdict> spinning = lag(20, 0.5, 0.0);
  REQUIRE(spinning);
  CHECK(*spinning->member == 1);
  CHECK_FALSE(spinning->confirmed);
  CHECK(spinning->why.find("busy outside the collectives") == 0);
  CHECK(spinning->stalled_seconds > 2);
  CHECK(spinning->stalled_seconds < 2.6);
  // Given half the CPU it is still named once it has had 2 s of its own: a spin on a busy
  // machine is found, later.
  std::optional<FreezeVerdict> slow_spin = lag(40, 0.25, 0.25);
  REQUIRE(slow_spin);
  CHECK(*slow_spin->member == 1);
}

// Seen on CI's machine: a worker held to 1 ms of CPU a second by a cgroup quota was killed as
// "no CPU time ... (deadlocked or blocked)" where the kernel keeps no schedstat. Runnable without
// CPU time is waiting for a CPU there too; runnable with growing CPU time is still a spin.
TEST_CASE("without schedstat, runnable and short of CPU is waiting; a spin is still found") {
  CHECK_FALSE(lag(40, 0, 0, 'R', common::ProgressPhase::kStepping, false));
  std::optional<FreezeVerdict> spinning =
      lag(20, 0.5, 0, 'R', common::ProgressPhase::kStepping, false);
  REQUIRE(spinning);
  CHECK(*spinning->member == 1);
  CHECK(spinning->why.find("busy outside the collectives") == 0);
  std::optional<FreezeVerdict> blocked =
      lag(40, 0, 0, 'S', common::ProgressPhase::kStepping, false);
  REQUIRE(blocked);
  CHECK(blocked->why.find("no CPU time") == 0);
}

TEST_CASE("a member in I/O (state D) or in a busy phase is not frozen") {
  CHECK_FALSE(lag(40, 0, 0, 'D'));  // a checkpoint write throttled to a crawl
  CHECK_FALSE(lag(40, 0.5, 0, 'R', common::ProgressPhase::kSaving));
  CHECK_FALSE(lag(40, 0, 0, 'S', common::ProgressPhase::kValidating));
  // Blocked with no CPU time in no busy phase: deadlocked.
  std::optional<FreezeVerdict> blocked = lag(40, 0, 0, 'S');
  REQUIRE(blocked);
  CHECK(blocked->why.find("no CPU time") == 0);
}

// A debugger's pause or a short SIGSTOP under the bound is no freeze, and the default floor
// (kDefaultFreezeSeconds) holds a first verdict back for 10 s whatever the step time.
TEST_CASE("a short stop under the bound is not named; the default floor is 10 s") {
  double now = 0;
  FreezeWatch watch = trained(now, FreezeSettings{});
  std::vector<MemberObservation> stuck = {
      member(10, 101, 100, 20), member(11, 100, 100, 20, 0.01, 'T'), member(12, 101, 100, 20)};
  for (double t = 0; t <= 9.5; t += 0.5) CHECK_FALSE(watch.observe(now + t, stuck));
  stuck[1].process.state = 'S';  // continued after 9.5 s
  for (uint64_t c = 101; c < 110; ++c, now += 0.5) {
    CHECK_FALSE(
        watch.observe(now + 10, {member(10, c, c, c), member(11, c, c, c), member(12, c, c, c)}));
  }
  std::vector<MemberObservation> held = {
      member(10, 111, 110, 30), member(11, 110, 110, 30, 0.01, 'T'), member(12, 111, 110, 30)};
  double start = now + 10;
  std::optional<FreezeVerdict> warned, confirmed;
  for (double t = 0; t <= 20 && !confirmed; t += 0.5) {
    std::optional<FreezeVerdict> v = watch.observe(start + t, held);
    if (v && !v->confirmed) {
      CHECK_FALSE(warned);
      warned = v;
      CHECK(t > 10);
    }
    if (v && v->confirmed) confirmed = v;
  }
  REQUIRE(warned);
  REQUIRE(confirmed);
  CHECK(confirmed->bound_seconds == Approx(10));
  CHECK(confirmed->stalled_seconds > 15);
  CHECK(*confirmed->member == 1);
}

// A warning whose stall ends (the member moves on) is forgotten: the next stall warns again
// before it can be confirmed, never confirmed on the strength of the old one.
TEST_CASE("a warning that the group outlives is forgotten") {
  double now = 0;
  FreezeWatch watch = trained(now);
  std::vector<MemberObservation> stuck = {member(10, 101, 100, 20), member(11, 100, 100, 20),
                                          member(12, 101, 100, 20)};
  CHECK_FALSE(watch.observe(now, stuck));
  std::optional<FreezeVerdict> first = watch.observe(now + 2.5, stuck);
  REQUIRE(first);
  CHECK_FALSE(first->confirmed);
  CHECK_FALSE(watch.observe(
      now + 2.7, {member(10, 101, 101, 21), member(11, 101, 101, 21), member(12, 101, 101, 21)}));
  std::vector<MemberObservation> again = {member(10, 102, 101, 21), member(11, 101, 101, 21),
                                          member(12, 102, 101, 21)};
  CHECK_FALSE(watch.observe(now + 3, again));
  std::optional<FreezeVerdict> second = watch.observe(now + 5.5, again);
  REQUIRE(second);
  CHECK_FALSE(second->confirmed);
}

// The run-queue wait read_process() reports grows for a process kept waiting for the CPU: two
// spinning children pinned to one CPU each wait about half the time.
TEST_CASE("read_process counts a starved process's wait for the CPU") {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(0, &one);
  pid_t children[2];
  for (pid_t& child : children) {
    child = ::fork();
    if (child == 0) {
      ::sched_setaffinity(0, sizeof one, &one);
      for (volatile uint64_t spin = 0;; spin = spin + 1) {
      }
    }
    REQUIRE(child > 0);
  }
  launcher::ProcessSample before = launcher::read_process(children[0]);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  launcher::ProcessSample after = launcher::read_process(children[0]);
  for (pid_t child : children) {
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
  }
  REQUIRE(after.readable);
  if (after.run_ns == 0) WARN("no schedstat on this kernel: the run-queue wait is not counted");
  if (after.run_ns == 0) return;
  CHECK(after.run_ns > before.run_ns);
  CHECK(after.wait_ns - before.wait_ns > 50'000'000);  // of 400 ms, about half
}

// A worker that freezes before the watch's first look at a training group (its steps are short:
// the whole run up to the freeze fits between two looks) is judged all the same: a record first
// seen with collectives already ended counts as having ended one since the reset.
TEST_CASE("a member frozen before the watch first saw the group step is still named") {
  FreezeWatch watch(kTwoSeconds);
  std::vector<MemberObservation> loading = {member(10, 0, 0, 0), member(11, 0, 0, 0)};
  loading[0].record.reset();
  loading[1].record.reset();
  CHECK_FALSE(watch.observe(0, loading));  // the first look: nothing to read yet
  std::vector<MemberObservation> stuck = {member(10, 124, 123, 29), member(11, 121, 121, 29)};
  CHECK_FALSE(watch.observe(0.5, stuck));
  std::optional<FreezeVerdict> v = watch.observe(3, stuck);
  REQUIRE(v);
  REQUIRE(v->member);
  CHECK(*v->member == 1);
}

// A new attempt's members are all new processes: even when the watch's first look after the
// reset finds them already deep in training and one frozen (a fast start), it judges them. After
// a reset for a replacement, records seen at the first look are the old ones: no verdict until
// each moved past them.
TEST_CASE("after a fresh reset any record counts; after a replacement only progress past it") {
  std::vector<MemberObservation> stuck = {member(10, 124, 123, 29), member(11, 121, 121, 29)};
  FreezeWatch fresh(kTwoSeconds);
  fresh.reset(/*fresh=*/true);
  CHECK_FALSE(fresh.observe(0.5, stuck));
  std::optional<FreezeVerdict> v = fresh.observe(3, stuck);
  REQUIRE(v);
  CHECK(*v->member == 1);

  FreezeWatch replaced(kTwoSeconds);
  replaced.reset();
  CHECK_FALSE(replaced.observe(0.5, stuck));
  CHECK_FALSE(replaced.observe(30, stuck));
}

// Seen on CI's machine: a worker held by a cgroup quota inside the all-reduce stalled the whole
// group, which was torn down as "a link is down". Inside one collective, a member short of CPU
// makes the group slow, not cut; every member blocked is still a cut link.
TEST_CASE("a collective stuck on a member short of CPU is not a cut link") {
  auto inside = [](char state, uint64_t cpu) { return member(11, 103, 102, 20, 0.01, state, cpu); };
  double now = 0;
  FreezeWatch watch = trained(now);
  for (int i = 0; i <= 20; ++i, now += 0.5) {  // runnable, no CPU time: waiting for its quota
    CHECK_FALSE(
        watch.observe(now, {member(10, 103, 102, 20), inside('R', 100), member(12, 103, 102, 20)}));
  }
  // The main thread asleep (S) while a thread it waits for is runnable and held by the quota:
  // half the looks see no thread scheduled at all (the quota's period is 1 s), the others 1 ms
  // on a CPU against a second of waiting. Seen on CI's machine as "a link is down".
  now = 0;
  FreezeWatch held = trained(now);
  double ran = 1, waited = 0;
  for (int i = 0; i <= 20; ++i, now += 0.5) {
    if (i % 2 == 0) ran += 0.001, waited += 1;
    MemberObservation starved = inside('S', 100 + static_cast<uint64_t>(ran * 100));
    starved.process.runnable = true;
    starved.process.run_ns = static_cast<uint64_t>(ran * 1e9);
    starved.process.wait_ns = static_cast<uint64_t>(waited * 1e9);
    CHECK_FALSE(held.observe(now, {member(10, 103, 102, 20), starved, member(12, 103, 102, 20)}));
  }
  now = 0;
  FreezeWatch cut = trained(now);
  std::optional<FreezeVerdict> v;
  for (int i = 0; i <= 20 && !v; ++i, now += 0.5)
    v = cut.observe(now, {member(10, 103, 102, 20), inside('S', 100), member(12, 103, 102, 20)});
  REQUIRE(v);
  CHECK_FALSE(v->member);
  CHECK(v->why.find("a link is down") != std::string::npos);
}
