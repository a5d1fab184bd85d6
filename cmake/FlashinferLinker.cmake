# The linker (issue 49): LLVM's lld where the compiler can use it. The sanitized test build links
# about 150 executables and the library; GNU ld took 0.8-1.4 s a sanitized test executable (debug
# line tables, the sanitizer runtimes), lld 0.25 s (docs/PERFORMANCE.md, "The cold path cut by
# 13 % of its CPU time (session 66, issue 49)"). The output is the same program: nothing in this
# project depends on the linker (no linker scripts, no LTO; CUDA code is compiled whole, not
# device-linked).
#
#   FLASHINFER_LINKER  AUTO: lld in a build without CUDA when `ld.lld` is found and the compiler
#                      accepts -fuse-ld=lld, otherwise the compiler's default; DEFAULT; or a
#                      -fuse-ld= name (lld, gold, mold, bfd) used as given.
#
# AUTO keeps the default linker where CUDA is compiled: those binaries are the ones carried to a
# GPU machine (scripts/gpu-pack), and their link path is the one GPU runs have verified. The
# sanitized build, which does most of the linking, has no CUDA.
#
# Only this project's own targets are affected (a directory property, not an exported usage
# requirement): a consumer of the installed package links with its own choice. A target CMake
# links through nvcc would keep nvcc's default.
set(FLASHINFER_LINKER "AUTO" CACHE STRING "Linker for this project's targets: AUTO, DEFAULT, or a -fuse-ld= name")

set(_fi_linker "")
if(FLASHINFER_LINKER STREQUAL "AUTO" AND NOT FLASHINFER_WITH_CUDA)
  find_program(FLASHINFER_LD_LLD ld.lld)
  if(FLASHINFER_LD_LLD)
    include(CheckLinkerFlag)
    check_linker_flag(CXX "-fuse-ld=lld" FLASHINFER_CXX_ACCEPTS_LLD)
    if(FLASHINFER_CXX_ACCEPTS_LLD)
      set(_fi_linker lld)
    endif()
  endif()
elseif(NOT FLASHINFER_LINKER MATCHES "^(AUTO|DEFAULT)$")
  set(_fi_linker "${FLASHINFER_LINKER}")
endif()

if(_fi_linker)
  add_link_options("$<$<LINK_LANGUAGE:CXX,C>:-fuse-ld=${_fi_linker}>")
  message(STATUS "flashinfer: linking with -fuse-ld=${_fi_linker}")
else()
  message(STATUS "flashinfer: linking with the compiler's default linker")
endif()
