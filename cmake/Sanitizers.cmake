# DTRAIN_SANITIZE=address,undefined or DTRAIN_SANITIZE=thread builds everything with those sanitizers.
set(DTRAIN_SANITIZE "" CACHE STRING "Comma-separated -fsanitize= list (address,undefined | thread)")
if(DTRAIN_SANITIZE)
  if(DTRAIN_SANITIZE MATCHES "thread" AND DTRAIN_SANITIZE MATCHES "address")
    message(FATAL_ERROR "DTRAIN_SANITIZE: thread and address cannot be combined")
  endif()
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${DTRAIN_SANITIZE}>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>)
  add_link_options(-fsanitize=${DTRAIN_SANITIZE})
  message(STATUS "dtrain: sanitizers ${DTRAIN_SANITIZE}")
endif()

# DTRAIN_FUZZ=ON (clang only) instruments everything for libFuzzer's coverage and builds the
# targets of test/fuzz as fuzzers (scripts/fuzz.sh); off, they replay their corpora as tests.
option(DTRAIN_FUZZ "Build test/fuzz as libFuzzer targets (clang)" OFF)
if(DTRAIN_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "DTRAIN_FUZZ needs clang (CXX=clang++-14); this is ${CMAKE_CXX_COMPILER_ID}")
  endif()
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>)
endif()
