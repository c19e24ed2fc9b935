# Warnings for hasten's own targets (not for third-party headers).
add_library(hasten_warnings INTERFACE)
target_compile_options(hasten_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>
  $<$<COMPILE_LANGUAGE:C>:-Wall -Wextra>)
# GCC 12 in C++20 mode reports std::string's own concatenations (`"x" + std::string`) as
# overlapping or out-of-bounds copies from inside libstdc++ (GCC PR105329, PR105651; fixed in
# GCC 13): false positives that name no line of ours as the cause, so they are off there.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  target_compile_options(hasten_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-Wno-restrict -Wno-array-bounds -Wno-stringop-overflow>)
endif()
