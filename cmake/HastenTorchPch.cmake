# One precompiled <torch/torch.h> for every target that includes LibTorch: a translation unit
# that parses it from scratch takes ~12-20 s on these machines, loading the PCH ~4 s (it is
# 700 MB), so one PCH is built once and every target reuses it. GCC accepts a PCH only with
# the same code-model flags: the anchor is compiled -fPIC, and so is every target that reuses
# it, executables included (PIC code links into a PIE executable like PIE code does).
#
# hasten_use_torch_pch(target) does both. hasten_use_torch_pch(target TEST_CODE) is for test
# programs: they are compiled with HASTEN_TEST_CODE_FLAGS (-O0 unless set) and reuse a second
# PCH built with the same flags (GCC refuses a PCH built with another __OPTIMIZE__). Most of a
# test translation unit's time at -O3 is optimising and emitting LibTorch's inline functions
# (measured: hasten_rank_tests 44 s at -O3, 42 s at -O1), while what a test runs is LibTorch's
# and hasten's compiled libraries, which keep the build type's flags.
set(_HASTEN_PCH_DIR ${CMAKE_CURRENT_LIST_DIR})
set(HASTEN_TEST_CODE_FLAGS "-O0" CACHE STRING
    "Compile flags of the test programs (appended after the build type's; the libraries and plugins they load keep those)")
function(_hasten_torch_pch_anchor name)
  if(NOT TARGET ${name})
    add_library(${name} OBJECT ${_HASTEN_PCH_DIR}/torch_pch.cpp)
    target_link_libraries(${name} PRIVATE ${TORCH_LIBRARIES})
    target_include_directories(${name} SYSTEM PRIVATE ${TORCH_INCLUDE_DIRS})
    set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE ON UNITY_BUILD OFF)
    target_compile_options(${name} PRIVATE ${ARGN})
    target_precompile_headers(${name} PRIVATE <torch/torch.h>)
    if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
      target_precompile_headers(${name} PRIVATE ${_HASTEN_PCH_DIR}/torch_pch_json.hpp)
      target_link_libraries(${name} PRIVATE nlohmann_json::nlohmann_json)  # its include directory
    endif()
  endif()
endfunction()
function(hasten_use_torch_pch target)
  set(anchor hasten_torch_pch)
  # Clang accepts a PCH only with the same default visibility: plugins (hidden) get their own.
  get_target_property(visibility ${target} CXX_VISIBILITY_PRESET)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang" AND visibility STREQUAL "hidden")
    if("TEST_CODE" IN_LIST ARGN)
      message(FATAL_ERROR "hasten_use_torch_pch(${target} TEST_CODE): no test-code PCH with hidden visibility")
    endif()
    set(anchor hasten_torch_pch_hidden)
    _hasten_torch_pch_anchor(${anchor} -fvisibility=hidden -fvisibility-inlines-hidden)
  elseif("TEST_CODE" IN_LIST ARGN)
    separate_arguments(flags UNIX_COMMAND "${HASTEN_TEST_CODE_FLAGS}")
    set(anchor hasten_torch_pch_test_code)
    _hasten_torch_pch_anchor(${anchor} ${flags})
    target_compile_options(${target} PRIVATE ${flags})
  else()
    _hasten_torch_pch_anchor(${anchor})
  endif()
  get_target_property(type ${target} TYPE)
  get_target_property(pic ${target} POSITION_INDEPENDENT_CODE)
  if(type STREQUAL "EXECUTABLE" OR (DEFINED pic AND NOT pic))
    # -fPIE (what CMake adds to executables) would not match the PCH's -fPIC.
    set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE OFF)
    target_compile_options(${target} PRIVATE -fPIC)
  endif()
  target_precompile_headers(${target} REUSE_FROM ${anchor})
endfunction()
