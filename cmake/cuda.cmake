# CUDA detection: ONNXTRAIN_CUDA=AUTO turns the backend on when a toolkit (nvcc) is found,
# ON requires one, OFF never looks. The result is ONNXTRAIN_CUDA_ENABLED (cached, printed) and
# the compile definition ONNXTRAIN_WITH_CUDA=0/1 on target onnxtrain_config.
set(ONNXTRAIN_CUDA_ROOT "/usr/local/cuda" CACHE PATH "Where to look for the CUDA toolkit")
set(ONNXTRAIN_CUDA_ENABLED OFF)
if(NOT ONNXTRAIN_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS ${ONNXTRAIN_CUDA_ROOT}/bin/nvcc)
    set(CMAKE_CUDA_COMPILER ${ONNXTRAIN_CUDA_ROOT}/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
      # sm_90 machine code plus PTX so other GPUs JIT it.
      set(CMAKE_CUDA_ARCHITECTURES "90-real;90-virtual")
    endif()
    find_package(CUDAToolkit REQUIRED)
    set(ONNXTRAIN_CUDA_ENABLED ON)
  elseif(ONNXTRAIN_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ONNXTRAIN_CUDA=ON but no CUDA compiler was found "
                        "(looked on PATH and in ${ONNXTRAIN_CUDA_ROOT}/bin)")
  endif()
endif()
message(STATUS "onnxtrain: CUDA backend ${ONNXTRAIN_CUDA_ENABLED} (ONNXTRAIN_CUDA=${ONNXTRAIN_CUDA})")

add_library(onnxtrain_config INTERFACE)
if(ONNXTRAIN_CUDA_ENABLED)
  target_compile_definitions(onnxtrain_config INTERFACE ONNXTRAIN_WITH_CUDA=1)
else()
  target_compile_definitions(onnxtrain_config INTERFACE ONNXTRAIN_WITH_CUDA=0)
endif()
target_include_directories(onnxtrain_config INTERFACE ${PROJECT_SOURCE_DIR})
