#!/usr/bin/env python3
"""scripts/skip-summary on canned input: a ctest JUnit file with one test per case (what the
Release run writes: GTEST_SKIP() reasons in the cases' output) and one with a test per executable
or shard (the sanitized run's FLASHINFER_TEST_PER_EXECUTABLE) beside GoogleTest's XML reports,
in the forms ctest 3.25 and GoogleTest 1.12 write. Standard library only; run by ctest."""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "skip-summary")

# One ctest test per case: a pass, a skip with its reason in the output, a failure, a skip
# without a message, a disabled case.
PER_CASE = """<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="Linux" tests="5" failures="1" disabled="1" skipped="2" time="3.5">
  <testcase name="Norm.Passes" classname="Norm" time="0.1" status="run">
    <system-out>[ RUN      ] Norm.Passes</system-out>
  </testcase>
  <testcase name="NormCuda.MatchesCpu" classname="NormCuda" time="0.1" status="run">
    <skipped message="SKIP_REGULAR_EXPRESSION_MATCHED"/>
    <system-out>[ RUN      ] NormCuda.MatchesCpu
/x/tests/ops/test_norm.cpp:318: Skipped
no CUDA device
  visible here

[  SKIPPED ] NormCuda.MatchesCpu (0 ms)</system-out>
  </testcase>
  <testcase name="Gemm.Fails" classname="Gemm" time="0.2" status="fail">
    <failure message="Failed"/>
  </testcase>
  <testcase name="Bare.Skip" classname="Bare" time="0.1" status="run">
    <skipped message="SKIP_REGULAR_EXPRESSION_MATCHED"/>
    <system-out>/x/tests/a.cpp:9: Skipped

[  SKIPPED ] Bare.Skip (0 ms)</system-out>
  </testcase>
  <testcase name="X.DISABLED_Off" classname="X" time="0" status="disabled">
    <skipped message="Disabled"/>
  </testcase>
</testsuite>
"""

# One ctest test per executable or shard: test_norm (its report: a pass, two skips, a disabled
# case), test_backend_ops-0 (a shard; a failed case), test_ring (all cases pass, but the process
# failed: a leak found at exit), test_crash (no report: it crashed), consumer_find_package (not a
# GoogleTest executable).
PER_EXECUTABLE = """<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="Linux" tests="5" failures="3" disabled="0" skipped="0" time="42">
  <testcase name="test_norm" classname="test_norm" time="3" status="run"/>
  <testcase name="test_backend_ops-0" classname="test_backend_ops-0" time="30" status="fail">
    <failure message="Failed"/>
  </testcase>
  <testcase name="test_ring" classname="test_ring" time="5" status="fail">
    <failure message="Failed"/>
  </testcase>
  <testcase name="test_crash" classname="test_crash" time="1" status="fail">
    <failure message="Failed"/>
  </testcase>
  <testcase name="consumer_find_package" classname="consumer_find_package" time="3" status="run"/>
</testsuite>
"""

GTEST_NORM = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="4" failures="0" disabled="1" errors="0" time="0.3" name="AllTests">
  <testsuite name="Norm" tests="2" failures="0" disabled="0" skipped="1" errors="0" time="0.2">
    <testcase name="Passes" file="x.cpp" line="1" status="run" result="completed" time="0.1" classname="Norm" />
    <testcase name="MatchesCpu" file="x.cpp" line="317" status="run" result="skipped" time="0" classname="Norm">
      <skipped message="../tests/ops/test_norm.cpp:318&#x0A;no CUDA device"><![CDATA[../tests/ops/test_norm.cpp:318
no CUDA device]]></skipped>
    </testcase>
  </testsuite>
  <testsuite name="Other" tests="2" failures="0" disabled="1" skipped="1" errors="0" time="0.1">
    <testcase name="AlsoSkips" file="x.cpp" line="9" status="run" result="skipped" time="0" classname="Other">
      <skipped message="../tests/ops/test_norm.cpp:10&#x0A;no CUDA device"><![CDATA[]]></skipped>
    </testcase>
    <testcase name="DISABLED_Off" file="x.cpp" line="12" status="notrun" result="suppressed" time="0" classname="Other" />
  </testsuite>
</testsuites>
"""

GTEST_SHARD = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="2" failures="1" disabled="0" errors="0" time="30" name="AllTests">
  <testsuite name="Op/BackendOpsCpu" tests="2" failures="1" disabled="0" errors="0" time="30">
    <testcase name="EveryTierMatchesScalar/rmsnorm" status="run" result="completed" time="1" classname="Op/BackendOpsCpu" />
    <testcase name="EveryTierMatchesScalar/mm_gguf" status="run" result="completed" time="29" classname="Op/BackendOpsCpu">
      <failure message="x.cpp:835&#x0A;Value of: diff.empty()" type=""><![CDATA[x.cpp:835
Value of: diff.empty()]]></failure>
    </testcase>
  </testsuite>
</testsuites>
"""

GTEST_RING = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="2" failures="0" disabled="0" errors="0" time="5" name="AllTests">
  <testsuite name="RingTest" tests="2" failures="0" disabled="0" errors="0" time="5">
    <testcase name="A" status="run" result="completed" time="2" classname="RingTest" />
    <testcase name="B" status="run" result="completed" time="3" classname="RingTest" />
  </testsuite>
</testsuites>
"""


def write(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          check=False)


class SkipSummary(unittest.TestCase):
    def test_one_ctest_test_per_case(self):
        with tempfile.TemporaryDirectory() as d:
            junit = os.path.join(d, "junit.xml")
            write(junit, PER_CASE)
            r = run("--label", "Release tests", junit)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[0], "Release tests: 3 skipped, by reason:")
        self.assertIn("  1  no CUDA device visible here", lines)
        self.assertIn("  1  (GTEST_SKIP() without a message)", lines)
        self.assertIn("  1  (no GTEST_SKIP message: ctest says 'Disabled')", lines)
        self.assertEqual(lines[-1], "Release tests: 1 passed, 1 failed, 3 skipped, 4 s")

    def test_one_ctest_test_per_executable_reads_the_gtest_reports(self):
        with tempfile.TemporaryDirectory() as d:
            junit = os.path.join(d, "junit.xml")
            write(junit, PER_EXECUTABLE)
            reports = os.path.join(d, "gtest-xml")
            os.mkdir(reports)
            write(os.path.join(reports, "test_norm.xml"), GTEST_NORM)
            write(os.path.join(reports, "test_backend_ops-0.xml"), GTEST_SHARD)
            write(os.path.join(reports, "test_ring.xml"), GTEST_RING)
            r = run("--label", "Sanitized tests", "--seconds", "61", "--gtest-xml-dir", reports,
                    junit)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[0], "Sanitized tests: 3 skipped, by reason:")
        self.assertEqual(lines[1], "  2  no CUDA device")
        self.assertEqual(lines[2], "  1  (a DISABLED_ case: not run)")
        self.assertIn("Sanitized tests: test_ring failed outside its cases (its exit status; "
                      "see its output)", lines)
        # Passed: Norm.Passes, rmsnorm, RingTest.A and .B, consumer_find_package. Failed: mm_gguf,
        # test_ring's exit, test_crash (no report).
        self.assertEqual(lines[-1], "Sanitized tests: 5 passed, 3 failed, 3 skipped, 61 s")

    def test_a_missing_file_is_exit_status_2(self):
        r = run("/nonexistent/junit.xml")
        self.assertEqual(r.returncode, 2)
        self.assertIn("cannot read", r.stderr)


if __name__ == "__main__":
    unittest.main()
