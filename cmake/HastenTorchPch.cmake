# One precompiled <torch/torch.h> for every target that includes LibTorch: a translation unit
# that parses it from scratch takes ~12-20 s on these machines, loading the PCH ~4 s (it is
# 700 MB), so one PCH is built once and every target reuses it. GCC accepts a PCH only with
# the same code-model flags: the anchor is compiled -fPIC, and so is every target that reuses
# it, executables included (PIC code links into a PIE executable like PIE code does).
# hasten_use_torch_pch(target) does both.
set(_HASTEN_PCH_DIR ${CMAKE_CURRENT_LIST_DIR})
function(hasten_use_torch_pch target)
  if(NOT TARGET hasten_torch_pch)
    add_library(hasten_torch_pch OBJECT ${_HASTEN_PCH_DIR}/torch_pch.cpp)
    target_link_libraries(hasten_torch_pch PRIVATE ${TORCH_LIBRARIES})
    target_include_directories(hasten_torch_pch SYSTEM PRIVATE ${TORCH_INCLUDE_DIRS})
    set_target_properties(hasten_torch_pch PROPERTIES POSITION_INDEPENDENT_CODE ON UNITY_BUILD OFF)
    target_precompile_headers(hasten_torch_pch PRIVATE <torch/torch.h>)
  endif()
  get_target_property(type ${target} TYPE)
  get_target_property(pic ${target} POSITION_INDEPENDENT_CODE)
  if(type STREQUAL "EXECUTABLE" OR (DEFINED pic AND NOT pic))
    # -fPIE (what CMake adds to executables) would not match the PCH's -fPIC.
    set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE OFF)
    target_compile_options(${target} PRIVATE -fPIC)
  endif()
  target_precompile_headers(${target} REUSE_FROM hasten_torch_pch)
endfunction()
