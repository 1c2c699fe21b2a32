// `dtrain agent`: its command line; the agent itself is launcher/placement/agent.h.
#include <unistd.h>

#include <boost/program_options.hpp>
#include <iostream>

#include "common/errors.h"
#include "launcher/cli/commands.h"
#include "launcher/cli/options.h"
#include "launcher/placement/agent.h"

namespace dtrain::launcher {

int agent_command(const Args& args) {
  namespace po = boost::program_options;
  AgentOptions options;
  po::options_description desc(
      "Usage: dtrain agent\n\n"
      "The remote end of a multi-host launch (`ssh HOST dtrain agent`): reads one JSON line\n"
      "{\"argv\": [...], \"env\": [[name, value], ...], \"cwd\": dir} on stdin, runs it in its "
      "own\n"
      "process group, and writes its output and control messages to stdout. Later stdin lines\n"
      "{\"signal\": N} signal the group, {\"signal\": N, \"value\": V} queue a signal to the\n"
      "worker alone, {\"reply\": ID, \"line\": ...} answer a relayed request; the end of stdin\n"
      "stops it. Exits with the worker's code.\n"
      "\nOptions");
  desc.add_options()("request-timeout", po::value(&options.request_seconds),
                     "seconds to wait for the first line (default 30)")(
      "keepalive", po::value(&options.keepalive_seconds),
      "stop the worker after this many seconds without a stdin line (default 0: never)")(
      "signal-grace", po::value(&options.signal_grace_seconds),
      "after passing SIGTERM/SIGINT/SIGHUP sent to the agent on to the worker, SIGKILL it this "
      "many seconds later (default 1.5)")("help,h", "show this help");
  po::variables_map vm = parse_options(args, desc, {}, "agent");
  if (vm.count("help")) {
    std::cout << desc;
    return 0;
  }
  if (!(options.request_seconds > 0))
    throw common::ConfigError("agent: --request-timeout must be positive");
  if (!(options.signal_grace_seconds >= 0))
    throw common::ConfigError("agent: --signal-grace must not be negative");
  if (!(options.keepalive_seconds >= 0))
    throw common::ConfigError("agent: --keepalive must not be negative");
  return run_agent(STDIN_FILENO, STDOUT_FILENO, options);
}

}  // namespace dtrain::launcher
