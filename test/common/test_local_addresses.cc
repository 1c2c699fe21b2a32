// is_this_machine: loopback and this machine's interface addresses are local; an address of no
// interface, an unresolvable name and an address living in another network namespace are not.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>

#include "common/local_addresses.h"
#include "test/support/netns_hosts.h"

using dtrain::common::is_this_machine;
using dtrain::common::this_machine_addresses;

namespace {

bool has_address(const std::string& address) {
  auto all = this_machine_addresses();
  return std::find(all.begin(), all.end(), address) != all.end();
}

}  // namespace

TEST_CASE("loopback names and addresses are this machine when lo has them") {
  REQUIRE(has_address("127.0.0.1"));
  CHECK(is_this_machine("127.0.0.1"));
  CHECK(is_this_machine("localhost"));
  CHECK(is_this_machine("127.0.1.1"));  // inside lo's 127.0.0.0/8, Debian's hostname line
  CHECK(is_this_machine("0.0.0.0"));
  if (has_address("::1")) {
    CHECK(is_this_machine("::1"));
    CHECK(is_this_machine("[::1]"));
  } else {
    WARN("lo has no ::1 here; the IPv6 loopback checks are skipped");
  }
}

TEST_CASE("every interface address of this machine is this machine, and so is its hostname") {
  auto all = this_machine_addresses();
  REQUIRE_FALSE(all.empty());
  for (const auto& address : all) {
    INFO(address);
    CHECK(is_this_machine(address));
  }
  char name[256] = {};
  REQUIRE(::gethostname(name, sizeof name - 1) == 0);
  INFO(name);
  CHECK(is_this_machine(name));  // through /etc/hosts, as any name
}

TEST_CASE("an address of no interface, an unresolvable name and nothing are not this machine") {
  int checked = 0;
  for (const char* address : {"192.0.2.1", "198.51.100.7", "203.0.113.9", "2001:db8::7"}) {
    if (has_address(address)) continue;  // a test network may really be assigned here
    INFO(address);
    CHECK_FALSE(is_this_machine(address));
    ++checked;
  }
  CHECK(checked >= 3);
  CHECK_FALSE(is_this_machine("dtrain-no-such-host.invalid"));
  CHECK_FALSE(is_this_machine(""));
  CHECK_FALSE(is_this_machine("[]"));
}

TEST_CASE("a namespace's own address is local there and nowhere else") {
  dtrain::testing::NetnsHosts hosts;
  if (!hosts.available()) {
    WARN("skipped: multi-host test bed unavailable: " << hosts.why_not());
    return;
  }
  bool own_in_1 = false, other_in_1 = true, loopback_in_1 = false;
  hosts.in_namespace(1, [&] {
    own_in_1 = is_this_machine(hosts.host(1));
    other_in_1 = is_this_machine(hosts.host(0));
    loopback_in_1 = is_this_machine("127.0.0.1");
  });
  bool own_in_0 = false, other_in_0 = true;
  hosts.in_namespace(0, [&] {
    own_in_0 = is_this_machine(hosts.host(0));
    other_in_0 = is_this_machine(hosts.host(1));
  });
  CHECK(own_in_1);
  CHECK_FALSE(other_in_1);
  CHECK(loopback_in_1);
  CHECK(own_in_0);
  CHECK_FALSE(other_in_0);
  CHECK_FALSE(is_this_machine(hosts.host(0)));  // the test's own (root) namespace
  CHECK_FALSE(is_this_machine(hosts.host(1)));
  // A launcher in host 0 (ip netns exec) sees the same thing as the thread above.
  auto r = hosts.run_in(0, {"ip", "-o", "-4", "addr", "show"});
  CHECK(r.out.find(hosts.host(0)) != std::string::npos);
}
