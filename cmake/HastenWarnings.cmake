# Warnings for hasten's own targets (not for third-party headers).
add_library(hasten_warnings INTERFACE)
target_compile_options(hasten_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>
  $<$<COMPILE_LANGUAGE:C>:-Wall -Wextra>)
# GCC 12 in C++20 mode reports std::string's own code, inlined from libstdc++, as overlapping
# copies (`"x" + std::string`: GCC PR105329), out-of-bounds copies, and a short string's inline
# buffer (in std::optional, or read by memcpy) as maybe uninitialised. Each warning points into
# <bits/basic_string.h>, none at a line of ours; GCC 13 no longer reports them. They are off for
# GCC 12 only (LibTorch itself builds with -Wno-maybe-uninitialized).
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  target_compile_options(hasten_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-Wno-restrict -Wno-array-bounds -Wno-stringop-overflow -Wno-maybe-uninitialized>)
endif()
# A unity build #includes each .cpp into a batch file, so GCC takes a class with a member of a
# file-local (anonymous-namespace) type for one defined in a header and warns that other
# translation units could not name it; in a .cpp of its own it is what file-local means.
if(HASTEN_UNITY_BUILD AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  target_compile_options(hasten_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Wno-subobject-linkage>)
endif()
