// Conformance with upstream FlashInfer's Python API: every op in the process-wide registry is
// compared with tests/api/data/upstream-api-signatures.tsv (every @flashinfer_api function and
// method of upstream at a pinned commit): qualified name, module, parameter names, order, kinds
// and defaults, and the signature text the recorder writes as `function_signature`. An op that
// declares a parameter which only the newer release's table has (upstream-0.7.4-signatures.tsv,
// the release whose semantics we follow) is compared with that table instead, as a whole.
// Deliberate differences live in tests/api/data/conformance-allowlist.tsv, one reasoned entry
// each; an entry that no longer matches a difference fails the test. See docs/CONFORMANCE.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "flashinfer/flashinfer.h"

namespace {

using flashinfer::OpDecl;
using flashinfer::OpRegistry;
using flashinfer::ParamDecl;

const std::string kDataDir = FLASHINFER_TEST_SOURCE_DIR + "/tests/api/data";
const std::string kUpstreamPath = kDataDir + "/upstream-api-signatures.tsv";
const std::string kAllowlistPath = kDataDir + "/conformance-allowlist.tsv";
const std::string kReleasePath = kDataDir + "/upstream-0.7.4-signatures.tsv";

// ---- a small parser of Python signature text (inspect.signature's str form) -------------------

enum class PyKind {
  kPositionalOnly,
  kPositionalOrKeyword,
  kKeywordOnly,
  kVarPositional,
  kVarKeyword
};

std::string_view kind_text(PyKind k) {
  switch (k) {
    case PyKind::kPositionalOnly:
      return "positional-only";
    case PyKind::kPositionalOrKeyword:
      return "positional-or-keyword";
    case PyKind::kKeywordOnly:
      return "keyword-only";
    case PyKind::kVarPositional:
      return "*args";
    case PyKind::kVarKeyword:
      return "**kwargs";
  }
  return "?";
}

struct PyParam {
  std::string name;
  PyKind kind = PyKind::kPositionalOrKeyword;
  std::optional<std::string> default_text;  // nullopt: required (or variadic)

  bool named() const { return kind != PyKind::kVarPositional && kind != PyKind::kVarKeyword; }
  /// The parameter as the signature text writes it: "eps=1e-06", "*args", "**kwargs".
  std::string text() const {
    if (kind == PyKind::kVarPositional) return "*" + name;
    if (kind == PyKind::kVarKeyword) return "**" + name;
    return default_text ? name + "=" + *default_text : name;
  }
};

struct PySignature {
  std::vector<PyParam> params;  // in text order, variadics included

