// Ring all-reduce (also over a virtual ring), broadcast, all-gather and barrier over a RingLink.
// Every rank makes the same number of send_recv calls per collective, and rank r's send in call k
// has exactly the size of rank r+1's receive in call k, so any link that keeps call boundaries or
// just a byte stream works. Nothing here allocates per slice, retries or times out.
#include "worker/comm/ring_algorithms.h"

#include <algorithm>
#include <cstring>

#include "common/errors.h"

namespace dtrain::comm {
namespace {

int ring_mod(long long value, int size) {
  const long long m = value % size;
  return static_cast<int>(m < 0 ? m + size : m);
}

void check_ring(int rank, int size) {
  DT_ENFORCE(size >= 1 && rank >= 0 && rank < size, "rank {} of a ring of size {}", rank, size);
}

size_t slice_count(size_t total, size_t per_slice) {
  return (total + per_slice - 1) / per_slice;
}

// Slice k of range: [begin + k * per_slice, ...) clipped to the range; empty past its end.
IndexRange slice_of(IndexRange range, size_t k, size_t per_slice) {
  const size_t begin = std::min(range.begin + k * per_slice, range.end);
  return {begin, std::min(begin + per_slice, range.end)};
}

// Step s: send chunk (rank - s), receive chunk (rank - s - 1) into scratch and add it into place.
// Afterwards this rank holds the complete sum of chunk (rank + 1).
void reduce_scatter(RingLink& link, int rank, int size, float* data, size_t count,
                    std::vector<float>& scratch, size_t per_slice) {
  const size_t slices = slice_count(ring_chunk(count, size, 0).size(), per_slice);
  for (int step = 0; step + 1 < size; ++step) {
    const IndexRange send = ring_chunk(count, size, ring_mod(rank - step, size));
    const IndexRange recv = ring_chunk(count, size, ring_mod(rank - step - 1, size));
    for (size_t k = 0; k < slices; ++k) {
      const IndexRange out = slice_of(send, k, per_slice);
      const IndexRange in = slice_of(recv, k, per_slice);
      link.send_recv(data + out.begin, out.size() * sizeof(float), scratch.data(),
                     in.size() * sizeof(float));
      add_into(data + in.begin, scratch.data(), in.size());
    }
  }
}

// Step s: send chunk (rank + 1 - s), complete here, and receive chunk (rank - s) straight into
// place.
void all_gather_chunks(RingLink& link, int rank, int size, float* data, size_t count,
                       size_t per_slice) {
  const size_t slices = slice_count(ring_chunk(count, size, 0).size(), per_slice);
  for (int step = 0; step + 1 < size; ++step) {
    const IndexRange send = ring_chunk(count, size, ring_mod(rank + 1 - step, size));
    const IndexRange recv = ring_chunk(count, size, ring_mod(rank - step, size));
    for (size_t k = 0; k < slices; ++k) {
      const IndexRange out = slice_of(send, k, per_slice);
      const IndexRange in = slice_of(recv, k, per_slice);
      link.send_recv(data + out.begin, out.size() * sizeof(float), data + in.begin,
                     in.size() * sizeof(float));
    }
  }
}

// The virtual ranks one real rank holds in virtual_ring_all_reduce: buffers[j] is virtual rank
// first + j. Virtual rank j's predecessor is j - 1 here; that of j = 0 is across the link, or, in
// a world of one, the last held rank.
struct HeldBlock {
  int virtual_size;
  int first;
  float* const* buffers;
  int held;

