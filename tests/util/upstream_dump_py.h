// Test helper: the Python half of the torch-written upstream-format dump tests. kTorchSavePy
// (used alone by dump tests with their own record()) defines save() (torch.save as torch >= 2.1
// writes it, fp8 pickled by hand because Debian's torch 1.13 has no float8); kUpstreamDumpRestPy
// adds e4m3 / e2m1 decoding tables, the 128x4 scale layout, an independent NVFP4 quantizer and
// record() (one call directory in upstream's recorder layout). A test appends its calls and runs
// run_upstream_dump_script(): one interpreter start writes every call, then replay_sequence replays
// them and every call must pass.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "flashinfer/replay.h"

namespace flashinfer::testing {

// The interpreter check and save() alone, for dump tests that write their own record().
inline constexpr const char* kTorchSavePy = R"PY(
import json, sys, zipfile, struct
try:
    import torch
except ImportError:
    sys.exit(77)

# torch.save as torch >= 2.1 writes it: legacy dtypes through _rebuild_tensor_v2 and a typed
# storage; fp8 (an ("fp8", uint8 codes) pair) through _rebuild_tensor_v3 and an UntypedStorage
# (an ("fp4", uint8 pairs) tuple the same way, as float4_e2m1fn_x2; ("u16", int16 bits),
# ("u32", int32 bits) and ("u64", int64 bits) ones as torch.uint16 / uint32 / uint64, which torch
# 1.13 lacks; UntypedStorage sizes count bytes).
LEGACY = {torch.float32: "FloatStorage", torch.bfloat16: "BFloat16Storage",
          torch.int32: "IntStorage", torch.int64: "LongStorage", torch.uint8: "ByteStorage",
          torch.float16: "HalfStorage", torch.bool: "BoolStorage", torch.int16: "ShortStorage"}
def save(d, path):
    out = bytearray(b"\x80\x02}(")
    blobs = []
    def s(x):
        b = x.encode()
        out.extend(b"X" + struct.pack("<I", len(b)) + b)
    def i(v):
        out.extend(b"J" + struct.pack("<i", v))
    def ints(vs):
        out.extend(b"(")
        for v in vs: i(v)
        out.extend(b"t")
    for name, v in d.items():
        fp8 = isinstance(v, tuple)
        t = v[1] if fp8 else v
        # A permuted view of a whole storage (a column-major weight) keeps its strides.
        if t.storage_offset() != 0 or t.storage().size() != t.numel():
            t = t.contiguous()
        base = torch.empty(0, dtype=t.dtype).set_(t.storage(), 0, (t.numel(),))
        key = str(len(blobs))
        raw = base if t.dtype in (torch.uint8, torch.bool) else base.view(torch.uint8)
        blobs.append(raw.numpy().tobytes())
        s(name)
        out.extend(b"ctorch._utils\n_rebuild_tensor_v%d\n(" % (3 if fp8 else 2))
        out.extend(b"(")
        s("storage")
        out.extend(b"ctorch\n%s\n" % (b"UntypedStorage" if fp8 else LEGACY[t.dtype].encode()))
        s(key); s("cpu"); i(t.numel() * (t.element_size() if fp8 else 1))
        out.extend(b"tQ")
        i(0); ints(list(t.shape)); ints(list(t.stride()))
        out.extend(b"\x89ccollections\nOrderedDict\n)R")
        if fp8:  # ("fp8", codes) or ("fp4", packed pairs): the float8 / float4 dtypes
            out.extend(b"ctorch\n%s\n" % {"fp8": b"float8_e4m3fn", "fp4": b"float4_e2m1fn_x2",
                                             "u16": b"uint16", "u32": b"uint32",
                                             "u64": b"uint64"}[v[0]])
        out.extend(b"tR")
    out.extend(b"u.")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", bytes(out))
        for k, b in enumerate(blobs):
            z.writestr("archive/data/%d" % k, b)
        z.writestr("archive/version", "3\n")
)PY";

// kTorchSavePy continues with the tables, the quantizer and record().
inline constexpr const char* kUpstreamDumpRestPy = R"PY(
def e4m3_value(c):
    s = -1.0 if c & 0x80 else 1.0
    e, m = (c >> 3) & 0xF, c & 7
    if e == 0xF and m == 7: return float("nan")
    return s * (m / 8.0 * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7))
