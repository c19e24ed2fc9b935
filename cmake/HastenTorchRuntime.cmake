# After find_package(Torch): where the libraries LibTorch loads live, and LibTorch's CMake
# package made to link what LibTorch itself loads. Included by hasten's own build
# (cmake/HastenTorch.cmake) and, installed, by find_package(hasten), so that a program built
# against hasten links the same CUDA runtime as hasten and LibTorch.
#
# Sets: HASTEN_TORCH_LIB_DIRS (for RUNPATHs: a program that installs itself can use
# set(CMAKE_INSTALL_RPATH ${HASTEN_TORCH_LIB_DIRS})), HASTEN_TORCH_CUDA, and, where LibTorch has
# CUDA, HASTEN_NCCL_INCLUDE_DIR, HASTEN_NCCL_LIBRARY, HASTEN_NCCL_VERSION, HASTEN_CUDA_INCLUDE_DIR
# and HASTEN_CUDART_LIBRARY. Reads HASTEN_CUDA (AUTO when unset).
# Where the libraries LibTorch loads live: its lib/ and, for a wheel, the nvidia/* packages
# next to it (libtorch_cuda.so's own DT_RPATH finds them the same way).
set(HASTEN_TORCH_LIB_DIRS "${TORCH_INSTALL_PREFIX}/lib")
get_filename_component(_hasten_site "${TORCH_INSTALL_PREFIX}/.." ABSOLUTE)
set(_hasten_wheel_nvidia "${_hasten_site}/nvidia")

# CUDA: LibTorch is a CUDA build (it has torch_cuda) unless the user turned CUDA off.
set(HASTEN_TORCH_CUDA OFF)
if(TARGET torch_cuda AND NOT HASTEN_CUDA STREQUAL "OFF")
  set(HASTEN_TORCH_CUDA ON)
elseif(HASTEN_CUDA STREQUAL "ON")
  message(FATAL_ERROR "hasten: HASTEN_CUDA=ON but the LibTorch at ${TORCH_INSTALL_PREFIX} has no CUDA "
                      "(a CPU-only build); use a CUDA LibTorch or HASTEN_CUDA=AUTO")
endif()

if(TARGET torch_cuda)
  # The NCCL and CUDA runtime LibTorch itself loads: a wheel's nvidia/nccl and nvidia/cu13
  # (headers included), else a libtorch archive's lib/, else the toolkit.
  file(GLOB _hasten_cu_dirs LIST_DIRECTORIES true "${_hasten_wheel_nvidia}/cu[0-9]*")
  set(_hasten_nccl_hints "${_hasten_wheel_nvidia}/nccl" "${TORCH_INSTALL_PREFIX}")
  set(_hasten_cuda_hints ${_hasten_cu_dirs} "${_hasten_wheel_nvidia}/cuda_runtime" "${TORCH_INSTALL_PREFIX}"
      ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_TARGET_DIR})
  find_path(HASTEN_NCCL_INCLUDE_DIR nccl.h HINTS ${_hasten_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS}
            PATH_SUFFIXES include NO_DEFAULT_PATH)
  find_library(HASTEN_NCCL_LIBRARY NAMES libnccl.so.2 nccl HINTS ${_hasten_nccl_hints} ${CUDAToolkit_LIBRARY_DIR}
               PATH_SUFFIXES lib lib64 NO_DEFAULT_PATH)
  # Headers that cuda_runtime.h can be compiled with: the wheel's nvidia/cu13/include holds
  # cuda_runtime.h but not the crt/ headers it includes (torch 2.11's and 2.15's), so a directory
  # qualifies only with crt/host_config.h, and the toolkit's (of the same major, checked above)
  # serves where the wheel's does not.
  find_path(HASTEN_CUDA_INCLUDE_DIR NAMES crt/host_config.h
            HINTS ${_hasten_cuda_hints} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include NO_DEFAULT_PATH)
  find_library(HASTEN_CUDART_LIBRARY NAMES libcudart.so.13 libcudart.so.12 cudart
               HINTS ${_hasten_cuda_hints} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64 NO_DEFAULT_PATH)
  if(NOT HASTEN_NCCL_INCLUDE_DIR OR NOT HASTEN_NCCL_LIBRARY OR NOT HASTEN_CUDA_INCLUDE_DIR OR NOT HASTEN_CUDART_LIBRARY)
    message(FATAL_ERROR "hasten: LibTorch ${HASTEN_TORCH_VERSION} has CUDA but NCCL or the CUDA runtime was not "
                        "found next to it (looked in ${_hasten_nccl_hints} ${_hasten_cuda_hints})")
  endif()
  file(STRINGS "${HASTEN_NCCL_INCLUDE_DIR}/nccl.h" _hasten_nccl_v REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
  string(REGEX REPLACE ".*NCCL_MAJOR ([0-9]+).*NCCL_MINOR ([0-9]+).*NCCL_PATCH ([0-9]+).*" "\\1.\\2.\\3"
         HASTEN_NCCL_VERSION "${_hasten_nccl_v}")
  get_filename_component(_d "${HASTEN_NCCL_LIBRARY}" DIRECTORY)
  list(APPEND HASTEN_TORCH_LIB_DIRS "${_d}")
  get_filename_component(_d "${HASTEN_CUDART_LIBRARY}" DIRECTORY)
  list(APPEND HASTEN_TORCH_LIB_DIRS "${_d}")
  list(REMOVE_DUPLICATES HASTEN_TORCH_LIB_DIRS)
  # LibTorch's package links the toolkit's cudart into everything (torch::cudart); at run time
  # libtorch_cuda loads its own (the wheel's nvidia/cu13). Link that one, so one CUDA runtime
  # is in the process and nothing needs the toolkit to run.
  if(TARGET torch::cudart)
    set_property(TARGET torch::cudart PROPERTY INTERFACE_LINK_LIBRARIES "${HASTEN_CUDART_LIBRARY}")
  endif()
  # NVRTC (the toolkit's, in TORCH_LIBRARIES) is LibTorch's business: libtorch_cuda loads its own.
  if(CUDA_NVRTC_LIB)
    list(REMOVE_ITEM TORCH_LIBRARIES "${CUDA_NVRTC_LIB}")
  endif()
endif()
# The wheel links MKL statically; its package still adds link directories under an empty
# MKL_ROOT (/lib/intel64...), which would end up in every rpath.
if(TARGET caffe2::mkl AND NOT MKL_ROOT)
  set_property(TARGET caffe2::mkl PROPERTY INTERFACE_LINK_DIRECTORIES "")
endif()