  // Chunk (v + offset) mod virtual_size, v the virtual rank buffers[j] holds.
  IndexRange chunk(size_t count, int j, int offset) const {
    const long long v = static_cast<long long>(first) + j + offset;
    return ring_chunk(count, virtual_size, ring_mod(v, virtual_size));
  }
  int before(int j) const { return j == 0 ? held - 1 : j - 1; }
};

void check_held_block(const RingLink* link, int size, const HeldBlock& block, size_t count) {
  const int v_size = block.virtual_size;
  DT_ENFORCE(size <= v_size, "real ring of {} larger than its virtual ring of {}", size, v_size);
  DT_ENFORCE(block.first >= 0 && block.first < v_size, "virtual rank {} of {}", block.first,
             v_size);
  // Every other real rank holds at least one virtual rank; a world of one holds them all.
  DT_ENFORCE(
      block.held >= 1 && block.held <= v_size - size + 1 && (size > 1 || block.held == v_size),
      "{} virtual ranks held on one of {} ranks of a virtual ring of {}", block.held, size, v_size);
  DT_ENFORCE(link != nullptr || size == 1, "elastic all-reduce over {} ranks without a link", size);
  DT_ENFORCE(block.buffers != nullptr, "elastic all-reduce without buffers");
  for (int j = 0; j < block.held; ++j) {
    DT_ENFORCE(block.buffers[j] != nullptr || count == 0,
               "all-reduce of {} floats from a null buffer (virtual rank {})", count, j);
    for (int other = 0; other < j && count > 0; ++other)
      DT_ENFORCE(block.buffers[j] != block.buffers[other], "buffers {} and {} are one", other, j);
  }
}

// reduce_scatter over the virtual ring: in step s virtual rank v adds chunk (v - s - 1) of its
// predecessor into its own. Only the first held rank's receive and the last one's send go over
// the link; in step s no virtual rank receives the chunk it sends (virtual_size > 1), so the
// local adds read what the step began with, in any order.
void virtual_reduce_scatter(RingLink* link, const HeldBlock& block, size_t count,
                            std::vector<float>& scratch, size_t per_slice) {
  const int last = block.held - 1;
  const size_t slices = slice_count(ring_chunk(count, block.virtual_size, 0).size(), per_slice);
  for (int step = 0; step + 1 < block.virtual_size; ++step) {
    if (link != nullptr) {
      const IndexRange send = block.chunk(count, last, -step);
      const IndexRange recv = block.chunk(count, 0, -step - 1);
      for (size_t k = 0; k < slices; ++k) {
        const IndexRange out = slice_of(send, k, per_slice);
        const IndexRange in = slice_of(recv, k, per_slice);
        link->send_recv(block.buffers[last] + out.begin, out.size() * sizeof(float), scratch.data(),
                        in.size() * sizeof(float));
        add_into(block.buffers[0] + in.begin, scratch.data(), in.size());
      }
    }
    for (int j = link != nullptr ? 1 : 0; j < block.held; ++j) {
      const IndexRange in = block.chunk(count, j, -step - 1);
      add_into(block.buffers[j] + in.begin, block.buffers[block.before(j)] + in.begin, in.size());
    }
  }
}

// all_gather_chunks over the virtual ring: in step s virtual rank v copies chunk (v - s) of its
// predecessor (complete there) into place; local copies as above.
void virtual_all_gather(RingLink* link, const HeldBlock& block, size_t count, size_t per_slice) {
  const int last = block.held - 1;
  const size_t slices = slice_count(ring_chunk(count, block.virtual_size, 0).size(), per_slice);
  for (int step = 0; step + 1 < block.virtual_size; ++step) {
    if (link != nullptr) {
      const IndexRange send = block.chunk(count, last, 1 - step);
      const IndexRange recv = block.chunk(count, 0, -step);
      for (size_t k = 0; k < slices; ++k) {
        const IndexRange out = slice_of(send, k, per_slice);
        const IndexRange in = slice_of(recv, k, per_slice);
        link->send_recv(block.buffers[last] + out.begin, out.size() * sizeof(float),
                        block.buffers[0] + in.begin, in.size() * sizeof(float));
      }
    }
    for (int j = link != nullptr ? 1 : 0; j < block.held; ++j) {
      const IndexRange in = block.chunk(count, j, -step);
      std::copy_n(block.buffers[block.before(j)] + in.begin, in.size(),
                  block.buffers[j] + in.begin);
    }
  }
}

}  // namespace

// Block width of the add and divide loops: the fixed inner trip count lets GCC vectorise them at
// -O2 (its very-cheap cost model refuses loops of unknown length).
constexpr size_t kLanes = 16;

void add_into(float* __restrict dst, const float* __restrict src, size_t n) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (size_t j = 0; j < kLanes; ++j) dst[i + j] += src[i + j];
  for (; i < n; ++i) dst[i] += src[i];
}

void divide_by(float* __restrict data, size_t n, float divisor) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (size_t j = 0; j < kLanes; ++j) data[i + j] /= divisor;
  for (; i < n; ++i) data[i] /= divisor;
}

IndexRange ring_chunk(size_t count, int size, int chunk) {
  DT_ENFORCE(size >= 1 && chunk >= 0 && chunk < size, "chunk {} of {}", chunk, size);
  const size_t n = static_cast<size_t>(size);
  const size_t c = static_cast<size_t>(chunk);
  const size_t base = count / n;
  const size_t extra = count % n;
  const size_t begin = c * base + std::min(c, extra);
  return {begin, begin + base + (c < extra ? 1 : 0)};
}

void ring_all_reduce(RingLink& link, int rank, int size, float* data, size_t count, ReduceOp op,
                     std::vector<float>& scratch, size_t slice_bytes) {
  check_ring(rank, size);
  DT_ENFORCE(data != nullptr || count == 0, "all-reduce of {} floats from a null buffer", count);
  DT_ENFORCE(slice_bytes >= sizeof(float), "slice of {} bytes holds no float", slice_bytes);
  if (size == 1 || count == 0) return;  // kMean would divide by 1: nothing to do either
  const size_t per_slice = slice_bytes / sizeof(float);
  const size_t scratch_floats = std::min(per_slice, ring_chunk(count, size, 0).size());
  if (scratch.size() < scratch_floats) scratch.resize(scratch_floats);

  reduce_scatter(link, rank, size, data, count, scratch, per_slice);
  if (op == ReduceOp::kMean) {
    // Only the chunk completed here; the all-gather copies these bits to every rank, so this is
    // bit for bit what dividing everything on every rank would give.
    const IndexRange mine = ring_chunk(count, size, ring_mod(rank + 1, size));
    divide_by(data + mine.begin, mine.size(), static_cast<float>(size));
  }
  all_gather_chunks(link, rank, size, data, count, per_slice);
}