  const PyParam* find(std::string_view name) const {
    for (const PyParam& p : params) {
      if (p.name == name && p.named()) return &p;
    }
    return nullptr;
  }
  const PyParam* var_positional() const {
    for (const PyParam& p : params) {
      if (p.kind == PyKind::kVarPositional) return &p;
    }
    return nullptr;
  }
  const PyParam* var_keyword() const {
    for (const PyParam& p : params) {
      if (p.kind == PyKind::kVarKeyword) return &p;
    }
    return nullptr;
  }
  std::vector<const PyParam*> named() const {
    std::vector<const PyParam*> out;
    for (const PyParam& p : params) {
      if (p.named()) out.push_back(&p);
    }
    return out;
  }
  /// How many named parameters come before `*args` (nullopt without one).
  std::optional<std::size_t> var_positional_index() const {
    std::size_t n = 0;
    for (const PyParam& p : params) {
      if (p.kind == PyKind::kVarPositional) return n;
      if (p.named()) ++n;
    }
    return std::nullopt;
  }
};

std::string trim(std::string_view s) {
  std::size_t b = 0;
  std::size_t e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

bool is_identifier(std::string_view s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

/// Splits `s` at top-level occurrences of `sep` (outside brackets and string literals). Throws
/// std::runtime_error on unbalanced brackets or an unterminated string.
std::vector<std::string> split_top_level(std::string_view s, char sep, std::size_t max_parts = 0) {
  std::vector<std::string> parts;
  std::string cur;
  std::vector<char> closers;
  char quote = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (quote) {
      cur += c;
      if (c == '\\' && i + 1 < s.size()) {
        cur += s[++i];
      } else if (c == quote) {
        quote = 0;
      }
      continue;
    }
    if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '(' || c == '[' || c == '{') {
      closers.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (closers.empty() || closers.back() != c) {
        throw std::runtime_error(std::string("unbalanced '") + c + "' at offset " +
                                 std::to_string(i));
      }
      closers.pop_back();
    } else if (c == sep && closers.empty() && (max_parts == 0 || parts.size() + 1 < max_parts)) {
      parts.push_back(cur);
      cur.clear();
      continue;
    }
    cur += c;
  }
  if (quote) throw std::runtime_error("unterminated string literal");
  if (!closers.empty()) throw std::runtime_error(std::string("missing '") + closers.back() + "'");
  parts.push_back(cur);
  return parts;
}

/// Parses "(a, b=1, *args, c=None, **kwargs)". Throws std::runtime_error naming the problem.
PySignature parse_py_signature(std::string_view text) {
  const std::string t = trim(text);
  if (t.size() < 2 || t.front() != '(') throw std::runtime_error("does not start with '('");
  if (t.back() != ')') throw std::runtime_error("does not end with ')'");
  const std::string inner = t.substr(1, t.size() - 2);
  // "(a)(b)" balances but is not one parameter list.
  {
    int depth = 0;
    char quote = 0;
    for (std::size_t i = 0; i < inner.size(); ++i) {
      const char c = inner[i];
      if (quote) {
        if (c == '\\') {
          ++i;
        } else if (c == quote) {
          quote = 0;
        }
      } else if (c == '\'' || c == '"') {
        quote = c;
      } else if (c == '(' || c == '[' || c == '{') {
        ++depth;
      } else if (c == ')' || c == ']' || c == '}') {
        if (--depth < 0) throw std::runtime_error("text after the closing ')'");
      }
    }
  }
  PySignature sig;
  if (trim(inner).empty()) return sig;
  bool keyword_only = false;
  bool bare_star_pending = false;  // a bare `*` must be followed by a named parameter
  std::set<std::string> seen;
  for (const std::string& raw : split_top_level(inner, ',')) {
    const std::string item = trim(raw);
    if (item.empty()) throw std::runtime_error("empty parameter");
    if (sig.var_keyword()) throw std::runtime_error("parameter after **" + sig.var_keyword()->name);
    if (item == "/") {
      if (keyword_only || sig.params.empty()) throw std::runtime_error("misplaced '/'");
      for (PyParam& p : sig.params) {
        if (p.kind == PyKind::kPositionalOnly) throw std::runtime_error("second '/'");
        p.kind = PyKind::kPositionalOnly;
      }
      continue;
    }
    if (item == "*") {
      if (keyword_only) throw std::runtime_error("second '*'");
      keyword_only = true;
      bare_star_pending = true;
      continue;
    }
    PyParam p;
    if (item.rfind("**", 0) == 0) {
      p.kind = PyKind::kVarKeyword;
      p.name = trim(item.substr(2));
    } else if (item[0] == '*') {
      if (keyword_only) throw std::runtime_error("*" + trim(item.substr(1)) + " after '*'");
      p.kind = PyKind::kVarPositional;
      p.name = trim(item.substr(1));
      keyword_only = true;
    } else {
      const std::vector<std::string> nd = split_top_level(item, '=', 2);
      p.name = trim(nd[0]);
      if (p.name.find(':') != std::string::npos) {
        throw std::runtime_error("annotations are not supported: `" + item + "`");
      }
      if (nd.size() == 2) {
        p.default_text = trim(nd[1]);
        if (p.default_text->empty()) throw std::runtime_error("empty default for `" + p.name + "`");
      }
      p.kind = keyword_only ? PyKind::kKeywordOnly : PyKind::kPositionalOrKeyword;
      bare_star_pending = false;
    }
    if (!is_identifier(p.name)) throw std::runtime_error("bad parameter name `" + item + "`");
    if (!seen.insert(p.name).second)
      throw std::runtime_error("duplicate parameter `" + p.name + "`");
    if (p.kind == PyKind::kVarKeyword && bare_star_pending) {
      throw std::runtime_error("named arguments must follow bare '*'");
    }
    sig.params.push_back(std::move(p));
  }
  if (bare_star_pending) throw std::runtime_error("named arguments must follow bare '*'");
  return sig;
}

/// Python's inspect renders an Enum member default as repr(member), "<SfLayout.layout_128x4: 0>";
/// the upstream table writes the default as its source expression, "SfLayout.layout_128x4". Both
/// name the same member, so ours is compared in the source form.
std::string enum_defaults_as_source(const std::string& text) {
  static const std::regex member(
      R"(<([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+): [^<>]*>)");
  return std::regex_replace(text, member, "$1");
}

std::optional<std::string> our_default(const ParamDecl& p) {
  if (!p.default_value) return std::nullopt;
  return enum_defaults_as_source(p.default_value->repr());
}

PyKind our_kind(const ParamDecl& p) {
  return p.keyword_only ? PyKind::kKeywordOnly : PyKind::kPositionalOrKeyword;
}

std::string render(const ParamDecl& p) {
  const auto d = our_default(p);
  return d ? p.name + "=" + *d : p.name;
}

std::string default_desc(const std::optional<std::string>& d) {
  return d ? "`=" + *d + "`" : "none (required)";
}

// ---- the upstream table ------------------------------------------------------------------------

struct UpstreamEntry {
  std::string module;
  std::string qualified_name;
  std::string signature_text;
  std::string where;  // file:line upstream
  PySignature sig;
};

struct Upstream {
  std::string commit;
  std::vector<UpstreamEntry> entries;
  std::multimap<std::string, std::size_t> by_name;

  std::vector<const UpstreamEntry*> find(const std::string& name) const {
    std::vector<const UpstreamEntry*> out;
    auto [b, e] = by_name.equal_range(name);
    for (auto it = b; it != e; ++it) out.push_back(&entries[it->second]);
    return out;
  }
};

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t tab = line.find('\t', start);
    out.push_back(line.substr(start, tab == std::string::npos ? std::string::npos : tab - start));
    if (tab == std::string::npos) break;
    start = tab + 1;
  }
  return out;
}

/// Loads the table; throws std::runtime_error naming the line of any malformed row.
Upstream load_upstream(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  Upstream up;
  std::string line;
  int lineno = 0;
  bool header_seen = false;
  static const std::regex commit_re(R"(commit ([0-9a-f]{40}))");
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const std::string at = path + ":" + std::to_string(lineno) + ": ";
    if (line[0] == '#') {
      std::smatch m;
      if (up.commit.empty() && std::regex_search(line, m, commit_re)) up.commit = m[1];
      continue;
    }
    const std::vector<std::string> f = split_tabs(line);
    if (!header_seen) {
      if (line != "module\tqualified_name\tsignature\tfile:line") {
        throw std::runtime_error(at + "expected the header row, got `" + line + "`");
      }
      header_seen = true;
      continue;
    }
    if (f.size() != 4) {
      throw std::runtime_error(at + "expected 4 tab-separated fields, got " +
                               std::to_string(f.size()));
    }
    UpstreamEntry e{f[0], f[1], f[2], f[3], {}};
    try {
      e.sig = parse_py_signature(e.signature_text);
    } catch (const std::exception& ex) {
      throw std::runtime_error(at + "signature of " + e.qualified_name +
                               " does not parse: " + ex.what());
    }
    up.by_name.emplace(e.qualified_name, up.entries.size());
    up.entries.push_back(std::move(e));
  }
  if (!header_seen) throw std::runtime_error(path + ": no header row");
  if (up.commit.empty()) throw std::runtime_error(path + ": no `commit <40 hex>` comment");
  return up;
}

