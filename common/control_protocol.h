// The line protocol between workers and the launcher over DTRAIN_CONTROL: one JSON object per
// line, each naming the task and attempt it comes from. Workers send hello, heartbeat and
// progress; the launcher treats any of them as a sign of life. Formatting and parsing only.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::common {

/// DTRAIN_CONTROL is "unix:<absolute socket path>".
inline constexpr const char* kControlScheme = "unix:";
/// Longest line either side accepts; longer ones close the connection.
inline constexpr size_t kMaxControlLine = 64 * 1024;

/// The "type" of a control line, parsed once; a line of any other type is malformed.
enum class ControlMessageType { kHello, kHeartbeat, kProgress };

/// The wire name: "hello", "heartbeat", "progress".
const char* control_message_type_name(ControlMessageType type);

struct ControlMessage {
  ControlMessageType type = ControlMessageType::kHeartbeat;
  std::string task;  ///< "worker:1"
  int attempt = 0;
  int pid = 0;  ///< in hello
  // progress (absent fields stay empty)
  std::optional<int> epoch, epochs, step, steps;
  std::optional<double> loss, accuracy, samples_per_second;
  /// A language model's (docs/language-models.md): samples_per_second x its sequence length.
  std::optional<double> tokens_per_second;
  /// In every progress message of dtrain-worker: steps done in the run, across epochs (the
  /// checkpoints' global step).
  std::optional<int64_t> global_step;
  /// Sent once by each training worker right after it restored a checkpoint or found none: the
  /// global step it resumes from (0 on a fresh start). dtrain-worker sends it in a heartbeat.
  std::optional<int64_t> restored_step;
  /// Per step, averaged since the sender's previous progress message: seconds this task spent
  /// computing (forward, backward, optimizer), and seconds it waited for the all-reduces (its
  /// peers' lateness plus the transfer). The straggler of a synchronous group computes longest
  /// and waits least; its peers wait for it. dtrain-worker sends them on the CPU only.
  std::optional<double> compute_seconds_per_step, wait_seconds_per_step;
  /// The sender's group generation (DTRAIN_GENERATION, then each re-formation in place); sent
  /// by dtrain-worker with restored_step and in progress when it is above 0.
  std::optional<int> generation;
};

/// A training worker whose group broke (a peer died, froze or was cut off) asks the launcher how
/// to go on (docs/design.md#in-place-recovery): one line on its DTRAIN_CONTROL connection,
///   {"request": "reform", "task": "worker:0", "attempt": 0, "generation": 0, "whole_step": 386,
///    "in_flight": true, "what": "worker:1 (rank 1): connection closed"}
/// whole_step: the global step of the newest whole state it holds (after undoing a step that
/// was cut short); -1 when it holds none.
struct ReformRequest {
  std::string task;
  int attempt = 0;
  int generation = 0;  ///< the generation whose group broke
  int64_t whole_step = -1;
  /// It was in a step (whole_step + 1) that it abandoned: the group may have to do it again.
  bool in_flight = false;
  std::string what;  ///< what the worker saw
};

/// The launcher's answer, one line, sent once it has decided (possibly seconds later):
///   {"request": "reform", "ok": true, "generation": 1}: re-form as that generation (every failed
///     task has a replacement with DTRAIN_GENERATION=1);
///   {"request": "reform", "ok": false, "error": "..."}: no recovery in place; exit (the launcher
///     takes the old path: the group restarts from the newest checkpoint).
struct ReformReply {
  bool ok = false;
  int generation = 0;
  std::string error;
  /// Elastic jobs (docs/design.md#elastic-membership): the ring ranks of that generation,
  /// format_members' text ("0,2,3"); empty: every rank of the cluster.
  std::string members = {};
};

/// "0,2,3": ring ranks, ascending, comma-separated.
std::string format_members(const std::vector<int>& members);
/// The ranks of format_members' text, each in [0, size), ascending and distinct, at least one;
/// ConfigError naming source otherwise. Empty text: every rank of size.
std::vector<int> parse_members(std::string_view text, int size, std::string_view source);

/// A spare (DTRAIN_SPARE, docs/design.md#spares) waits to be promoted:
///   {"request": "spare", "spare": "spare:0", "pid": 4242}
/// and the launcher answers when it promotes it to a failed task's place, or when the job ends:
///   {"request": "spare", "ok": true, "task": "worker:1", "generation": 2, "tf_config": "..."}
///   {"request": "spare", "ok": false, "error": "the job has ended"}
struct SpareRequest {
  std::string spare;  ///< "spare:0"
  int pid = 0;
};

struct SpareAssignment {
  bool ok = false;
  std::string task;  ///< the task it becomes
  int generation = 0;
  std::string tf_config;  ///< that task's TF_CONFIG text
  std::string error;
  std::string members = {};  ///< elastic: the generation's ring ranks (ReformReply::members)
};