E4M3 = torch.tensor([e4m3_value(c) for c in range(256)], dtype=torch.float32)
FIN8 = torch.tensor([c for c in range(256) if E4M3[c] == E4M3[c]])
E2M1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])

def fp4_values(b):  # uint8 [r, c/2] -> fp32 [r, c], low nibble first
    lo, hi = E2M1[(b & 0xF).long()], E2M1[(b >> 4).long()]
    return torch.stack([lo, hi], -1).reshape(b.shape[0], -1)
def swz(r, c, ksf):  # 128x4 scale layout
    return ((r // 128) * ((ksf + 3) // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
def unswizzle(buf, n, ksf):
    v = buf.tolist()
    return torch.tensor([[v[swz(r, c, ksf)] for c in range(ksf)] for r in range(n)],
                        dtype=torch.uint8)
def rbytes(shape, lo=0, hi=256):
    return torch.randint(lo, hi, shape, dtype=torch.int64).to(torch.uint8)

d = sys.argv[1]
seq = [0]
# outs: the result (a tensor, or a list for a tuple's items; None when upstream returns None);
# mutated: this library's mutated.pt (arguments written in place, which upstream does not record);
# extra: more record fields (self_id=..., function_signature=..., output_metadata=...).
def record(name, module, tensors, meta, outs, mutated=None, **extra):
    seq[0] += 1
    call = "%s/20261122_180000_%03d_pid4242_%s_call%04d" % (d, seq[0], name, seq[0])
    import os
    os.makedirs(call)
    save(tensors, call + "/inputs.pt")
    if mutated:
        save(mutated, call + "/mutated.pt")
    if outs is None:
        okeys = []
    elif isinstance(outs, list) or (isinstance(outs, tuple) and outs[0] not in ("fp8", "fp4")):
        # A nested tuple's items are result_<i>__<j> (the recorder's nested keys).
        flat = {}
        def add(key, v):
            if isinstance(v, list):
                for j, x in enumerate(v):
                    add(key + "__%d" % j, x)
            else:
                flat[key] = v
        for i, v in enumerate(outs):
            add("result_%d" % i, v)
        okeys = list(flat)
        save(flat, call + "/outputs.pt")
    else:
        okeys = ["result"]
        save({"result": outs}, call + "/outputs.pt")
    rec = {"function_name": name, "module": module, "call_sequence": seq[0],
           "timestamp": "20261122_180000_%03d" % seq[0], "process_id": 4242,
           "input_metadata": meta, "output_metadata": {},
           "tensor_info": {"input_tensor_keys": list(tensors), "output_tensor_keys": okeys},
           "tensor_format": "torch", "execution_status": "completed"}
    rec.update(extra)
    with open(call + "/metadata.jsonl", "w") as f:
        f.write(json.dumps(rec) + "\n")

G2 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6])
POS8 = torch.tensor([E4M3[c].item() for c in range(127)])
def rne(a, grid):  # codes of the nearest grid values, ties to the even code
    dist = (a.reshape(-1, 1) - grid.reshape(1, -1)).abs()
    tie = dist == dist.min(1, keepdim=True)[0]
    even = (torch.arange(len(grid)) % 2 == 0).to(torch.int64)
    return (tie.to(torch.int64) * (1 + even)).argmax(1).reshape(a.shape)
