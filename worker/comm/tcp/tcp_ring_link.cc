// See tcp_ring_link.h. send_recv() is one poll() loop: write the outgoing frames to the next
// rank, read incoming frames from the previous rank straight into the caller's buffer, and watch
// the next rank's socket for an abort or end of stream.
#include "worker/comm/tcp/tcp_ring_link.h"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/errors.h"

namespace dtrain::comm {
namespace {

// Outgoing byte stream cut into data frames of at most kMaxDataPayload.
struct Sender {
  Sender(const void* bytes, size_t length)
      : data(static_cast<const unsigned char*>(bytes)), left(length) {}
  const unsigned char* data;
  size_t left;
  unsigned char header[kFrameHeaderBytes] = {};
  size_t header_left = 0;
  size_t frame_left = 0;

  bool done() const { return left == 0 && header_left == 0 && frame_left == 0; }
  // Writes what the socket takes now; false when it would block.
  bool write_some(int fd) {
    if (header_left == 0 && frame_left == 0 && left > 0) {
      frame_left = std::min<size_t>(left, kMaxDataPayload);
      encode_header({FrameType::kData, static_cast<uint32_t>(frame_left)}, header);
      header_left = kFrameHeaderBytes;
    }
    iovec parts[2] = {{header + kFrameHeaderBytes - header_left, header_left},
                      {const_cast<unsigned char*>(data), frame_left}};
    msghdr msg{};
    msg.msg_iov = header_left > 0 ? parts : parts + 1;
    msg.msg_iovlen = header_left > 0 ? 2 : 1;
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return false;
      throw common::IoError(std::strerror(errno));
    }
    size_t sent = static_cast<size_t>(n);
    size_t from_header = std::min(sent, header_left);
    header_left -= from_header;
    sent -= from_header;
    data += sent;
    frame_left -= sent;
    left -= sent;
    return true;
  }
};

// Incoming byte stream of data frames, payloads written straight to their place.
struct Receiver {
  Receiver(void* bytes, size_t length) : data(static_cast<unsigned char*>(bytes)), left(length) {}
  unsigned char* data;
  size_t left;
  unsigned char header[kFrameHeaderBytes] = {};
  size_t header_got = 0;
  size_t frame_left = 0;
  std::string abort_text;
  size_t abort_left = 0;

  bool done() const { return left == 0 && header_got == 0 && frame_left == 0; }
  // Reads what is there; false when it would block. Throws IoError for bad frames or an abort.
  bool read_some(int fd, const std::string& peer) {
    ssize_t n;
    if (abort_left > 0) {
      char buffer[512];
      n = ::recv(fd, buffer, std::min(abort_left, sizeof buffer), 0);
      if (n > 0) {
        abort_text.append(buffer, static_cast<size_t>(n));
        abort_left -= static_cast<size_t>(n);
        if (abort_left == 0) throw common::IoError(abort_text);
      }
    } else if (frame_left == 0) {
      n = ::recv(fd, header + header_got, kFrameHeaderBytes - header_got, 0);
      if (n > 0 && (header_got += static_cast<size_t>(n)) == kFrameHeaderBytes) start_frame(peer);
    } else {
      n = ::recv(fd, data, frame_left, 0);
      if (n > 0) {
        data += n;
        frame_left -= static_cast<size_t>(n);
        left -= static_cast<size_t>(n);
      }
    }
    if (n == 0) throw common::IoError(peer + ": connection closed");
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return false;
      throw common::IoError(peer + ": " + std::strerror(errno));
    }
    return true;
  }
  void start_frame(const std::string& peer) {
    header_got = 0;
    FrameHeader h = decode_header(header);
    std::string problem = check_header(h);
    if (problem.empty() && h.type == FrameType::kAbort) {
      abort_left = h.length;
      if (abort_left == 0) throw common::IoError(peer + " aborted");
      return;
    }
    if (problem.empty() && h.type == FrameType::kGoodbye) {
      throw common::IoError(peer +
                            " left the ring (goodbye) while data from it was still expected");
    }
    if (problem.empty() && h.type != FrameType::kData)
      problem = fmt::format("unexpected {} frame", frame_type_name(h.type));
    if (problem.empty() && (h.length == 0 || h.length > left)) {
      problem = fmt::format("data frame of {} bytes where {} were expected", h.length, left);
    }
    if (!problem.empty()) throw common::IoError(fmt::format("{}: bad frame: {}", peer, problem));
    frame_left = h.length;
  }
};

}  // namespace

TcpRingLink::TcpRingLink(RingIdentity id, CommOptions options, common::UniqueFd next,
                         common::UniqueFd previous, std::unique_ptr<Acceptor> acceptor)
    : id_(std::move(id)),
      options_(options),
      next_(std::move(next)),
      previous_(std::move(previous)),
      acceptor_(std::move(acceptor)) {}

