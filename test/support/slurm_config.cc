// See slurm_config.h. The settings every test cluster shares are one template whose varying parts
// are filled in by name (@CLUSTER@, @HOST@, @PORT@, @DIR@); the nodes and partition are appended.
#include "test/support/slurm_config.h"

namespace dtrain::testing {
namespace {

/// slurm.conf up to the nodes and the partition. Notes on the choices Slurm 22.05 needs here:
/// - AuthInfo cred_expire also holds a requeued job back (BeginTime = requeue + cred_expire + 1;
///   default 120 s); 5 is the least Slurm takes.
/// - SchedulerParameters: a pending job that becomes eligible (a requeued one once its BeginTime
///   passes) otherwise waits for a periodic pass, 60 s (main) or 30 s (backfill).
/// - SlurmdParameters=config_overrides: each node claims 4 CPUs on a 2-core machine.
/// - PlugStackConfig: an empty file, so no site SPANK plugin from /etc/slurm is loaded.
/// - MailProg: slurmctld logs an error at start without an existing one.
constexpr const char* kSlurmConf = R"(ClusterName=@CLUSTER@
SlurmctldHost=@HOST@(127.0.0.1)
SlurmctldPort=@PORT@
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=@DIR@/munge.socket,cred_expire=5
SlurmUser=root
SlurmdUser=root
StateSaveLocation=@DIR@/state
SlurmdSpoolDir=@DIR@/spool-%n
SlurmctldPidFile=@DIR@/slurmctld.pid
SlurmdPidFile=@DIR@/slurmd-%n.pid
SlurmctldLogFile=@DIR@/slurmctld.log
SlurmdLogFile=@DIR@/slurmd-%n.log
PlugStackConfig=@DIR@/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=10
MinJobAge=600
JobRequeue=1
SchedulerParameters=sched_interval=1,bf_interval=1
)";

/// text with every occurrence of each key replaced by its value.
std::string filled(std::string text,
                   const std::vector<std::pair<std::string, std::string>>& values) {
  for (const auto& [key, value] : values) {
    for (size_t at = text.find(key); at != std::string::npos;
         at = text.find(key, at + value.size())) {
      text.replace(at, key.size(), value);
    }
  }
  return text;
}

}  // namespace

std::string slurm_conf_text(const SlurmConfigInput& input) {
  std::string text = filled(kSlurmConf, {{"@CLUSTER@", input.cluster},
                                         {"@HOST@", input.host},
                                         {"@PORT@", std::to_string(input.controller_port)},
                                         {"@DIR@", input.dir}});
  std::string nodes;
  for (const auto& [node, port] : input.nodes) {
    text += "NodeName=" + node + " NodeAddr=127.0.0.1 NodeHostname=" + input.host +
            " Port=" + std::to_string(port) + " CPUs=" + std::to_string(input.cpus_per_node) +
            " State=UNKNOWN\n";
    nodes += (nodes.empty() ? "" : ",") + node;
  }
  text += "PartitionName=" + input.partition + " Nodes=" + nodes +
          " Default=YES MaxTime=INFINITE State=UP\n";
  return text;
}

}  // namespace dtrain::testing
