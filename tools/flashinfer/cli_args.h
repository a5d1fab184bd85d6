// The options of the `flashinfer` tool's commands, declared through this thin layer over CLI11
// (defined in main.cpp) so that only main.cpp includes CLI11: its inline code was compiled again
// in every command's source, about 3 of each one's 4-10 CPU-s (docs/PERFORMANCE.md, "CI time
// (session 32)"). The names follow CLI11's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace flashinfer::cli {

/// One option of a command: a handle to adjust it after adding.
class Arg {
 public:
  explicit Arg(CLI::Option* o) : o_(o) {}
  /// The command fails to parse without it.
  Arg& required();
  /// Values split at `c` ("--include a,b").
  Arg& delimiter(char c);
  /// Repeatable: every occurrence's values are kept (the command's default may be take-last).
  Arg& take_all();
  /// Takes between lo and hi values per occurrence.
  Arg& expected(int lo, int hi);
  /// How many times it was given on the command line.
  std::size_t count() const;

 private:
  CLI::Option* o_;
};

/// The options of one command (or of one of its subcommands).
class Args {
 public:
  explicit Args(CLI::App& app) : app_(&app) {}
  Arg add_option(const std::string& names, std::string& value, const std::string& help);
  Arg add_option(const std::string& names, int& value, const std::string& help);
  Arg add_option(const std::string& names, int64_t& value, const std::string& help);
  Arg add_option(const std::string& names, uint64_t& value, const std::string& help);
  Arg add_option(const std::string& names, double& value, const std::string& help);
  Arg add_option(const std::string& names, std::vector<std::string>& value,
                 const std::string& help);
  Arg add_flag(const std::string& names, bool& value, const std::string& help);
  /// Text printed after the options in --help.
  void footer(const std::string& text);
  /// An option given twice takes its last value (upstream's argparse), for options added after.
  void take_last_by_default();
  Args add_subcommand(const std::string& name, const std::string& help);
  void require_subcommand(int n);
  /// Whether this (sub)command was selected on the command line.
  bool parsed() const;

 private:
  CLI::App* app_;
};

/// Parses `line` as the options `add` declares (a --testlist line); throws std::exception
/// (CLI11's parse errors) on a bad line.
void parse_line(const std::string& description, const std::string& line,
                const std::function<void(Args&)>& add);

/// The error CLI11 raises for a missing required option, from code that checks it itself.
[[noreturn]] void throw_required(const std::string& name);

}  // namespace flashinfer::cli
