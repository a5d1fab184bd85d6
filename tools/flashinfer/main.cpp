// `flashinfer`: the command-line tool. Dispatches to the subcommand table in commands.h and maps
// flashinfer::Error to an exit status.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "commands.h"
#include "flashinfer/error.h"

namespace flashinfer::cli {

std::vector<Command> commands() {
  return {version_command(), info_command(), list_ops_command(), replay_command(),
          show_command(),    diff_command(), repro_command(),    export_command(),
          bench_command(),   jit_command(),  trace_command()};
}

}  // namespace flashinfer::cli

int main(int argc, char** argv) {
  using namespace flashinfer;
  CLI::App app{"flashinfer: FlashInfer's kernels in native C++, with API logging and replay",
               "flashinfer"};
  app.require_subcommand(1);
  std::function<int()> to_run;
  for (const cli::Command& cmd : cli::commands()) {
    CLI::App* sub = app.add_subcommand(cmd.name, cmd.summary);
    auto run = cmd.setup(*sub);
    sub->callback([&to_run, run] { to_run = run; });
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help exits 0; a usage error exits 2, as the commands' documented statuses say.
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    return to_run ? to_run() : 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "flashinfer: %s\n", e.what());
    switch (e.code()) {
      case ErrorCode::kInvalidArgument:
        return 2;
      case ErrorCode::kIo:
      case ErrorCode::kFormat:
        return 3;
      case ErrorCode::kUnsupported:
        return 4;
      default:
        return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flashinfer: %s\n", e.what());
    return 1;
  }
}
