// The text of slurm.conf for the test cluster of slurm_cluster.h: the daemons' settings (every
// state, spool, pid and log file under one dir), the nodes and one default partition. A pure
// function of its input: it writes no file, picks no port and checks nothing.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace dtrain::testing {

/// What varies between test clusters; each field goes into the text as given.
struct SlurmConfigInput {
  std::string cluster;      ///< ClusterName (lower-case letters and digits)
  std::string host;         ///< this machine's short name: SlurmctldHost and each NodeHostname
  int controller_port = 0;  ///< SlurmctldPort
  /// Holds munge.socket, state/, spool-<node>/, the pid and log files and plugstack.conf.
  std::string dir;
  std::vector<std::pair<std::string, int>> nodes;  ///< NodeName and slurmd Port; all 127.0.0.1
  int cpus_per_node = 0;
  std::string partition;  ///< the default partition, holding every node
};

/// The whole slurm.conf (Slurm 22.05); slurm_config.cc notes why each unusual setting is there.
std::string slurm_conf_text(const SlurmConfigInput& input);

}  // namespace dtrain::testing
