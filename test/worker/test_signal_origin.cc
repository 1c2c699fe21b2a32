// sent_by_ancestor (worker/signal_origin.h) on real processes: this test's parent and
// grandparent are ancestors, init is not counted, and a child or an unrelated pid is not one.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <string>

#include "worker/signal_origin.h"

using dtrain::train::sent_by_ancestor;

namespace {

int parent_of(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(in, text);
  std::istringstream fields(text.substr(text.rfind(')') + 1));
  std::string state;
  int ppid = 0;
  fields >> state >> ppid;
  return ppid;
}

}  // namespace

TEST_CASE("a signal's sender is an ancestor: the parent and its parents, never init or a child") {
  int parent = static_cast<int>(::getppid());
  CHECK(sent_by_ancestor(parent) == (parent > 1));
  int grandparent = parent_of(parent);
  if (grandparent > 1) CHECK(sent_by_ancestor(grandparent));
  CHECK_FALSE(sent_by_ancestor(1));
  CHECK_FALSE(sent_by_ancestor(0));
  CHECK_FALSE(sent_by_ancestor(static_cast<int>(::getpid())));
  pid_t child = ::fork();
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  REQUIRE(child > 0);
  CHECK_FALSE(sent_by_ancestor(static_cast<int>(child)));
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
}
