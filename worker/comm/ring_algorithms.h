// Ring collectives written against a RingLink: all-reduce (reduce-scatter + all-gather), its
// elastic form over a larger virtual ring, chain broadcast, all-gather and barrier, each pipelined
// in slices. Pure algorithms: no sockets, threads, time-outs or retries here (the link owns
// those), and no state kept between calls beyond the caller's scratch buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/comm/ring_link.h"

namespace dtrain::comm {

/// Largest payload of one send_recv call in the sliced collectives.
inline constexpr size_t kSliceBytes = 256 * 1024;

/// Elements [begin, end) of a buffer.
struct IndexRange {
  size_t begin = 0;
  size_t end = 0;
  size_t size() const { return end - begin; }
};

/// dst[i] += src[i], vectorised in fixed blocks; elementwise, so the bits are those of the plain
/// loop. The one addition every reduction here (ring and shared memory) uses.
void add_into(float* __restrict dst, const float* __restrict src, size_t n);
/// data[i] /= divisor, vectorised the same way.
void divide_by(float* __restrict data, size_t n, float divisor);

/// Elements of chunk `chunk` when `count` elements are split over `size` ranks: contiguous, in
/// chunk order, and the first count % size chunks hold one element more.
IndexRange ring_chunk(size_t count, int size, int chunk);

/// In-place all-reduce of count floats over the ring (rank of size). Every rank must call it with
/// the same count, op and slice_bytes. Chunk c is summed as
///   ((x_c + x_{c+1}) + x_{c+2}) + ... + x_{c-1}   (rank indices mod size)
/// on rank c-1 and then copied to every rank, so all ranks end bit-identical, run after run, and
/// slice_bytes does not change the bits. kMean divides the sums by (float)size. scratch is grown
/// to at most one slice and reused across calls. Blocks in link.send_recv; throws what it throws.
void ring_all_reduce(RingLink& link, int rank, int size, float* data, size_t count, ReduceOp op,
                     std::vector<float>& scratch, size_t slice_bytes = kSliceBytes);

/// This rank's part of an elastic all-reduce (docs/design.md#elastic-membership): `held`
/// consecutive virtual ranks of a virtual ring of virtual_size, starting at virtual rank `first`
/// (mod virtual_size); buffers[j] holds count floats of virtual rank (first + j) % virtual_size.
/// Real rank r+1's block starts where rank r's ends (ring order), and the blocks cover the
/// virtual ring once. Afterwards every buffer holds what ring_all_reduce over virtual_size real
/// ranks leaves on each of them, bit for bit, whoever holds which virtual rank. Every rank makes
/// the link calls ring_all_reduce makes on a ring of virtual_size, with the same sizes; transfers
/// between the virtual ranks held here are local adds and copies. link may be null only when
/// size == 1 (then everything is local). Full membership (held == 1, virtual_size == size,
/// first == rank) is ring_all_reduce itself. Blocks and throws as ring_all_reduce does.
void virtual_ring_all_reduce(RingLink* link, int rank, int size, int virtual_size, int first,
                             float* const* buffers, int held, size_t count, ReduceOp op,
                             std::vector<float>& scratch, size_t slice_bytes = kSliceBytes);

/// Copies bytes from root's data into every other rank's data along the chain root, root+1, ...,
/// root-1, slice by slice. Every rank must call it with the same bytes, root and slice_bytes.
void ring_broadcast(RingLink& link, int rank, int size, void* data, size_t bytes, int root,
                    size_t slice_bytes = kSliceBytes);

/// Every rank's `bytes` bytes from `mine`, in rank order (size * bytes bytes). Every rank must
/// call it with the same bytes and slice_bytes.
std::vector<uint8_t> ring_all_gather(RingLink& link, int rank, int size, const void* mine,
                                     size_t bytes, size_t slice_bytes = kSliceBytes);

/// Returns once every rank has entered it (an all-gather of one byte).
void ring_barrier(RingLink& link, int rank, int size);

}  // namespace dtrain::comm