// ---- the allowlist -----------------------------------------------------------------------------

struct AllowEntry {
  std::string op;
  std::string what;
  std::string reason;
  int line = 0;
};

/// The difference keys an entry may name (see Mismatch::what).
bool valid_what(const std::string& what) {
  static const std::regex re(
      R"(not-upstream|module|signature|order|var-positional|var-keyword|decl-vs-signature|param:[A-Za-z_][A-Za-z0-9_]*)");
  return std::regex_match(what, re);
}

/// Loads the allowlist; format problems (not three fields, an unknown difference key, a missing
/// or placeholder reason, a duplicate) are returned in `problems`.
std::vector<AllowEntry> load_allowlist(const std::string& path,
                                       std::vector<std::string>& problems) {
  std::vector<AllowEntry> out;
  std::ifstream in(path);
  if (!in) {
    problems.push_back("cannot open " + path);
    return out;
  }
  std::set<std::pair<std::string, std::string>> keys;
  std::string line;
  int lineno = 0;
  static const std::regex placeholder(R"(^\s*(todo|tbd|fixme|xxx|\?+|-|n/a|none)\b)",
                                      std::regex::icase);
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (trim(line).empty() || line[0] == '#') continue;
    const std::string at = "allowlist line " + std::to_string(lineno) + ": ";
    const std::vector<std::string> f = split_tabs(line);
    if (f.size() != 3) {
      problems.push_back(at + "expected `qualified_name<TAB>what<TAB>reason`, got " +
                         std::to_string(f.size()) + " field(s)");
      continue;
    }
    AllowEntry e{trim(f[0]), trim(f[1]), trim(f[2]), lineno};
    if (!valid_what(e.what)) {
      problems.push_back(at + "unknown difference key `" + e.what +
                         "` (one of not-upstream, module, signature, order, var-positional, "
                         "var-keyword, decl-vs-signature, param:<name>)");
    }
    if (e.reason.size() < 20 || std::regex_search(e.reason, placeholder)) {
      problems.push_back(at + e.op + " " + e.what + ": the reason `" + e.reason +
                         "` is not a reason; say why the difference is deliberate");
    }
    if (!keys.emplace(e.op, e.what).second) {
      problems.push_back(at + "duplicate entry " + e.op + " " + e.what);
    }
    out.push_back(std::move(e));
  }
  return out;
}

struct Mismatch;
/// Every problem of the allowlist at `path` given the differences found: format problems (see
/// load_allowlist) and stale entries, which match no difference any more.
std::vector<std::string> allowlist_problems(
    const std::string& path, const std::vector<Mismatch>& all,
    const std::function<bool(const std::string&)>& op_exists);

// ---- comparison --------------------------------------------------------------------------------

/// One difference. `what` is the key an allowlist entry names:
///   not-upstream       the qualified name is not an @flashinfer_api function/method upstream
///   module             the defining module differs
///   signature          signature() text differs from upstream's (what the recorder writes)
///   param:<name>       a named parameter is missing, extra, or differs in kind or default
///   order              the shared named parameters come in a different order
///   var-positional     `*args` missing, extra, renamed or placed elsewhere
///   var-keyword        `**kwargs` missing, extra or renamed
///   decl-vs-signature  our ParamDecl list and our own signature() text disagree
struct Mismatch {
  std::string op;
  std::string what;
  std::string message;
};

