# `flashinfer repro` end to end against the installed package: install into a scratch prefix,
# record an rmsnorm, a BatchDecodeWithPagedKVCacheWrapper session and a MoE LoRA delta through
# pointer tables, generate a reproducer for the rmsnorm call, the wrapper's run call and the
# delta (whose tables the reproducer rebuilds from the recorded weight banks) with the installed
# `flashinfer`, build each with find_package(flashinfer_cpp), and run them: all pass. The rmsnorm
# reproducer is then run on the data of a recording whose output was tampered with: it must fail.
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(rc)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

run_step("install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
run_step("recording" ${RECORDER} ${WORK_DIR}/dump)
run_step("tampered recording" ${RECORDER} ${WORK_DIR}/dump_tampered --tamper)

foreach(op rmsnorm BatchDecodeWithPagedKVCacheWrapper.run bgmv_moe_gemm1_lora_delta)
  file(GLOB call LIST_DIRECTORIES true ${WORK_DIR}/dump/*_${op}_call*)
  list(LENGTH call n)
  if(NOT n EQUAL 1)
    message(FATAL_ERROR "expected one ${op} call in ${WORK_DIR}/dump, found ${n}")
  endif()
  set(src ${WORK_DIR}/repro_${op})
  run_step("flashinfer repro (${op})" ${prefix}/bin/flashinfer repro --dir ${call} -o ${src})
  run_step("configuring the ${op} reproducer" ${CMAKE_COMMAND} -S ${src} -B ${src}/build
           -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}
           -DCMAKE_BUILD_TYPE=Release)
  run_step("building the ${op} reproducer" ${CMAKE_COMMAND} --build ${src}/build)
  run_step("running the ${op} reproducer" ${src}/build/repro)
  if(NOT step_output MATCHES "\nPASS\n")
    message(FATAL_ERROR "the ${op} reproducer did not print PASS:\n${step_output}")
  endif()
  message(STATUS "${op} reproducer:\n${step_output}")
endforeach()

# The tampered recording's rmsnorm data, run by the reproducer built above: a mismatch, exit 1.
file(GLOB call LIST_DIRECTORIES true ${WORK_DIR}/dump_tampered/*_rmsnorm_call*)
run_step("flashinfer repro (tampered)" ${prefix}/bin/flashinfer repro --dir ${call}
         -o ${WORK_DIR}/repro_tampered)
execute_process(COMMAND ${WORK_DIR}/repro_rmsnorm/build/repro --data
                        ${WORK_DIR}/repro_tampered/data
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 1 OR NOT out MATCHES "result: FAIL" OR NOT out MATCHES "\nFAIL\n")
  message(FATAL_ERROR "the reproducer on tampered data should fail with status 1, got ${rc}:\n${out}")
endif()
