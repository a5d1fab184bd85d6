# Installs the built library into a scratch prefix, configures and builds tests/consumer against
# it with find_package(flashinfer_cpp), and runs the result: once as is, once with CUDA hidden
# from the consumer (the package must not need the toolkit). Then runs the installed tool with
# no library path set (it must find libflashinfer through its RUNPATH).
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix}
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "install failed: ${rc}")
endif()
foreach(variant default no_cuda)
  set(extra "")
  if(variant STREQUAL "no_cuda")
    set(extra -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON -DCMAKE_DISABLE_FIND_PACKAGE_CUDA=ON
              -DCMAKE_CUDA_COMPILER=/nonexistent/nvcc)
  endif()
  set(build ${WORK_DIR}/build_${variant})
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${CONSUMER_SRC} -B ${build}
                          -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}
                          ${extra}
                  RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "configuring the consumer (${variant}) failed: ${rc}")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${build} RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "building the consumer (${variant}) failed: ${rc}")
  endif()
  execute_process(COMMAND ${build}/consumer RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "the consumer (${variant}) failed: ${rc}")
  endif()
endforeach()
file(GLOB tool ${prefix}/bin/flashinfer)
if(tool)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH ${tool} version
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc)
    message(FATAL_ERROR "the installed tool does not start (RUNPATH?): ${rc} ${out} ${err}")
  endif()
endif()
