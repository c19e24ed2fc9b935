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
if(DEFINED HASTEN_WITH_NCCL)
  message(FATAL_ERROR "hasten: HASTEN_WITH_NCCL is gone: the nccl plugin is built with the CUDA paths "
                      "(HASTEN_CUDA=AUTO, ON or OFF)")
endif()
# Torch_DIR from the Python (not a user's): found again on every configure, so that new pins
# (a new .venv target) or another HASTEN_PYTHON take effect in an existing build directory.
if((NOT Torch_DIR OR HASTEN_TORCH_DIR_FROM_PYTHON) AND NOT DEFINED ENV{Torch_DIR} AND EXISTS "${HASTEN_PYTHON}")
  execute_process(COMMAND "${HASTEN_PYTHON}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
                  OUTPUT_VARIABLE _hasten_torch_prefix RESULT_VARIABLE _rc
                  OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(_rc EQUAL 0 AND _hasten_torch_prefix)
    # The real path: .venv is a link into a cache, and a LibTorch under the source directory
    # would make CMake refuse to export its include directories.
    get_filename_component(_hasten_torch_prefix "${_hasten_torch_prefix}" REALPATH)
    if(Torch_DIR AND NOT Torch_DIR STREQUAL "${_hasten_torch_prefix}/Torch")
      unset(Torch_DIR CACHE)
      unset(Caffe2_DIR CACHE)
    endif()
    # Appended: a prefix the user passed is searched first.
    list(APPEND CMAKE_PREFIX_PATH "${_hasten_torch_prefix}")
    set(HASTEN_TORCH_DIR_FROM_PYTHON ON CACHE INTERNAL "Torch_DIR came from HASTEN_PYTHON's torch")
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
                          "needs the CUDA toolkit (nvcc) of the same major version: install it (or set "
                          "CUDAToolkit_ROOT)")
    endif()
    # The package refuses an older major than LibTorch's own CUDA (a wheel's CUDA runtime is in
    # nvidia/cuNN): say which one is needed.
    file(GLOB _hasten_cu_majors LIST_DIRECTORIES true RELATIVE "${_hasten_torch_root}/../nvidia"
         "${_hasten_torch_root}/../nvidia/cu[0-9]*")
    foreach(_d ${_hasten_cu_majors})
      string(SUBSTRING "${_d}" 2 -1 _major)
      if(CUDAToolkit_VERSION_MAJOR LESS _major)
        message(FATAL_ERROR "hasten: the LibTorch at ${_hasten_torch_root} is built with CUDA ${_major} and the "
                            "CUDA toolkit found is ${CUDAToolkit_VERSION} (${CUDAToolkit_NVCC_EXECUTABLE}): install "
                            "a CUDA ${_major} toolkit (or set CUDAToolkit_ROOT)")
      endif()
    endforeach()
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
# The tests' peers and `make bench` run HASTEN_PYTHON's torch: it should be this LibTorch.
if(EXISTS "${HASTEN_PYTHON}")
  execute_process(COMMAND "${HASTEN_PYTHON}" -c "import torch; print(torch.__version__.split('+')[0])"
                  OUTPUT_VARIABLE _hasten_py_torch RESULT_VARIABLE _rc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(_rc EQUAL 0 AND NOT _hasten_py_torch VERSION_EQUAL HASTEN_TORCH_VERSION)
    message(WARNING "hasten: HASTEN_PYTHON (${HASTEN_PYTHON}) runs torch ${_hasten_py_torch}, hasten builds against "
                    "LibTorch ${HASTEN_TORCH_VERSION}: the parity tests would compare two builds")
  endif()
endif()
string(REGEX MATCH "^[0-9]+\\.[0-9]+" _hasten_torch_mm "${HASTEN_TORCH_VERSION}")
if(_hasten_torch_mm VERSION_GREATER HASTEN_TORCH_TESTED_MAX)
  message(WARNING "hasten: LibTorch ${HASTEN_TORCH_VERSION} is newer than the newest tested (${HASTEN_TORCH_TESTED_MAX})")
endif()

# One C++ ABI: Debian's libraries hasten links (yaml-cpp, GoogleTest, Boost) use the new
# libstdc++ ABI; a LibTorch built with the old one cannot share std::string with them.
# LibTorch's CMake package does not say which ABI it uses: ask its library. The new ABI's
# std::string is std::__cxx11::basic_string, whose mangled names hold "__cxx11".
file(STRINGS "${TORCH_INSTALL_PREFIX}/lib/libc10.so" _hasten_cxx11 REGEX "__cxx11" LIMIT_COUNT 1)
if(NOT _hasten_cxx11)
  message(FATAL_ERROR "hasten: the LibTorch at ${TORCH_INSTALL_PREFIX} uses the old C++ ABI "
                      "(_GLIBCXX_USE_CXX11_ABI=0) and this system's C++ libraries the new one: use a cxx11-ABI "
                      "LibTorch (every PyPI wheel from 2.7 on)")
endif()

# fmt: LibTorch's headers include the fmt it ships (torch/include/fmt); hasten's logging uses
# that same fmt, header-only, so the process holds one fmt.
if(NOT EXISTS "${TORCH_INSTALL_PREFIX}/include/fmt/format.h")
  message(FATAL_ERROR "hasten: the LibTorch at ${TORCH_INSTALL_PREFIX} ships no fmt headers (include/fmt)")
endif()

# What LibTorch loads at run time, and its package's links made to match (the same file runs
# in a project's find_package(hasten): cmake/hastenConfig.cmake.in).
include(${CMAKE_CURRENT_LIST_DIR}/HastenTorchRuntime.cmake)

# Binaries and plugins find libhasten next door and LibTorch where it was built from, so they
# run without LD_LIBRARY_PATH, installed or not. The build tree gets the same directories
# first (CMake appends the directories of what a target links).
set(CMAKE_INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}" ${HASTEN_TORCH_LIB_DIRS})
if(NOT CMAKE_INSTALL_LIBDIR STREQUAL "lib")  # the build tree's lib/ (an install to lib/<triplet>)
  list(APPEND CMAKE_INSTALL_RPATH "$ORIGIN/../lib")
endif()
# The build tree uses the same RUNPATH (its bin/ and lib/ mirror the installed layout; targets
# built elsewhere set their own): otherwise CMake pads the build tree's RUNPATH with empty
# entries to rewrite it in place at install, and an empty entry searches the current directory.
set(CMAKE_BUILD_WITH_INSTALL_RPATH ON)
