// The fatal-signal stack printer every test binary carries (tests/util/crash_handler.cpp): a
// child process that crashes prints a stack naming the crashing function, and still dies of the
// same signal.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "util/crash_handler.h"

namespace flashinfer::crash_test {

// Distinct, never inlined functions for the stacks to name (namespaced: the demangled name is
// what the test looks for).
__attribute__((noinline)) void segfault_here_for_the_stack_test(int depth) {
  volatile int* volatile p = nullptr;  // volatile pointer: no compile-time null, a real fault
  *p = depth;
}

__attribute__((noinline)) void abort_here_for_the_stack_test() { std::abort(); }

__attribute__((noinline)) int divide_here_for_the_stack_test(int d) {
  volatile int n = 7;
  return n / d;
}

namespace {

struct Death {
  int status = 0;
  std::string stderr_text;
};

// Runs `fn` in a forked child whose stderr is captured; returns how it ended and what it wrote.
template <class Fn>
Death run_child(Fn fn) {
  Death d;
  int fds[2];
  if (::pipe(fds) != 0) {
    ADD_FAILURE() << "pipe failed";
    return d;
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], STDERR_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    fn();
    ::_exit(0);  // not reached when fn crashes
  }
  ::close(fds[1]);
  char buf[4096];
  for (;;) {
    const ssize_t r = ::read(fds[0], buf, sizeof(buf));
    if (r <= 0) break;
    d.stderr_text.append(buf, static_cast<std::size_t>(r));
  }
  ::close(fds[0]);
  ::waitpid(pid, &d.status, 0);
  return d;
}

void expect_named_crash(const Death& d, int sig, const char* sig_name, const char* function) {
  ASSERT_TRUE(WIFSIGNALED(d.status)) << "the child was not killed by a signal; stderr:\n"
                                     << d.stderr_text;
  EXPECT_EQ(WTERMSIG(d.status), sig) << "the exit status must be the signal's";
  EXPECT_NE(d.stderr_text.find(std::string("*** fatal signal ") + sig_name), std::string::npos)
      << d.stderr_text;
  EXPECT_NE(d.stderr_text.find("stack (innermost first"), std::string::npos) << d.stderr_text;
  EXPECT_NE(d.stderr_text.find(function), std::string::npos)
      << "the stack does not name " << function << ":\n"
      << d.stderr_text;
  EXPECT_NE(d.stderr_text.find("*** end of stack"), std::string::npos) << d.stderr_text;
}

TEST(CrashHandler, FindsAddr2line) {
  // binutils is a build dependency (the linker); without addr2line frames would be unnamed.
  EXPECT_TRUE(test::crash_handler_symbolizes())
      << "addr2line not found on PATH (or FLASHINFER_TEST_CRASH_SYMBOLIZE=0)";
}

TEST(CrashHandler, SegfaultNamesTheFaultingFunctionAndKeepsTheSignal) {
  if (!test::crash_handler_installed(SIGSEGV)) {
    GTEST_SKIP() << "a sanitizer owns SIGSEGV in this build (its report names the frame)";
  }
  const Death d = run_child([] { segfault_here_for_the_stack_test(3); });
  expect_named_crash(d, SIGSEGV, "SIGSEGV",
                     "flashinfer::crash_test::segfault_here_for_the_stack_test(int)");
  EXPECT_NE(d.stderr_text.find("at address 0x0,"), std::string::npos) << d.stderr_text;
  // The caller's frame is there too: the test's lambda, in this file's test body.
  EXPECT_NE(d.stderr_text.find("SegfaultNamesTheFaultingFunction"), std::string::npos)
      << d.stderr_text;
}

TEST(CrashHandler, AbortNamesTheCaller) {
  ASSERT_TRUE(test::crash_handler_installed(SIGABRT));
  const Death d = run_child([] { abort_here_for_the_stack_test(); });
  expect_named_crash(d, SIGABRT, "SIGABRT",
                     "flashinfer::crash_test::abort_here_for_the_stack_test()");
}

TEST(CrashHandler, DivisionByZeroIsSigfpe) {
  if (!test::crash_handler_installed(SIGFPE)) {
    GTEST_SKIP() << "a sanitizer owns SIGFPE in this build";
  }
  const Death d = run_child([] { divide_here_for_the_stack_test(0); });
  expect_named_crash(d, SIGFPE, "SIGFPE", "flashinfer::crash_test::divide_here_for_the_stack_test");
}

TEST(CrashHandler, RawFramesWhenSymbolizationIsOff) {
  ASSERT_TRUE(test::crash_handler_installed(SIGABRT));
  const Death d = run_child([] {
    test::crash_handler_set_symbolize(false);  // as FLASHINFER_TEST_CRASH_SYMBOLIZE=0 does
    abort_here_for_the_stack_test();
  });
  ASSERT_TRUE(WIFSIGNALED(d.status)) << d.stderr_text;
  EXPECT_EQ(WTERMSIG(d.status), SIGABRT);
  EXPECT_NE(d.stderr_text.find("*** fatal signal SIGABRT"), std::string::npos) << d.stderr_text;
  // backtrace_symbols_fd's form, module(symbol+offset)[address], not addr2line's names.
  EXPECT_NE(d.stderr_text.find(")[0x"), std::string::npos) << d.stderr_text;
  EXPECT_EQ(d.stderr_text.find("abort_here_for_the_stack_test()"), std::string::npos)
      << d.stderr_text;
}

}  // namespace
}  // namespace flashinfer::crash_test
