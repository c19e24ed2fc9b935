# Warnings for hasten's own targets (not for third-party headers).
add_library(hasten_warnings INTERFACE)
target_compile_options(hasten_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>
  $<$<COMPILE_LANGUAGE:C>:-Wall -Wextra>)
