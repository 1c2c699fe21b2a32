// Loopback port helpers for local jobs and tests: ask the OS for free ports, check one is free.
// A port reported free can be taken by someone else before it is used; callers re-check.
#pragma once

#include <string>
#include <vector>

namespace dtrain::common {

/// count distinct TCP ports that were free on 127.0.0.1 at the time of the call. Holds all the
/// sockets open until every port is chosen, so the ports differ. Throws IoError on failure.
std::vector<int> pick_free_ports(int count);

/// True when a TCP listener could bind host:port right now (SO_REUSEADDR, as the workers do).
/// host must resolve (a name or a literal); resolution failure is an IoError. A numeric host
/// never touches the resolver.
bool is_port_free(const std::string& host, int port);

/// The numeric addresses a listener on host binds ("localhost": "127.0.0.1" and "::1"), so that
/// later checks need no resolver. May block on the resolver; throws IoError when host does not
/// resolve.
std::vector<std::string> listen_addresses(const std::string& host);

}  // namespace dtrain::common