std::string join_names(const std::vector<std::string>& names) {
  std::string s = "(";
  for (std::size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + names[i];
  return s + ")";
}

void compare_params(const OpDecl& d, const UpstreamEntry& e, std::vector<Mismatch>& out) {
  const auto add = [&](const std::string& name, const std::string& msg) {
    out.push_back({d.name, "param:" + name, "parameter `" + name + "`: " + msg});
  };
  const std::vector<const PyParam*> up_named = e.sig.named();
  const bool up_kwargs = e.sig.var_keyword() != nullptr;
  for (std::size_t i = 0; i < up_named.size(); ++i) {
    const PyParam& u = *up_named[i];
    const int idx = d.param_index(u.name);
    if (idx < 0) {
      add(u.name, "missing; upstream declares `" + u.text() + "` (" +
                      std::string(kind_text(u.kind)) + ") as named parameter #" +
                      std::to_string(i));
      continue;
    }
    const ParamDecl& p = d.params[static_cast<std::size_t>(idx)];
    if (our_kind(p) != u.kind) {
      add(u.name, "kind: ours " + std::string(kind_text(our_kind(p))) + ", upstream " +
                      std::string(kind_text(u.kind)));
    }
    const auto ours = our_default(p);
    if (ours != u.default_text) {
      add(u.name,
          "default: ours " + default_desc(ours) + ", upstream " + default_desc(u.default_text));
    }
  }
  for (const ParamDecl& p : d.params) {
    if (e.sig.find(p.name)) continue;
    if (up_kwargs && p.keyword_only) continue;  // one of the kwargs upstream's body accepts
    // The holder of *args' values (bind_arguments), when upstream has that *args.
    if (p.name == d.var_positional && e.sig.var_positional() &&
        e.sig.var_positional()->name == p.name) {
      continue;
    }
    if (up_kwargs) {
      add(p.name, "upstream accepts it only through **" + e.sig.var_keyword()->name +
                      ", so ours must be keyword-only; ours is positional-or-keyword `" +
                      render(p) + "`");
    } else {
      add(p.name, "ours declares `" + render(p) + "` (" + std::string(kind_text(our_kind(p))) +
                      "), upstream has no such parameter");
    }
  }
  std::vector<std::string> ours_order;
  std::vector<std::string> up_order;
  for (const ParamDecl& p : d.params) {
    if (e.sig.find(p.name)) ours_order.push_back(p.name);
  }
  for (const PyParam* u : up_named) {
    if (d.param_index(u->name) >= 0) up_order.push_back(u->name);
  }
  if (ours_order != up_order) {
    out.push_back({d.name, "order",
                   "order of the shared parameters: ours " + join_names(ours_order) +
                       ", upstream " + join_names(up_order)});
  }
}

std::string position_desc(const PySignature& sig) {
  const auto idx = sig.var_positional_index();
  if (!idx) return "";
  const auto named = sig.named();
  return *idx == 0 ? " first" : " after `" + named[*idx - 1]->name + "`";
}

void compare_variadics(const OpDecl& d, const PySignature& ours, const UpstreamEntry& e,
                       std::vector<Mismatch>& out) {
  const PyParam* ov = ours.var_positional();
  const PyParam* uv = e.sig.var_positional();
  if (uv && !ov) {
    out.push_back(
        {d.name, "var-positional",
         "upstream takes `*" + uv->name + "`" + position_desc(e.sig) + "; ours has none"});
  } else if (ov && !uv) {
    out.push_back({d.name, "var-positional",
                   "ours takes `*" + ov->name + "`" + position_desc(ours) + "; upstream has none"});
  } else if (ov && uv &&
             (ov->name != uv->name ||
              ours.var_positional_index() != e.sig.var_positional_index())) {
    out.push_back({d.name, "var-positional",
                   "ours takes `*" + ov->name + "`" + position_desc(ours) + ", upstream `*" +
                       uv->name + "`" + position_desc(e.sig)});
  }
  const PyParam* ok = ours.var_keyword();
  const PyParam* uk = e.sig.var_keyword();
  if (uk && !ok) {
    out.push_back({d.name, "var-keyword", "upstream takes `**" + uk->name + "`; ours has none"});
  } else if (ok && !uk) {
    out.push_back({d.name, "var-keyword", "ours takes `**" + ok->name + "`; upstream has none"});
  } else if (ok && uk && ok->name != uk->name) {
    out.push_back(
        {d.name, "var-keyword", "ours takes `**" + ok->name + "`, upstream `**" + uk->name + "`"});
  }
}

/// Our signature() text must render our ParamDecl list: the same named parameters in order with
/// the same kinds and defaults, except keyword-only parameters that the text folds into **kwargs.
void check_decl_renders(const OpDecl& d, const PySignature& ours, std::vector<Mismatch>& out) {
  const auto add = [&](const std::string& msg) {
    out.push_back({d.name, "decl-vs-signature", msg});
  };
  std::vector<std::string> text_order;
  for (const PyParam* t : ours.named()) {
    text_order.push_back(t->name);
    const int idx = d.param_index(t->name);
    if (idx < 0) {
      add("signature() renders `" + t->text() + "`, which the ParamDecl list lacks");
      continue;
    }
    const ParamDecl& p = d.params[static_cast<std::size_t>(idx)];
    if (our_kind(p) != t->kind) {
      add("`" + p.name + "` is " + std::string(kind_text(our_kind(p))) +
          " in the ParamDecl list but " + std::string(kind_text(t->kind)) + " in signature() text");
    }
    if (our_default(p) != t->default_text) {
      add("`" + p.name + "` defaults to " + default_desc(our_default(p)) +
          " in the ParamDecl list but " + default_desc(t->default_text) + " in signature() text");
    }
  }
  std::vector<std::string> decl_order;
  for (const ParamDecl& p : d.params) {
    if (ours.find(p.name)) {
      decl_order.push_back(p.name);
    } else if (p.name == d.var_positional && ours.var_positional()) {
      // The parameter that holds *args' values (bind_arguments) renders as `*args` itself.
    } else if (!ours.var_keyword() || !p.keyword_only) {
      add("ParamDecl `" + render(p) + "` is missing from signature() text" +
          (ours.var_keyword() ? " and is not keyword-only, so **kwargs cannot stand for it" : ""));
    }
  }
  if (decl_order != text_order) {
    add("ParamDecl order " + join_names(decl_order) + " but signature() order " +
        join_names(text_order));
  }
}

std::vector<Mismatch> check_op(const OpDecl& d, const Upstream& up) {
  std::vector<Mismatch> out;
  const std::string ours_text = enum_defaults_as_source(d.signature());
  const std::vector<const UpstreamEntry*> candidates = up.find(d.name);
  if (candidates.empty()) {
    out.push_back({d.name, "not-upstream",
                   "no @flashinfer_api function or method of this name upstream (ours: " +
                       d.module + "." + d.name + ours_text + ")"});
    return out;
  }
  const UpstreamEntry* e = candidates.front();
  for (const UpstreamEntry* c : candidates) {
    if (c->module == d.module) e = c;
  }
  if (e->module != d.module) {
    std::string msg = "module: ours `" + d.module + "`, upstream `" + e->module + "`";
    for (const UpstreamEntry* c : candidates) {
      if (c != e) msg += " (also `" + c->module + "`)";
    }
    out.push_back({d.name, "module", msg});
  }
  if (ours_text != e->signature_text) {
    out.push_back(
        {d.name, "signature",
         "signature text: ours `" + ours_text + "`, upstream `" + e->signature_text + "`"});
  }
  compare_params(d, *e, out);
  PySignature ours;
  try {
    ours = parse_py_signature(ours_text);
  } catch (const std::exception& ex) {
    out.push_back({d.name, "signature",
                   "our signature() text `" + ours_text + "` does not parse: " + ex.what()});
    return out;
  }
  compare_variadics(d, ours, *e, out);
  check_decl_renders(d, ours, out);
  return out;
}

std::vector<std::string> allowlist_problems(
    const std::string& path, const std::vector<Mismatch>& all,
    const std::function<bool(const std::string&)>& op_exists) {
  std::vector<std::string> problems;
  const std::vector<AllowEntry> allow = load_allowlist(path, problems);
  for (const AllowEntry& a : allow) {
    const bool live = std::any_of(all.begin(), all.end(), [&](const Mismatch& m) {
      return m.op == a.op && m.what == a.what;
    });
    if (!live) {
      problems.push_back(
          "allowlist line " + std::to_string(a.line) + ": stale entry " + a.op + " " + a.what +
          ": " +
          (op_exists(a.op) ? "no such difference any more" : "no registered op of this name") +
          "; remove it");
    }
  }
  return problems;
}

/// The differences no allowlist entry names.
std::vector<const Mismatch*> not_allowlisted(const std::vector<Mismatch>& all,
                                             const std::vector<AllowEntry>& allow) {
  std::set<std::pair<std::string, std::string>> allowed;
  for (const AllowEntry& a : allow) allowed.emplace(a.op, a.what);
  std::vector<const Mismatch*> out;
  for (const Mismatch& m : all) {
    if (!allowed.count({m.op, m.what})) out.push_back(&m);
  }
  return out;
}

/// Whether `d` follows the release's signature rather than the pinned one: it declares a
/// parameter that the release's entry of its name has and the pinned entries lack.
bool follows_release(const OpDecl& d, const Upstream& pinned, const Upstream& release) {
  const std::vector<const UpstreamEntry*> newer = release.find(d.name);
  if (newer.empty()) return false;
  for (const ParamDecl& p : d.params) {
    const bool in_release = std::any_of(newer.begin(), newer.end(), [&](const UpstreamEntry* e) {
      return e->sig.find(p.name) != nullptr;
    });
    if (!in_release) continue;
    const std::vector<const UpstreamEntry*> pinned_entries = pinned.find(d.name);
    const bool in_pinned =
        std::any_of(pinned_entries.begin(), pinned_entries.end(),
                    [&](const UpstreamEntry* e) { return e->sig.find(p.name) != nullptr; });
    if (!in_pinned) return true;
  }
  return false;
}

struct Fixture {
  Upstream up;                           // the pinned commit's table
  Upstream release;                      // flashinfer-python 0.7.4's signatures of the same names
  std::set<std::string> follow_release;  // ops compared with `release`
  std::vector<Mismatch> all;             // every difference, allowlisted or not
};

const Fixture& fixture() {
  static const Fixture f = [] {
    Fixture x;
    x.up = load_upstream(kUpstreamPath);
    x.release = load_upstream(kReleasePath);
    for (const OpDecl* d : OpRegistry::global().ops()) {
      const bool newer = follows_release(*d, x.up, x.release);
      if (newer) x.follow_release.insert(d->name);
      for (Mismatch& m : check_op(*d, newer ? x.release : x.up)) x.all.push_back(std::move(m));
    }
    return x;
  }();
  return f;
}

// ---- tests of the parser -----------------------------------------------------------------------

TEST(PySignatureParser, PlainDefaults) {
  const PySignature s = parse_py_signature("(input, weight, eps=1e-06, out=None, enable_pdl=None)");
  ASSERT_EQ(s.params.size(), 5u);
  EXPECT_EQ(s.params[0].name, "input");
  EXPECT_EQ(s.params[0].kind, PyKind::kPositionalOrKeyword);
  EXPECT_FALSE(s.params[0].default_text.has_value());
  EXPECT_EQ(s.params[2].name, "eps");
  EXPECT_EQ(s.params[2].default_text, std::optional<std::string>("1e-06"));
  EXPECT_EQ(s.params[4].text(), "enable_pdl=None");
  EXPECT_EQ(s.var_positional(), nullptr);
  EXPECT_EQ(s.var_keyword(), nullptr);
}

TEST(PySignatureParser, VariadicsAndKeywordOnly) {
  const PySignature plan =
      parse_py_signature("(self, indptr, page_size, *deprecated_positional_args, **kwargs)");
  ASSERT_EQ(plan.params.size(), 5u);
  EXPECT_EQ(plan.params[3].kind, PyKind::kVarPositional);
  EXPECT_EQ(plan.params[3].name, "deprecated_positional_args");
  EXPECT_EQ(plan.params[4].kind, PyKind::kVarKeyword);
  EXPECT_EQ(plan.var_positional_index(), std::optional<std::size_t>(3));
  EXPECT_EQ(plan.named().size(), 3u);

  const PySignature run = parse_py_signature("(self, q, *args, q_scale=None, return_lse=False)");
  EXPECT_EQ(run.find("q")->kind, PyKind::kPositionalOrKeyword);
  EXPECT_EQ(run.find("q_scale")->kind, PyKind::kKeywordOnly);
  EXPECT_EQ(run.find("return_lse")->default_text, std::optional<std::string>("False"));
  EXPECT_EQ(run.find("args"), nullptr);  // variadics are not named parameters

  const PySignature bare = parse_py_signature("(q, k, *, kv_valid_bits=None, mask_type='dense')");
  ASSERT_EQ(bare.params.size(), 4u);
  EXPECT_EQ(bare.params[2].kind, PyKind::kKeywordOnly);
  EXPECT_EQ(bare.params[3].default_text, std::optional<std::string>("'dense'"));

  const PySignature posonly = parse_py_signature("(a, b, /, c)");
  EXPECT_EQ(posonly.params[1].kind, PyKind::kPositionalOnly);
  EXPECT_EQ(posonly.params[2].kind, PyKind::kPositionalOrKeyword);

  EXPECT_TRUE(parse_py_signature("()").params.empty());
}

TEST(PySignatureParser, NestedDefaultsStayWhole) {
  const PySignature s = parse_py_signature(
      "(a, shape=(1, 2), s='x, y)', t=\"it's\", d={'k': [1, 2]}, e=f(x=1), *, g=torch.bfloat16)");
  ASSERT_EQ(s.params.size(), 7u);
  EXPECT_EQ(s.params[1].default_text, std::optional<std::string>("(1, 2)"));
  EXPECT_EQ(s.params[2].default_text, std::optional<std::string>("'x, y)'"));
  EXPECT_EQ(s.params[3].default_text, std::optional<std::string>("\"it's\""));
  EXPECT_EQ(s.params[4].default_text, std::optional<std::string>("{'k': [1, 2]}"));
  EXPECT_EQ(s.params[5].default_text, std::optional<std::string>("f(x=1)"));
  EXPECT_EQ(s.params[6].kind, PyKind::kKeywordOnly);
  EXPECT_EQ(s.params[6].default_text, std::optional<std::string>("torch.bfloat16"));
}

TEST(PySignatureParser, RejectsMalformedText) {
  for (const char* bad :
       {"a, b", "(a, b", "(a, b))", "(a)(b)", "(a, , b)", "(a, a)", "(**kw, b)", "(*, **kw)",
        "(a, *)", "(*a, *b)", "(a=)", "(1a)", "(s='x)", "(a: int)"}) {
    EXPECT_THROW(parse_py_signature(bad), std::runtime_error) << bad;
  }
}

TEST(PySignatureParser, EnumDefaultsCompareInSourceForm) {
  EXPECT_EQ(enum_defaults_as_source("(a, sfLayout=<SfLayout.layout_128x4: 0>, b=None)"),
            "(a, sfLayout=SfLayout.layout_128x4, b=None)");
  EXPECT_EQ(enum_defaults_as_source("(t=<TopKTieBreak.NONE: 'none'>)"), "(t=TopKTieBreak.NONE)");
  // An object repr is not an enum member.
  EXPECT_EQ(enum_defaults_as_source("<flashinfer.decode.X object at 0x1>"),
            "<flashinfer.decode.X object at 0x1>");
}

// ---- tests of the data -------------------------------------------------------------------------

TEST(Conformance, UpstreamTableLoads) {
  const Upstream& up = fixture().up;
  EXPECT_EQ(up.commit, "fb28d7242b3506a2348265962041acc1fb56cca4");
  const auto rms = up.find("rmsnorm");
  ASSERT_EQ(rms.size(), 1u);
  EXPECT_EQ(rms[0]->module, "flashinfer.norm");
  EXPECT_EQ(rms[0]->signature_text, "(input, weight, eps=1e-06, out=None, enable_pdl=None)");
  EXPECT_EQ(rms[0]->where, "flashinfer/norm/__init__.py:142");
  // One name may be defined in several modules (recurrent_kda: flashinfer.kda and kda_decode).
  EXPECT_EQ(up.find("recurrent_kda").size(), 2u);
  const auto plan = up.find("BatchDecodeWithPagedKVCacheWrapper.plan");
  ASSERT_EQ(plan.size(), 1u);
  ASSERT_NE(plan[0]->sig.var_keyword(), nullptr);
  EXPECT_EQ(plan[0]->sig.var_positional()->name, "deprecated_positional_args");
}

// The release's table: the same names, each with 0.7.4's signature where the wheel has it.
TEST(Conformance, ReleaseTableLoads) {
  const Fixture& f = fixture();
  EXPECT_EQ(f.release.commit, "77039051b0be921788dc2784ec41423b558878ec");
  const auto sampler = f.release.find("top_k_top_p_sampling_from_logits");
  ASSERT_EQ(sampler.size(), 1u);
  EXPECT_NE(sampler[0]->sig.find("top_k_max"), nullptr);
  EXPECT_EQ(f.up.find("top_k_top_p_sampling_from_logits")[0]->sig.find("top_k_max"), nullptr);
  for (const UpstreamEntry& e : f.release.entries) {
    EXPECT_FALSE(f.up.find(e.qualified_name).empty()) << e.qualified_name;
  }
}

// ---- tests of the comparison on hand-made declarations (the drift issue #15 names) -------------

using flashinfer::EnumValue;
using flashinfer::ParamKind;
using flashinfer::Value;

OpDecl make_decl(std::string name, std::string module, std::vector<ParamDecl> params) {
  OpDecl d;
  const auto dot = name.find('.');
  if (dot != std::string::npos) d.class_name = name.substr(0, dot);
  d.name = std::move(name);
  d.module = std::move(module);
  d.params = std::move(params);
  return d;
}

ParamDecl tensor(std::string n) { return ParamDecl(std::move(n), ParamKind::kTensor); }
ParamDecl integer(std::string n) { return ParamDecl(std::move(n), ParamKind::kInt); }
ParamDecl sf_layout() {
  return ParamDecl("sfLayout", ParamKind::kEnum)
      .type("SfLayout")
      .def(Value(EnumValue{"SfLayout", "layout_128x4", "0"}));
}

std::vector<std::string> keys_of(const std::vector<Mismatch>& ms) {
  std::vector<std::string> keys;
  for (const Mismatch& m : ms) keys.push_back(m.what);
  return keys;
}

std::string message_of(const std::vector<Mismatch>& ms, const std::string& what) {
  for (const Mismatch& m : ms) {
    if (m.what == what) return m.message;
  }
  return "<no " + what + " difference>";
}

using Keys = std::vector<std::string>;

// An op follows the release exactly when it declares a parameter only the release has; one that
// does is compared with the release's whole signature (EveryOpMatchesUpstream), never half of it.
TEST(ConformanceCheck, FollowsTheReleaseByItsParameters) {
  const Fixture& f = fixture();
  const OpDecl pinned = make_decl("top_k_renorm_probs", "flashinfer.sampling",
                                  {tensor("probs"), ParamDecl("top_k", ParamKind::kAny)});
  EXPECT_FALSE(follows_release(pinned, f.up, f.release));
  OpDecl newer = pinned;
  newer.params.push_back(ParamDecl("is_deterministic", ParamKind::kBool).def(false));
  EXPECT_TRUE(follows_release(newer, f.up, f.release));
  OpDecl invented = pinned;
  invented.params.push_back(ParamDecl("no_such_parameter", ParamKind::kBool).def(false));
  EXPECT_FALSE(follows_release(invented, f.up, f.release));
}

TEST(ConformanceCheck, MatchingDeclarationHasNoDifference) {
  const Upstream& up = fixture().up;
  const OpDecl rms =
      make_decl("rmsnorm", "flashinfer.norm",
                {tensor("input"), tensor("weight"), ParamDecl("eps", ParamKind::kFloat).def(1e-6),
                 tensor("out").opt(), ParamDecl("enable_pdl", ParamKind::kBool).opt()});
  EXPECT_TRUE(check_op(rms, up).empty());
  // An Enum default renders as "<SfLayout.layout_128x4: 0>" and matches the source form.
  const OpDecl deq = make_decl("mxfp4_dequantize", "flashinfer.quantization.fp4_quantization",
                               {tensor("a_fp4"), tensor("a_sf"), sf_layout()});
  EXPECT_TRUE(check_op(deq, up).empty());
}

TEST(ConformanceCheck, ExtraParameter) {
  const auto ms = check_op(make_decl("top_k_renorm_probs", "flashinfer.sampling",
                                     {tensor("probs"), integer("top_k"),
                                      ParamDecl("is_deterministic", ParamKind::kBool).def(false)}),
                           fixture().up);
  EXPECT_EQ(keys_of(ms), (Keys{"signature", "param:is_deterministic"}));
  EXPECT_EQ(message_of(ms, "signature"),
            "signature text: ours `(probs, top_k, is_deterministic=False)`, upstream "
            "`(probs, top_k)`");
  EXPECT_EQ(message_of(ms, "param:is_deterministic"),
            "parameter `is_deterministic`: ours declares `is_deterministic=False` "
            "(positional-or-keyword), upstream has no such parameter");
}

TEST(ConformanceCheck, MissingParameterAndModule) {
  const auto ms = check_op(make_decl("mxfp4_dequantize", "flashinfer.fp4_quantization",
                                     {tensor("a_fp4"), tensor("a_sf")}),
                           fixture().up);
  EXPECT_EQ(keys_of(ms), (Keys{"module", "signature", "param:sfLayout"}));
  EXPECT_EQ(message_of(ms, "module"),
            "module: ours `flashinfer.fp4_quantization`, upstream "
            "`flashinfer.quantization.fp4_quantization`");
  EXPECT_EQ(message_of(ms, "param:sfLayout"),
            "parameter `sfLayout`: missing; upstream declares `sfLayout=SfLayout.layout_128x4` "
            "(positional-or-keyword) as named parameter #2");
}

TEST(ConformanceCheck, KindDefaultAndOrder) {
  const auto ms = check_op(
      make_decl("rmsnorm", "flashinfer.norm",
                {tensor("input"), tensor("weight"), ParamDecl("eps", ParamKind::kFloat).def(1e-5),
                 ParamDecl("enable_pdl", ParamKind::kBool).opt(), tensor("out").opt().kw()}),
      fixture().up);
  EXPECT_EQ(keys_of(ms), (Keys{"signature", "param:eps", "param:out", "order"}));
  EXPECT_EQ(message_of(ms, "param:eps"),
            "parameter `eps`: default: ours `=1e-05`, upstream `=1e-06`");
  EXPECT_EQ(message_of(ms, "param:out"),
            "parameter `out`: kind: ours keyword-only, upstream positional-or-keyword");
  EXPECT_EQ(message_of(ms, "order"),
            "order of the shared parameters: ours (input, weight, eps, enable_pdl, out), upstream "
            "(input, weight, eps, out, enable_pdl)");
}

TEST(ConformanceCheck, WrapperPlanWithoutVariadics) {
  // Upstream: (self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
  // page_size, *deprecated_positional_args, **kwargs).
  std::vector<ParamDecl> params = {ParamDecl("self", ParamKind::kObject),
                                   tensor("indptr"),
                                   tensor("indices"),
                                   tensor("last_page_len"),
                                   integer("num_qo_heads"),
                                   integer("num_kv_heads"),
                                   integer("head_dim"),
                                   integer("page_size")};
  std::vector<ParamDecl> positional = params;
  positional.push_back(ParamDecl("pos_encoding_mode", ParamKind::kString).def("NONE"));
  const auto ms = check_op(
      make_decl("BatchDecodeWithPagedKVCacheWrapper.plan", "flashinfer.decode", positional),
      fixture().up);
  EXPECT_EQ(keys_of(ms),
            (Keys{"signature", "param:pos_encoding_mode", "var-positional", "var-keyword"}));
  EXPECT_EQ(message_of(ms, "param:pos_encoding_mode"),
            "parameter `pos_encoding_mode`: upstream accepts it only through **kwargs, so ours "
            "must be keyword-only; ours is positional-or-keyword `pos_encoding_mode='NONE'`");
  EXPECT_EQ(message_of(ms, "var-positional"),
            "upstream takes `*deprecated_positional_args` after `page_size`; ours has none");
  EXPECT_EQ(message_of(ms, "var-keyword"), "upstream takes `**kwargs`; ours has none");

  // Keyword-only extras are the kwargs upstream's body accepts: no parameter difference, but the
  // text still lacks the variadics.
  params.push_back(ParamDecl("seq_lens", ParamKind::kTensor).opt().kw());
  const auto kw =
      check_op(make_decl("BatchDecodeWithPagedKVCacheWrapper.plan", "flashinfer.decode", params),
               fixture().up);
  EXPECT_EQ(keys_of(kw), (Keys{"signature", "var-positional", "var-keyword"}));
}

TEST(ConformanceCheck, NotUpstream) {
  const auto ms =
      check_op(make_decl("get_seq_lens", "flashinfer.page",
                         {tensor("kv_indptr"), tensor("kv_last_page_len"), integer("page_size")}),
               fixture().up);
  EXPECT_EQ(keys_of(ms), (Keys{"not-upstream"}));
  EXPECT_EQ(message_of(ms, "not-upstream"),
            "no @flashinfer_api function or method of this name upstream (ours: "
            "flashinfer.page.get_seq_lens(kv_indptr, kv_last_page_len, page_size))");
}

TEST(ConformanceCheck, AllowlistSuppressesAndGoesStale) {
  const auto ms = check_op(make_decl("top_k_renorm_probs", "flashinfer.sampling",
                                     {tensor("probs"), integer("top_k"),
                                      ParamDecl("is_deterministic", ParamKind::kBool).def(false)}),
                           fixture().up);
  const std::string path = ::testing::TempDir() + "/conformance-allowlist-test.tsv";
  {
    std::ofstream out(path);
    out << "# comment line\n"
        << "top_k_renorm_probs\tparam:is_deterministic\tkept for engines that still pass it\n"
        << "rmsnorm\tmodule\tonce differed, since fixed upstream and here\n"
        << "no_such_op\tsignature\ta reason that is long enough\n"
        << "rmsnorm\tparam:eps\tTODO: explain later please\n"
        << "rmsnorm\tweird\ta reason that is long enough\n"
        << "rmsnorm\tonly two fields\n"
        << "top_k_renorm_probs\tparam:is_deterministic\tthe same entry a second time\n";
  }
  std::vector<std::string> format_problems;
  const std::vector<AllowEntry> allow = load_allowlist(path, format_problems);
  ASSERT_EQ(allow.size(), 6u);
  EXPECT_EQ(allow[0].op, "top_k_renorm_probs");
  EXPECT_EQ(allow[0].what, "param:is_deterministic");
  EXPECT_EQ(allow[0].reason, "kept for engines that still pass it");
  EXPECT_EQ(allow[0].line, 2);

  // The entry takes param:is_deterministic out; the signature text difference stays.
  const std::vector<const Mismatch*> left = not_allowlisted(ms, allow);
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0]->what, "signature");

  const std::vector<std::string> problems = allowlist_problems(path, ms, [](const std::string& op) {
    return op == "rmsnorm" || op == "top_k_renorm_probs";
  });
  const std::vector<std::string> expected = {
      "allowlist line 5: rmsnorm param:eps: the reason `TODO: explain later please` is not a "
      "reason; say why the difference is deliberate",
      "allowlist line 6: unknown difference key `weird` (one of not-upstream, module, signature, "
      "order, var-positional, var-keyword, decl-vs-signature, param:<name>)",
      "allowlist line 7: expected `qualified_name<TAB>what<TAB>reason`, got 2 field(s)",
      "allowlist line 8: duplicate entry top_k_renorm_probs param:is_deterministic",
      "allowlist line 3: stale entry rmsnorm module: no such difference any more; remove it",
      "allowlist line 4: stale entry no_such_op signature: no registered op of this name; remove "
      "it",
      "allowlist line 5: stale entry rmsnorm param:eps: no such difference any more; remove it",
      "allowlist line 6: stale entry rmsnorm weird: no such difference any more; remove it"};
  EXPECT_EQ(problems, expected);
  std::filesystem::remove(path);
}

