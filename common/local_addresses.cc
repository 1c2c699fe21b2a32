// See local_addresses.h. getaddrinfo for the host, getifaddrs for this machine; compares raw
// address bytes (IPv4-mapped IPv6 as IPv4; IPv6 scope ids only when both sides carry one).
#include "common/local_addresses.h"

#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>

#include "common/errors.h"

namespace dtrain::common {
namespace {

/// One address in comparable form: IPv4 as 4 bytes, IPv6 as 16, with its scope id (0 if none).
struct Address {
  std::string bytes;
  uint32_t scope = 0;
};

bool to_address(const sockaddr* sa, Address* out) {
  if (sa == nullptr) return false;
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    out->bytes.assign(reinterpret_cast<const char*>(&in->sin_addr), 4);
    return true;
  }
  if (sa->sa_family != AF_INET6) return false;
  const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
  if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
    out->bytes.assign(reinterpret_cast<const char*>(&in6->sin6_addr) + 12, 4);
    return true;
  }
  out->bytes.assign(reinterpret_cast<const char*>(&in6->sin6_addr), 16);
  out->scope = in6->sin6_scope_id;
  return true;
}

bool is_unspecified(const Address& a) {
  return a.bytes.find_first_not_of('\0') == std::string::npos;
}

struct IfaddrsFree {
  void operator()(ifaddrs* list) const { ::freeifaddrs(list); }
};

std::unique_ptr<ifaddrs, IfaddrsFree> interface_list() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) {
    throw IoError(std::string("cannot list this machine's interface addresses (getifaddrs): ") +
                  std::strerror(errno));
  }
  return std::unique_ptr<ifaddrs, IfaddrsFree>(list);
}

/// a and b agree on the bits set in mask (all three the same length).
bool same_prefix(const std::string& a, const std::string& b, const std::string& mask) {
  for (size_t i = 0; i < a.size(); ++i) {
    if ((a[i] & mask[i]) != (b[i] & mask[i])) return false;
  }
  return true;
}

/// wanted is an interface's address, or inside the prefix of a loopback interface's address (the
/// kernel routes all of 127.0.0.0/8 to lo when lo has 127.0.0.1/8; Debian's /etc/hosts names the
/// hostname 127.0.1.1).
bool carried_by_an_interface(const Address& wanted, const ifaddrs* list) {
  for (const ifaddrs* ifa = list; ifa != nullptr; ifa = ifa->ifa_next) {
    Address mine, mask;
    if (!to_address(ifa->ifa_addr, &mine) || mine.bytes.size() != wanted.bytes.size()) continue;
    bool scopes_agree = wanted.scope == 0 || mine.scope == 0 || wanted.scope == mine.scope;
    if (mine.bytes == wanted.bytes && scopes_agree) return true;
    if ((ifa->ifa_flags & IFF_LOOPBACK) != 0 && to_address(ifa->ifa_netmask, &mask) &&
        mask.bytes.size() == mine.bytes.size() &&
        same_prefix(mine.bytes, wanted.bytes, mask.bytes)) {
      return true;
    }
  }
  return false;
}

struct AddrinfoFree {
  void operator()(addrinfo* list) const { ::freeaddrinfo(list); }
};

/// getaddrinfo with numeric literals kept away from the resolver; nullptr when host does not
/// resolve.
std::unique_ptr<addrinfo, AddrinfoFree> resolve(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST;
  addrinfo* list = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &list) != 0) {
    hints.ai_flags = 0;
    list = nullptr;
    if (::getaddrinfo(host.c_str(), nullptr, &hints, &list) != 0) return nullptr;
  }
  return std::unique_ptr<addrinfo, AddrinfoFree>(list);
}

}  // namespace

bool is_this_machine(const std::string& host) {
  std::string name = host;
  if (name.size() >= 2 && name.front() == '[' && name.back() == ']') {
    name = name.substr(1, name.size() - 2);
  }
  if (name.empty()) return false;
  auto resolved = resolve(name);
  if (!resolved) return false;
  auto interfaces = interface_list();
  for (const addrinfo* ai = resolved.get(); ai != nullptr; ai = ai->ai_next) {
    Address wanted;
    if (!to_address(ai->ai_addr, &wanted)) continue;
    if (is_unspecified(wanted) || carried_by_an_interface(wanted, interfaces.get())) return true;
  }
  return false;
}

std::vector<std::string> this_machine_addresses() {
  std::vector<std::string> out;
  auto interfaces = interface_list();
  for (const ifaddrs* ifa = interfaces.get(); ifa != nullptr; ifa = ifa->ifa_next) {
    if (ifa->ifa_addr == nullptr) continue;
    int family = ifa->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    socklen_t size = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    char text[NI_MAXHOST] = {};
    if (::getnameinfo(ifa->ifa_addr, size, text, sizeof text, nullptr, 0, NI_NUMERICHOST) == 0) {
      out.emplace_back(text);
    }
  }
  return out;
}

}  // namespace dtrain::common
