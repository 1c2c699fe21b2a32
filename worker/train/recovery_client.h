// The worker's recovery client (docs/design.md#the-workers-recovery-client): the one object that
// owns the group (comm::GroupCommunicator), its generation and, in an elastic job, its members,
// asks the launcher for the next generation when the group breaks (the reform request), joins
// it and there shares the whole state the trainer hands it (whole_state.h). The trainer sees it
// through Recovery and knows nothing of the launcher or the control protocol. It does not take
// signals (the notice and the SIGTERMs are worker/main.cc's) nor make communicators (its factory
// does).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/control_protocol.h"
#include "common/errors.h"
#include "common/progress_record.h"
#include "worker/comm/communicator.h"
#include "worker/comm/group_communicator.h"
#include "worker/comm/membership.h"
#include "worker/comm/ring_identity.h"
#include "worker/train/model_tensors.h"
#include "worker/train/whole_state.h"

namespace dtrain::train {

/// No recovery in place after the group broke: not in place, or the launcher refused the reform
/// request (the message names its reason) or did not answer it. The worker ends with the
/// group's error, as a worker without recovery in place does.
class NoRecovery : public common::IoError {
 public:
  using common::IoError::IoError;
};

/// What the trainer sees of recovery in place. Called from the trainer's thread only.
class Recovery {
 public:
  virtual ~Recovery() = default;
  /// The group's generation now (DTRAIN_GENERATION at the start, then each re-formation's).
  virtual int generation() const = 0;
  /// True when a broken group may re-form in place (rejoin may succeed): the trainer then keeps
  /// whole steps (docs/design.md#in-place-recovery).
  virtual bool in_place() const = 0;
  /// Elastic jobs (docs/design.md#elastic-membership): the virtual shards this member holds in
  /// this generation. nullopt: not elastic (each member holds its own rank's shard).
  virtual std::optional<comm::ShardPlan> shards() const = 0;
  /// After a collective failed with comm::GroupBroken (`what`, the step in flight abandoned when
  /// in_flight): leaves the broken group, asks the launcher for the next generation, joins it and
  /// shares the newest whole state there (held: this member's, which it holds; held.global_step
  /// is the whole step the request names). Returns the shared Position, the named set's device
  /// buffers already holding its tensors. Throws NoRecovery (above), or comm::GroupBroken when
  /// the next generation failed to form or broke while the state was shared (call again).
  /// Blocks up to the reply's time-out plus the rendezvous's.
  virtual Position rejoin(const std::string& what, bool in_flight, ModelTensors& tensors,
                          const HeldState& held) = 0;
};

struct RecoveryOptions {
  std::string task = "worker:0";  ///< names this worker to the launcher
  int attempt = 0;
  /// This worker's place in the whole cluster (rank, size V, peers), and the generation it
  /// starts in.
  comm::RingIdentity ring;
  /// Elastic jobs: the starting generation's members (ring ranks, ascending, ring.rank among
  /// them). nullopt: not elastic, every rank of the cluster is a member.
  std::optional<std::vector<int>> members;
  /// The launcher answers reform requests (DTRAIN_RECOVERY "in_place").
  bool in_place = false;
  /// How long a reform request waits for the launcher's answer (which waits up to 10 s for a
  /// failure to explain the break).
  double reply_seconds = 30;
  /// How many times a group that broke before it first formed asks for the next generation.
  int start_reforms = 5;
};

class RecoveryClient final : public Recovery {
 public:
  /// Makes the communicator of ring (the members' ring in an elastic job; its generation set):
  /// blocks for the rendezvous; IoError when it fails, ConfigError when it cannot fit.
  using Factory = std::function<std::unique_ptr<comm::Communicator>(const comm::RingIdentity&)>;

  /// control and record (either may be disabled or null) must outlive this.
  RecoveryClient(RecoveryOptions options, Factory factory, common::ControlClient& control,
                 common::ProgressRecordWriter* record = nullptr);
  ~RecoveryClient() override;

  /// Forms the starting generation's group (blocking for its rendezvous) and returns it. In
  /// place, a group that breaks before it first forms (a member killed while it loaded its
  /// data) asks the launcher for the next generation, up to start_reforms times. Throws
  /// comm::GroupBroken when it cannot form, ConfigError from the factory.
  comm::GroupCommunicator& form();
  /// The group form() made (form() first). Lives as long as this object.
  comm::GroupCommunicator& group();
  /// From now on a broken group does not re-form (rejoin throws NoRecovery): the trainer cannot
  /// keep whole steps on this worker's device and transport.
  void give_up_in_place() { options_.in_place = false; }

  int generation() const override { return generation_; }
  bool in_place() const override { return options_.in_place; }
  std::optional<comm::ShardPlan> shards() const override;
  /// The generation's members (ring ranks, ascending): every rank when not elastic.
  const std::vector<int>& members() const { return members_; }
  bool elastic() const { return options_.members.has_value(); }
  /// The cluster's ring: rank and size V (whatever the members).
  const comm::RingIdentity& ring() const { return options_.ring; }

  Position rejoin(const std::string& what, bool in_flight, ModelTensors& tensors,
                  const HeldState& held) override;

 private:
  /// Sends the reform request for the generation now and takes the launcher's answer: the next
  /// generation and its members. Throws NoRecovery when there is none.
  void ask_launcher(const std::string& what, int64_t whole_step, bool in_flight);
  /// The ring generation g's communicator joins: this worker's, cut down to the members.
  comm::RingIdentity ring_of(int generation) const;

  RecoveryOptions options_;
  Factory factory_;
  common::ControlClient& control_;
  common::ProgressRecordWriter* record_;
  int generation_ = 0;
  std::vector<int> members_;
  std::unique_ptr<comm::GroupCommunicator> group_;
};

}  // namespace dtrain::train
