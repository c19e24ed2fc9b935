// Reads the ELF header, program headers and dynamic section with plain read() (never mmap, so a
// short file is an answer, not a SIGBUS) and checks what the dynamic loader trusts: magic,
// class, byte order, machine, type, that every table and loadable segment lies inside the file,
// and that what the loader makes read-only, calls, reads or relocates lies inside the library.
#include "plugins/elf_check.hpp"

#include <elf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
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

// Where the bytes at memory address `addr` (`len` of them) are in the file, per the loadable
// segment holding them; UINT64_MAX when no segment maps them from the file.
uint64_t file_offset(const std::vector<Elf64_Phdr>& ph, uint64_t addr, uint64_t len) {
  for (const auto& p : ph)
    if (p.p_type == PT_LOAD && addr >= p.p_vaddr && addr - p.p_vaddr <= p.p_filesz && len <= p.p_filesz - (addr - p.p_vaddr))
      return p.p_offset + (addr - p.p_vaddr);
  return UINT64_MAX;
}

// The dynamic section's pointers, checked against the memory the loadable segments take
// [begin, end): the loader follows them unchecked, so a damaged one has it read, write or call
// memory of this process that is not the library's, which a probe child may survive by chance
// (its memory lies elsewhere) and this process not. Relocations are checked one by one: each
// writes where its r_offset says.
std::string dynamic_problem(int fd, const std::vector<Elf64_Phdr>& ph, uint64_t begin, uint64_t end) {
  const std::string span = "the library's loadable segments span addresses " + std::to_string(begin) + " to " +
                           std::to_string(end);
  auto outside = [&](const std::string& what, uint64_t addr, uint64_t size) -> std::string {
    if (addr >= begin && addr <= end && size <= end - addr) return "";
    return "corrupted dynamic section: " + what + " covers " + bytes(size) + " from address " + std::to_string(addr) +
           ", outside the library (" + span + ")";
  };
  const Elf64_Phdr* dyn = nullptr;
  for (const auto& p : ph)
    if (p.p_type == PT_DYNAMIC) dyn = &p;
  if (dyn == nullptr) return "";  // the loader refuses such a file itself, touching nothing
  // The loader reads the section at its address, up to DT_NULL.
  if (auto why = outside("the dynamic section (PT_DYNAMIC)", dyn->p_vaddr, sizeof(Elf64_Dyn)); !why.empty()) return why;
  std::map<int64_t, uint64_t> value;  // tag -> its value (the last one, as the loader keeps)
  constexpr int kMaxEntries = 1 << 16;  // real libraries have tens; a damaged file is not read to its end
  for (uint64_t at = dyn->p_vaddr, n = 0;; at += sizeof(Elf64_Dyn), ++n) {
    Elf64_Dyn d{};
    const uint64_t offset = file_offset(ph, at, sizeof d);
    if (offset == UINT64_MAX || n == kMaxEntries || !read_at(fd, &d, sizeof d, offset))
      return "corrupted dynamic section: it has no end (DT_NULL) within " + std::to_string(kMaxEntries) +
             " entries inside the library's file";
    if (d.d_tag == DT_NULL) break;
    value[d.d_tag] = d.d_un.d_val;
  }
  auto has = [&](int64_t tag) { return value.count(tag) != 0; };
  auto get = [&](int64_t tag) { return has(tag) ? value.at(tag) : 0; };
  struct Table {
    int64_t at, size;
    const char* what;
  };
  static constexpr Table tables[] = {
      {DT_INIT_ARRAY, DT_INIT_ARRAYSZ, "DT_INIT_ARRAY (the constructors)"},
      {DT_FINI_ARRAY, DT_FINI_ARRAYSZ, "DT_FINI_ARRAY (the destructors)"},
      {DT_PREINIT_ARRAY, DT_PREINIT_ARRAYSZ, "DT_PREINIT_ARRAY"},
      {DT_RELA, DT_RELASZ, "DT_RELA (the relocations)"},
      {DT_REL, DT_RELSZ, "DT_REL (the relocations)"},
      {DT_JMPREL, DT_PLTRELSZ, "DT_JMPREL (the PLT relocations)"},
      {DT_RELR, DT_RELRSZ, "DT_RELR (the relative relocations)"},
      {DT_STRTAB, DT_STRSZ, "DT_STRTAB (the symbol names)"},
      {DT_INIT, -1, "DT_INIT (the constructor)"},
      {DT_FINI, -1, "DT_FINI (the destructor)"},
      {DT_SYMTAB, -1, "DT_SYMTAB (the symbols)"},
      {DT_HASH, -1, "DT_HASH"},
      {DT_GNU_HASH, -1, "DT_GNU_HASH"},
      {DT_VERSYM, -1, "DT_VERSYM"},
      {DT_VERNEED, -1, "DT_VERNEED"},
      {DT_VERDEF, -1, "DT_VERDEF"},
  };
  for (const Table& t : tables)
    if (has(t.at))
      if (auto why = outside(t.what, get(t.at), t.size < 0 ? 1 : get(t.size)); !why.empty()) return why;

  // Every relocation's target. The tables lie in the library now; their entries are read from
  // the file (the loader reads them before it writes anything).
  // A table's bytes, read from the file (bounded by it before anything is allocated); false when
  // the file does not hold them.
  auto read_table = [&](int64_t at, int64_t size, std::vector<char>& out) {
    out.clear();
    if (get(size) == 0) return true;
    const uint64_t offset = file_offset(ph, get(at), get(size));
    if (offset == UINT64_MAX) return false;
    out.resize(get(size));
    return read_at(fd, out.data(), out.size(), offset);
  };
  std::vector<char> raw;
  // The loader applies the first DT_RELACOUNT (DT_RELCOUNT) entries as relative relocations
  // whatever their type, the rest by type; a size that is not a whole number of entries still
  // has its last, partial one applied, so it is refused.
  auto check_relocations = [&](int64_t at, int64_t size, int64_t relative_count, bool with_addend,
                               const char* name) -> std::string {
    if (!has(at)) return "";
    const size_t entry = with_addend ? sizeof(Elf64_Rela) : sizeof(Elf64_Rel);
    if (get(size) % entry != 0)
      return std::string("corrupted dynamic section: ") + name + " holds " + bytes(get(size)) + ", not a whole number of " +
             std::to_string(entry) + "-byte entries";
    if (!read_table(at, size, raw)) return std::string("corrupted dynamic section: ") + name + "'s entries are not in the file";
    const uint64_t relative = relative_count != 0 ? get(relative_count) : 0;
    for (size_t k = 0; k + entry <= raw.size(); k += entry) {
      Elf64_Rel r{};
      std::memcpy(&r, raw.data() + k, sizeof r);  // r_offset and r_info lead both layouts
      if (k / entry >= relative && ELF64_R_TYPE(r.r_info) == 0) continue;  // R_*_NONE writes nothing
      if (auto why = outside(std::string("relocation ") + std::to_string(k / entry) + " of " + name + " (what it writes)",
                             r.r_offset, sizeof(uint64_t));
          !why.empty())
        return why;
    }
    return "";
  };
  const bool plt_rela = !has(DT_PLTREL) || get(DT_PLTREL) == DT_RELA;
  for (auto why : {check_relocations(DT_RELA, DT_RELASZ, DT_RELACOUNT, true, "DT_RELA"),
                   check_relocations(DT_REL, DT_RELSZ, DT_RELCOUNT, false, "DT_REL"),
                   check_relocations(DT_JMPREL, DT_PLTRELSZ, 0, plt_rela, "DT_JMPREL")})
    if (!why.empty()) return why;
  // DT_RELR: an address, then bitmaps of the 63 words after it.
  if (has(DT_RELR)) {
    if (get(DT_RELRSZ) % 8 != 0)
      return "corrupted dynamic section: DT_RELR holds " + bytes(get(DT_RELRSZ)) + ", not a whole number of 8-byte entries";
    if (!read_table(DT_RELR, DT_RELRSZ, raw)) return "corrupted dynamic section: DT_RELR's entries are not in the file";
    uint64_t next = 0;
    for (size_t k = 0; k + 8 <= raw.size(); k += 8) {
      uint64_t e = 0;
      std::memcpy(&e, raw.data() + k, 8);
      std::string why;
      if ((e & 1) == 0) {
        why = outside("entry " + std::to_string(k / 8) + " of DT_RELR (what it writes)", e, 8);
        next = e + 8;
      } else {
        for (unsigned bit = 1; bit < 64 && why.empty(); ++bit)
          if ((e >> bit) & 1) why = outside("entry " + std::to_string(k / 8) + " of DT_RELR (what it writes)", next + (bit - 1) * 8, 8);
        next += 63 * 8;
      }
      if (!why.empty()) return why;
    }
  }
  return "";
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
  uint64_t span_begin = UINT64_MAX, span_end = 0;  // the memory the loadable segments take
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
    if (p.p_memsz > UINT64_MAX - p.p_vaddr)
      return "corrupted ELF header: " + which + " (a loadable segment) ends past the end of the address space";
    // The loader reserves memory up to the last segment's end and maps each segment there in
    // turn: one reaching into the next, or out of order, would be zero-filled over memory
    // of this process beyond the reservation.
    if (loads > 1 && p.p_vaddr < span_end)
      return "corrupted ELF header: " + which + " (a loadable segment) starts at address " + std::to_string(p.p_vaddr) +
             ", before the end of the one before it (" + std::to_string(span_end) +
             "): loadable segments must follow each other in address order";
    span_begin = std::min(span_begin, p.p_vaddr);
    span_end = std::max(span_end, p.p_vaddr + p.p_memsz);
  }
  if (loads == 0) return "corrupted ELF header: no loadable segment";
  // Ranges the loader and later the process use at the library's address plus p_vaddr, never
  // checked: a damaged RELRO range makes other memory of this process read-only (mprotect
  // changes what it reaches before it fails on a hole); damaged program header, unwind table
  // (PT_GNU_EH_FRAME), TLS image or note addresses are read, in this process, by every
  // exception thrown or thread started later, far from the cause. The probe child would not
  // notice any of it.
  for (size_t i = 0; i < ph.size(); ++i) {
    const Elf64_Phdr& p = ph[i];
    const char* what = p.p_type == PT_GNU_RELRO      ? "the range made read-only after relocation"
                       : p.p_type == PT_PHDR         ? "the program headers"
                       : p.p_type == PT_DYNAMIC      ? "the dynamic section"
                       : p.p_type == PT_GNU_EH_FRAME ? "the unwind table"
                       : p.p_type == PT_TLS          ? "the thread-local data's image"
                       : p.p_type == PT_NOTE         ? "the notes"
                       : p.p_type == PT_GNU_PROPERTY ? "the properties"
                                                     : nullptr;
    if (what == nullptr) continue;
    const uint64_t len = p.p_type == PT_TLS ? p.p_filesz : p.p_memsz;  // TLS's memsz is the block's size
    if (!(p.p_vaddr >= span_begin && p.p_vaddr <= span_end && len <= span_end - p.p_vaddr))
      return "corrupted ELF header: program header " + std::to_string(i) + " (" + what +
             ") reaches outside the loadable segments (it covers " + std::to_string(len) + " bytes from address " +
             std::to_string(p.p_vaddr) + ", they span " + std::to_string(span_begin) + " to " + std::to_string(span_end) + ")";
    // The loader takes the program headers from where PT_PHDR says they are mapped.
    if (p.p_type == PT_PHDR && file_offset(ph, p.p_vaddr, ph.size() * sizeof(Elf64_Phdr)) != eh.e_phoff)
      return "corrupted ELF header: program header " + std::to_string(i) + " (the program headers) puts them at address " +
             std::to_string(p.p_vaddr) + ", which does not hold them (they are at byte " + std::to_string(eh.e_phoff) +
             " of the file)";
  }

  // Section headers: the loader does not need them, but a file cut short loses them first.
  if (eh.e_shnum > 0) {
    if (eh.e_shentsize != sizeof(Elf64_Shdr))
      return "corrupted ELF header: section header entry size " + std::to_string(eh.e_shentsize) + " (expected " +
             std::to_string(sizeof(Elf64_Shdr)) + ")";
    const uint64_t sh_end = eh.e_shoff + uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr);
    if (eh.e_shoff > size || sh_end > size) return beyond("section headers", eh.e_shoff, sh_end, size, true);
  }
  return dynamic_problem(fd, ph, span_begin, span_end);
}

}  // namespace hasten::detail
