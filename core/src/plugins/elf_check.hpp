// A cheap look at a plugin file's ELF headers before anything maps it: a truncated or
// damaged file gets a reason in words ("truncated: ...", "not an ELF file") instead of the
// SIGBUS or SIGSEGV the dynamic loader can die of on it.
#pragma once

#include <string>

namespace hasten::detail {

// Why `file` cannot be a shared library for this host, or "" when its ELF header, program
// headers and section header table are consistent with the file's size and this machine, and
// what the loader follows (ranges, tables, relocation targets) lies inside the library.
std::string elf_problem(const std::string& file);

}  // namespace hasten::detail
