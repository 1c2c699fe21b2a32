// See control_protocol.h.
#include "common/control_protocol.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <utility>

#include "common/clock.h"
#include "common/errors.h"
#include "common/json.h"

namespace dtrain::common {

namespace {

constexpr std::pair<ControlMessageType, const char*> kMessageTypes[] = {
    {ControlMessageType::kHello, "hello"},
    {ControlMessageType::kHeartbeat, "heartbeat"},
    {ControlMessageType::kProgress, "progress"}};

ControlMessageType parse_message_type(const JsonNode& node) {
  std::string name = node.as_string();
  for (const auto& [type, type_name] : kMessageTypes) {
    if (name == type_name) return type;
  }
  node.fail(fmt::format("unknown control message type \"{}\"", name));
}

}  // namespace

const char* control_message_type_name(ControlMessageType type) {
  switch (type) {
    case ControlMessageType::kHello:
      return "hello";
    case ControlMessageType::kHeartbeat:
      return "heartbeat";
    case ControlMessageType::kProgress:
      return "progress";
  }
  return "?";
}

ControlMessage heartbeat_message(const std::string& task, int attempt, int pid) {
  ControlMessage m;
  m.type = ControlMessageType::kHeartbeat;
  m.task = task;
  m.attempt = attempt;
  m.pid = pid;
  return m;
}

std::string format_control_message(const ControlMessage& m) {
  JsonWriter w;
  w.begin_object()
      .key("type")
      .value(control_message_type_name(m.type))
      .key("task")
      .value(m.task)
      .key("attempt")
      .value(m.attempt);
  if (m.pid != 0) w.key("pid").value(m.pid);
  auto put_int = [&](const char* key, const std::optional<int>& v) {
    if (v) w.key(key).value(*v);
  };
  auto put_double = [&](const char* key, const std::optional<double>& v) {
    if (v) w.key(key).value(*v);
  };
  put_int("epoch", m.epoch);
  put_int("epochs", m.epochs);
  put_int("step", m.step);
  put_int("steps", m.steps);
  put_double("loss", m.loss);
  put_double("accuracy", m.accuracy);
  put_double("samples_per_second", m.samples_per_second);
  put_double("tokens_per_second", m.tokens_per_second);
  if (m.global_step) w.key("global_step").value(*m.global_step);
  if (m.restored_step) w.key("restored_step").value(*m.restored_step);
  put_double("compute_seconds_per_step", m.compute_seconds_per_step);
  put_double("wait_seconds_per_step", m.wait_seconds_per_step);
  put_int("generation", m.generation);
  return w.end_object().str() + "\n";
}

std::optional<ControlMessage> parse_control_message(std::string_view line) {
  try {
    JsonDocument doc = JsonDocument::parse(line, "control message");
    JsonNode root = doc.root();
    ControlMessage m;
    m.type = parse_message_type(root.at("type"));
    m.task = root.at("task").as_string();
    m.attempt = static_cast<int>(root.at("attempt").as_int(0, 1 << 30));
    if (auto n = root.find("pid")) m.pid = static_cast<int>(n->as_int(0, 1 << 30));
    for (auto [key, field] : {std::pair{"epoch", &m.epoch},
                              {"epochs", &m.epochs},
                              {"step", &m.step},
                              {"steps", &m.steps},
                              {"generation", &m.generation}}) {
      if (auto n = root.find(key); n && !n->is_null())
        *field = static_cast<int>(n->as_int(0, 1 << 30));
    }
    for (auto [key, field] : {std::pair{"loss", &m.loss},
                              {"accuracy", &m.accuracy},
                              {"samples_per_second", &m.samples_per_second},
                              {"tokens_per_second", &m.tokens_per_second}}) {
      if (auto n = root.find(key); n && !n->is_null()) *field = n->as_number(-1e300, 1e300);
    }
    for (auto [key, field] :
         {std::pair{"global_step", &m.global_step}, {"restored_step", &m.restored_step}}) {
      if (auto n = root.find(key); n && !n->is_null()) *field = n->as_int(0, int64_t{1} << 53);
    }
    for (auto [key, field] : {std::pair{"compute_seconds_per_step", &m.compute_seconds_per_step},
                              {"wait_seconds_per_step", &m.wait_seconds_per_step}}) {
      if (auto n = root.find(key); n && !n->is_null()) *field = n->as_number(0, 1e300);
    }
    return m;
  } catch (const ConfigError&) {
    return std::nullopt;
  }
}

std::string format_reform_request(const ReformRequest& r) {
  JsonWriter w;
  w.begin_object().key("request").value("reform").key("task").value(r.task);
  w.key("attempt").value(r.attempt).key("generation").value(r.generation);
  w.key("whole_step").value(r.whole_step).key("in_flight").value(r.in_flight);
  w.key("what").value(r.what);
  return w.end_object().str() + "\n";
}

std::optional<ReformRequest> parse_reform_request(std::string_view json) {
  try {
    JsonDocument doc = JsonDocument::parse(json, "reform request");
    JsonNode root = doc.root();
    if (root.at("request").as_string() != "reform") return std::nullopt;
    ReformRequest r;
    r.task = root.at("task").as_string();
    r.attempt = static_cast<int>(root.at("attempt").as_int(0, 1 << 30));
    r.generation = static_cast<int>(root.at("generation").as_int(0, 1 << 30));
    r.whole_step = root.at("whole_step").as_int(-1, int64_t{1} << 53);
    if (auto in_flight = root.find("in_flight")) r.in_flight = in_flight->as_bool();
    if (auto what = root.find("what")) r.what = what->as_string();
    return r;
  } catch (const ConfigError&) {
    return std::nullopt;
  }
}

std::string format_reform_reply(const ReformReply& r) {
  JsonWriter w;
  w.begin_object().key("request").value("reform").key("ok").value(r.ok);
  if (r.ok) {
    w.key("generation").value(r.generation);
    if (!r.members.empty()) w.key("members").value(r.members);
  } else {
    w.key("error").value(r.error);
  }
  return w.end_object().str() + "\n";
}

std::optional<ReformReply> parse_reform_reply(std::string_view line) {
  try {
    JsonDocument doc = JsonDocument::parse(line, "reform reply");
    JsonNode root = doc.root();
    std::optional<JsonNode> request = root.find("request");
    if (!request || !request->is_string() || request->as_string() != "reform") return std::nullopt;
    ReformReply r;
    r.ok = root.at("ok").as_bool();
    if (r.ok) {
      r.generation = static_cast<int>(root.at("generation").as_int(0, 1 << 30));
      if (auto members = root.find("members")) r.members = members->as_string();
    } else if (auto error = root.find("error")) {
      r.error = error->as_string();
    }
    return r;
  } catch (const ConfigError&) {
    return std::nullopt;
  }
}

std::string format_members(const std::vector<int>& members) {
  std::string text;
  for (int m : members) text += (text.empty() ? "" : ",") + std::to_string(m);
  return text;
}

std::vector<int> parse_members(std::string_view text, int size, std::string_view source) {
  std::vector<int> members;
  if (text.empty()) {
    for (int r = 0; r < size; ++r) members.push_back(r);
    return members;
  }
  auto bad = [&](const std::string& why) {
    return ConfigError(
        fmt::format("{}: \"{}\": {}; expected ascending ring ranks below {}, "
                    "comma-separated (0,2,3)",
                    source, text, why, size));
  };
  size_t at = 0;
  while (at <= text.size()) {
    size_t comma = text.find(',', at);
    std::string_view item =
        text.substr(at, comma == std::string_view::npos ? text.npos : comma - at);
    int value = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size())
      throw bad(fmt::format("\"{}\" is not a rank", item));
    if (value < 0 || value >= size) throw bad(fmt::format("rank {} is outside the cluster", value));
    if (!members.empty() && value <= members.back()) throw bad("ranks out of order or repeated");
    members.push_back(value);
    if (comma == std::string_view::npos) break;
    at = comma + 1;
  }
  return members;
}

