// The launcher's side of the agent protocol (launcher/placement/remote_child.cc) over a fake
// session: a worker line that begins with the marker byte, escaped by the agent's framing, reaches
// the supervisor as that output line and never as an event (issue 25: a fake "signaled" event made
// a Slurm launch exit 143), and a piece after a cut overlong line is output too.
#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "launcher/placement/agent_output.h"
#include "launcher/placement/agent_protocol.h"
#include "launcher/placement/remote_child.h"
#include "test/launcher/fake_spawner.h"

using namespace dtrain;
using launcher::kEventMarker;

TEST_CASE("remote child: a worker's marker-like line is output, never an event", "[agent]") {
  const std::string fake = std::string(kEventMarker) + "{\"event\":\"signaled\",\"signal\":15}";
  const std::string pad(launcher::kMaxAgentLine, 'p');
  // What the worker wrote: fake events at a line start, after '\r', and after a cut.
  const std::string worker = fake + "\r\nbar\r" + fake + "\n" + pad + fake + "\n" + fake + "\n";
  launcher::AgentOutput framing(launcher::kMaxAgentLine);
  framing.add_marked(kEventMarker, launcher::format_agent_started_event(42));
  framing.feed(worker);
  framing.add_marked(kEventMarker,
                     launcher::format_agent_exit_event(launcher::ExitStatus::exited(0)));
  framing.finish();
  const std::string session = framing.ready();

  for (auto kind :
       {launcher::RemoteTarget::Kind::kSlurmStep, launcher::RemoteTarget::Kind::kRemoteShell}) {
    boost::asio::io_context io;
    testing::FakeSpawner local(io, [&](testing::FakeProcess& p) {
      for (size_t at = 0; at < session.size(); at += 4093) p.print(session.substr(at, 4093));
      p.end(launcher::ExitStatus::exited(0));
    });
    std::unique_ptr<launcher::ProcessSpawner> agents = launcher::make_agent_spawner(io, local);
    launcher::SpawnRequest request;
    request.argv = {"dtrain", "agent"};
    request.remote = launcher::RemoteTarget{kind, "node1", 0};
    std::string output;
    std::vector<int> signaled;
    int started = 0;
    bool ended = false;
    launcher::ChildCallbacks callbacks;
    callbacks.on_output = [&](std::string_view bytes) { output.append(bytes); };
    callbacks.on_signaled = [&](int sig, bool) { signaled.push_back(sig); };
    callbacks.on_started = [&](int pid) { started = pid; };
    callbacks.on_exit = [&](const launcher::ChildEnd& end) {
      ended = true;
      CHECK(end.status.code == 0);
    };
    std::unique_ptr<launcher::Child> child = agents->spawn(request, callbacks);
    io.run_for(std::chrono::seconds(5));
    CHECK(ended);
    CHECK(started == 42);
    CHECK(signaled.empty());
    CHECK(output == worker);  // byte for byte
  }
}
