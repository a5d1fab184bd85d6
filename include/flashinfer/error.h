// flashinfer::Error and the argument-check macros used by every public op.
#pragma once

#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

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

// One part of a failed check's message: the value and how to print it. A string literal is
// printed through its pointer, anything else through its operator<<.
struct FailPart {
  const void* value;
  void (*write)(std::ostream&, const void*);
};

void write_fail_cstr(std::ostream& os, const void* value);

template <class T>
void write_fail_part(std::ostream& os, const void* value) {
  os << *static_cast<const T*>(value);
}

template <class T>
[[gnu::always_inline]] inline FailPart fail_part(const T& x) {
  if constexpr (std::is_array_v<T> &&
                std::is_same_v<std::remove_cv_t<std::remove_extent_t<T>>, char>) {
    return {static_cast<const char*>(x), &write_fail_cstr};
  } else if constexpr (std::is_same_v<std::decay_t<T>, const char*> ||
                       std::is_same_v<std::decay_t<T>, char*>) {
    return {x, &write_fail_cstr};
  } else {
    return {&x, &write_fail_part<T>};
  }
}

// Formats the parts into a stream made here, out of line, and throws.
[[noreturn, gnu::cold]] void fail_with(ErrorCode code, const char* file, int line,
                                       std::string_view op, std::string_view arg,
                                       const FailPart* parts, std::size_t n);

// The message is formatted only when a check has already failed, out of line. A check's failure
// branch only lists its parts: a variadic template that formatted them itself had an instance per
// list of part types (each literal's char[N] a type of its own), each with a stream's
// construction inlined, 9 % of the op layer's code (session 53).
template <class... Args>
[[noreturn, gnu::cold, gnu::always_inline]] inline void fail(ErrorCode code, const char* file,
                                                             int line, std::string_view op,
                                                             std::string_view arg,
                                                             const Args&... parts) {
  if constexpr (sizeof...(Args) == 0) {
    fail_with(code, file, line, op, arg, nullptr, 0);
  } else {
    const FailPart list[] = {fail_part(parts)...};
    fail_with(code, file, line, op, arg, list, sizeof...(Args));
  }
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