void TcpRingLink::fail(const std::string& message) {
  if (broken_.empty() && interrupted_.load(std::memory_order_acquire)) {
    broken_ = interrupted_why_;  // whatever the shut sockets said, this is why
  } else if (broken_.empty()) {
    broken_ = message;
    send_abort(next_.get(), message);
    send_abort(previous_.get(), message);
  }
  throw common::IoError(broken_);
}

void TcpRingLink::interrupt(const std::string& why) noexcept {
  std::unique_lock<std::mutex> lock(interrupt_mutex_, std::defer_lock);
  try {
    lock.lock();  // held until the flag is set: a second interrupt() leaves the text alone
    if (interrupted_.load(std::memory_order_relaxed)) return;
    interrupted_why_ = fmt::format("{} interrupted: {}", id_.describe(id_.rank), why);
  } catch (...) {  // no memory for the text: interrupt all the same, with an empty reason
  }
  // Set before the shutdown, so a send_recv woken by it finds the reason.
  interrupted_.store(true, std::memory_order_release);
  ::shutdown(next_.get(), SHUT_RDWR);
  ::shutdown(previous_.get(), SHUT_RDWR);
}

TcpRingLink::~TcpRingLink() {
  if (!broken_.empty() || interrupted_.load(std::memory_order_acquire)) return;
  for (int fd : {next_.get(), previous_.get()}) {
    try {
      write_frame(fd, FrameType::kGoodbye, nullptr, 0, Deadline(0.1, "goodbye"), "goodbye");
    } catch (...) {
    }
  }
}

// The next rank only ever sends an abort or a goodbye, or its end closes because it died.
void TcpRingLink::check_next_side(bool still_sending) {
  try {
    read_frame(next_.get(), FrameType::kGoodbye, Deadline(1, "an abort message"),
               id_.describe(id_.next()));
    next_left_ = true;
  } catch (const common::IoError& e) {
    fail(fmt::format("{} (noticed by {})", e.what(), id_.names[static_cast<size_t>(id_.rank)]));
  }
  if (still_sending)
    fail(fmt::format("{} left the ring while {} still had data for it", id_.describe(id_.next()),
                     id_.describe(id_.rank)));
}

void TcpRingLink::send_recv(const void* send, size_t send_bytes, void* recv, size_t recv_bytes) {
  if (!broken_.empty()) throw common::IoError(broken_);
  if (interrupted_.load(std::memory_order_acquire)) fail("");
  Sender out(send, send_bytes);
  Receiver in(recv, recv_bytes);
  std::string from = id_.describe(id_.previous());
  Deadline deadline(options_.collective_seconds, "a collective");
  try {
    while (!out.done() || !in.done()) {
      if (next_left_ && !out.done()) {
        fail(fmt::format("{} left the ring while {} still had data for it",
                         id_.describe(id_.next()), id_.describe(id_.rank)));
      }
      short next_events =
          static_cast<short>((next_left_ ? 0 : POLLIN) | (out.done() ? 0 : POLLOUT));
      pollfd fds[2] = {{next_.get(), next_events, 0},
                       // Once this call's bytes are in, the previous rank's next frames wait.
                       {previous_.get(), static_cast<short>(in.done() ? 0 : POLLIN), 0}};
      int rc = ::poll(fds, 2, deadline.poll_ms());
      if (interrupted_.load(std::memory_order_acquire)) fail("");
      if (rc == 0 && deadline.expired()) {
        fail(fmt::format("timed out after {:.0f} s in a collective waiting for {} and {}",
                         deadline.seconds(), from, id_.describe(id_.next())));
      }
      if (!next_left_ && (fds[0].revents & (POLLIN | POLLHUP | POLLERR)))
        check_next_side(!out.done());
      if (fds[0].revents & POLLOUT)
        while (!out.done() && out.write_some(next_.get())) {
        }
      if (fds[1].revents & (POLLIN | POLLHUP | POLLERR))
        while (!in.done() && in.read_some(previous_.get(), from)) {
        }
    }
  } catch (const common::IoError& e) {
    if (!broken_.empty()) throw;
    std::string what = e.what();
    if (what.find("(noticed by") == std::string::npos &&
        what.find(" failed: ") == std::string::npos) {
      what += " (noticed by " + id_.names[static_cast<size_t>(id_.rank)] + ")";
    }
    fail(what);
  }
}

void TcpRingLink::abort(const std::string& message) noexcept {
  if (!broken_.empty()) return;
  broken_ = fmt::format("{} failed: {}", id_.describe(id_.rank), message);
  if (interrupted_.load(std::memory_order_acquire)) return;  // shut: nothing can be sent
  send_abort(next_.get(), broken_);
  send_abort(previous_.get(), broken_);
}

}  // namespace dtrain::comm