void virtual_ring_all_reduce(RingLink* link, int rank, int size, int virtual_size, int first,
                             float* const* buffers, int held, size_t count, ReduceOp op,
                             std::vector<float>& scratch, size_t slice_bytes) {
  check_ring(rank, size);
  const HeldBlock block{virtual_size, first, buffers, held};
  check_held_block(link, size, block, count);
  DT_ENFORCE(slice_bytes >= sizeof(float), "slice of {} bytes holds no float", slice_bytes);
  if (virtual_size == 1 || count == 0) return;               // as in ring_all_reduce
  if (held == 1 && virtual_size == size && first == rank) {  // full membership
    ring_all_reduce(*link, rank, size, buffers[0], count, op, scratch, slice_bytes);
    return;
  }
  RingLink* across = size > 1 ? link : nullptr;
  const size_t per_slice = slice_bytes / sizeof(float);
  const size_t scratch_floats = std::min(per_slice, ring_chunk(count, virtual_size, 0).size());
  if (across != nullptr && scratch.size() < scratch_floats) scratch.resize(scratch_floats);

  virtual_reduce_scatter(across, block, count, scratch, per_slice);
  if (op == ReduceOp::kMean) {  // each virtual rank v divides the chunk it completed, v + 1
    for (int j = 0; j < held; ++j) {
      const IndexRange mine = block.chunk(count, j, 1);
      divide_by(buffers[j] + mine.begin, mine.size(), static_cast<float>(virtual_size));
    }
  }
  virtual_all_gather(across, block, count, per_slice);
}

void ring_broadcast(RingLink& link, int rank, int size, void* data, size_t bytes, int root,
                    size_t slice_bytes) {
  check_ring(rank, size);
  DT_ENFORCE(root >= 0 && root < size, "broadcast root {} outside a ring of size {}", root, size);
  DT_ENFORCE(data != nullptr || bytes == 0, "broadcast of {} bytes into a null buffer", bytes);
  DT_ENFORCE(slice_bytes > 0, "broadcast with empty slices");
  if (size == 1 || bytes == 0) return;
  auto* bytes_ptr = static_cast<uint8_t*>(data);
  const IndexRange all{0, bytes};
  const size_t slices = slice_count(bytes, slice_bytes);
  const size_t depth = static_cast<size_t>(ring_mod(rank - root, size));  // 0 at root
  const bool forwards = depth + 1 < static_cast<size_t>(size);            // next is not root
  // Call k: receive slice k + 1 - depth from the previous rank while sending slice k - depth,
  // received in the call before, to the next. Every rank makes the same number of calls.
  const size_t calls = slices + static_cast<size_t>(size) - 2;
  for (size_t k = 0; k < calls; ++k) {
    IndexRange out;
    IndexRange in;
    if (forwards && k >= depth) out = slice_of(all, k - depth, slice_bytes);
    if (depth >= 1 && k + 1 >= depth) in = slice_of(all, k + 1 - depth, slice_bytes);
    link.send_recv(bytes_ptr + out.begin, out.size(), bytes_ptr + in.begin, in.size());
  }
}

std::vector<uint8_t> ring_all_gather(RingLink& link, int rank, int size, const void* mine,
                                     size_t bytes, size_t slice_bytes) {
  check_ring(rank, size);
  DT_ENFORCE(mine != nullptr || bytes == 0, "all-gather of {} bytes from a null buffer", bytes);
  DT_ENFORCE(slice_bytes > 0, "all-gather with empty slices");
  std::vector<uint8_t> result(bytes * static_cast<size_t>(size));
  if (bytes == 0) return result;
  std::memcpy(result.data() + bytes * static_cast<size_t>(rank), mine, bytes);
  const size_t slices = slice_count(bytes, slice_bytes);
  // Step s: pass on block (rank - s), received in step s - 1 (or our own), and receive block
  // (rank - s - 1).
  for (int step = 0; step + 1 < size; ++step) {
    uint8_t* send = result.data() + bytes * static_cast<size_t>(ring_mod(rank - step, size));
    uint8_t* recv = result.data() + bytes * static_cast<size_t>(ring_mod(rank - step - 1, size));
    for (size_t k = 0; k < slices; ++k) {
      const IndexRange piece = slice_of({0, bytes}, k, slice_bytes);
      link.send_recv(send + piece.begin, piece.size(), recv + piece.begin, piece.size());
    }
  }
  return result;
}

void ring_barrier(RingLink& link, int rank, int size) {
  const uint8_t token = 1;
  ring_all_gather(link, rank, size, &token, sizeof(token));
}

}  // namespace dtrain::comm
