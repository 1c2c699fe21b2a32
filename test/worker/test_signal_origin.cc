// sent_by_job_stopper (worker/signal_origin.h) on real processes: a chain P -> A -> W of forked
// processes where W asks about P and A. The parent always stops the job; a grandparent only when
// it is named slurmstepd (prctl renames P); init, W itself and an unrelated process never do.
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "worker/signal_origin.h"

using dtrain::train::sent_by_job_stopper;

namespace {

// Forks P named p_name, which forks A, which forks W; W writes one letter per question to the
// pipe: about P, about A (its parent), about init, about itself. Returns what W wrote.
std::string ask_from_grandchild(const char* p_name) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  pid_t p = ::fork();
  REQUIRE(p >= 0);
  if (p == 0) {
    ::prctl(PR_SET_NAME, p_name);
    int p_pid = static_cast<int>(::getpid());
    pid_t a = ::fork();
    if (a == 0) {
      int a_pid = static_cast<int>(::getpid());
      pid_t w = ::fork();
      if (w == 0) {
        std::string answers;
        for (int sender : {p_pid, a_pid, 1, static_cast<int>(::getpid())})
          answers += sent_by_job_stopper(sender) ? 'y' : 'n';
        (void)!::write(fds[1], answers.data(), answers.size());
        ::_exit(0);
      }
      ::waitpid(w, nullptr, 0);
      ::_exit(0);
    }
    ::waitpid(a, nullptr, 0);
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string got;
  char buffer[16];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) > 0;) got.append(buffer, size_t(n));
  ::close(fds[0]);
  ::waitpid(p, nullptr, 0);
  return got;
}

}  // namespace

TEST_CASE("the job's stop comes from the parent, or from a slurmstepd above it") {
  CHECK(ask_from_grandchild("slurmstepd") == "yynn");
  CHECK(ask_from_grandchild("bash") == "nynn");  // the shell that started the launcher
  CHECK_FALSE(sent_by_job_stopper(0));
  pid_t child = ::fork();
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  REQUIRE(child > 0);
  CHECK_FALSE(sent_by_job_stopper(static_cast<int>(child)));
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
}
