// Validation and the chief/rank rules of cluster_spec.h.
#include "common/cluster_spec.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <map>

#include "common/errors.h"

namespace dtrain::common {
namespace {

bool is_host_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
}

bool all_digits(const std::string& text) {
  return !text.empty() &&
         std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

const std::vector<std::string> kNoAddresses;

// An IPv6 address as written inside brackets, with an optional zone ("fe80::1%eth0").
bool is_ipv6_literal(const std::string& host) {
  std::string address = host.substr(0, host.find('%'));
  std::string zone = host.size() > address.size() ? host.substr(address.size() + 1) : "x";
  in6_addr parsed{};
  return ::inet_pton(AF_INET6, address.c_str(), &parsed) == 1 && !zone.empty() &&
         std::all_of(zone.begin(), zone.end(), is_host_char);
}

// A host name or IPv4 address: letters, digits, '-', '.', '_', and no leading '-' (a remote shell
// would take "-oProxyCommand=..." for an option) or '.'.
void check_host_name(const std::string& text, const std::string& host, const std::string& where) {
  if (host.empty()) {
    throw ConfigError(fmt::format("{}: \"{}\" has no host (expected host:port)", where, text));
  }
  if (!std::all_of(host.begin(), host.end(), is_host_char)) {
    throw ConfigError(fmt::format("{}: \"{}\": host \"{}\" has characters a host name cannot have",
                                  where, text, host));
  }
  if (host[0] == '-' || host[0] == '.') {
    throw ConfigError(
        fmt::format("{}: \"{}\": host \"{}\" cannot start with '{}'", where, text, host, host[0]));
  }
}

// One spelling per address: lower case, IPv6 in its shortest form, and every name of this
// machine's loopback ("localhost", 127.0.0.1, ::1) as "loopback", since they bind the same port.
std::string canonical_host(const std::string& host) {
  std::string name = lower(host);
  if (!name.empty() && name.back() == '.') name.pop_back();
  in6_addr v6{};
  char text[INET6_ADDRSTRLEN] = {};
  if (::inet_pton(AF_INET6, name.c_str(), &v6) == 1 &&
      ::inet_ntop(AF_INET6, &v6, text, sizeof text) != nullptr)
    name = text;
  for (const char* loopback : {"localhost", "localhost.localdomain", "ip6-localhost",
                               "ip6-loopback", "127.0.0.1", "::1"}) {
    if (name == loopback) return "loopback";
  }
  return name;
}

}  // namespace

std::string TaskId::text() const {
  return fmt::format("{}:{}", type, index);
}

TaskId parse_task_id(const std::string& text) {
  size_t colon = text.find(':');
  std::string type = text.substr(0, colon);
  std::string index = colon == std::string::npos ? "" : text.substr(colon + 1);
  if (type.empty() || !all_digits(index) || index.size() > 6) {
    throw ConfigError(fmt::format("task \"{}\": expected TYPE:INDEX such as worker:1", text));
  }
  return TaskId{type, std::stoi(index)};
}

HostPort parse_host_port(const std::string& text, const std::string& where) {
  HostPort result;
  std::string port;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos) {
      throw ConfigError(fmt::format(
          "{}: \"{}\" is not a valid [IPv6]:port address (no closing ']')", where, text));
    }
    result.host = text.substr(1, close - 1);
    if (!is_ipv6_literal(result.host)) {
      throw ConfigError(fmt::format("{}: \"{}\": \"{}\" in brackets is not an IPv6 address", where,
                                    text, result.host));
    }
    if (close + 1 >= text.size() || text[close + 1] != ':') {
      throw ConfigError(fmt::format("{}: \"{}\" has no port", where, text));
    }
    port = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string::npos) {
      throw ConfigError(fmt::format("{}: \"{}\" has no port (expected host:port)", where, text));
    }
    result.host = text.substr(0, colon);
    port = text.substr(colon + 1);
    check_host_name(text, result.host, where);
  }
  if (port.empty()) throw ConfigError(fmt::format("{}: \"{}\" has no port", where, text));
  if (!all_digits(port) || port.size() > 5 || std::stoi(port) < 1 || std::stoi(port) > 65535) {
    throw ConfigError(
        fmt::format("{}: \"{}\": port \"{}\" is not a number from 1 to 65535", where, text, port));
  }
  result.port = std::stoi(port);
  return result;
}

