// Running a command line from a test (the CLI, Python interop scripts) and capturing its output.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace flashinfer::testing {

struct CommandResult {
  int status = -1;  // exit code; -1 when the command could not start or did not exit normally
  std::string out;  // stdout and stderr together
};

inline CommandResult run_command(const std::string& cmd) {
  CommandResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

/// The `flashinfer` command-line tool built beside the tests, run with `args`.
inline CommandResult run_flashinfer(const std::string& args) {
  return run_command(std::string(FLASHINFER_TEST_BIN_DIR) + "/flashinfer " + args);
}

}  // namespace flashinfer::testing
