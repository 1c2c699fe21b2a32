// How many NVIDIA GPUs a process may use, from the kernel driver's files (one folder per GPU, named
// by PCI bus id, under /proc/driver/nvidia/gpus/) and CUDA_VISIBLE_DEVICES. It loads no CUDA
// library, creates no CUDA context, starts no process, and only lists one folder, so it cannot
// hang. It does not check that a GPU works, that a UUID names a real GPU, or MIG slices: the CUDA
// runtime answers those when a worker trains.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::common {

/// GPU folders under <proc_root>/driver/nvidia/gpus: the host's (or container's) NVIDIA GPUs.
/// 0 when the folder is absent (no NVIDIA driver loaded) or unreadable. Never throws.
int count_driver_gpus(const std::string& proc_root = "/proc");

/// A CUDA_VISIBLE_DEVICES entry as a device index: "3" -> 3; "-1", "", "GPU-..", "1x" -> nullopt.
std::optional<int> parse_gpu_index(std::string_view entry);

/// The GPUs CUDA would show, in its order, named as CUDA_VISIBLE_DEVICES entries, on a host with
/// device_count GPUs. Unset (nullopt): "0".."device_count-1". Set: its comma-separated entries
/// (spaces trimmed) up to the first invalid one, at most device_count of them. An entry is valid
/// when it is an index below device_count or a "GPU-"/"MIG-" UUID not seen before. So "" and
/// "-1" show none, "0,1" on a one-GPU host shows "0", and "1,-1,0" shows "1".
std::vector<std::string> visible_gpu_names(const std::optional<std::string>& cuda_visible_devices,
                                           int device_count);

/// visible_gpu_names(cuda_visible_devices, count_driver_gpus(proc_root)).size(): the GPUs a process
/// with that CUDA_VISIBLE_DEVICES (nullopt: unset, which shows all) may use. An empty string is
/// set, and shows none, as in CUDA. Never throws, never blocks.
int count_visible_gpus(const std::optional<std::string>& cuda_visible_devices,
                       const std::string& proc_root = "/proc");

}  // namespace dtrain::common
