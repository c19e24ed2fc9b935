# hasten_add_plugin(<name> KIND <strategy|precision|tracker|comm> SOURCES <src>...
#                   [TORCH] [OUTPUT_DIRECTORY <dir>] [INSTALL_DESTINATION <dir>])
#
# Builds a hasten plugin library lib<hasten-KIND-NAME>.so: hidden visibility, only
# hasten_plugin_entry_v* exported, no undefined symbols. C-tier plugins (tracker, comm) link
# nothing of hasten or LibTorch; TORCH builds a torch-tier plugin (strategy, precision): it
# links LibTorch; its sources include <hasten/plugin_torch.hpp>, whose descriptors carry the
# LibTorch build fingerprint. Works in hasten's tree and, after find_package(hasten),
# out of tree.
set(_HASTEN_PLUGIN_CMAKE_DIR ${CMAKE_CURRENT_LIST_DIR})

function(hasten_add_plugin name)
  cmake_parse_arguments(ARG "TORCH" "KIND;OUTPUT_DIRECTORY;INSTALL_DESTINATION" "SOURCES" ${ARGN})
  set(kinds strategy precision tracker comm)
  if(NOT ARG_KIND IN_LIST kinds)
    message(FATAL_ERROR "hasten_add_plugin(${name}): KIND must be one of ${kinds}, got '${ARG_KIND}'")
  endif()
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "hasten_add_plugin(${name}): SOURCES is empty")
  endif()
  set(target hasten-${ARG_KIND}-${name})
  add_library(${target} MODULE ${ARG_SOURCES})
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    CXX_STANDARD_REQUIRED ON
    LINK_DEPENDS ${_HASTEN_PLUGIN_CMAKE_DIR}/hasten-plugin.map)
  target_link_options(${target} PRIVATE
    -Wl,--no-undefined -Wl,--version-script=${_HASTEN_PLUGIN_CMAKE_DIR}/hasten-plugin.map)
  # C tier: C++17 is enough (the SDK's C++ wrapper). Torch tier: LibTorch's headers need C++20.
  if(ARG_TORCH)
    set_target_properties(${target} PROPERTIES CXX_STANDARD 20)
    if(NOT TORCH_LIBRARIES)
      find_package(Torch REQUIRED)
    endif()
    target_link_libraries(${target} PRIVATE hasten::sdk_torch ${TORCH_LIBRARIES})
    target_include_directories(${target} SYSTEM PRIVATE ${TORCH_INCLUDE_DIRS})
    if(COMMAND hasten_use_torch_pch)
      hasten_use_torch_pch(${target})
    endif()
  else()
    set_target_properties(${target} PROPERTIES CXX_STANDARD 17)
    target_link_libraries(${target} PRIVATE hasten::sdk)
  endif()
  if(ARG_OUTPUT_DIRECTORY)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${ARG_OUTPUT_DIRECTORY})
  elseif(DEFINED HASTEN_PLUGIN_OUTPUT_DIR)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${HASTEN_PLUGIN_OUTPUT_DIR})
  endif()
  if(ARG_INSTALL_DESTINATION)
    install(TARGETS ${target} LIBRARY DESTINATION ${ARG_INSTALL_DESTINATION})
  endif()
endfunction()
