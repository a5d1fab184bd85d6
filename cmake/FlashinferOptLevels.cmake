# Optimization by role (issue 49): the build type's flags (-O3 in Release) go where run time is
# spent, the CPU kernels (src/kernels/cpu) and the tensor core (src/core); the rest compiles at a
# level chosen for compile time, because most of its compile time is the optimizer working on
# template-generated glue that runs once per call (docs/PERFORMANCE.md, "CI time and the
# fresh-machine path": api/rope.cpp 14.2 CPU-s at -O3, 13.4 at -O2; tests/trace/test_trace.cpp
# 81.6 at -O3, 45.0 at -O1).
#
#   FLASHINFER_GLUE_OPT  the library's other sources that run on every call or every recorded call
#                        (recorder, apilog, calls, formats, startup)
#   FLASHINFER_OP_OPT    the op layer (src/api: declarations, argument checks, dispatch), replay,
#                        the trace templates, the JIT driver and the command-line tool: code that
#                        runs once per call or once per process around the kernels, and most of
#                        the library's compile time (session 32: api/rope.cpp 4.7 CPU-s at
#                        -O2, 3.4 at -O1; the tool's cmd_replay.cpp 9.5 / 7.3)
#   FLASHINFER_TEST_OPT  the GoogleTest executables
#
#   FLASHINFER_TEST_LOOP_OPT  the tests whose own code runs long loops (tests/CMakeLists.txt's
#                        list), after FLASHINFER_TEST_OPT
#
# AUTO: in Release, -O2 for the glue, -Og for the op layer (since session 52; -O1 before: GCC's -Og
# skips the -O1 passes that cost most on this template-generated code, the op layer's 29 objects
# 510 -> 371 CPU-s, for about 380 more instructions a call, 10,650 -> 11,031 for a public
# rmsnorm() at level 0 under callgrind), -O0 for the tests (since session 48:
# about 20 % less compile time for the test sources, the largest part of a fresh build) and -O1
# for the loop-heavy tests; in the sanitized build the
# glue keeps the build type's flags (-O1), the op layer and the tests take -O0 and the loop-heavy
# tests -O1; otherwise (Debug) nothing: the build type's flags. The sanitized op layer at -O0
# (session 48): its unity batches are most of that build's library time (api_batch_6: 67 s at
# -O1, 27 s at -O0, clang with ASan), and the op layer's own code is per-call glue. The sanitized build was tried with
# -O0 for glue and tests (session 26): it compiled much faster cold (its api sources 2-3x), but its
# tests ran 2.5x slower (test_backend_ops' CPU cases 245 s against 96 s: the glue's time). With -O0
# for the test sources alone (session 27) their objects took 546 CPU-s instead of 1117 (clang, ASan)
# and the suite 285 s instead of 206, most of the difference in five files whose fp64 references and
# sweeps loop in the test's own code: those keep -O1. An empty value means the build type's flags;
# any other value is passed as given (e.g. -O3).
set(FLASHINFER_GLUE_OPT "AUTO" CACHE STRING
    "Optimization flags of the recorder, API logging, formats and start-up (AUTO, empty, or flags)")
set(FLASHINFER_OP_OPT "AUTO" CACHE STRING
    "Optimization flags of the op layer, replay, trace, JIT and the CLI (AUTO, empty, or flags)")
set(FLASHINFER_TEST_OPT "AUTO" CACHE STRING
    "Optimization flags of the test executables (AUTO, empty, or flags)")
set(FLASHINFER_TEST_LOOP_OPT "AUTO" CACHE STRING
    "Optimization flags of the loop-heavy test executables (AUTO, empty, or flags)")

function(_flashinfer_resolve_opt out value sanitized release)
  if(value STREQUAL "AUTO")
    if(FLASHINFER_SANITIZE)
      set(value "${sanitized}")
    elseif(CMAKE_BUILD_TYPE STREQUAL "Release")
      set(value "${release}")
    else()
      set(value "")
    endif()
  endif()
  separate_arguments(value UNIX_COMMAND "${value}")
  set(${out} "${value}" PARENT_SCOPE)
endfunction()

_flashinfer_resolve_opt(FLASHINFER_GLUE_OPT_FLAGS "${FLASHINFER_GLUE_OPT}" "" "-O2")
_flashinfer_resolve_opt(FLASHINFER_OP_OPT_FLAGS "${FLASHINFER_OP_OPT}" "-O0" "-Og")
_flashinfer_resolve_opt(FLASHINFER_TEST_OPT_FLAGS "${FLASHINFER_TEST_OPT}" "-O0" "-O0")
_flashinfer_resolve_opt(FLASHINFER_TEST_LOOP_OPT_FLAGS "${FLASHINFER_TEST_LOOP_OPT}" "-O1" "-O1")
message(STATUS "flashinfer: glue sources '${FLASHINFER_GLUE_OPT_FLAGS}', op layer and CLI "
               "'${FLASHINFER_OP_OPT_FLAGS}', tests '${FLASHINFER_TEST_OPT_FLAGS}', "
               "loop-heavy tests '${FLASHINFER_TEST_LOOP_OPT_FLAGS}' (empty: the build type's "
               "flags)")

# flashinfer_set_opt_level(role SOURCES...) or (role TARGET t): the role's flags on C++ sources
# (after the build type's, so they win) or on a whole target's C++ compiles.
function(flashinfer_set_opt_level role kind)
  if(role STREQUAL "glue")
    set(_flags ${FLASHINFER_GLUE_OPT_FLAGS})
  elseif(role STREQUAL "op")
    set(_flags ${FLASHINFER_OP_OPT_FLAGS})
  elseif(role STREQUAL "test")
    set(_flags ${FLASHINFER_TEST_OPT_FLAGS})
  else()
    message(FATAL_ERROR "flashinfer_set_opt_level: unknown role '${role}'")
  endif()
  if(NOT _flags)
    return()
  endif()
  if(kind STREQUAL "TARGET")
    target_compile_options(${ARGV2} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${_flags}>")
  else()
    set_property(SOURCE ${ARGN} APPEND PROPERTY COMPILE_OPTIONS ${_flags})
  endif()
endfunction()
