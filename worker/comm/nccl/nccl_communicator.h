// The Communicator of GPU training: the gradient all-reduce runs as NCCL on a communication
// stream of the model's CUDA device, ordered against its compute stream by events; host-memory
// collectives go to the host communicator it was bootstrapped over. Plain C++: no CUDA or NCCL
// types here, so the factory and the trainer need neither. Does not connect or rendezvous itself.
#pragma once

#include <memory>
#include <string>

#include "worker/comm/communicator.h"
#include "worker/mem/device.h"

namespace dtrain::comm {

/// Builds the NCCL communicator of this rank. bootstrap is an already-connected host communicator
/// (the TCP ring after its authenticated rendezvous, or a SoloCommunicator for a world of one);
/// the result takes it over and has its rank and size. Rank 0 creates the ncclUniqueId and
/// broadcasts it over bootstrap, so the id travels only over the authenticated ring; then every
/// rank calls ncclCommInitRank on the current CUDA device, which must be device's GPU (device must
/// be a CUDA device and outlive the result). Blocks until every rank has joined: the broadcast
/// with the bootstrap's time-outs, ncclCommInitRank with NCCL's own (it has no time-out argument).
/// Throws ConfigError when device is not a CUDA device, IoError when NCCL or CUDA fail.
///
/// The result, on device memory: start_all_reduce() enqueues, never blocking the host and never
/// synchronising a stream, so start and finish may be captured into a CUDA graph together with
/// the compute stream's work. At most 64 all-reduces may be started and not yet finished; the
/// 65th start, a second finish of a ticket, or a finish of an unknown ticket throw EnforceError.
/// Host-memory collectives (all_reduce, broadcast, barrier, all_gather) are the bootstrap's: they
/// do not touch the device, so they neither wait for nor order against started device
/// all-reduces (from the host's point of view those are done once enqueued); they do first throw
/// IoError if NCCL has reported an asynchronous error. One thread at a time. abort() aborts the
/// NCCL communicator (stopping its kernels) and then the bootstrap; it never throws.
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> bootstrap,
                                                     nn::Device& device);

/// True in the CUDA build (NCCL is linked in); false in a CPU-only build. Says nothing about
/// whether a GPU is present (see gpu::probe_build(), which opens no CUDA context).
bool nccl_available();

/// The version of the NCCL library linked at run time, "2.28.9"; "none" in a CPU-only build.
std::string nccl_version_string();

}  // namespace dtrain::comm
