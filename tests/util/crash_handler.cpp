// Every test binary prints a symbolized stack when it dies of SIGSEGV, SIGABRT, SIGBUS, SIGFPE or
// SIGILL, so that a crash on a machine nobody can log into (the GPU machine's ctest log) names
// its frame. Linked into every test executable (tests/CMakeLists.txt) and installed by a static
// initializer, before main.
//
// On a fatal signal the handler writes to stderr:
//   *** fatal signal SIGSEGV (segmentation fault: invalid memory reference) at address 0x0, pid 42
//   stack (innermost first; the first frames are the handler's own and the signal frame):
//     ...
//     #3 0x55d0c2a3b4c5 flashinfer::foo(int) at /src/foo.cpp:12 (the test binary+0x1b4c4)
//     ...
// then restores the default action and raises the signal again, so the exit status (killed by
// the signal, a core dump where enabled) is the one the crash would have had without it.
//
// Names and file:line come from binutils' addr2line (demangled, -C), run once per module on the
// frames' module-relative addresses; it reads .symtab, so functions get names in Release builds
// too (file:line needs -g, else "??:0"). Without addr2line, glibc's backtrace_symbols_fd lines.
// FLASHINFER_TEST_CRASH_SYMBOLIZE=0 keeps the raw lines; FLASHINFER_ADDR2LINE names the tool.
//
// Async-signal safety, as far as practical: output through write(2) from static buffers;
// backtrace() is called once at install so that its lazy load of libgcc_s happens outside the
// handler; addr2line runs through vfork + execve (no atfork handlers, no allocation) with an
// alarm so a stuck tool cannot hang the dying process. dladdr takes the loader's lock: a crash
// inside dlopen could deadlock there (accepted for a test binary). The handler runs on an
// alternate stack, so a stack overflow is reported too (on the main thread).
//
// A signal a sanitizer already handles (ASan's SIGSEGV/SIGBUS/SIGFPE) is left to it: its own
// report is better. gtest death tests are unaffected: the child still dies of its signal, and
// EXPECT_DEATH's regex is matched anywhere in the child's stderr.
#include <dlfcn.h>
#include <elf.h>
#include <execinfo.h>
#include <fcntl.h>
#include <link.h>
#include <signal.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "util/crash_handler.h"

extern char** environ;

namespace flashinfer::test {
namespace {

constexpr int kSignals[] = {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL};
constexpr int kMaxFrames = 64;
constexpr int kMaxModules = 16;

bool g_installed[65] = {};
bool g_symbolize = true;
char g_addr2line[512] = {};
uintptr_t g_exe_base = 0;
char g_exe_path[4096] = {};  // the test binary's path (/proc/self/exe would be addr2line's own)
alignas(16) char g_alt_stack[1 << 17];

// ---- output without allocation -------------------------------------------------------------

void put(const char* s) {
  std::size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    s += w;
    n -= static_cast<std::size_t>(w);
  }
}

// `v` in base 10 or 16 (with 0x) into `buf` (at least 24 bytes); returns buf.
char* fmt_uint(char* buf, uint64_t v, bool hex) {
  char tmp[24];
  int n = 0;
  const unsigned base = hex ? 16 : 10;
  do {
    const unsigned d = static_cast<unsigned>(v % base);
    tmp[n++] = static_cast<char>(d < 10 ? '0' + d : 'a' + d - 10);
    v /= base;
  } while (v != 0);
  int o = 0;
  if (hex) {
    buf[o++] = '0';
    buf[o++] = 'x';
  }
  while (n > 0) buf[o++] = tmp[--n];
  buf[o] = '\0';
  return buf;
}

void put_uint(uint64_t v, bool hex) {
  char b[24];
  put(fmt_uint(b, v, hex));
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV:
      return "SIGSEGV (segmentation fault: invalid memory reference)";
    case SIGABRT:
      return "SIGABRT (abort: an assertion, std::terminate or abort())";
    case SIGBUS:
      return "SIGBUS (bus error: misaligned or unmapped file-backed access)";
    case SIGFPE:
      return "SIGFPE (arithmetic exception: integer division by zero or overflow)";
    case SIGILL:
      return "SIGILL (illegal instruction: a trap such as __builtin_trap, or bad code)";
    default:
      return "fatal signal";
  }
}

