// The `flashinfer` command's subcommand table (apitrace style): each command registers its
// options on its subcommand (cli_args.h) and runs when selected.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "cli_args.h"

namespace flashinfer::cli {

struct Command {
  std::string name;
  std::string summary;
  // Adds the command's options to `sub` and returns the function that runs it (exit status).
  std::function<std::function<int()>(Args& sub)> setup;
};

/// How the tool was started: argv[0] when it names a path (build/bin/flashinfer), else
/// "flashinfer"; the command lines it prints start with it.
const std::string& invoked_as();

/// Every subcommand, in the order `flashinfer --help` lists them.
std::vector<Command> commands();

Command version_command();
Command info_command();
Command list_ops_command();
Command replay_command();
Command show_command();
Command diff_command();
Command repro_command();
Command bench_command();
Command export_command();
Command jit_command();
Command trace_command();

}  // namespace flashinfer::cli
