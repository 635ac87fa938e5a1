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
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
      # sm_90 (H100/H200) machine code plus compute_80 PTX, which the driver JITs for A100,
      # Ada and newer GPUs; plus machine code for each GPU of this machine that nvidia-smi
      # reports (a T4 or an RTX 20xx, 7.5, would otherwise get no kernel it can load: the
      # device is refused when opened, ops/cuda_arch.h). Set before enable_language, which
      # would otherwise pick its own. -DCMAKE_CUDA_ARCHITECTURES=... overrides all of this.
      set(_onnxtrain_archs "90-real;80-virtual")
      find_program(ONNXTRAIN_NVIDIA_SMI nvidia-smi)
      if(ONNXTRAIN_NVIDIA_SMI)
        execute_process(COMMAND ${ONNXTRAIN_NVIDIA_SMI} --query-gpu=compute_cap
                                --format=csv,noheader
                        OUTPUT_VARIABLE _onnxtrain_caps RESULT_VARIABLE _onnxtrain_rc
                        ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE TIMEOUT 30)
        if(_onnxtrain_rc EQUAL 0)
          string(REPLACE "\n" ";" _onnxtrain_caps "${_onnxtrain_caps}")
          foreach(_cap IN LISTS _onnxtrain_caps)
            string(STRIP "${_cap}" _cap)
            if(_cap MATCHES "^([0-9]+)\\.([0-9])$")
              list(APPEND _onnxtrain_archs "${CMAKE_MATCH_1}${CMAKE_MATCH_2}-real")
            endif()
          endforeach()
          list(REMOVE_DUPLICATES _onnxtrain_archs)
        endif()
      endif()
      set(CMAKE_CUDA_ARCHITECTURES "${_onnxtrain_archs}" CACHE STRING "CUDA architectures")
    endif()
    enable_language(CUDA)
    # C++20 (op_api.h uses std::span). CMake 3.25 does not know nvcc 13's dialect flags.
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA_STANDARD 20)
    find_package(CUDAToolkit REQUIRED)
    # cuDNN and NCCL ship beside the toolkit (/usr/local/cuda) or as distro packages.
    find_library(ONNXTRAIN_CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} ${ONNXTRAIN_CUDA_ROOT}/lib64)
    find_library(ONNXTRAIN_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${ONNXTRAIN_CUDA_ROOT}/lib64)
    find_path(ONNXTRAIN_CUDNN_INCLUDE cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    find_path(ONNXTRAIN_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    if(NOT ONNXTRAIN_CUDNN_LIBRARY OR NOT ONNXTRAIN_NCCL_LIBRARY OR NOT ONNXTRAIN_CUDNN_INCLUDE
       OR NOT ONNXTRAIN_NCCL_INCLUDE)
      message(FATAL_ERROR "CUDA toolkit found but cuDNN or NCCL is missing "
                          "(cudnn: ${ONNXTRAIN_CUDNN_LIBRARY}, nccl: ${ONNXTRAIN_NCCL_LIBRARY}); "
                          "install them or configure with -DONNXTRAIN_CUDA=OFF")
    endif()
    add_library(onnxtrain_cudnn INTERFACE)
    target_link_libraries(onnxtrain_cudnn INTERFACE ${ONNXTRAIN_CUDNN_LIBRARY})
    target_include_directories(onnxtrain_cudnn INTERFACE ${ONNXTRAIN_CUDNN_INCLUDE})
    add_library(onnxtrain_nccl INTERFACE)
    target_link_libraries(onnxtrain_nccl INTERFACE ${ONNXTRAIN_NCCL_LIBRARY})
    target_include_directories(onnxtrain_nccl INTERFACE ${ONNXTRAIN_NCCL_INCLUDE})
    set(ONNXTRAIN_CUDA_ENABLED ON)
  elseif(ONNXTRAIN_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ONNXTRAIN_CUDA=ON but no CUDA compiler was found "
                        "(looked on PATH and in ${ONNXTRAIN_CUDA_ROOT}/bin)")
  endif()
endif()
if(ONNXTRAIN_CUDA_ENABLED)
  message(STATUS "onnxtrain: CUDA backend ON (ONNXTRAIN_CUDA=${ONNXTRAIN_CUDA}), kernels for "
                 "${CMAKE_CUDA_ARCHITECTURES}")
else()
  message(STATUS "onnxtrain: CUDA backend OFF (ONNXTRAIN_CUDA=${ONNXTRAIN_CUDA})")
endif()

add_library(onnxtrain_config INTERFACE)
if(ONNXTRAIN_CUDA_ENABLED)
  target_compile_definitions(onnxtrain_config INTERFACE ONNXTRAIN_WITH_CUDA=1)
else()
  target_compile_definitions(onnxtrain_config INTERFACE ONNXTRAIN_WITH_CUDA=0)
endif()
target_include_directories(onnxtrain_config INTERFACE ${PROJECT_SOURCE_DIR})