bool trusted_control_peer(unsigned peer_uid, unsigned self_uid) {
  return peer_uid == self_uid || peer_uid == 0;
}

std::optional<unsigned> control_peer_uid(int fd) {
  ucred peer{};
  socklen_t length = sizeof peer;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) != 0) return std::nullopt;
  return peer.uid;
}

ControlClient::ControlClient(std::string address) {
  if (address.rfind(kControlScheme, 0) == 0) path_ = address.substr(std::strlen(kControlScheme));
}

ControlClient::~ControlClient() {
  if (fd_ >= 0) ::close(fd_);
}

bool ControlClient::connect_now() {
  fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path_.c_str(), path_.size() + 1);
  std::optional<unsigned> peer;
  if (fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0)
    peer = control_peer_uid(fd_);
  if (!peer || !trusted_control_peer(*peer, ::geteuid())) {  // progress is not for other users
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    return false;
  }
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
  return true;
}

ControlClient::Sent ControlClient::send_line(const std::string& line) {
  ssize_t n = ::send(fd_, line.data(), line.size(), MSG_NOSIGNAL);
  if (n == static_cast<ssize_t>(line.size())) return Sent::kWhole;
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Sent::kFull;
  ::close(fd_);  // broken or partly written: start over with a fresh connection
  fd_ = -1;
  return Sent::kBroken;
}