std::string format_spare_request(const SpareRequest& request);
std::optional<SpareRequest> parse_spare_request(std::string_view json);
std::string format_spare_assignment(const SpareAssignment& assignment);
/// An assignment line; nullopt for any other line.
std::optional<SpareAssignment> parse_spare_assignment(std::string_view line);

std::string format_reform_request(const ReformRequest& request);  ///< one line, with newline
/// The request in a parsed control line's JSON text; nullopt when it is not a well-formed one.
std::optional<ReformRequest> parse_reform_request(std::string_view json);
std::string format_reform_reply(const ReformReply& reply);  ///< one line, with newline
/// A reply line; nullopt for any other line (other replies on the same connection).
std::optional<ReformReply> parse_reform_reply(std::string_view line);

/// A training worker in place that got a SIGTERM from a process other than its parent asks the
/// launcher, before it leaves alone, whether the whole job is being stopped (systemctl stop, a
/// kill of the process tree: docs/design.md#in-place-recovery):
///   {"request": "sigterm", "task": "worker:1", "attempt": 0, "sender": 4242}
/// The launcher answers once it knows (it waits a moment for a stop signal of its own):
///   {"request": "sigterm", "ok": true, "job_stop": true}: save with the group and stop;
///   {"request": "sigterm", "ok": true, "job_stop": false}: this worker alone is preempted.
struct SigtermQuery {
  std::string task;
  int attempt = 0;
  int sender = 0;  ///< the SIGTERM's sender (si_pid)
};

std::string format_sigterm_query(const SigtermQuery& query);  ///< one line, with newline
/// The query in a parsed control line's JSON text; nullopt when it is not a well-formed one.
std::optional<SigtermQuery> parse_sigterm_query(std::string_view json);
std::string format_sigterm_answer(bool job_stop);  ///< one line, with newline
/// An answer line's job_stop; nullopt for any other line.
std::optional<bool> parse_sigterm_answer(std::string_view line);

/// A heartbeat of task on attempt from pid.
ControlMessage heartbeat_message(const std::string& task, int attempt, int pid);

/// One line, newline included.
std::string format_control_message(const ControlMessage& message);

/// Parses one line (without newline). Returns nullopt for anything malformed: the launcher logs
/// and drops it rather than trusting it.
std::optional<ControlMessage> parse_control_message(std::string_view line);

/// Whether a control socket served by peer_uid may be trusted by a client running as self_uid:
/// the same user, or root (design.md, "Control protocol").
bool trusted_control_peer(unsigned peer_uid, unsigned self_uid);

/// The uid of the process at the other end of a connected UNIX socket (SO_PEERCRED); nullopt
/// when the kernel does not say.
std::optional<unsigned> control_peer_uid(int fd);

/// Best-effort sender used by workers: connects lazily to DTRAIN_CONTROL, never blocks longer
/// than the kernel's socket buffer allows (non-blocking writes; a full buffer drops the
/// message), and silently does nothing when DTRAIN_CONTROL is unset or the launcher is gone. A
/// connection the launcher has closed (it closes idle ones) is replaced at once, once. A socket
/// served by another user (trusted_control_peer) is not written to.
class ControlClient {
 public:
  /// address: the value of DTRAIN_CONTROL ("" = disabled).
  explicit ControlClient(std::string address);
  ~ControlClient();
  ControlClient(const ControlClient&) = delete;
  ControlClient& operator=(const ControlClient&) = delete;

  /// True when the message was handed to the kernel.
  bool send(const ControlMessage& message);
  /// Sends a reform request and waits up to timeout_seconds for the launcher's reply (lines that
  /// are not one are skipped). nullopt when DTRAIN_CONTROL is unset, the launcher cannot be
  /// reached or does not answer in time.
  std::optional<ReformReply> request_reform(const ReformRequest& request, double timeout_seconds);
  /// Sends a spare's request and waits up to timeout_seconds for its assignment, as
  /// request_reform does.
  std::optional<SpareAssignment> request_promotion(const SpareRequest& request,
                                                   double timeout_seconds);
  /// Asks whether a SIGTERM is the whole job's stop and waits up to timeout_seconds for the
  /// answer, as request_reform does; nullopt when there is none.
  std::optional<bool> ask_about_sigterm(const SigtermQuery& query, double timeout_seconds);
  /// True when DTRAIN_CONTROL names a socket (the client may still fail to reach it).
  bool enabled() const { return !path_.empty(); }

 private:
  /// Writes line on a fresh connection and waits up to timeout_seconds for a line is_reply
  /// accepts (others are skipped); nullopt when unreachable, closed or out of time.
  std::optional<std::string> exchange(const std::string& line, double timeout_seconds,
                                      const std::function<bool(std::string_view)>& is_reply);
  enum class Sent { kWhole, kFull, kBroken };
  bool connect_now();
  Sent send_line(const std::string& line);

  std::string path_;
  int fd_ = -1;
};

}  // namespace dtrain::common