// ---- symbolization -------------------------------------------------------------------------

struct Frame {
  uintptr_t pc = 0;
  uintptr_t rel = 0;  // the address addr2line is given for this module
  int module = -1;
  const char* sname = nullptr;  // dladdr's (exported, mangled) name when addr2line gives none
  const char* func = nullptr;   // into g_out
  const char* where = nullptr;  // into g_out
};

struct Module {
  uintptr_t base = 0;
  const char* path = nullptr;
};

Frame g_frames[kMaxFrames];
Module g_modules[kMaxModules];
int g_module_count = 0;
char g_out[1 << 17];  // addr2line's output for one module
char g_argv_text[kMaxFrames][24];

// Under ASan, vfork's interceptor (and a noreturn call in the child) unpoison "the stack" from
// the thread's bounds, which the alternate stack is not: shadow writes out of range. There the
// child comes from fork (the process is the test's, its atfork handlers are ASan's and ours).
#if defined(__SANITIZE_ADDRESS__)
#define FI_CRASH_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FI_CRASH_ASAN 1
#endif
#endif
#ifdef FI_CRASH_ASAN
#define FI_CRASH_NO_ASAN __attribute__((no_sanitize("address")))
#define FI_CRASH_SPAWN ::fork
#else
#define FI_CRASH_NO_ASAN
#define FI_CRASH_SPAWN ::vfork
#endif

// addr2line -C -f -e `path` rel... for the frames of module `m`, its stdout read back into g_out;
// each frame of the module gets two lines (function, file:line). Returns false when the tool
// could not run or said less than that.
FI_CRASH_NO_ASAN bool run_addr2line(int m, std::size_t* used) {
  const char* argv[kMaxFrames + 6];
  int argc = 0, want = 0;
  argv[argc++] = "addr2line";
  argv[argc++] = "-C";
  argv[argc++] = "-f";
  argv[argc++] = "-e";
  argv[argc++] = g_modules[m].path;
  for (int i = 0; i < kMaxFrames; ++i) {
    if (g_frames[i].pc == 0 || g_frames[i].module != m) continue;
    argv[argc++] = fmt_uint(g_argv_text[i], g_frames[i].rel, true);
    ++want;
  }
  argv[argc] = nullptr;
  if (want == 0) return true;
  int fds[2];
  if (::pipe(fds) != 0) return false;
  const pid_t pid = FI_CRASH_SPAWN();
  if (pid == 0) {
    // The child shares the parent's memory until execve: system calls only.
    ::dup2(fds[1], STDOUT_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    const int devnull = ::open("/dev/null", O_WRONLY);
    if (devnull >= 0) ::dup2(devnull, STDERR_FILENO);
    ::alarm(30);  // kept across execve: a stuck addr2line dies
    ::execve(g_addr2line, const_cast<char* const*>(argv), environ);
    ::_exit(127);
  }
  ::close(fds[1]);
  if (pid < 0) {
    ::close(fds[0]);
    return false;
  }
  const std::size_t start = *used;
  for (;;) {
    if (*used + 1 >= sizeof(g_out)) break;
    const ssize_t r = ::read(fds[0], g_out + *used, sizeof(g_out) - 1 - *used);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    *used += static_cast<std::size_t>(r);
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  g_out[(*used)++] = '\0';
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return false;
  // Split into lines, two per frame, in the order the addresses were given.
  char* p = g_out + start;
  for (int i = 0; i < kMaxFrames; ++i) {
    if (g_frames[i].pc == 0 || g_frames[i].module != m) continue;
    char* lines[2];
    for (char*& line : lines) {
      if (*p == '\0') return false;
      line = p;
      while (*p != '\0' && *p != '\n') ++p;
      if (*p == '\n') *p++ = '\0';
    }
    g_frames[i].func = lines[0];
    g_frames[i].where = lines[1];
  }
  return true;
}

// The module holding `pc`, added to g_modules on first sight; -1 when unknown.
int module_of(uintptr_t pc, Frame& f) {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(pc), &info) == 0 || info.dli_fbase == nullptr) return -1;
  f.sname = info.dli_sname;
  const auto base = reinterpret_cast<uintptr_t>(info.dli_fbase);
  // A position-dependent executable is given absolute addresses, everything else offsets.
  const auto* ehdr = static_cast<const ElfW(Ehdr)*>(info.dli_fbase);
  f.rel = ehdr->e_type == ET_EXEC ? pc : pc - base;
  for (int m = 0; m < g_module_count; ++m) {
    if (g_modules[m].base == base) return m;
  }
  if (g_module_count == kMaxModules) return -1;
  // The main program's dli_fname is argv[0], maybe relative to a directory since left.
  const char* path = base == g_exe_base ? g_exe_path : info.dli_fname;
  if (path == nullptr || path[0] == '\0') return -1;
  g_modules[g_module_count] = Module{base, path};
  return g_module_count++;
}

