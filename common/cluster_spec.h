// The cluster of a job or a TF_CONFIG: task types, their addresses, and TensorFlow's rules for
// who is chief and where each task sits in the training ring. Knows nothing of processes.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/json.h"

namespace dtrain::common {

inline constexpr const char* kChief = "chief";
inline constexpr const char* kWorker = "worker";
inline constexpr const char* kEvaluator = "evaluator";
inline constexpr const char* kPs = "ps";

/// One task of the cluster, e.g. {"worker", 1}.
struct TaskId {
  std::string type;
  int index = 0;
  bool operator==(const TaskId& other) const { return type == other.type && index == other.index; }
  bool operator<(const TaskId& other) const {
    return type != other.type ? type < other.type : index < other.index;
  }
  /// "worker:1", the form `dtrain tf-config --task` takes.
  std::string text() const;
};

/// "worker:1" -> {"worker", 1}. Throws ConfigError naming what is wrong.
TaskId parse_task_id(const std::string& text);

/// host and port of "host:port" or "[v6]:port".
struct HostPort {
  std::string host;
  int port = 0;
};

/// Splits and checks an address; errors are ConfigError "<where>: \"<text>\" has no port" etc.
/// A host is a name or IPv4 address (letters, digits, '-', '.', '_'; no leading '-' or '.'),
/// or an IPv6 address in brackets.
HostPort parse_host_port(const std::string& text, const std::string& where);

/// The same text for two addresses that name the same socket: case, IPv6 spelling and the
/// loopback's names ("localhost", 127.0.0.1, ::1) do not count.
std::string address_key(const HostPort& address);

/// Task types mapped to addresses, in the order they were written (TF_CONFIG keeps that order).
class ClusterSpec {
 public:
  using Job = std::pair<std::string, std::vector<std::string>>;

  ClusterSpec() = default;
  explicit ClusterSpec(std::vector<Job> jobs) : jobs_(std::move(jobs)) {}
  ClusterSpec(std::initializer_list<Job> jobs) : jobs_(jobs) {}

  /// Reads and validates an object like {"worker": ["h:1", "h:2"]}. allowed_types lists the task
  /// types accepted; rules: addresses are "host:port" with port 1-65535, no address twice (by
  /// address_key), at most one chief and one evaluator, at least one chief or worker.
  static ClusterSpec from_json(const JsonNode& node, const std::vector<std::string>& allowed_types);

  const std::vector<Job>& jobs() const { return jobs_; }
  /// Addresses of a task type; empty when the type is absent.
  const std::vector<std::string>& addresses(const std::string& type) const;
  int count(const std::string& type) const { return static_cast<int>(addresses(type).size()); }
  bool has(const TaskId& task) const { return task.index >= 0 && task.index < count(task.type); }
  const std::string& address(const TaskId& task) const;

  /// Every task, job by job in document order.
  std::vector<TaskId> tasks() const;
  /// The tasks that train together (chief, then workers), in ring order.
  std::vector<TaskId> training_tasks() const;
  /// TensorFlow's chief: the "chief" task if there is one, else worker 0.
  TaskId chief() const;
  bool is_chief(const TaskId& task) const { return task == chief(); }
  /// Position in the training ring: chief 0, worker i -> i + number of chiefs; nullopt for
  /// evaluator and ps tasks, which do not train.
  std::optional<int> ring_rank(const TaskId& task) const;
  int ring_size() const { return count(kChief) + count(kWorker); }

  /// Compact JSON as TensorFlow's Python json.dumps writes it: {"worker": ["h:1", "h:2"]}.
  std::string to_python_json() const;

 private:
  std::vector<Job> jobs_;
};

}  // namespace dtrain::common
