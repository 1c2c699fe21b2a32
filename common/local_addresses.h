// Whether a host named in a cluster spec is this machine: one of its addresses belongs to an
// interface of this machine (of this network namespace, under `ip netns exec`), loopback included.
// Not whether the host is reachable, and not a name match: "myhost" is local only because it
// resolves to an address that one of this machine's interfaces carries.
#pragma once

#include <string>
#include <vector>

namespace dtrain::common {

/// True iff host (a name, an IPv4 or IPv6 literal, brackets allowed) resolves to an address that an
/// interface of this machine carries right now (getifaddrs, any interface, up or down). 127.0.0.1
/// and ::1 count when lo has them (a fresh network namespace whose lo is down has neither), and so
/// does the rest of a loopback interface's prefix (127.0.1.1, Debian's usual hostname line). The
/// unspecified addresses 0.0.0.0 and :: count too: connecting to them reaches this machine.
/// An unresolvable name is not local. Blocking: a numeric address never touches the resolver; a
/// name goes through getaddrinfo (/etc/hosts, then DNS) and may block for the resolver's own
/// time-outs (resolv.conf `timeout` x `attempts`, 5 s x 2 per server by default) and no longer.
/// Throws IoError when the interface list cannot be read.
bool is_this_machine(const std::string& host);

/// The numeric addresses of this machine's interfaces ("127.0.0.1", "10.0.0.5", "::1",
/// "fe80::1%eth0"), in getifaddrs order, for tests and error messages. Throws IoError as above.
std::vector<std::string> this_machine_addresses();

}  // namespace dtrain::common
