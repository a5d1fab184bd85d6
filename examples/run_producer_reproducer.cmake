# Runs PRODUCER with the flight recorder on into DUMP_DIR, then REPRODUCER on DUMP_DIR; fails
# unless both exit 0 and the dump directory holds a session.jsonl.
file(REMOVE_RECURSE ${DUMP_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} -E env FLASHINFER_LOGLEVEL=10 FLASHINFER_DUMP_DIR=${DUMP_DIR}
                        FLASHINFER_LOGDEST=stderr ${PRODUCER}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}")
if(rc)
  message(FATAL_ERROR "producer failed (${rc}): ${err}")
endif()
if(NOT EXISTS ${DUMP_DIR}/session.jsonl)
  message(FATAL_ERROR "the producer wrote no session.jsonl in ${DUMP_DIR}")
endif()
execute_process(COMMAND ${REPRODUCER} ${DUMP_DIR} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
message("${out}")
if(rc)
  message(FATAL_ERROR "reproducer failed (${rc}): ${err}")
endif()
