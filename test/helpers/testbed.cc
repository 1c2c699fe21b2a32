// dtrain-testbed: the multi-host test bed (test/support/netns_hosts.h) for scripts, which cannot
// build it themselves: `dtrain-testbed hosts N` sets up N network-namespace hosts with sshd,
// prints what a job file and a launcher need, one `name=value` line each, and keeps the hosts
// until its stdin closes or it gets SIGINT/SIGTERM/SIGHUP; then it tears them down (every process
// in the namespaces is killed) and exits 0. Exit 1 with the reason on stderr when the machine
// refuses (not root, no sshd...). scripts/chaos.sh --hosts runs it as a coprocess.
//   host<i>=10.77.x.<i+1>           the address of host i
//   netns<i>=<namespace>            run a program on host i: ip netns exec <namespace> ...
//   remote_shell=["ssh", "-F", ...] the job's remote_shell (JSON), usable from any host
//   ready=1                         the last line
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "common/json.h"
#include "test/support/netns_hosts.h"

int main(int argc, char** argv) {
  if (argc != 3 || std::string(argv[1]) != "hosts") {
    std::cerr << "usage: dtrain-testbed hosts N   (N >= 2)\n";
    return 2;
  }
  int count = std::atoi(argv[2]);
  if (count < 2 || count > 16) {
    std::cerr << "dtrain-testbed: N must be 2..16, got \"" << argv[2] << "\"\n";
    return 2;
  }
  sigset_t stop;
  sigemptyset(&stop);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&stop, sig);
  sigprocmask(SIG_BLOCK, &stop, nullptr);  // taken below, so the destructor always runs
  try {
    dtrain::testing::NetnsHosts hosts(count);
    if (!hosts.available()) {
      std::cerr << "dtrain-testbed: the multi-host test bed cannot run here: " << hosts.why_not()
                << "\n";
      return 1;
    }
    dtrain::common::JsonWriter shell;
    shell.begin_array();
    for (const std::string& arg : hosts.ssh_command()) shell.value(arg);
    shell.end_array();
    for (int i = 0; i < count; ++i) {
      std::cout << "host" << i << "=" << hosts.host(i) << "\n";
      std::cout << "netns" << i << "=" << hosts.namespace_name(i) << "\n";
    }
    std::cout << "remote_shell=" << shell.str() << "\nready=1" << std::endl;
    while (true) {
      pollfd in{STDIN_FILENO, POLLIN, 0};
      timespec tick{0, 200 * 1000 * 1000};
      if (::ppoll(&in, 1, &tick, nullptr) > 0) {
        char buffer[256];
        if (::read(STDIN_FILENO, buffer, sizeof buffer) <= 0) break;  // stdin closed
      }
      timespec now{0, 0};
      if (::sigtimedwait(&stop, nullptr, &now) > 0) break;
    }
  } catch (const std::exception& e) {
    std::cerr << "dtrain-testbed: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
