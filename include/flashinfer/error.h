// flashinfer::Error and the argument-check macros used by every public op.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace flashinfer {

/// What kind of failure an Error reports; the CLI maps it to an exit status.
enum class ErrorCode {
  kInvalidArgument,  // wrong shape, dtype, device, rank, value out of range
  kUnsupported,      // a valid request this build or device cannot serve
  kCuda,             // a CUDA runtime or driver call failed
  kIo,               // a file could not be read or written
  kFormat,           // a file or record is malformed
  kInternal,         // a broken invariant inside the library
};

std::string_view error_code_name(ErrorCode code);

/// The one exception type the library throws. `op()` and `arg()` name the public op and the
/// argument at fault (empty when not applicable); what() is the full human-readable message.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string op, std::string arg, const std::string& detail,
        const char* file = nullptr, int line = 0);

  ErrorCode code() const noexcept { return code_; }
  const std::string& op() const noexcept { return op_; }
  const std::string& arg() const noexcept { return arg_; }
  const std::string& detail() const noexcept { return detail_; }
  const char* file() const noexcept { return file_; }
  int line() const noexcept { return line_; }

 private:
  ErrorCode code_;
  std::string op_;
  std::string arg_;
  std::string detail_;
  const char* file_;
  int line_;
};

namespace detail {

[[noreturn]] void throw_error(ErrorCode code, const char* file, int line, std::string_view op,
                              std::string_view arg, const std::string& detail);

// Out of line and cold: the message is formatted only when a check has already failed.
template <class... Args>
[[noreturn, gnu::cold, gnu::noinline]] void fail(ErrorCode code, const char* file, int line,
                                                 std::string_view op, std::string_view arg,
                                                 const Args&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  throw_error(code, file, line, op, arg, os.str());
}

}  // namespace detail
}  // namespace flashinfer

#define FLASHINFER_LIKELY(x) __builtin_expect(!!(x), 1)
#define FLASHINFER_UNLIKELY(x) __builtin_expect(!!(x), 0)

/// Throws flashinfer::Error(code) naming `op` and `arg` when `cond` is false. The trailing
/// arguments are streamed into the message, only on failure.
#define FLASHINFER_CHECK_CODE(cond, code, op, arg, ...)                                         \
  do {                                                                                          \
    if (FLASHINFER_UNLIKELY(!(cond))) {                                                         \
      ::flashinfer::detail::fail(code, __FILE__, __LINE__, op, arg __VA_OPT__(, ) __VA_ARGS__); \
    }                                                                                           \
  } while (0)

/// The common case: an invalid argument of a public op.
#define FLASHINFER_CHECK(cond, op, arg, ...) \
  FLASHINFER_CHECK_CODE(cond, ::flashinfer::ErrorCode::kInvalidArgument, op, arg, __VA_ARGS__)

/// Throws unconditionally.
#define FLASHINFER_FAIL(code, op, arg, ...) \
  ::flashinfer::detail::fail(code, __FILE__, __LINE__, op, arg __VA_OPT__(, ) __VA_ARGS__)
