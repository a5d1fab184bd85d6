# flashinfer_set_warnings(target): -Wall -Wextra for C++, the same spirit for nvcc; errors in CI.
# -Wno-restrict: GCC 12 reports false positives inside std::string at -O3 (GCC bug 105329).
# -Wno-pass-failed: clang reports `omp simd` loops it did not vectorize at low -O levels.
function(flashinfer_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wno-unknown-pragmas
       $<$<CXX_COMPILER_ID:GNU>:-Wno-restrict> $<$<CXX_COMPILER_ID:Clang>:-Wno-pass-failed>>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra --Werror=all-warnings>)
  if(FLASHINFER_SANITIZE AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # GCC's flow analysis reports false maybe-uninitialized warnings inside the standard library
    # (std::regex, std::function) once sanitizer instrumentation is on.
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-maybe-uninitialized>)
  endif()
  if(FLASHINFER_WARNINGS_AS_ERRORS)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>
                                             $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Werror>)
  endif()
endfunction()