bool ControlClient::send(const ControlMessage& message) {
  if (path_.empty() || path_.size() >= sizeof(sockaddr_un{}.sun_path)) return false;
  bool reused = fd_ >= 0;
  if (!reused && !connect_now()) return false;
  std::string line = format_control_message(message);
  Sent sent = send_line(line);
  // The launcher closes connections that stay idle too long: one fresh try, so the message
  // that finds its connection closed is not the one lost.
  if (sent == Sent::kBroken && reused && connect_now()) sent = send_line(line);
  return sent == Sent::kWhole;
}

std::optional<std::string> ControlClient::exchange(
    const std::string& line, double timeout_seconds,
    const std::function<bool(std::string_view)>& is_reply) {
  if (path_.empty() || path_.size() >= sizeof(sockaddr_un{}.sun_path)) return std::nullopt;
  const double deadline = monotonic_seconds() + timeout_seconds;
  auto left_ms = [&] {
    return static_cast<int>(std::max(0.0, (deadline - monotonic_seconds()) * 1000));
  };
  // A fresh connection: nothing unread of the old one's replies comes in between.
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!connect_now()) return std::nullopt;
  for (size_t sent = 0; sent < line.size();) {
    ssize_t n = ::send(fd_, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    pollfd p{fd_, POLLOUT, 0};
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && left_ms() > 0 &&
        ::poll(&p, 1, left_ms()) >= 0)
      continue;
    return std::nullopt;
  }
  std::string buffer;
  while (left_ms() > 0) {
    pollfd p{fd_, POLLIN, 0};
    int ready = ::poll(&p, 1, left_ms());
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;
    char chunk[4096];
    ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) break;  // the launcher closed it, or it broke
    buffer.append(chunk, static_cast<size_t>(n));
    for (size_t end; (end = buffer.find('\n')) != std::string::npos;) {
      std::string reply = buffer.substr(0, end);
      buffer.erase(0, end + 1);
      if (is_reply(reply)) return reply;
    }
    if (buffer.size() > kMaxControlLine) break;
  }
  return std::nullopt;
}

std::optional<ReformReply> ControlClient::request_reform(const ReformRequest& request,
                                                         double timeout_seconds) {
  std::optional<std::string> line =
      exchange(format_reform_request(request), timeout_seconds,
               [](std::string_view l) { return parse_reform_reply(l).has_value(); });
  if (!line) return std::nullopt;
  return parse_reform_reply(*line);
}

std::optional<SpareAssignment> ControlClient::request_promotion(const SpareRequest& request,
                                                                double timeout_seconds) {
  std::optional<std::string> line =
      exchange(format_spare_request(request), timeout_seconds,
               [](std::string_view l) { return parse_spare_assignment(l).has_value(); });
  if (!line) return std::nullopt;
  return parse_spare_assignment(*line);
}

