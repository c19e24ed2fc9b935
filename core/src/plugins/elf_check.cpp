// Reads the ELF header and program headers with plain read() (never mmap, so a short file is
// an answer, not a SIGBUS) and checks what the dynamic loader trusts: magic, class, byte order,
// machine, type, and that every table and loadable segment lies inside the file.
#include "plugins/elf_check.hpp"

#include <elf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <vector>

namespace hasten::detail {

namespace {

#if defined(__x86_64__)
constexpr unsigned kHostMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr unsigned kHostMachine = EM_AARCH64;
#elif defined(__powerpc64__)
constexpr unsigned kHostMachine = EM_PPC64;
#elif defined(__riscv)
constexpr unsigned kHostMachine = EM_RISCV;
#else
constexpr unsigned kHostMachine = 0;  // unknown host: the machine is not checked
#endif

bool read_at(int fd, void* buf, size_t len, uint64_t offset) {
  size_t done = 0;
  while (done < len) {
    const ssize_t n = ::pread(fd, static_cast<char*>(buf) + done, len - done, static_cast<off_t>(offset + done));
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

std::string bytes(uint64_t n) { return std::to_string(n) + (n == 1 ? " byte" : " bytes"); }

// `end` past `size`: truncated when the table starts inside the file, else a damaged offset
// (or, for the section headers at the end of a file, one cut short: both are said).
std::string beyond(const char* what, uint64_t start, uint64_t end, uint64_t size, bool at_end) {
  if (start < size)
    return std::string("truncated: ") + what + " end at byte " + std::to_string(end) + " but the file has " +
           bytes(size);
  return std::string(at_end ? "truncated or corrupted ELF header: " : "corrupted ELF header: ") + what +
         " start at byte " + std::to_string(start) + ", past the end of the file (" + bytes(size) + ")";
}

}  // namespace

std::string elf_problem(const std::string& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::string("cannot be read: ") + std::strerror(errno);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return std::string("cannot be read: ") + std::strerror(errno);
  const auto size = static_cast<uint64_t>(st.st_size);

  unsigned char ident[EI_NIDENT] = {};
  const bool whole_ident = read_at(fd, ident, sizeof(ident), 0);
  if (size < SELFMAG || std::memcmp(ident, ELFMAG, SELFMAG) != 0)
    return "not an ELF file (it does not start with the bytes 7f 'E' 'L' 'F')";
  if (!whole_ident || size < sizeof(Elf64_Ehdr))
    return "truncated: " + bytes(size) + ", shorter than an ELF header";
  if (ident[EI_CLASS] != ELFCLASS64)
    return ident[EI_CLASS] == ELFCLASS32 ? "a 32-bit ELF file; this host loads 64-bit libraries"
                                         : "corrupted ELF header: unknown class " + std::to_string(ident[EI_CLASS]);
  const unsigned char host_data = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? ELFDATA2LSB : ELFDATA2MSB;
  if (ident[EI_DATA] != host_data)
    return ident[EI_DATA] == ELFDATA2LSB || ident[EI_DATA] == ELFDATA2MSB
               ? std::string("an ELF file of the other byte order than this host's")
               : "corrupted ELF header: unknown byte order " + std::to_string(ident[EI_DATA]);
  if (ident[EI_VERSION] != EV_CURRENT)
    return "corrupted ELF header: unknown ELF version " + std::to_string(ident[EI_VERSION]);

  Elf64_Ehdr eh{};
  if (!read_at(fd, &eh, sizeof(eh), 0)) return "truncated: shorter than an ELF header";
  if (eh.e_type != ET_DYN)
    return eh.e_type == ET_EXEC || eh.e_type == ET_REL || eh.e_type == ET_CORE
               ? "not a shared library (ELF type " + std::to_string(eh.e_type) +
                     (eh.e_type == ET_EXEC ? ", an executable)" : eh.e_type == ET_REL ? ", an object file)" : ", a core dump)")
               : "corrupted ELF header: unknown ELF type " + std::to_string(eh.e_type);
  if (kHostMachine != 0 && eh.e_machine != kHostMachine)
    return "built for another machine (ELF machine " + std::to_string(eh.e_machine) + ", this host is " +
           std::to_string(kHostMachine) + ")";
  if (eh.e_ehsize != sizeof(Elf64_Ehdr))
    return "corrupted ELF header: header size " + std::to_string(eh.e_ehsize) + " (expected " +
           std::to_string(sizeof(Elf64_Ehdr)) + ")";

  // Program headers: what the loader maps.
  if (eh.e_phentsize != sizeof(Elf64_Phdr))
    return "corrupted ELF header: program header entry size " + std::to_string(eh.e_phentsize) + " (expected " +
           std::to_string(sizeof(Elf64_Phdr)) + ")";
  if (eh.e_phnum == 0 || eh.e_phnum == PN_XNUM)
    return "corrupted ELF header: " + std::to_string(eh.e_phnum) + " program headers";
  const uint64_t ph_end = eh.e_phoff + uint64_t{eh.e_phnum} * sizeof(Elf64_Phdr);
  if (eh.e_phoff > size || ph_end > size) return beyond("program headers", eh.e_phoff, ph_end, size, false);
  std::vector<Elf64_Phdr> ph(eh.e_phnum);
  if (!read_at(fd, ph.data(), ph.size() * sizeof(Elf64_Phdr), eh.e_phoff))
    return "truncated: the program headers cannot be read";
  int loads = 0;
  for (size_t i = 0; i < ph.size(); ++i) {
    const Elf64_Phdr& p = ph[i];
    const std::string which = "program header " + std::to_string(i);
    if (p.p_type != PT_LOAD && p.p_type != PT_DYNAMIC && p.p_type != PT_INTERP && p.p_type != PT_NOTE &&
        p.p_type != PT_TLS && p.p_type != PT_GNU_RELRO)
      continue;  // the loader ignores kinds it does not map or read
    // Intact program headers that point past the end: the file was cut short.
    if (p.p_offset > size || p.p_filesz > size - p.p_offset)
      return "truncated: " + which + " (a " + (p.p_type == PT_LOAD ? std::string("loadable segment") : "table") +
             ") " + (p.p_offset < size ? "ends at byte " + std::to_string(p.p_offset + p.p_filesz)
                                       : "starts at byte " + std::to_string(p.p_offset)) +
             " but the file has " + bytes(size);
    if (p.p_type != PT_LOAD) continue;
    ++loads;
    if (p.p_filesz > p.p_memsz)
      return "corrupted ELF header: " + which + " has more bytes in the file (" + std::to_string(p.p_filesz) +
             ") than in memory (" + std::to_string(p.p_memsz) + ")";
    if (p.p_align > 1 && ((p.p_align & (p.p_align - 1)) != 0 || (p.p_vaddr - p.p_offset) % p.p_align != 0))
      return "corrupted ELF header: " + which + " has an inconsistent alignment " + std::to_string(p.p_align);
  }
  if (loads == 0) return "corrupted ELF header: no loadable segment";

  // Section headers: the loader does not need them, but a file cut short loses them first.
  if (eh.e_shnum > 0) {
    if (eh.e_shentsize != sizeof(Elf64_Shdr))
      return "corrupted ELF header: section header entry size " + std::to_string(eh.e_shentsize) + " (expected " +
             std::to_string(sizeof(Elf64_Shdr)) + ")";
    const uint64_t sh_end = eh.e_shoff + uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr);
    if (eh.e_shoff > size || sh_end > size) return beyond("section headers", eh.e_shoff, sh_end, size, true);
  }
  return "";
}

}  // namespace hasten::detail
