// Reads NumPy's .npy format (header versions 1.0, 2.0 and 3.0): a file read whole into memory
// of its own (never mapped), its header dict checked against the bytes really there. Only C-order
// arrays of uint8, float32 and the integer dtypes, little-endian or single-byte; no big-endian,
// no Fortran order (refused, not transposed), no structured or object arrays, no writing.
// npz_file.h reads the same arrays out of zip archives.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dtrain::data {

enum class NpyDtype {
  kUint8,
  kInt8,
  kUint16,
  kInt16,
  kUint32,
  kInt32,
  kUint64,
  kInt64,
  kFloat32,
  kFloat64,
};

/// Bytes per element of dtype.
int npy_itemsize(NpyDtype dtype);
/// Whether dtype is one of the integer types.
bool npy_is_integer(NpyDtype dtype);

/// One checked array. data points at count * itemsize bytes in C order, little-endian, possibly
/// unaligned (read elements with memcpy); it keeps alive what holds them (a file's bytes or an
/// inflated buffer) and is shared by copies.
struct NpyArray {
  std::string descr;  ///< as the header writes it, e.g. "<u1"
  NpyDtype dtype = NpyDtype::kUint8;
  std::vector<int64_t> shape;  ///< empty for a scalar
  int64_t count = 0;           ///< product of shape (1 for a scalar)
  std::shared_ptr<const uint8_t> data;
  uint64_t bytes = 0;  ///< count * npy_itemsize(dtype)
};

/// A stream of bytes an .npy header is parsed from: memory, or a deflated zip member.
class ByteReader {
 public:
  virtual ~ByteReader() = default;
  /// Up to n bytes into out; fewer only at the end. Throws ConfigError naming the file.
  virtual size_t read(uint8_t* out, size_t n) = 0;
};

/// An .npy header: what the array is, and where its data starts.
struct NpyHeader {
  std::string descr;
  NpyDtype dtype = NpyDtype::kUint8;
  std::vector<int64_t> shape;
  int64_t count = 0;
  uint64_t data_offset = 0;  ///< bytes of magic, version, length and dict
  uint64_t data_bytes = 0;   ///< count * itemsize
};

/// What the reader takes, for messages about other dtypes.
inline constexpr const char* kNpyAnyDtype = "uint8, float32, float64 or an integer type";

/// Largest header dict accepted (NumPy itself refuses more than 10000 bytes by default).
inline constexpr uint64_t kMaxNpyHeaderBytes = uint64_t{1} << 16;

/// Reads an .npy header from in, whose whole length (header and data) is total_bytes, and checks
/// that the data is exactly what the header promises. where names the array in errors ("f.npy"
/// or "f.npz: x_train"): ConfigError "<where>: <what is wrong>". Reads no more than the header.
/// expected says what the caller takes, for the message about a dtype it does not
/// ("dtype '<c8' is not supported (images: uint8, float32, or float64 ...)").
NpyHeader read_npy_header(ByteReader& in, uint64_t total_bytes, const std::string& where,
                          const std::string& expected = kNpyAnyDtype);

/// The array in the .npy file at path, its data left in the file's bytes (common::FileBytes:
/// read once, not copied again).
/// expected: as for read_npy_header.
NpyArray read_npy(const std::string& path, const std::string& expected = kNpyAnyDtype);

/// A reader over memory [data, data + size).
class MemoryReader : public ByteReader {
 public:
  MemoryReader(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}
  size_t read(uint8_t* out, size_t n) override;

 private:
  const uint8_t* data_;
  uint64_t size_, position_ = 0;
};

}  // namespace dtrain::data
