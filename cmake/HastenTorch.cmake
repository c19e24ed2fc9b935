# Which LibTorch hasten builds against, whether it has CUDA, and which NCCL goes with it.
#
# LibTorch: a Torch_DIR or CMAKE_PREFIX_PATH the user passes (a libtorch archive, a conda
# environment, a machine's own PyTorch) wins; otherwise the torch of HASTEN_PYTHON, the
# project's .venv made by scripts/install-deps.sh. Supported: 2.11 to 2.15 (README).
#
# Sets: HASTEN_TORCH_VERSION, HASTEN_TORCH_CUDA (ON/OFF: the CUDA paths are built),
# HASTEN_TORCH_LIB_DIRS (where LibTorch and the libraries it loads live, for rpaths),
# HASTEN_NCCL_INCLUDE_DIR / HASTEN_NCCL_LIBRARY / HASTEN_CUDART_LIBRARY /
# HASTEN_CUDA_INCLUDE_DIR (the nccl plugin's), and HASTEN_PYTHON.
set(HASTEN_TORCH_MIN_VERSION 2.11)
set(HASTEN_TORCH_TESTED_MAX 2.15)

set(HASTEN_PYTHON "${CMAKE_SOURCE_DIR}/.venv/bin/python" CACHE FILEPATH
    "The Python interpreter of the tests and peers (its torch should be the LibTorch built against)")
if(NOT Torch_DIR AND NOT DEFINED ENV{Torch_DIR} AND EXISTS "${HASTEN_PYTHON}")
  execute_process(COMMAND "${HASTEN_PYTHON}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
                  OUTPUT_VARIABLE _hasten_torch_prefix RESULT_VARIABLE _rc
                  OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(_rc EQUAL 0 AND _hasten_torch_prefix)
    # The real path: .venv is a link into a cache, and a LibTorch under the source directory
    # would make CMake refuse to export its include directories.
    get_filename_component(_hasten_torch_prefix "${_hasten_torch_prefix}" REALPATH)
    # Appended: a prefix the user passed is searched first.
    list(APPEND CMAKE_PREFIX_PATH "${_hasten_torch_prefix}")
  endif()
endif()

# The CUDA wheel's TorchConfig needs the CUDA toolkit (it runs find_package(CUDAToolkit));
# say so in one line instead of its own message.
find_file(_hasten_torch_config TorchConfig.cmake PATH_SUFFIXES Torch cmake/Torch share/cmake/Torch
          NO_CACHE)
if(_hasten_torch_config)
  get_filename_component(_hasten_torch_root "${_hasten_torch_config}/../../../.." ABSOLUTE)
  if(EXISTS "${_hasten_torch_root}/lib/libtorch_cuda.so" AND NOT HASTEN_CUDA STREQUAL "OFF")
    find_package(CUDAToolkit QUIET)
    if(NOT CUDAToolkit_FOUND)
      message(FATAL_ERROR "hasten: the LibTorch at ${_hasten_torch_root} is a CUDA build and its CMake package "
                          "needs the CUDA toolkit (nvcc): install it (or set CUDAToolkit_ROOT)")
    endif()
  endif()
endif()

# hasten compiles no CUDA kernels, so the arch list the CUDA wheel's package computes is
# unused: name one instead of letting it probe the GPUs (an nvcc try_run, which also fails on
# CMake < 3.26 with C++20).
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "Common")
endif()
find_package(Torch REQUIRED)
set(HASTEN_TORCH_VERSION ${Torch_VERSION})
if(HASTEN_TORCH_VERSION VERSION_LESS HASTEN_TORCH_MIN_VERSION)
  message(FATAL_ERROR "hasten: LibTorch ${HASTEN_TORCH_VERSION} at ${TORCH_INSTALL_PREFIX} is too old "
                      "(supported: ${HASTEN_TORCH_MIN_VERSION} to ${HASTEN_TORCH_TESTED_MAX}); "
                      "run `make deps` for the pinned wheel or pass Torch_DIR")
endif()
string(REGEX MATCH "^[0-9]+\\.[0-9]+" _hasten_torch_mm "${HASTEN_TORCH_VERSION}")
if(_hasten_torch_mm VERSION_GREATER HASTEN_TORCH_TESTED_MAX)
  message(WARNING "hasten: LibTorch ${HASTEN_TORCH_VERSION} is newer than the newest tested (${HASTEN_TORCH_TESTED_MAX})")
endif()

# One C++ ABI: Debian's libraries hasten links (yaml-cpp, GoogleTest, Boost) use the new
# libstdc++ ABI; a LibTorch built with the old one cannot share std::string with them.
get_target_property(_hasten_torch_opts torch INTERFACE_COMPILE_OPTIONS)
if(_hasten_torch_opts MATCHES "_GLIBCXX_USE_CXX11_ABI=0")
  message(FATAL_ERROR "hasten: the LibTorch at ${TORCH_INSTALL_PREFIX} uses the old C++ ABI "
                      "(_GLIBCXX_USE_CXX11_ABI=0) and this system's C++ libraries the new one: use a cxx11-ABI "
                      "LibTorch (every PyPI wheel from 2.7 on)")
endif()

# fmt: LibTorch's headers include the fmt it ships (torch/include/fmt); hasten's logging uses
# that same fmt, header-only, so the process holds one fmt.
if(NOT EXISTS "${TORCH_INSTALL_PREFIX}/include/fmt/format.h")
  message(FATAL_ERROR "hasten: the LibTorch at ${TORCH_INSTALL_PREFIX} ships no fmt headers (include/fmt)")
endif()

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

if(HASTEN_TORCH_CUDA)
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
  find_path(HASTEN_CUDA_INCLUDE_DIR cuda_runtime.h HINTS ${_hasten_cuda_hints} ${CUDAToolkit_INCLUDE_DIRS}
            PATH_SUFFIXES include NO_DEFAULT_PATH)
  find_library(HASTEN_CUDART_LIBRARY NAMES libcudart.so.13 libcudart.so.12 cudart
               HINTS ${_hasten_cuda_hints} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64 NO_DEFAULT_PATH)
  if(NOT HASTEN_NCCL_INCLUDE_DIR OR NOT HASTEN_NCCL_LIBRARY OR NOT HASTEN_CUDA_INCLUDE_DIR OR NOT HASTEN_CUDART_LIBRARY)
    message(FATAL_ERROR "hasten: LibTorch ${HASTEN_TORCH_VERSION} has CUDA but NCCL or the CUDA runtime was not "
                        "found next to it (looked in ${_hasten_nccl_hints} ${_hasten_cuda_hints}); "
                        "pass -DHASTEN_CUDA=OFF for a CPU-only build")
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

# Binaries and plugins find libhasten next door and LibTorch where it was built from, so they
# run without LD_LIBRARY_PATH, installed or not. The build tree gets the same directories
# first (CMake appends the directories of what a target links).
set(CMAKE_INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}" ${HASTEN_TORCH_LIB_DIRS})
set(CMAKE_BUILD_RPATH ${HASTEN_TORCH_LIB_DIRS})