const char* basename_of(const char* path) {
  const char* b = path;
  for (const char* p = path; *p != '\0'; ++p) {
    if (*p == '/') b = p + 1;
  }
  return b;
}

void print_stack(uintptr_t fault_pc) {
  void* raw[kMaxFrames];
  const int n = ::backtrace(raw, kMaxFrames);
  put("stack (innermost first; the first frames are the handler's own and the signal frame):\n");
  if (!g_symbolize || g_addr2line[0] == '\0') {
    ::backtrace_symbols_fd(raw, n, STDERR_FILENO);
    if (g_addr2line[0] == '\0') put("(no addr2line found: raw frames, names only for exports)\n");
    return;
  }
  for (int i = 0; i < kMaxFrames; ++i) g_frames[i] = Frame{};
  g_module_count = 0;
  for (int i = 0; i < n; ++i) {
    Frame& f = g_frames[i];
    f.pc = reinterpret_cast<uintptr_t>(raw[i]);
    // A return address points after its call (maybe into the next function): look up pc - 1;
    // the interrupted instruction's own address (the frame below the signal frame) is exact.
    const uintptr_t look = i == 0 || f.pc == fault_pc ? f.pc : f.pc - 1;
    f.module = module_of(look, f);
  }
  std::size_t used = 0;
  for (int m = 0; m < g_module_count; ++m) {
    if (!run_addr2line(m, &used)) {
      for (int i = 0; i < n; ++i) {
        if (g_frames[i].module == m) g_frames[i].func = g_frames[i].where = nullptr;
      }
    }
  }
  for (int i = 0; i < n; ++i) {
    const Frame& f = g_frames[i];
    put("  #");
    put_uint(static_cast<uint64_t>(i), false);
    put(" ");
    put_uint(f.pc, true);
    put(" ");
    const bool named = f.func != nullptr && std::strcmp(f.func, "??") != 0;
    put(named ? f.func : f.sname != nullptr ? f.sname : "??");
    if (f.where != nullptr && f.where[0] != ':' && std::strncmp(f.where, "??", 2) != 0) {
      put(" at ");
      put(f.where);
    }
    if (f.module >= 0) {
      put(" (");
      put(f.module >= 0 && g_modules[f.module].base == g_exe_base
              ? "the test binary"
              : basename_of(g_modules[f.module].path));
      put("+");
      put_uint(f.rel, true);
      put(")");
    }
    put("\n");
  }
}

// The interrupted instruction's address from the signal context (0 where unknown).
uintptr_t context_pc(const void* ctx) {
  const auto* uc = static_cast<const ucontext_t*>(ctx);
  if (uc == nullptr) return 0;
#if defined(__x86_64__)
  return static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  return static_cast<uintptr_t>(uc->uc_mcontext.pc);
#else
  return 0;
#endif
}

