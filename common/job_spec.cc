// Job-file schema: see job_spec.h and docs/job-file.md.
#include "common/job_spec.h"

#include <cctype>
#include <limits>

#include "common/atomic_file.h"
#include "common/env_vars.h"
#include "common/errors.h"
#include "common/json.h"
#include "common/ports.h"

namespace dtrain::common {
namespace {

constexpr int kMaxWorkers =
    4096;  // issue 25: a launcher holds ~3 fds per worker, see raise_open_file_limit()
constexpr double kMaxSeconds = 7 * 24 * 3600.0;

bool is_valid_job_name(const std::string& name) {
  if (name.empty() || name.size() > 64 || !std::isalnum(static_cast<unsigned char>(name[0])))
    return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.')
      return false;
  }
  return true;
}

bool is_valid_env_name(const std::string& name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}

std::vector<std::string> parse_argv(const JsonNode& node) {
  std::vector<std::string> argv;
  for (const JsonNode& item : node.as_array()) argv.push_back(item.as_string());
  if (argv.empty()) node.fail("expected a non-empty list of strings (program and arguments)");
  if (argv[0].empty()) node.fail("the program name (first element) is empty");
  return argv;
}

double parse_seconds(const JsonNode& node, double min) {
  return node.as_number(min, kMaxSeconds);
}

RestartPolicy parse_restart(const JsonNode& node) {
  node.check_keys({"max_restarts", "max_preemptions", "backoff_seconds", "backoff_max_seconds",
                   "grace_seconds", "startup_seconds", "healthy_seconds"});
  RestartPolicy policy;
  if (auto n = node.find("max_restarts"))
    policy.max_restarts = static_cast<int>(n->as_int(0, 1000000));
  if (auto n = node.find("max_preemptions"))
    policy.max_preemptions = static_cast<int>(n->as_int(0, 1000000));
  if (auto n = node.find("backoff_seconds")) policy.backoff_seconds = parse_seconds(*n, 0);
  if (auto n = node.find("backoff_max_seconds")) policy.backoff_max_seconds = parse_seconds(*n, 0);
  if (auto n = node.find("grace_seconds")) policy.grace_seconds = parse_seconds(*n, 0);
  if (auto n = node.find("startup_seconds")) policy.startup_seconds = parse_seconds(*n, 0);
  if (auto n = node.find("healthy_seconds")) policy.healthy_seconds = parse_seconds(*n, 0);
  if (policy.backoff_max_seconds < policy.backoff_seconds) {
    node.at("backoff_max_seconds")
        .fail(fmt::format("must be at least backoff_seconds ({})", policy.backoff_seconds));
  }
  return policy;
}

std::vector<std::pair<std::string, std::string>> parse_env(const JsonNode& node) {
  std::vector<std::pair<std::string, std::string>> env;
  for (const auto& [name, value] : node.as_object()) {
    if (!is_valid_env_name(name)) {
      value.fail(fmt::format("\"{}\" is not a valid environment variable name", name));
    }
    if (is_reserved_env_name(name)) {
      value.fail(fmt::format("{} is set by the launcher and cannot be overridden", name));
    }
    env.emplace_back(name, value.as_string());
  }
  return env;
}

std::string parse_sbatch_value(const JsonNode& node) {
  std::string value = node.as_string();
  for (char c : value) {
    if (c == '\n' || c == '\r' || c == '\0') node.fail("must be one line");
  }
  return value;
}

SlurmOptions parse_slurm(const JsonNode& node) {
  node.check_keys({"port_base", "srun", "nodes", "tasks_per_node", "cpus_per_task", "gpus_per_task",
                   "time", "partition", "signal_lead_seconds", "sbatch"});
  SlurmOptions slurm;
  if (auto n = node.find("port_base")) slurm.port_base = static_cast<int>(n->as_int(1, 65535));
  if (auto n = node.find("srun")) slurm.srun = parse_argv(*n);
  if (auto n = node.find("nodes")) slurm.nodes = static_cast<int>(n->as_int(1, kMaxWorkers));
  if (auto n = node.find("tasks_per_node"))
    slurm.tasks_per_node = static_cast<int>(n->as_int(1, kMaxWorkers));
  if (auto n = node.find("cpus_per_task"))
    slurm.cpus_per_task = static_cast<int>(n->as_int(1, 4096));
  if (auto n = node.find("gpus_per_task")) slurm.gpus_per_task = static_cast<int>(n->as_int(0, 64));
  if (auto n = node.find("time")) slurm.time = parse_sbatch_value(*n);
  if (auto n = node.find("partition")) slurm.partition = parse_sbatch_value(*n);
  if (auto n = node.find("signal_lead_seconds")) slurm.signal_lead_seconds = parse_seconds(*n, 1);
  if (auto n = node.find("sbatch")) {
    for (const JsonNode& item : n->as_array()) slurm.sbatch.push_back(parse_sbatch_value(item));
  }
  if (slurm.nodes * slurm.tasks_per_node > kMaxWorkers) {
    node.at("tasks_per_node")
        .fail(fmt::format("nodes x tasks_per_node is more than {} workers", kMaxWorkers));
  }
  return slurm;
}

void parse_cluster_or_workers(const JsonNode& root, JobSpec& spec) {
  std::optional<JsonNode> cluster = root.find("cluster");
  std::optional<JsonNode> workers = root.find("workers");
  if (cluster && workers) {
    workers->fail("give either \"cluster\" or \"workers\", not both");
  }
  std::optional<JsonNode> slurm = root.find("slurm");
  if (cluster && cluster->is_string()) {
    if (cluster->as_string() != "slurm") {
      cluster->fail(fmt::format("expected an object of task addresses or \"slurm\", found {}",
                                cluster->describe()));
    }
    spec.slurm = true;
    if (slurm) spec.slurm_options = parse_slurm(*slurm);
    return;
  }
  if (slurm) slurm->fail("only for a job with \"cluster\": \"slurm\"");
  if (cluster) {
    spec.cluster = ClusterSpec::from_json(*cluster, {kChief, kWorker, kEvaluator});
  } else if (workers) {
    spec.auto_workers = static_cast<int>(workers->as_int(1, kMaxWorkers));
  } else {
    root.fail("missing \"cluster\" (TF_CONFIG-style addresses) or \"workers\" (a count)");
  }
}

// In place needs dtrain-worker: it undoes a cut-off step and re-forms its group; a `command`
// program owns its state, so only the whole group can start again
// (docs/design.md#in-place-recovery).
RecoveryMode parse_recovery(const JsonNode& root, bool command_job) {
  std::optional<JsonNode> n = root.find("recovery");
  if (!n) return command_job ? RecoveryMode::kRestart : RecoveryMode::kInPlace;
  std::string mode = n->as_string();
  if (mode != "in_place" && mode != "restart")
    n->fail(fmt::format("expected \"in_place\" or \"restart\", found {}", n->describe()));
  if (mode == "restart") return RecoveryMode::kRestart;
  if (command_job) {
    n->fail(
        "\"in_place\" needs dtrain-worker: a \"command\" program owns its state, so only the "
        "whole group can restart (remove \"recovery\" or set it to \"restart\")");
  }
  return RecoveryMode::kInPlace;
}

void parse_fields(const JsonNode& root, JobSpec& spec) {
  root.check_keys({"job", "cluster", "workers", "restart", "train", "command", "env", "run_dir",
                   "hang_timeout_seconds", "remote_shell", "success", "gpu_sharing", "slurm",
                   "master_port", "recovery", "spares", "elastic", "freeze_seconds"});
  JsonNode job = root.at("job");
  spec.job = job.as_string();
  if (!is_valid_job_name(spec.job)) {
    job.fail(
        fmt::format("{} is not a valid job name (1-64 letters, digits, '.', '_' or '-', "
                    "starting with a letter or digit)",
                    job.describe()));
  }
  parse_cluster_or_workers(root, spec);
  if (auto n = root.find("restart")) spec.restart = parse_restart(*n);
  if (auto n = root.find("train")) {
    if (!n->is_object()) n->fail(fmt::format("expected an object, found {}", n->describe()));
    spec.train_json = n->dump();
  }
  if (auto n = root.find("command")) spec.command = parse_argv(*n);
  if (!spec.train_json && spec.command.empty()) {
    root.fail("missing \"train\": dtrain-worker needs a training config (or give \"command\")");
  }
  if (auto n = root.find("env")) spec.env = parse_env(*n);
  spec.run_dir = "runs/" + spec.job;
  if (auto n = root.find("run_dir")) spec.run_dir = n->as_nonempty_string();
  if (auto n = root.find("hang_timeout_seconds"))
    spec.hang_timeout_seconds = parse_seconds(*n, 0.001);
  if (auto n = root.find("freeze_seconds")) spec.freeze_seconds = parse_seconds(*n, 0);
  if (auto n = root.find("remote_shell")) spec.remote_shell = parse_argv(*n);
  if (auto n = root.find("gpu_sharing")) spec.gpu_sharing = n->as_bool();
  if (auto n = root.find("master_port")) spec.master_port = static_cast<int>(n->as_int(1, 65535));
  if (auto n = root.find("success")) {
    std::string rule = n->as_string();
    if (rule != "all" && rule != "chief")
      n->fail(fmt::format("expected \"all\" or \"chief\", found {}", n->describe()));
    spec.success = rule == "chief" ? SuccessRule::kChiefOnly : SuccessRule::kAllTasks;
  }
  spec.recovery = parse_recovery(root, !spec.command.empty());
  if (auto n = root.find("spares")) {
    spec.spares = static_cast<int>(n->as_int(0, kMaxSpares));
    if (spec.spares > 0 && spec.recovery != RecoveryMode::kInPlace) {
      n->fail(
          fmt::format("{} spare(s) need recovery in place: dtrain-worker (no \"command\") and "
                      "no \"recovery\": \"restart\"",
                      spec.spares));
    }
  }
  if (auto n = root.find("elastic")) {
    n->check_keys({"min_workers", "host_discovery", "discovery_interval_seconds"});
    spec.elastic_min_workers = static_cast<int>(n->at("min_workers").as_int(1, kMaxWorkers));
    if (auto d = n->find("host_discovery")) spec.elastic_discovery = parse_argv(*d);
    if (auto d = n->find("discovery_interval_seconds"))
      spec.elastic_discovery_seconds = parse_seconds(*d, 0.1);
    // A command job restarts with the new membership (as torchrun's elastic agent does); a
    // dtrain-worker job re-forms in place.
    if (spec.recovery != RecoveryMode::kInPlace && spec.command.empty()) {
      n->fail(
          "an elastic dtrain-worker job re-forms its group in place: remove \"recovery\": "
          "\"restart\"");
    }
  }
}

}  // namespace

