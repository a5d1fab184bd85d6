#include "replay/collective_replay.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda_runtime.h"
#include "flashinfer/api_call.h"
#include "flashinfer/error.h"
#include "flashinfer/op_typed.h"
#include "flashinfer/replay.h"
#include "flashinfer/stream.h"
#include "recorder/dump_schema.h"

namespace flashinfer::detail {
namespace {

namespace fs = std::filesystem;
namespace schema = flashinfer::dump_schema;
using Json = nlohmann::ordered_json;

std::map<std::string, CollectiveSpec, std::less<>>& specs() {
  static std::map<std::string, CollectiveSpec, std::less<>> m;
  return m;
}
std::mutex& specs_mutex() {
  static std::mutex m;
  return m;
}

// One rank's calls on one workspace.
struct Stream {
  int64_t pid = 0;
  std::string repr;
  std::optional<int64_t> world, rank;
  int64_t group = 0;        // which group of that size (a Mapping's MoE EP group; else 0)
  std::string creator_dir;  // empty: made before the recording began
  std::vector<std::string> calls;
  std::vector<std::string> functions;  // calls[i]'s function (op or one of spec.also)
};

// The per-process, per-function call number of a call directory ("..._call0042": 42), or -1.
int64_t call_number(const std::string& dir) {
  const std::string name = fs::path(dir).filename().string();
  const auto at = name.rfind("_call");
  if (at == std::string::npos || at + 5 >= name.size()) return -1;
  const std::string digits = name.substr(at + 5);
  if (digits.size() > 12 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

// The streams of one op under one recording root, in the order their workspaces were made.
struct Index {
  std::size_t entries = 0;          // call directories seen
  fs::file_time_type root_mtime{};  // the root's modification time when they were counted
  std::vector<Stream> streams;
  std::map<std::string, std::size_t> stream_of_call;
};

std::optional<int64_t> json_int(const Json& j) {
  if (j.is_number_integer()) return j.get<int64_t>();
  if (j.is_object() && j.contains("value") && j["value"].is_number_integer()) {
    return j["value"].get<int64_t>();
  }
  return std::nullopt;
}

// The recorded argument of parameter `index` (named `name`): arg_<i> or kwarg_<name>.
const Json* recorded_arg(const Json& im, std::size_t index, const std::string& name) {
  const std::string a = schema::arg_key(index), k = std::string(schema::kKwargPrefix) + name;
  if (im.contains(a)) return &im[a];
  if (im.contains(k)) return &im[k];
  return nullptr;
}

std::string repr_of(const Json* j) {
  return j && j->is_object() && j->contains(std::string(schema::kRepr))
             ? (*j)[std::string(schema::kRepr)].get<std::string>()
             : std::string();
}

// What names a workspace in a record: an object's repr, or an opaque integer handle's value
// (init_ulysses_a2a's result, ulysses_a2a's fa; 0 is no handle).
std::string workspace_key(const Json* j) {
  std::string r = repr_of(j);
  if (r.empty() && j && j->is_number_integer() && j->get<int64_t>() != 0) {
    r = "handle " + std::to_string(j->get<int64_t>());
  }
  return r;
}

// The integer after "key=" in a repr such as "Mapping(world_size=4, rank=1, ...)".
std::optional<int64_t> repr_int(const std::string& repr, const std::string& key) {
  for (std::size_t at = repr.find(key + "="); at != std::string::npos;
       at = repr.find(key + "=", at + 1)) {
    if (at > 0 && repr[at - 1] != '(' && repr[at - 1] != ' ') continue;  // "ep_rank=" for "rank="
    const std::size_t v = at + key.size() + 1;
    std::size_t end = v;
    while (end < repr.size() && (std::isdigit(static_cast<unsigned char>(repr[end])) != 0 ||
                                 (end == v && repr[end] == '-'))) {
      ++end;
    }
    if (end == v) return std::nullopt;
    return std::stoll(repr.substr(v, end - v));
  }
  return std::nullopt;
}

Index build_index(const std::string& root, const std::string& op, const CollectiveSpec& spec,
                  const OpDecl& decl) {
  Index ix;
  const std::vector<std::string> dirs = replay::list_calls(root);
  ix.entries = dirs.size();
  const OpDecl* creator = OpRegistry::global().find(spec.creator);
  std::map<std::pair<int64_t, std::string>, std::size_t> current;  // (pid, repr) -> stream
  std::map<std::pair<int64_t, std::string>, std::size_t> groups;   // (pid, group token) -> id
  // A backend that says its rank and size (ThreadCommBackend(rank=1, size=4, group=0x...))
  // places its stream; a torch ProcessGroup's repr does not, and its ranks are processes of
  // their own. The group token keeps two groups of one size recorded in one process apart.
  auto place_by_backend = [&groups](Stream& s, const std::string& c) {
    const auto rank = repr_int(c, "rank"), size = repr_int(c, "size");
    if (!rank || !size || *size <= 0 || *rank < 0 || *rank >= *size) return;
    s.rank = rank;
    s.world = size;
    if (const auto at = c.find("group="); at != std::string::npos) {
      const std::string token = c.substr(at + 6, c.find_first_of(",)", at) - at - 6);
      s.group = static_cast<int64_t>(
          groups.emplace(std::make_pair(s.pid, token), groups.size() + 1).first->second);
    }
  };
  for (const std::string& d : dirs) {
    Json rec;
    try {
      rec = Json::parse(replay::read_metadata((fs::path(d) / schema::kMetadataFile).string()).json);
    } catch (const std::exception&) {
      continue;  // an unreadable record: its own replay reports it
    }
    const std::string fn = rec.value(std::string(schema::kFunctionName), std::string());
    const int64_t pid = rec.value(std::string(schema::kProcessId), int64_t{0});
    const std::string im_key(schema::kInputMetadata), om_key(schema::kOutputMetadata);
    const Json im = rec.contains(im_key) ? rec[im_key] : Json::object();
    if (fn == spec.creator && creator) {
      const Json om = rec.contains(om_key) ? rec[om_key] : Json::object();
      const std::string result(schema::kResult);
      Stream s;
      s.pid = pid;
      // A constructor's object is its self (arg_0); a function's, its result.
      s.repr = creator->is_constructor()
                   ? repr_of(recorded_arg(im, 0, "self"))
                   : workspace_key(om.contains(result) ? &om[result] : nullptr);
      if (s.repr.empty()) continue;  // the call failed: no workspace
      const auto& ps = creator->params;
      if (spec.creator_world_param) {
        const std::size_t i = *spec.creator_world_param;
        if (const Json* w = recorded_arg(im, i, ps.at(i).name)) s.world = json_int(*w);
      }
      if (spec.creator_rank_param) {
        const std::size_t i = *spec.creator_rank_param;
        if (const Json* r = recorded_arg(im, i, ps.at(i).name)) s.rank = json_int(*r);
      }
      if (spec.creator_mapping_param) {
        const std::size_t i = *spec.creator_mapping_param;
        const std::string m = repr_of(recorded_arg(im, i, ps.at(i).name));
        const auto ep = repr_int(m, "moe_ep_size"), tp = repr_int(m, "tp_size"),
                   rank = repr_int(m, "rank");
        if (ep && tp && rank && *ep > 0 && *tp > 0) {
          s.world = *ep;
          s.rank = *rank % *tp % *ep;
          // The EP groups: one per (PP / CP position, TP rank / ep) (several when moe_tp_size or
          // the cluster size exceed 1).
          s.group = *rank / *tp * (*tp / *ep) + *rank % *tp / *ep;
        }
      }
      if (!s.rank) {
        const std::size_t i = spec.creator_comm_param;
        if (i < ps.size()) place_by_backend(s, repr_of(recorded_arg(im, i, ps.at(i).name)));
      }
      s.creator_dir = fs::path(d).lexically_normal().string();
      current[{pid, s.repr}] = ix.streams.size();
      ix.stream_of_call[s.creator_dir] = ix.streams.size();
      ix.streams.push_back(std::move(s));
    } else if (fn == op || std::find(spec.also.begin(), spec.also.end(), fn) != spec.also.end()) {
      // The stream: by the op's own rank argument where it has one (its workspace is a tensor),
      // else by its workspace object.
      std::optional<int64_t> rank, world;
      std::string repr;
      if (spec.rank_param && spec.world_param) {
        if (const Json* j =
                recorded_arg(im, *spec.rank_param, decl.params.at(*spec.rank_param).name)) {
          rank = json_int(*j);
        }
        if (const Json* j =
                recorded_arg(im, *spec.world_param, decl.params.at(*spec.world_param).name)) {
          world = json_int(*j);
        }
        repr = "rank " + (rank ? std::to_string(*rank) : std::string("?"));
        // Workspaces of one rank told apart by their shapes (a recorded tensor has no address:
        // SGLang's namespaces of MoE all-to-all workspaces differ in size).
        const std::size_t wp = spec.workspace_param_of(fn);
        if (const Json* w = recorded_arg(im, wp, decl.params.at(wp).name);
            w && w->is_object() && w->contains(std::string(schema::kShape))) {
          repr += ", workspace " + (*w)[std::string(schema::kShape)].dump();
        }
      } else {
        // The parameter's name in the function's own declaration (a free function's first
        // parameter is not `self`).
        const std::size_t wp = spec.workspace_param_of(fn);
        const OpDecl* fd = fn == decl.name ? &decl : OpRegistry::global().find(fn);
        repr = workspace_key(recorded_arg(
            im, wp, fd && wp < fd->params.size() ? fd->params[wp].name : std::string("self")));
      }
      auto it = current.find({pid, repr});
      if (it == current.end()) {
        // Made before the recording began (or keyed by the op's rank): no creation call.
        Stream s;
        s.pid = pid;
        s.repr = repr;
        s.rank = rank;
        s.world = world;
        if ((spec.workspace_is_backend || spec.place_by_workspace_repr) && !s.rank) {
          place_by_backend(s, repr);
        }
        it = current.emplace(std::make_pair(pid, repr), ix.streams.size()).first;
        ix.streams.push_back(std::move(s));
      }
      ix.streams[it->second].calls.push_back(fs::path(d).lexically_normal().string());
      ix.streams[it->second].functions.push_back(fn);
      ix.stream_of_call[fs::path(d).lexically_normal().string()] = it->second;
    }
  }
  return ix;
}

const Index& index_for(const std::string& root, const std::string& op, const CollectiveSpec& spec,
                       const OpDecl& decl) {
  static std::mutex m;
  static std::map<std::pair<std::string, std::string>, Index> cache;
  const std::lock_guard<std::mutex> lock(m);
  Index& ix = cache[{root, op}];
  // Adding or removing a call directory changes the root's modification time: only then is the
  // index built again (a replay of N calls would otherwise read the root's records N times). A
  // changed root is read again even when it holds as many calls as before: a ring recording
  // replaces its oldest calls, and a folder removed and recorded again has new ones.
  std::error_code ec;
  const fs::file_time_type mtime = fs::last_write_time(root, ec);
  if (!ec && ix.entries != 0 && mtime == ix.root_mtime) return ix;
  ix = build_index(root, op, spec, decl);
  ix.root_mtime = mtime;
  return ix;
}

}  // namespace

void register_collective(CollectiveSpec spec) {
  const std::lock_guard<std::mutex> lock(specs_mutex());
  if (!spec.creator.empty()) specs()[spec.creator] = spec;
  for (const std::string& f : spec.also) specs()[f] = spec;
  specs()[spec.op] = std::move(spec);
}

const CollectiveSpec* collective_spec(std::string_view op) {
  const std::lock_guard<std::mutex> lock(specs_mutex());
  auto it = specs().find(op);
  return it == specs().end() ? nullptr : &it->second;
}

Value replay_collective(const CollectiveSpec& spec, const OpDecl& decl, const std::string& dump_dir,
                        std::vector<Value>& args, Device device, std::string* note) {
  const std::string op = spec.op;
  const bool creating = decl.name == spec.creator;
  const OpDecl* op_decl = decl.name == op ? &decl : OpRegistry::global().find(op);
  FLASHINFER_CHECK(op_decl != nullptr, "replay", "", op, " is not declared");
  const fs::path dir = fs::path(dump_dir).lexically_normal();
  const std::string root = (dir.has_filename() ? dir : dir.parent_path()).parent_path().string();
  const Index& ix = index_for(root, op, spec, *op_decl);
  auto self = ix.stream_of_call.find(dir.string());
  if (self == ix.stream_of_call.end()) {
    FLASHINFER_FAIL(ErrorCode::kFormat, "replay", "", op,
                    " is a collective: its call could not be placed among the recording's calls "
                    "of ",
                    op, " under ", root);
  }
  const Stream& mine = ix.streams[self->second];
  const std::string pre = !creating && spec.prelude ? spec.prelude(decl.name) : std::string();
  const OpDecl* pre_decl = pre.empty() ? nullptr : OpRegistry::global().find(pre);
  // A local function (spec.local) meets the other ranks through the call whose state it needs:
  // they replay only that, this rank that and then the call.
  const bool local = !creating && pre_decl &&
                     std::find(spec.local.begin(), spec.local.end(), decl.name) != spec.local.end();
  const std::size_t my_pos = static_cast<std::size_t>(
      std::find(mine.calls.begin(), mine.calls.end(), dir.string()) - mine.calls.begin());
  std::string match_fn = decl.name, match_dir = dir.string();
  if (local) {
    std::size_t j = std::min(my_pos, mine.calls.size());
    while (j > 0 && mine.functions[j - 1] != pre) --j;
    if (j == 0) {
      FLASHINFER_FAIL(ErrorCode::kUnsupported, "replay", "", decl.name, " needs the ", pre,
                      " call before it, and the recording has none");
    }
    match_fn = pre;
    match_dir = mine.calls[j - 1];
  }
  // The calls meet by function: the k-th call of match_fn in one rank's stream meets the k-th in
  // every other rank's (a creator's call is its stream's call 0).
  std::size_t k = 0;
  if (!creating) {
    for (std::size_t i = 0; i < mine.calls.size(); ++i) {
      if (mine.functions[i] != match_fn) continue;
      ++k;
      if (mine.calls[i] == match_dir) break;
    }
  }
  // Ranks in processes of their own number their calls of a function alike (every rank makes
  // the same calls in the same order), so the call number in the directory name matches them
  // even where a recording lost some calls (ring mode); ranks sharing a process share that
  // counter, and their streams match by ordinal.
  bool by_number = false;
  const int64_t my_number = call_number(match_dir);
  // The position of the matching call in a stream (calls.size(): none).
  auto index_of = [&](const Stream* s) -> std::size_t {
    std::size_t n = 0;
    for (std::size_t i = 0; i < s->calls.size(); ++i) {
      if (s->functions[i] != match_fn) continue;
      if (by_number ? call_number(s->calls[i]) == my_number : ++n == k) return i;
    }
    return s->calls.size();
  };
  auto call_of = [&](const Stream* s) -> std::string {
    if (creating) return s->creator_dir;
    const std::size_t i = index_of(s);
    return i < s->calls.size() ? s->calls[i] : std::string();
  };
  // The group: streams of the same world size, one per rank. Streams whose rank was not
  // recorded take ranks in the order their processes' ids and workspaces sort.
  std::vector<const Stream*> same;
  for (const Stream& s : ix.streams) {
    if (s.world == mine.world && s.group == mine.group &&
        s.rank.has_value() == mine.rank.has_value()) {
      same.push_back(&s);
    }
  }
  int64_t world = mine.world.value_or(static_cast<int64_t>(same.size()));
  std::vector<const Stream*> group(static_cast<std::size_t>(std::max<int64_t>(world, 0)), nullptr);
  int64_t my_rank = -1;
  if (mine.rank) {
    // The j-th stream of this rank meets the j-th stream of every other rank.
    std::size_t j = 0;
    for (const Stream* s : same) {
      if (s == &mine) break;
      j += s->rank == mine.rank ? 1 : 0;
    }
    std::map<int64_t, std::size_t> seen;
    for (const Stream* s : same) {
      const int64_t r = *s->rank;
      if (r < 0 || r >= world) continue;
      if (seen[r]++ == j) group[static_cast<std::size_t>(r)] = s;
    }
    my_rank = *mine.rank;
  } else {
    std::vector<const Stream*> sorted = same;
    std::stable_sort(sorted.begin(), sorted.end(),
                     [](const Stream* a, const Stream* b) { return a->pid < b->pid; });
    for (std::size_t r = 0; r < sorted.size() && r < group.size(); ++r) group[r] = sorted[r];
    my_rank = static_cast<int64_t>(std::find(sorted.begin(), sorted.end(), &mine) - sorted.begin());
  }
  {
    std::set<int64_t> pids;
    bool all = true;
    for (const Stream* s : group) {
      if (!s) {
        all = false;
        break;
      }
      pids.insert(s->pid);
    }
    by_number = all && my_number >= 0 && pids.size() == group.size() && group.size() > 1;
  }
  std::string missing;
  for (std::size_t r = 0; r < group.size(); ++r) {
    if (!group[r] || call_of(group[r]).empty()) {
      missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
  }
  if (world < 1 || !missing.empty()) {
    FLASHINFER_FAIL(ErrorCode::kUnsupported, "replay", "", decl.name, " is a collective of ", world,
                    " ranks: replaying call ", k, " of ", match_fn, " of rank ", my_rank,
                    " needs the same call of every rank, and the recording has none for rank(s) ",
                    missing.empty() ? std::string("?") : missing,
                    " (record every rank into one dump directory)");
  }
  // A recorded call's arguments, rebuilt on the replay device.
  auto rebuild = [&](const std::string& call, std::size_t r, const std::string& what) {
    replay::Options o;
    o.device = device;
    o.run = false;
    replay::Result peer = replay::replay_from_dump(call, o);
    if (peer.status == replay::Status::kError) {
      FLASHINFER_FAIL(ErrorCode::kFormat, "replay", "", "rank ", r, "'s ", what, " (", call,
                      ") could not be rebuilt: ", peer.error);
    }
    return peer;
  };
  // Every rank's arguments; this rank's are the caller's.
  std::vector<std::vector<Value>> all(group.size());
  for (std::size_t r = 0; r < group.size() && !local; ++r) {
    if (static_cast<int64_t>(r) == my_rank) continue;
    all[r] = rebuild(call_of(group[r]), r, "call " + std::to_string(k) + " of " + decl.name).args;
  }
  // Each rank's creation (the workspace's sizes) and the call whose state this one needs.
  std::vector<std::optional<std::vector<Value>>> created(group.size());
  std::vector<std::optional<std::vector<Value>>> before(group.size());
  std::vector<NamedTensors> before_recorded(group.size());
  for (std::size_t r = 0; r < group.size() && !creating; ++r) {
    const Stream* s = group[r];
    if (!s->creator_dir.empty()) created[r] = rebuild(s->creator_dir, r, "creation").args;
    if (!pre_decl) continue;
    const std::size_t at = index_of(s);
    // A local call's match is its prelude itself.
    std::size_t j = local ? at + 1 : at;
    while (j > 0 && s->functions[j - 1] != pre) --j;
    if (j == 0) {
      FLASHINFER_FAIL(ErrorCode::kUnsupported, "replay", "", decl.name, " of rank ", r,
                      " needs the ", pre, " call before it, and the recording has none");
    }
    replay::Result p = rebuild(s->calls[j - 1], r, pre);
    before[r] = std::move(p.args);
    before_recorded[r] = std::move(p.expected);
  }
  comm::ThreadGroup g(static_cast<int64_t>(group.size()), device);
  Value result;
  // The workspaces outlive every rank's call: a rank that returned first must not free the
  // memory a slower peer still reads.
  std::vector<Value> workspaces(group.size());
  g.run([&](int64_t r) {
    ScopedUnobserved quiet;  // per thread: the replayed calls are not logged or recorded again
    const auto i = static_cast<std::size_t>(r);
    std::vector<Value>& a = r == my_rank ? args : all[i];
    const std::shared_ptr<comm::CommBackend> b = g.backend(r);
    if (creating) {
      if (spec.creator_workspace) {
        workspaces[i] = spec.creator_workspace(a, b);
      } else if (spec.prepare_creator) {
        spec.prepare_creator(a, b);
      } else {
        a.at(spec.creator_comm_param) = to_value(b);
      }
    } else {
      if (created[i] && spec.prepare_creator) spec.prepare_creator(*created[i], b);
      workspaces[i] = spec.make_workspace(b, a, created[i] ? &*created[i] : nullptr);
      if (before[i]) {
        std::vector<Value>& pa = *before[i];
        pa.at(spec.workspace_param_of(pre)) = workspaces[i];
        if (spec.adjust_args) spec.adjust_args(pre, pa, b);
        const Value got = pre_decl->invoke(CallArgs(*pre_decl, pa));
        pa.at(spec.workspace_param_of(pre)) = Value();
        // This rank's stream only: a device-wide wait would also wait for a peer's kernel
        // spinning on this rank's next call.
        if (device.is_cuda()) cuda_stream_synchronize(current_cuda_stream(), device.index);
        if (local && r != my_rank) return;  // the peers of a local call replay its prelude only
        if (spec.after_prelude) spec.after_prelude(decl.name, a, got, before_recorded[i]);
      }
      a.at(spec.workspace_param_of(decl.name)) = workspaces[i];
      if (spec.adjust_args) spec.adjust_args(decl.name, a, b);
    }
    Value v = decl.invoke(CallArgs(decl, a));
    if (device.is_cuda()) cuda_stream_synchronize(current_cuda_stream(), device.index);
    if (r == my_rank) result = std::move(v);
  });
  for (std::size_t r = 0; r < group.size(); ++r) {
    std::vector<Value>& a = static_cast<int64_t>(r) == my_rank ? args : all[r];
    if ((!creating || (!spec.prepare_creator && !spec.creator_workspace)) && !a.empty()) {
      a.at(creating ? spec.creator_comm_param : spec.workspace_param_of(decl.name)) = Value();
    }
  }
  workspaces.clear();
  if (note) {
    *note = "a collective: replayed with the recorded calls of all " +
            std::to_string(group.size()) + " ranks (this is rank " + std::to_string(my_rank) +
            (creating ? std::string(", its workspace's creation")
                      : (local ? ", its " + decl.name + " after call " + std::to_string(k) +
                                     " of " + match_fn + ", which every rank replayed"
                               : ", call " + std::to_string(k) + " of " + decl.name +
                                     " on its workspace" +
                                     (pre.empty() ? std::string() : " after its " + pre))) +
            "), each rank a thread on " + device.str();
  }
  return result;
}

}  // namespace flashinfer::detail