void on_fatal_signal(int sig, siginfo_t* info, void* ctx) {
  const int saved_errno = errno;
  put("\n*** fatal signal ");
  put(signal_name(sig));
  if (sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL) {
    put(" at address ");
    put_uint(reinterpret_cast<uintptr_t>(info->si_addr), true);
  }
  put(", pid ");
  put_uint(static_cast<uint64_t>(::getpid()), false);
  put(" ***\n");
  print_stack(context_pc(ctx));
  put("*** end of stack; re-raising the signal\n");
  errno = saved_errno;
  // SA_RESETHAND restored the default action on entry; the signal is blocked until this handler
  // returns, then delivered with the default action (a fault re-executes and faults again).
  ::raise(sig);
}

// addr2line from FLASHINFER_ADDR2LINE, else the first executable one on PATH.
void find_addr2line() {
  const char* env = std::getenv("FLASHINFER_ADDR2LINE");
  if (env != nullptr && env[0] != '\0') {
    if (std::strlen(env) < sizeof(g_addr2line) && ::access(env, X_OK) == 0) {
      std::strcpy(g_addr2line, env);
    }
    return;
  }
  const char* path = std::getenv("PATH");
  if (path == nullptr || path[0] == '\0') path = "/usr/bin:/bin";
  while (*path != '\0') {
    const char* end = std::strchr(path, ':');
    const std::size_t len =
        end != nullptr ? static_cast<std::size_t>(end - path) : std::strlen(path);
    constexpr char kTool[] = "/addr2line";
    if (len > 0 && len + sizeof(kTool) < sizeof(g_addr2line)) {
      std::memcpy(g_addr2line, path, len);
      std::memcpy(g_addr2line + len, kTool, sizeof(kTool));
      if (::access(g_addr2line, X_OK) == 0) return;
    }
    if (end == nullptr) break;
    path = end + 1;
  }
  g_addr2line[0] = '\0';
}

void install() {
  const char* sym = std::getenv("FLASHINFER_TEST_CRASH_SYMBOLIZE");
  g_symbolize = sym == nullptr || std::strcmp(sym, "0") != 0;
  find_addr2line();
  Dl_info self{};
  if (::dladdr(reinterpret_cast<void*>(&install), &self) != 0) {
    g_exe_base = reinterpret_cast<uintptr_t>(self.dli_fbase);
  }
  const ssize_t len = ::readlink("/proc/self/exe", g_exe_path, sizeof(g_exe_path) - 1);
  g_exe_path[len > 0 ? len : 0] = '\0';
  void* warm[2];
  ::backtrace(warm, 2);  // loads libgcc_s now rather than inside the handler

  stack_t ss{};
  ss.ss_sp = g_alt_stack;
  ss.ss_size = sizeof(g_alt_stack);
  ::sigaltstack(&ss, nullptr);
  for (int sig : kSignals) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0) continue;
    const bool has_siginfo = (old.sa_flags & SA_SIGINFO) != 0;
    if (has_siginfo || (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN)) continue;
    struct sigaction sa {};
    sa.sa_sigaction = &on_fatal_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
    if (::sigaction(sig, &sa, nullptr) == 0) g_installed[sig] = true;
  }
}

const bool g_install_done = (install(), true);

}  // namespace

bool crash_handler_installed(int sig) {
  return g_install_done && sig > 0 && sig < 65 && g_installed[sig];
}

bool crash_handler_symbolizes() { return g_symbolize && g_addr2line[0] != '\0'; }

void crash_handler_set_symbolize(bool on) { g_symbolize = on; }

namespace {
volatile sig_atomic_t g_skip_leak_check = 0;
}  // namespace

void skip_leak_check_at_exit() { g_skip_leak_check = 1; }

}  // namespace flashinfer::test

// LeakSanitizer asks this hook when it checks, at exit (a program without LSan never calls it).
extern "C" int __lsan_is_turned_off() { return flashinfer::test::g_skip_leak_check; }
