// The Slurm test bed itself (test/support/slurm_cluster.h): srun spreads tasks over both nodes, a
// batch job gets the allocation it asked for and runs steps on a chosen node, two steps share a
// node at once, a requeued job runs again, scancel --signal reaches the steps but not the batch
// shell, and a destroyed fixture leaves no daemon, job process or file behind. Skips, with a WARN
// naming the reason, where the machine refuses (not root, Slurm or munge not installed).
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "test/support/slurm_cluster.h"

using dtrain::testing::process_alive;
using dtrain::testing::SlurmCluster;

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

/// Writes "#!/bin/bash\n" + body to dir/name, executable, with every "@D@" in body replaced by
/// dir; returns the path.
std::string write_script(const std::string& dir, const std::string& name, std::string body) {
  for (size_t at = body.find("@D@"); at != std::string::npos; at = body.find("@D@", at)) {
    body.replace(at, 3, dir);
  }
  std::string path = dir + "/" + name;
  std::ofstream(path) << "#!/bin/bash\n" << body;
  ::chmod(path.c_str(), 0755);
  return path;
}

/// Polls every 50 ms until path exists and holds `text`, or timeout_seconds passed.
bool wait_for_text(const std::string& path, const std::string& text, double timeout_seconds) {
  auto start = std::chrono::steady_clock::now();
  while (!std::filesystem::exists(path) || read_file(path).find(text) == std::string::npos) {
    if (seconds_since(start) > timeout_seconds) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

/// Pids of processes whose command line names dir (the fixture's daemons).
std::vector<int> processes_naming(const std::string& dir) {
  std::vector<int> pids;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = read_file("/proc/" + name + "/cmdline");
    if (cmdline.find(dir + "/") != std::string::npos && process_alive(std::stoi(name))) {
      pids.push_back(std::stoi(name));
    }
  }
  return pids;
}

std::string comm(int pid) {
  std::string text = read_file("/proc/" + std::to_string(pid) + "/comm");
  return text.substr(0, text.find('\n'));
}

}  // namespace

TEST_CASE("srun -N2 -n4 runs two tasks on each node") {
  SlurmCluster cluster;
  SKIP_UNLESS_SLURM(cluster);
  REQUIRE(cluster.node_names() == std::vector<std::string>{"n1", "n2"});
  auto r = cluster.run(
      {"srun", "-N2", "-n4", "--ntasks-per-node=2", "-l", "printenv", "SLURMD_NODENAME"});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  std::map<std::string, int> tasks_on;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) ++tasks_on[line.substr(line.find(' ') + 1)];
  CHECK(tasks_on == std::map<std::string, int>{{"n1", 2}, {"n2", 2}});
}

TEST_CASE("a batch job gets its allocation and runs a step on a chosen node") {
  SlurmCluster cluster;
  SKIP_UNLESS_SLURM(cluster);
  std::string script =
      write_script(cluster.dir(), "batch.sh", R"sh(#SBATCH -N2 -n4 --ntasks-per-node=2
echo "$SLURM_JOB_NODELIST $SLURM_TASKS_PER_NODE $SLURM_JOB_ID" > @D@/batch.txt
srun --nodes=1 --ntasks=1 --nodelist=n2 --exact printenv SLURMD_NODENAME >> @D@/batch.txt
)sh");
  std::string id = cluster.sbatch(script);
  CHECK(cluster.wait_job_state(id, {"COMPLETED", "FAILED", "CANCELLED"}, 30) == "COMPLETED");
  auto info = cluster.job_info(id);
  CHECK(info["ExitCode"] == "0:0");
  CHECK(info["BatchFlag"] == "1");
  CHECK(info["NodeList"] == "n[1-2]");
  CHECK(read_file(cluster.dir() + "/batch.txt") == "n[1-2] 2(x2) " + id + "\nn2\n");
  CHECK(cluster.job_info("999999").empty());
  CHECK_THROWS_WITH(cluster.sbatch(cluster.dir() + "/no-such-script.sh"),
                    Catch::Contains("sbatch --parsable") && Catch::Contains("no-such-script"));
}

TEST_CASE("two single-task steps run on one node at the same time") {
  SlurmCluster cluster;
  SKIP_UNLESS_SLURM(cluster);
  // Each step marks its start, then waits (15 s at most) for the other's mark: both exit 0 only
  // if both ran at once.
  const std::string& d = cluster.dir();
  std::string script = write_script(d, "steps.sh", R"sh(#SBATCH -N2 -n4 --ntasks-per-node=2
W='touch "$1/step-$2"
for i in $(seq 150); do [ -e "$1/step-$3" ] && exit 0; sleep 0.1; done
exit 1'
srun --nodes=1 --ntasks=1 --nodelist=n1 --exact bash -c "$W" step @D@ a b &
A=$!
srun --nodes=1 --ntasks=1 --nodelist=n1 --exact bash -c "$W" step @D@ b a &
B=$!
wait $A; echo a=$? >> @D@/steps.txt
wait $B; echo b=$? >> @D@/steps.txt
)sh");
  std::string id = cluster.sbatch(script);
  CHECK(cluster.wait_job_state(id, {"COMPLETED", "FAILED", "CANCELLED"}, 40) == "COMPLETED");
  INFO(read_file(d + "/slurm-" + id + ".out"));
  CHECK(read_file(d + "/steps.txt") == "a=0\nb=0\n");
}