const char* success_rule_name(SuccessRule rule) {
  return rule == SuccessRule::kChiefOnly ? "chief" : "all";
}

const char* recovery_mode_name(RecoveryMode mode) {
  return mode == RecoveryMode::kInPlace ? "in_place" : "restart";
}

JobSpec parse_job_spec(std::string_view text, const std::string& source) {
  JobSpec spec;
  spec.source = source;
  try {
    JsonDocument doc = JsonDocument::parse(text, source);
    parse_fields(doc.root(), spec);
  } catch (const ConfigError& e) {
    std::string message = e.what();
    if (message.rfind(source + ":", 0) == 0) throw;
    throw ConfigError(fmt::format("{}: {}", source, message));
  }
  return spec;
}

JobSpec load_job_spec(const std::string& path) {
  std::string text;
  try {
    text = read_file(path, kMaxJsonFileBytes);
  } catch (const IoError& e) {
    throw ConfigError(fmt::format("job file: {}", e.what()));
  }
  return parse_job_spec(text, path);
}

ClusterSpec resolve_cluster(const JobSpec& spec) {
  DT_ENFORCE(!spec.slurm,
             "a Slurm job's cluster comes from its allocation (launcher/placement/slurm.h)");
  if (spec.auto_workers == 0) return spec.cluster;
  std::vector<std::string> addresses;
  for (int port : pick_free_ports(spec.auto_workers)) {
    addresses.push_back(fmt::format("localhost:{}", port));
  }
  return ClusterSpec({{kWorker, addresses}});
}

