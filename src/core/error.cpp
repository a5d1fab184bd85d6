#include "flashinfer/error.h"

#include <string>

namespace flashinfer {
namespace {

std::string compose(std::string_view op, std::string_view arg, const std::string& detail) {
  std::string msg;
  if (!op.empty()) {
    msg += op;
    msg += ": ";
  }
  if (!arg.empty()) {
    msg += "argument '";
    msg += arg;
    msg += "': ";
  }
  msg += detail;
  return msg;
}

}  // namespace

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kCuda:
      return "CUDA error";
    case ErrorCode::kIo:
      return "I/O error";
    case ErrorCode::kFormat:
      return "format error";
    case ErrorCode::kInternal:
      return "internal error";
  }
  return "error";
}

Error::Error(ErrorCode code, std::string op, std::string arg, const std::string& detail,
             const char* file, int line)
    : std::runtime_error(compose(op, arg, detail)),
      code_(code),
      op_(std::move(op)),
      arg_(std::move(arg)),
      detail_(detail),
      file_(file),
      line_(line) {}

namespace detail {

void throw_error(ErrorCode code, const char* file, int line, std::string_view op,
                 std::string_view arg, const std::string& detail) {
  throw Error(code, std::string(op), std::string(arg), detail, file, line);
}

void write_fail_cstr(std::ostream& os, const void* value) {
  const char* s = static_cast<const char*>(value);
  os << (s ? s : "(null)");
}

void fail_with(ErrorCode code, const char* file, int line, std::string_view op,
               std::string_view arg, const FailPart* parts, std::size_t n) {
  std::ostringstream os;
  for (std::size_t i = 0; i < n; ++i) parts[i].write(os, parts[i].value);
  throw_error(code, file, line, op, arg, os.str());
}

}  // namespace detail
}  // namespace flashinfer