std::optional<bool> ControlClient::ask_about_sigterm(const SigtermQuery& query,
                                                     double timeout_seconds) {
  std::optional<std::string> line =
      exchange(format_sigterm_query(query), timeout_seconds,
               [](std::string_view l) { return parse_sigterm_answer(l).has_value(); });
  if (!line) return std::nullopt;
  return parse_sigterm_answer(*line);
}

std::string format_sigterm_query(const SigtermQuery& q) {
  JsonWriter w;
  w.begin_object().key("request").value("sigterm").key("task").value(q.task);
  w.key("attempt").value(q.attempt).key("sender").value(q.sender);
  return w.end_object().str() + "\n";
}

std::optional<SigtermQuery> parse_sigterm_query(std::string_view json) {
  try {
    JsonDocument doc = JsonDocument::parse(json, "sigterm query");
    JsonNode root = doc.root();
    if (root.at("request").as_string() != "sigterm") return std::nullopt;
    SigtermQuery q;
    q.task = root.at("task").as_string();
    q.attempt = static_cast<int>(root.at("attempt").as_int(0, 1 << 30));
    q.sender = static_cast<int>(root.at("sender").as_int(0, 1 << 30));
    return q;
  } catch (const ConfigError&) {
    return std::nullopt;
  }
}

std::string format_sigterm_answer(bool job_stop) {
  JsonWriter w;
  w.begin_object().key("request").value("sigterm").key("ok").value(true);
  w.key("job_stop").value(job_stop);
  return w.end_object().str() + "\n";
}

std::optional<bool> parse_sigterm_answer(std::string_view line) {
  try {
    JsonDocument doc = JsonDocument::parse(line, "sigterm answer");
    JsonNode root = doc.root();
    std::optional<JsonNode> request = root.find("request");
    if (!request || !request->is_string() || request->as_string() != "sigterm") return std::nullopt;
    std::optional<JsonNode> job_stop = root.find("job_stop");
    if (!root.at("ok").as_bool() || !job_stop) return false;
    return job_stop->as_bool();
  } catch (const ConfigError&) {
    return std::nullopt;
  }
}

std::string format_spare_request(const SpareRequest& r) {
  JsonWriter w;
  w.begin_object().key("request").value("spare").key("spare").value(r.spare);
  w.key("pid").value(r.pid);
  return w.end_object().str() + "\n";
}

std::optional<SpareRequest> parse_spare_request(std::string_view json) {
  try {
    JsonDocument doc = JsonDocument::parse(json, "spare request");
    JsonNode root = doc.root();
    if (root.at("request").as_string() != "spare") return std::nullopt;
    SpareRequest r;
    r.spare = root.at("spare").as_string();
    r.pid = static_cast<int>(root.at("pid").as_int(1, 1 << 30));
    return r;
  } catch (const ConfigError&) {
    return std::nullopt;
  }
}

std::string format_spare_assignment(const SpareAssignment& a) {
  JsonWriter w;
  w.begin_object().key("request").value("spare").key("ok").value(a.ok);
  if (a.ok) {
    w.key("task").value(a.task).key("generation").value(a.generation);
    w.key("tf_config").value(a.tf_config);
    if (!a.members.empty()) w.key("members").value(a.members);
  } else {
    w.key("error").value(a.error);
  }
  return w.end_object().str() + "\n";
}

std::optional<SpareAssignment> parse_spare_assignment(std::string_view line) {
  try {
    JsonDocument doc = JsonDocument::parse(line, "spare assignment");
    JsonNode root = doc.root();
    std::optional<JsonNode> request = root.find("request");
    if (!request || !request->is_string() || request->as_string() != "spare") return std::nullopt;
    SpareAssignment a;
    a.ok = root.at("ok").as_bool();
    if (a.ok) {
      a.task = root.at("task").as_string();
      a.generation = static_cast<int>(root.at("generation").as_int(0, 1 << 30));
      a.tf_config = root.at("tf_config").as_string();
      if (auto members = root.find("members")) a.members = members->as_string();
    } else if (auto error = root.find("error")) {
      a.error = error->as_string();
    }
    return a;
  } catch (const ConfigError&) {
    return std::nullopt;
  }
}

}  // namespace dtrain::common