def nvfp4(v, gs):
    m, n = v.shape
    blk = v.float().view(m, n // 16, 16)
    amax = blk.abs().amax(-1)
    sfc = rne(((gs * amax) / 6.0).clamp(max=448.0), POS8)
    sfv = POS8[sfc]
    y = (blk * gs) / sfv[..., None]
    code = rne(y.abs().clamp(max=6.0), G2) + 8 * (torch.signbit(y)).to(torch.int64)
    code = torch.where(sfv[..., None] == 0, torch.zeros_like(code), code).reshape(m, n)
    q = (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8)
    flat = [0] * ((m + 127) // 128 * 128 * ((n // 16 + 3) // 4 * 4))
    sl = sfc.tolist()
    for r in range(m):
        for c in range(n // 16):
            flat[swz(r, c, n // 16)] = sl[r][c]
    return q, torch.tensor(flat, dtype=torch.uint8), (E2M1[code] * sfv.repeat_interleave(16, 1))
)PY";

/// Writes each script to `dir` and runs them all in one interpreter start (importing torch is the
/// slow part), script i with scripts[i].second as its argument. False when python3-torch is not
/// installed (exit status 77); otherwise the run must exit 0. Leaves `dir` less the scripts.
inline bool run_python_scripts(
    const std::filesystem::path& dir,
    const std::vector<std::pair<std::string, std::filesystem::path>>& scripts) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  std::vector<fs::path> files{dir / "make.py"};
  std::string cmd = "/usr/bin/python3";
  if (scripts.size() > 1) {
    // runpy gives each script fresh globals and its own sys.argv, as a run of its own would.
    files.push_back(dir / "run_each.py");
    std::ofstream(files.back()) << "import runpy, sys\n"
                                   "for path, arg in zip(sys.argv[1::2], sys.argv[2::2]):\n"
                                   "    sys.argv = [path, arg]\n"
                                   "    runpy.run_path(path, run_name='__main__')\n";
    cmd += " " + files.back().string();
  }
  for (std::size_t i = 0; i < scripts.size(); ++i) {
    if (i > 0) files.push_back(dir / ("make" + std::to_string(i) + ".py"));
    const fs::path& file = i > 0 ? files.back() : files.front();
    std::ofstream(file) << scripts[i].first;
    cmd += " " + file.string() + " " + scripts[i].second.string();
  }
  const int st = std::system(cmd.c_str());
  if (st != 0 && WIFEXITED(st) && WEXITSTATUS(st) == 77) {
    fs::remove_all(dir);
    return false;
  }
  EXPECT_EQ(st, 0);
  for (const auto& f : files) fs::remove(f);
  return true;
}

/// Replays `dump`: there must be `expected_calls` calls and every one must pass. Returns the
/// results for further checks.
inline std::vector<replay::Result> replay_expecting_every_call_to_pass(
    const std::filesystem::path& dump, std::size_t expected_calls) {
  auto replayed = replay::replay_sequence(dump.string());
  EXPECT_EQ(replayed.size(), expected_calls);
  for (const auto& r : replayed) {
    EXPECT_EQ(r.status, replay::Status::kPassed) << r.function_name << ": " << r.error;
  }
  return replayed;
}

/// Writes `script` to dir/make.py, runs it once with `arg` as its argument (exit status 0 expected)
/// and replays `dump` (what the script wrote: `arg` itself or a directory above it). std::nullopt
/// (nothing checked) when python3-torch is not installed (exit status 77). Removes `dir`. For dumps
/// whose calls need not all pass; run_dump_script() checks that every one does.
inline std::optional<std::vector<replay::Result>> replay_dump_script(
    const std::filesystem::path& dir, const std::string& script, const std::filesystem::path& arg,
    const std::filesystem::path& dump) {
  if (!run_python_scripts(dir, {{script, arg}})) return std::nullopt;
  auto replayed = replay::replay_sequence(dump.string());
  std::filesystem::remove_all(dir);
  return replayed;
}

/// Writes `script` to dir/make.py, runs it once with `dump` as its argument and replays the calls
/// it wrote there; every call must pass and there must be `expected_calls`. Returns false
/// (nothing checked) when python3-torch is not installed (exit status 77). Removes `dir`.
/// `results`, when given, receives the replay results for further checks.
inline bool run_dump_script(const std::filesystem::path& dir, const std::string& script,
                            const std::filesystem::path& dump, std::size_t expected_calls,
                            std::vector<replay::Result>* results = nullptr) {
  if (!run_python_scripts(dir, {{script, dump}})) return false;
  auto replayed = replay_expecting_every_call_to_pass(dump, expected_calls);
  std::filesystem::remove_all(dir);
  if (results != nullptr) *results = std::move(replayed);
  return true;
}

/// run_dump_script() of kTorchSavePy + kUpstreamDumpRestPy + `body` in a fresh temporary
/// directory that is also the dump.
inline bool run_upstream_dump_script(const std::string& tag, const std::string& body,
                                     std::size_t expected_calls,
                                     std::vector<replay::Result>* results = nullptr) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / (tag + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  // Appended in place: gcc 12's -Warray-bounds misreads `std::string(a) + b` (a temporary's
  // move) inlined here when the test's headers come from the precompiled header.
  std::string script(kTorchSavePy);
  script += kUpstreamDumpRestPy;
  script += body;
  return run_dump_script(dir, script, dir, expected_calls, results);
}

}  // namespace flashinfer::testing