std::string address_key(const HostPort& address) {
  return fmt::format("{}:{}", canonical_host(address.host), address.port);
}

ClusterSpec ClusterSpec::from_json(const JsonNode& node,
                                   const std::vector<std::string>& allowed_types) {
  std::vector<Job> jobs;
  std::map<std::string, std::string> seen;  // normalised address -> path where first seen
  for (const auto& [type, list] : node.as_object()) {
    if (std::find(allowed_types.begin(), allowed_types.end(), type) == allowed_types.end()) {
      std::string names;
      for (const auto& name : allowed_types) names += (names.empty() ? "" : ", ") + name;
      list.fail(fmt::format("unknown task type \"{}\" (expected one of: {})", type, names));
    }
    std::vector<std::string> addresses;
    for (const JsonNode& item : list.as_array()) {
      std::string address = item.as_string();
      HostPort parsed = parse_host_port(address, item.where());
      std::string key = address_key(parsed);
      auto [it, fresh] = seen.emplace(key, item.where());
      if (!fresh)
        item.fail(fmt::format("address \"{}\" is already used by {}", address, it->second));
      addresses.push_back(address);
    }
    if ((type == kChief || type == kEvaluator) && addresses.size() > 1) {
      list.fail(fmt::format("a cluster has at most one {}, found {}", type, addresses.size()));
    }
    jobs.emplace_back(type, std::move(addresses));
  }
  ClusterSpec spec(std::move(jobs));
  if (spec.ring_size() == 0) {
    node.fail(
        "the cluster has no \"chief\" or \"worker\" address; at least one is needed to train");
  }
  return spec;
}

const std::vector<std::string>& ClusterSpec::addresses(const std::string& type) const {
  for (const auto& [name, list] : jobs_) {
    if (name == type) return list;
  }
  return kNoAddresses;
}

const std::string& ClusterSpec::address(const TaskId& task) const {
  DT_ENFORCE(has(task), "no task {} in the cluster", task.text());
  return addresses(task.type)[static_cast<size_t>(task.index)];
}

std::vector<TaskId> ClusterSpec::tasks() const {
  std::vector<TaskId> result;
  for (const auto& [type, list] : jobs_) {
    for (size_t i = 0; i < list.size(); ++i) result.push_back(TaskId{type, static_cast<int>(i)});
  }
  return result;
}

std::vector<TaskId> ClusterSpec::training_tasks() const {
  std::vector<TaskId> result;
  for (int i = 0; i < count(kChief); ++i) result.push_back(TaskId{kChief, i});
  for (int i = 0; i < count(kWorker); ++i) result.push_back(TaskId{kWorker, i});
  return result;
}

TaskId ClusterSpec::chief() const {
  return count(kChief) > 0 ? TaskId{kChief, 0} : TaskId{kWorker, 0};
}

std::optional<int> ClusterSpec::ring_rank(const TaskId& task) const {
  if (!has(task)) return std::nullopt;
  if (task.type == kChief) return task.index;
  if (task.type == kWorker) return task.index + count(kChief);
  return std::nullopt;
}

std::string ClusterSpec::to_python_json() const {
  std::string out = "{";
  for (size_t j = 0; j < jobs_.size(); ++j) {
    out += fmt::format("{}{}: [", j == 0 ? "" : ", ", json_quote(jobs_[j].first));
    for (size_t i = 0; i < jobs_[j].second.size(); ++i) {
      out += fmt::format("{}{}", i == 0 ? "" : ", ", json_quote(jobs_[j].second[i]));
    }
    out += "]";
  }
  return out + "}";
}

}  // namespace dtrain::common
