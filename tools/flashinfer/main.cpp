// `flashinfer`: the command-line tool. Dispatches to the subcommand table in commands.h and maps
// flashinfer::Error to an exit status. The one source that includes CLI11: cli_args.h's layer over
// it is defined here too.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "commands.h"
#include "flashinfer/error.h"
#include "suggest.h"

namespace flashinfer::cli {

Arg& Arg::required() {
  o_->required();
  return *this;
}
Arg& Arg::delimiter(char c) {
  o_->delimiter(c);
  return *this;
}
Arg& Arg::take_all() {
  o_->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  return *this;
}
Arg& Arg::expected(int lo, int hi) {
  o_->expected(lo, hi);
  return *this;
}
std::size_t Arg::count() const { return o_->count(); }

Arg Args::add_option(const std::string& names, std::string& value, const std::string& help) {
  return Arg(app_->add_option(names, value, help));
}
Arg Args::add_option(const std::string& names, int& value, const std::string& help) {
  return Arg(app_->add_option(names, value, help));
}
Arg Args::add_option(const std::string& names, int64_t& value, const std::string& help) {
  return Arg(app_->add_option(names, value, help));
}
Arg Args::add_option(const std::string& names, uint64_t& value, const std::string& help) {
  return Arg(app_->add_option(names, value, help));
}
Arg Args::add_option(const std::string& names, double& value, const std::string& help) {
  return Arg(app_->add_option(names, value, help));
}
Arg Args::add_option(const std::string& names, std::vector<std::string>& value,
                     const std::string& help) {
  return Arg(app_->add_option(names, value, help));
}
Arg Args::add_flag(const std::string& names, bool& value, const std::string& help) {
  return Arg(app_->add_flag(names, value, help));
}
void Args::footer(const std::string& text) { app_->footer(text); }
void Args::take_last_by_default() {
  app_->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}
Args Args::add_subcommand(const std::string& name, const std::string& help) {
  return Args(*app_->add_subcommand(name, help));
}
void Args::require_subcommand(int n) { app_->require_subcommand(n); }
bool Args::parsed() const { return app_->parsed(); }

void parse_line(const std::string& description, const std::string& line,
                const std::function<void(Args&)>& add) {
  CLI::App app{description};
  Args args(app);
  add(args);
  app.parse(line, false);
}

void throw_required(const std::string& name) { throw CLI::RequiredError(name); }

std::vector<Command> commands() {
  return {version_command(), info_command(), list_ops_command(), replay_command(),
          show_command(),    diff_command(), repro_command(),    export_command(),
          bench_command(),   jit_command(),  trace_command()};
}

namespace {

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// Every spelling of an option: --long names and -s short names.
std::vector<std::string> spellings(const CLI::App& app) {
  std::vector<std::string> out;
  for (const CLI::Option* o : app.get_options()) {
    for (const auto& l : o->get_lnames()) out.push_back("--" + l);
    for (const auto& s : o->get_snames()) out.push_back("-" + s);
  }
  return out;
}

// The option `arg` names in `app`, or null ("--name=value" and "-xVALUE" included).
const CLI::Option* find_option(const CLI::App& app, const std::string& arg) {
  for (const CLI::Option* o : app.get_options()) {
    if (arg.starts_with("--")) {
      const std::string name = arg.substr(2, arg.find('=') - 2);
      for (const auto& l : o->get_lnames()) {
        if (l == name) return o;
      }
    } else {
      for (const auto& s : o->get_snames()) {
        if (arg.compare(1, s.size(), s) == 0) return o;
      }
    }
  }
  return nullptr;
}

bool is_number(const std::string& s) {
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return end != s.c_str() && *end == '\0';
}

std::string unknown_option(const CLI::App& app, const std::string& where, const std::string& arg) {
  const std::string name = arg.substr(0, arg.find('='));
  const std::vector<std::string> valid = spellings(app);
  std::string m = where + ": unknown option '" + name + "'";
  if (const auto c = flashinfer::cli::closest(name, valid)) m += "; did you mean '" + *c + "'?";
  return m + "\noptions: " + joined(valid) + "\n";
}

/// The first unknown command or option on the command line, named with the closest valid
/// spelling and the valid ones; empty when every command and option is known (CLI11's message
/// then says what else is wrong: a missing value, a bad number).
std::string diagnose_usage(CLI::App& app, int argc, char** argv) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    names.push_back(sub->get_name());
  }
  const std::string list = "commands: " + joined(names) + " (flashinfer <command> --help)\n";
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; ++i) {
    if (!find_option(app, argv[i])) return unknown_option(app, "flashinfer", argv[i]);
  }
  if (i == argc) return "flashinfer: a command is required; " + list;
  const std::string cmd = argv[i];
  CLI::App* sub = nullptr;
  for (CLI::App* s : app.get_subcommands([](CLI::App*) { return true; })) {
    if (s->get_name() == cmd) sub = s;
  }
  if (!sub) {
    std::string m = "flashinfer: unknown command '" + cmd + "'";
    if (const auto c = closest(cmd, names)) m += "; did you mean '" + *c + "'?";
    return m + "\n" + list;
  }
  for (++i; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") break;
    if (a.size() < 2 || a[0] != '-' || is_number(a)) continue;  // a value or a positional
    const CLI::Option* o = find_option(*sub, a);
    if (!o) return unknown_option(*sub, "flashinfer " + cmd, a);
    // A value given as the next word is not an option to check ("--dir -x" names a folder).
    const bool inline_value = a.find('=') != std::string::npos || (a[1] != '-' && a.size() > 2);
    if (o->get_type_size_max() > 0 && !inline_value) ++i;
  }
  return "";
}

std::string g_invoked_as = "flashinfer";

}  // namespace

const std::string& invoked_as() { return g_invoked_as; }

}  // namespace flashinfer::cli

int main(int argc, char** argv) {
  using namespace flashinfer;
  CLI::App app{"flashinfer: FlashInfer's kernels in native C++, with API logging and replay",
               "flashinfer"};
  app.require_subcommand(1);
  // The command lines the tool prints (show, replay) start the way it was started.
  if (argc > 0 && std::string(argv[0]).find('/') != std::string::npos) cli::g_invoked_as = argv[0];
  std::function<int()> to_run;
  for (const cli::Command& cmd : cli::commands()) {
    CLI::App* sub = app.add_subcommand(cmd.name, cmd.summary);
    cli::Args args(*sub);
    auto run = cmd.setup(args);
    sub->callback([&to_run, run] { to_run = run; });
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help exits 0; a usage error exits 2, as the commands' documented statuses say.
    if (e.get_exit_code() == 0) return app.exit(e);
    const std::string why = cli::diagnose_usage(app, argc, argv);
    if (why.empty()) {
      app.exit(e);
    } else {
      std::fputs(why.c_str(), stderr);
    }
    return 2;
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
