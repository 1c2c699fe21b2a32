# Every third-party library dtrain uses, all from Debian packages (scripts/setup.sh installs them).
set(THREADS_PREFER_PTHREAD_FLAG ON)
find_package(Threads REQUIRED)
find_package(Boost 1.74 REQUIRED COMPONENTS program_options)
find_package(RapidJSON REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(ZLIB REQUIRED)
find_package(OpenSSL REQUIRED)
# HDF5 (worker/train/hdf5_image.cc, the only user): the weights of the Keras archive the final
# model is also written as (Debian's serial libhdf5, libhdf5-dev). FindHDF5 finds the folders.
# The library is not linked: hdf5_image.cc loads it by its soname (DTRAIN_HDF5_SONAME, read from
# the library found) when it first writes, so that a worker start does not load libhdf5 and the
# thirty libraries it needs (curl, gnutls, krb5, ...).
enable_language(C)  # FindHDF5 compiles a C test program
find_package(HDF5 REQUIRED COMPONENTS C)
find_library(DTRAIN_HDF5_LIBRARY NAMES hdf5_serial hdf5 HINTS ${HDF5_C_LIBRARY_DIRS} REQUIRED)
execute_process(COMMAND objdump -p ${DTRAIN_HDF5_LIBRARY} OUTPUT_VARIABLE _dtrain_hdf5_dump
                ERROR_QUIET)
if(_dtrain_hdf5_dump MATCHES "SONAME +([^ \n]+)")
  set(DTRAIN_HDF5_SONAME "${CMAKE_MATCH_1}")
else()
  set(DTRAIN_HDF5_SONAME "${DTRAIN_HDF5_LIBRARY}")  # no soname: the file itself
endif()
add_library(dtrain_hdf5 INTERFACE)
target_include_directories(dtrain_hdf5 SYSTEM INTERFACE ${HDF5_C_INCLUDE_DIRS})
target_compile_definitions(dtrain_hdf5 INTERFACE DTRAIN_HDF5_SONAME="${DTRAIN_HDF5_SONAME}")
target_link_libraries(dtrain_hdf5 INTERFACE ${CMAKE_DL_LIBS})
# Image folders (worker/data/image_decode.cc, the only user): libpng 1.6 and libjpeg-turbo.
find_package(PNG REQUIRED)
find_package(JPEG REQUIRED)
# oneDNN: Debian's dnnl-config.cmake insists on OpenCL (its GPU runtime), which the CPU backend
# never uses; find the header and library directly instead.
find_path(DNNL_INCLUDE_DIR dnnl.hpp REQUIRED)
find_library(DNNL_LIBRARY dnnl REQUIRED)
add_library(dtrain_dnnl INTERFACE)
target_include_directories(dtrain_dnnl SYSTEM INTERFACE ${DNNL_INCLUDE_DIR})
target_link_libraries(dtrain_dnnl INTERFACE ${DNNL_LIBRARY})
# RE2 (`dtrain logs --grep`): matching in time linear in the line, with no recursion.
find_path(RE2_INCLUDE_DIR re2/re2.h REQUIRED)
find_library(RE2_LIBRARY re2 REQUIRED)
add_library(dtrain_re2 INTERFACE)
target_include_directories(dtrain_re2 SYSTEM INTERFACE ${RE2_INCLUDE_DIR})
target_link_libraries(dtrain_re2 INTERFACE ${RE2_LIBRARY} Threads::Threads)
find_package(Catch2 2 REQUIRED)

# Debian's RapidJSON config sets variables only; wrap it in a target.
if(NOT TARGET dtrain_rapidjson)
  add_library(dtrain_rapidjson INTERFACE)
  target_include_directories(dtrain_rapidjson SYSTEM INTERFACE ${RAPIDJSON_INCLUDE_DIRS})
  target_compile_definitions(dtrain_rapidjson INTERFACE RAPIDJSON_HAS_STDSTRING=1)
endif()