std::string job_spec_to_json(const JobSpec& spec, const ClusterSpec& resolved) {
  JsonWriter w;
  w.begin_object().key("job").value(spec.job).key("cluster").raw(resolved.to_python_json());
  const RestartPolicy& r = spec.restart;
  w.key("restart")
      .begin_object()
      .key("max_restarts")
      .value(r.max_restarts)
      .key("max_preemptions")
      .value(r.max_preemptions)
      .key("backoff_seconds")
      .value(r.backoff_seconds)
      .key("backoff_max_seconds")
      .value(r.backoff_max_seconds)
      .key("grace_seconds")
      .value(r.grace_seconds)
      .key("startup_seconds")
      .value(r.startup_seconds)
      .key("healthy_seconds")
      .value(r.healthy_seconds)
      .end_object();
  if (spec.train_json) w.key("train").raw(*spec.train_json);
  if (!spec.command.empty()) {
    w.key("command").begin_array();
    for (const auto& arg : spec.command) w.value(arg);
    w.end_array();
  }
  w.key("env").begin_object();
  for (const auto& [name, value] : spec.env) w.key(name).value(value);
  w.end_object();
  w.key("run_dir").value(spec.run_dir);
  if (spec.hang_timeout_seconds) w.key("hang_timeout_seconds").value(*spec.hang_timeout_seconds);
  w.key("freeze_seconds").value(spec.freeze_seconds);
  w.key("success")
      .value(success_rule_name(spec.success))
      .key("gpu_sharing")
      .value(spec.gpu_sharing)
      .key("recovery")
      .value(recovery_mode_name(spec.recovery));
  if (spec.master_port) w.key("master_port").value(*spec.master_port);
  if (spec.spares > 0) w.key("spares").value(spec.spares);
  if (spec.elastic_min_workers > 0) {
    w.key("elastic").begin_object().key("min_workers").value(spec.elastic_min_workers);
    if (!spec.elastic_discovery.empty()) {
      w.key("host_discovery").begin_array();
      for (const auto& arg : spec.elastic_discovery) w.value(arg);
      w.end_array();
      w.key("discovery_interval_seconds").value(spec.elastic_discovery_seconds);
    }
    w.end_object();
  }
  w.key("remote_shell").begin_array();
  for (const auto& arg : spec.remote_shell) w.value(arg);
  w.end_array();
  return w.end_object().str();
}

}  // namespace dtrain::common
