// OpenMPI's all-reduce for comparison with dtrain's transports (scripts/bench-allreduce.sh
// --mpi): MPI_Allreduce of float32 sums, in place, 4 KiB to MAX_BYTES, timed and printed exactly
// as bench/allreduce_bench.cc does (median over iterations, busbw as in nccl-tests). Run with
// `mpirun -np N --mca btl self,vader` for its shared-memory transport. Built only where
// Debian's libopenmpi-dev is installed. Asserts nothing.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  size_t max_bytes = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : size_t{64} << 20;
  if (rank == 0) {
    std::printf(
        "# transport openmpi (MPI_Allreduce, btl self,vader), %d ranks, float32 sum, time "
        "= median over iterations, each on a freshly written buffer\nsize_bytes time_us algbw_GBps "
        "busbw_GBps\n",
        size);
  }
  for (size_t bytes = 4096; bytes <= max_bytes; bytes *= 2) {
    std::vector<float> data(bytes / 4, 1.0f);
    int count = static_cast<int>(data.size());
    int iterations = static_cast<int>(std::clamp<size_t>((size_t{256} << 20) / bytes, 5, 200));
    for (int w = 0; w < 3; ++w)
      MPI_Allreduce(MPI_IN_PLACE, data.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    std::vector<double> times;
    for (int i = 0; i < iterations; ++i) {
      // Untimed, as in allreduce_bench: every rank writes its buffer first.
      std::fill(data.begin(), data.end(), 1.0f);
      MPI_Barrier(MPI_COMM_WORLD);
      auto t = std::chrono::steady_clock::now();
      MPI_Allreduce(MPI_IN_PLACE, data.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count());
    }
    double t = median(times);
    double algbw = static_cast<double>(bytes) / t / 1e9;
    double busbw = algbw * 2.0 * (size - 1) / size;
    if (rank == 0) std::printf("%zu %.1f %.3f %.3f\n", bytes, t * 1e6, algbw, busbw);
  }
  MPI_Finalize();
  return 0;
}
