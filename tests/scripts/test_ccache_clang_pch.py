#!/usr/bin/env python3
"""scripts/ccache-clang-pch, the sanitized build's compiler launcher, on a two-target CMake
project with a clang precompiled header reused by the second target, built in two checkouts at
different paths with one empty ccache: the second checkout's PCH users hit the cache, a source
changed there compiles after the first checkout is deleted (a .pch restored from the first
checkout's cache entry would name its deleted files), a changed header rebuilds the PCH and its
users with the new value, and changing it back hits again. Skipped without clang++, ccache,
cmake or ninja. Standard library only; run by ctest."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCHER = os.path.abspath(os.path.join(HERE, "..", "..", "scripts", "ccache-clang-pch"))

CMAKELISTS = """cmake_minimum_required(VERSION 3.20)
project(pchcheck CXX)
set(pch_flags "SHELL:-Xclang -fno-pch-timestamp")
add_executable(anchor anchor.cpp)
target_include_directories(anchor PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/inc)
target_compile_options(anchor PRIVATE ${pch_flags})
target_precompile_headers(anchor PRIVATE <vector> <map> <value.h>)
add_executable(user user.cpp)
target_include_directories(user PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/inc)
target_compile_options(user PRIVATE ${pch_flags})
target_precompile_headers(user REUSE_FROM anchor)
"""


def tools_missing():
    return [t for t in ("clang++", "ccache", "cmake", "ninja") if shutil.which(t) is None]


@unittest.skipIf(tools_missing(), "needs clang++, ccache, cmake and ninja")
class CcacheClangPch(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="fi_ccache_pch_")
        self.env = dict(os.environ)
        self.env.update(
            CCACHE_DIR=os.path.join(self.tmp, "cache"),
            CCACHE_NOHASHDIR="1",
            CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime",
            CXX="clang++",
        )
        for k in ("CCACHE_DISABLE", "CCACHE_RECACHE", "CCACHE_READONLY"):
            self.env.pop(k, None)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def checkout(self, name):
        d = os.path.join(self.tmp, name)
        os.makedirs(os.path.join(d, "inc"))
        files = {
            "CMakeLists.txt": CMAKELISTS,
            "inc/value.h": "inline int value() { return 3; }\n",
            "anchor.cpp": "int main() { std::vector<int> v; return value() + int(v.size()); }\n",
            "user.cpp": "int main() { std::map<int, int> m; return value() + int(m.size()); }\n",
        }
        for rel, text in files.items():
            with open(os.path.join(d, rel), "w") as f:
                f.write(text)
        return d

    def run_in(self, d, *cmd):
        env = dict(self.env, CCACHE_BASEDIR=d)
        r = subprocess.run(cmd, cwd=d, env=env, capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, f"{cmd}:\n{r.stdout}\n{r.stderr}")
        return r

    def build(self, d):
        if not os.path.exists(os.path.join(d, "build", "build.ninja")):
            self.run_in(d, "cmake", "-S", ".", "-B", "build", "-G", "Ninja",
                        f"-DCMAKE_CXX_COMPILER_LAUNCHER={LAUNCHER}")
        subprocess.run(["ccache", "-z"], env=self.env, capture_output=True, check=True)
        self.run_in(d, "ninja", "-C", "build")
        out = subprocess.run(["ccache", "--print-stats"], env=self.env, capture_output=True,
                             text=True, check=True).stdout
        stats = dict(line.split("\t") for line in out.splitlines() if "\t" in line)
        hits = int(stats.get("direct_cache_hit", 0)) + int(stats.get("preprocessed_cache_hit", 0))
        return hits, int(stats.get("cache_miss", 0))

    def exit_status(self, d, exe):
        return subprocess.run([os.path.join(d, "build", exe)]).returncode

    def write(self, d, rel, text):
        with open(os.path.join(d, rel), "w") as f:
            f.write(text)

    def test_pch_users_hit_in_another_checkout(self):
        a, b = self.checkout("a"), self.checkout("b")
        self.assertEqual(self.build(a), (0, 2))  # anchor.cpp and user.cpp; the PCH is not cached
        self.assertEqual(self.build(b), (2, 0))
        self.assertTrue(os.path.exists(
            os.path.join(b, "build", "CMakeFiles", "anchor.dir", "cmake_pch.hxx.pch.sum")))
        shutil.rmtree(a)
        self.write(b, "user.cpp",
                   "int main() { std::map<int, int> m; return value() + int(m.size()) + 1; }\n")
        self.assertEqual(self.build(b), (0, 1))
        self.assertEqual(self.exit_status(b, "user"), 4)
        self.write(b, "inc/value.h", "inline int value() { return 5; }\n")
        self.assertEqual(self.build(b), (0, 2))
        self.assertEqual(self.exit_status(b, "user"), 6)
        self.assertEqual(self.exit_status(b, "anchor"), 5)
        self.write(b, "inc/value.h", "inline int value() { return 3; }\n")
        self.assertEqual(self.build(b), (2, 0))
        self.assertEqual(self.exit_status(b, "user"), 4)


if __name__ == "__main__":
    sys.exit(unittest.main())
