# Optimization by role (issue 49): the build type's flags (-O3 in Release) go where run time is
# spent, the CPU kernels (src/kernels/cpu) and the tensor core (src/core); the rest compiles at a
# level chosen for compile time, because most of its compile time is the optimizer working on
# template-generated glue that runs once per call (docs/PERFORMANCE.md, "CI time and the
# fresh-machine path": api/rope.cpp 14.2 CPU-s at -O3, 13.4 at -O2; tests/trace/test_trace.cpp
# 81.6 at -O3, 45.0 at -O1).
#
#   FLASHINFER_GLUE_OPT  the library's other sources (api, recorder, replay, formats, trace, ...)
#                        and the command-line tool
#   FLASHINFER_TEST_OPT  the GoogleTest executables
#
# AUTO: in Release, -O2 for the glue and -O1 for the tests; otherwise (Debug, the sanitized build)
# nothing: the build type's flags. The sanitized build was tried with -O0 for both (session 26):
# it compiled much faster cold (its api sources 2-3x), but its tests ran 2.5x slower
# (test_backend_ops' CPU cases 245 s against 96 s), and CI mostly compiles from a warm ccache
# while it runs the tests every time. An empty value means the build type's flags; any other
# value is passed as given (e.g. -O3).
set(FLASHINFER_GLUE_OPT "AUTO" CACHE STRING
    "Optimization flags of the library's non-kernel sources and the CLI (AUTO, empty, or flags)")
set(FLASHINFER_TEST_OPT "AUTO" CACHE STRING
    "Optimization flags of the test executables (AUTO, empty, or flags)")

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
_flashinfer_resolve_opt(FLASHINFER_TEST_OPT_FLAGS "${FLASHINFER_TEST_OPT}" "" "-O1")
message(STATUS "flashinfer: glue sources '${FLASHINFER_GLUE_OPT_FLAGS}', "
               "tests '${FLASHINFER_TEST_OPT_FLAGS}' (empty: the build type's flags)")

# flashinfer_set_opt_level(role SOURCES...) or (role TARGET t): the role's flags on C++ sources
# (after the build type's, so they win) or on a whole target's C++ compiles.
function(flashinfer_set_opt_level role kind)
  if(role STREQUAL "glue")
    set(_flags ${FLASHINFER_GLUE_OPT_FLAGS})
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