TEST_CASE("a job that requeues itself runs again and completes") {
  SlurmCluster cluster;
  SKIP_UNLESS_SLURM(cluster);
  std::string log = cluster.dir() + "/requeue.txt";
  std::string script = write_script(cluster.dir(), "requeue.sh", R"sh(#SBATCH -N1 -n1
if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then
  echo "first $(date +%s.%N)" >> @D@/requeue.txt
  scontrol requeue $SLURM_JOB_ID
  sleep 60
else
  echo "second $(date +%s.%N)" >> @D@/requeue.txt
fi
)sh");
  std::string id = cluster.sbatch(script, {"--requeue"});
  REQUIRE(wait_for_text(log, "first", 30));
  auto requeued = std::chrono::steady_clock::now();
  REQUIRE(wait_for_text(log, "second", 60));
  double restart_seconds = seconds_since(requeued);
  CHECK(cluster.wait_job_state(id, {"COMPLETED", "FAILED", "CANCELLED"}, 30) == "COMPLETED");
  CHECK(cluster.job_info(id)["Restarts"] == "1");
  std::istringstream runs(read_file(log));
  std::string first, second;
  double first_at = 0, second_at = 0;
  runs >> first >> first_at >> second >> second_at;
  CHECK(first == "first");
  CHECK(second == "second");
  WARN("requeued job started again " << second_at - first_at << " s after its first run ("
                                     << restart_seconds << " s as seen by the test)");
}

TEST_CASE("scancel --signal=TERM reaches the step, not the batch shell; scancel ends it all") {
  SlurmCluster cluster;
  SKIP_UNLESS_SLURM(cluster);
  const std::string& d = cluster.dir();
  std::string script = write_script(d, "term.sh", R"sh(#SBATCH -N1 -n1
trap 'echo batch-got-term >> @D@/batch.txt' TERM
srun --nodes=1 --ntasks=1 bash -c \
  'trap "echo got-term > @D@/step.txt; exit 143" TERM; touch @D@/ready; sleep 60 & wait' &
wait $!
echo step-ended $? >> @D@/batch.txt
sleep 60 &
wait $!
)sh");
  std::string id = cluster.sbatch(script);
  REQUIRE(wait_for_text(d + "/ready", "", 30));
  auto r = cluster.run({"scancel", "--signal=TERM", id});
  REQUIRE(r.exit_code == 0);
  CHECK(wait_for_text(d + "/step.txt", "got-term", 10));
  CHECK(wait_for_text(d + "/batch.txt", "step-ended", 10));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  std::string batch = read_file(d + "/batch.txt");
  INFO(batch);
  // The batch shell must not get TERM without --full/--batch (scancel(1)).
  CHECK(batch.find("batch-got-term") == std::string::npos);
  CHECK(cluster.job_info(id)["JobState"] == "RUNNING");
  CHECK_FALSE(cluster.job_processes().empty());

  REQUIRE(cluster.run({"scancel", id}).exit_code == 0);
  CHECK(cluster.wait_job_state(id, {"CANCELLED"}, 15) == "CANCELLED");
  auto start = std::chrono::steady_clock::now();
  while (!cluster.job_processes().empty() && seconds_since(start) < 5) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(cluster.job_processes().empty());
}

TEST_CASE("a destroyed cluster leaves no daemon, job process or dir behind") {
  auto setup_start = std::chrono::steady_clock::now();
  auto cluster = std::make_unique<SlurmCluster>();
  double setup_seconds = seconds_since(setup_start);
  SKIP_UNLESS_SLURM(*cluster);
  std::string dir = cluster->dir();
  // Steps and batch shell ignore TERM: the destructor must get past them on its own.
  std::string script = write_script(dir, "stubborn.sh", R"sh(#SBATCH -N2 -n2
trap '' TERM
srun bash -c 'trap "" TERM; touch @D@/started-$SLURM_PROCID; sleep 300' &
sleep 300
)sh");
  std::string id = cluster->sbatch(script);
  CHECK(cluster->wait_job_state(id, {"RUNNING"}, 30) == "RUNNING");
  REQUIRE(wait_for_text(dir + "/started-0", "", 30));
  REQUIRE(wait_for_text(dir + "/started-1", "", 30));
  // A step touches its file just before it runs sleep, and the batch shell runs its own sleep
  // after starting srun: on a busy machine one may not sleep yet. Look again until all three do
  // (at most 30 s).
  std::vector<int> jobs, daemons;
  std::multiset<std::string> names;
  for (auto look = std::chrono::steady_clock::now();;) {
    jobs = cluster->job_processes();
    daemons = processes_naming(dir);
    names.clear();
    for (int pid : daemons) names.insert(comm(pid));
    for (int pid : jobs) names.insert(comm(pid));
    if (names.count("sleep") >= 3 || seconds_since(look) > 30) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  INFO("processes: " << names.size());
  CHECK(names.count("munged") == 1);
  CHECK(names.count("slurmctld") == 1);
  CHECK(names.count("slurmd") == 2);
  CHECK(names.count("slurmstepd") == 3);  // batch step + step 0 on each node
  CHECK(names.count("sleep") == 3);

  auto teardown_start = std::chrono::steady_clock::now();
  cluster.reset();
  double teardown_seconds = seconds_since(teardown_start);
  WARN("set-up " << setup_seconds << " s, tear-down with a stubborn job " << teardown_seconds
                 << " s");
  for (int pid : daemons) CHECK_FALSE(process_alive(pid));
  for (int pid : jobs) CHECK_FALSE(process_alive(pid));
  CHECK_FALSE(std::filesystem::exists(dir));
}
