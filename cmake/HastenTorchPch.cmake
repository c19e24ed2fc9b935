# One precompiled <torch/torch.h> for every target that includes LibTorch: a translation unit
# that parses it from scratch takes ~20 s on these machines, with the PCH a few.
# hasten_torch_pch is a tiny object library that owns the PCH; hasten_use_torch_pch(target)
# reuses it. Targets that reuse it must compile with the same flags (all targets here are
# PIC and C++17, see the top-level CMakeLists.txt).
add_library(hasten_torch_pch OBJECT ${CMAKE_CURRENT_LIST_DIR}/torch_pch.cpp)
target_link_libraries(hasten_torch_pch PRIVATE ${TORCH_LIBRARIES})
target_include_directories(hasten_torch_pch PRIVATE ${TORCH_INCLUDE_DIRS})
target_precompile_headers(hasten_torch_pch PRIVATE <torch/torch.h>)

function(hasten_use_torch_pch target)
  target_precompile_headers(${target} REUSE_FROM hasten_torch_pch)
endfunction()