// The one test that shows the whole drift: every difference of every registered op that the
// allowlist does not name, in one failure.
TEST(Conformance, EveryOpMatchesUpstream) {
  const Fixture& f = fixture();
  const std::vector<const OpDecl*> ops = OpRegistry::global().ops();
  ASSERT_FALSE(ops.empty());
  std::vector<std::string> problems;
  const std::vector<AllowEntry> allow = load_allowlist(kAllowlistPath, problems);
  const std::vector<const Mismatch*> left = not_allowlisted(f.all, allow);
  const std::size_t count = left.size();
  const std::size_t allowlisted = f.all.size() - count;
  std::map<std::string, std::vector<const Mismatch*>> by_op;
  for (const Mismatch* m : left) by_op[m->op].push_back(m);
  if (count == 0) return;
  std::ostringstream os;
  os << count << " difference(s) from upstream FlashInfer (commit " << f.up.commit << ", or "
     << f.release.commit << " for an op that declares a parameter only that release has) in "
     << by_op.size() << " of " << ops.size() << " registered ops (" << allowlisted
     << " allowlisted in tests/api/data/conformance-allowlist.tsv):\n";
  for (const auto& [op, list] : by_op) {
    const OpDecl* d = OpRegistry::global().find(op);
    os << "\n"
       << op << "  [ours: " << d->module << " " << enum_defaults_as_source(d->signature()) << "]\n";
    const Upstream& table = f.follow_release.count(op) ? f.release : f.up;
    for (const UpstreamEntry* e : table.find(op)) {
      os << "  upstream" << (&table == &f.release ? " 0.7.4" : "") << ": " << e->module << " "
         << e->signature_text << "  (" << e->where << ")\n";
    }
    for (const Mismatch* m : list) os << "  - [" << m->what << "] " << m->message << "\n";
  }
  ADD_FAILURE() << os.str();
}

// The allowlist stays short and true: well-formed, reasoned, and every entry still matches a
// difference of a registered op.
TEST(Conformance, AllowlistEntriesAreLiveAndReasoned) {
  const std::vector<std::string> problems = allowlist_problems(
      kAllowlistPath, fixture().all,
      [](const std::string& op) { return OpRegistry::global().find(op) != nullptr; });
  std::ostringstream os;
  for (const std::string& p : problems) os << "  " << p << "\n";
  EXPECT_TRUE(problems.empty()) << problems.size() << " allowlist problem(s):\n" << os.str();
}

}  // namespace
