#include "loader/elf_check.hpp"

#include <elf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "util/log.hpp"

namespace ferry {
namespace {

#if defined(__x86_64__)
constexpr uint16_t kHostMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr uint16_t kHostMachine = EM_AARCH64;
#elif defined(__powerpc64__)
constexpr uint16_t kHostMachine = EM_PPC64;
#elif defined(__s390x__)
constexpr uint16_t kHostMachine = EM_S390;
#elif defined(__riscv)
constexpr uint16_t kHostMachine = EM_RISCV;
#else
constexpr uint16_t kHostMachine = EM_NONE;  // unknown host: leave the machine check to dlopen
#endif

std::string machine_name(uint16_t m) {
    switch (m) {
        case EM_386: return "i386";
        case EM_X86_64: return "x86_64";
        case EM_ARM: return "arm";
        case EM_AARCH64: return "aarch64";
        case EM_PPC64: return "ppc64";
        case EM_S390: return "s390x";
        case EM_RISCV: return "riscv";
        default: return cat("ELF machine ", m);
    }
}

// The ELF header fields are in the file's byte order, which was checked to be ours.
template <class T>
T field_at(std::span<const uint8_t> head, size_t off) {
    T v;
    std::memcpy(&v, head.data() + off, sizeof v);
    return v;
}

}  // namespace

std::string check_elf_image(std::span<const uint8_t> head, uint64_t file_size) {
    if (file_size == 0) return "the file is empty (0 bytes): an interrupted copy or install?";
    if (head.size() < SELFMAG || std::memcmp(head.data(), ELFMAG, SELFMAG) != 0)
        return "not a shared object (invalid ELF header: the file does not start with \\x7fELF)";
    if (head.size() < EI_NIDENT) return cat("truncated: only ", file_size, " bytes, less than an ELF header");
    if (head[EI_CLASS] != ELFCLASS64)
        return cat("built for a ", head[EI_CLASS] == ELFCLASS32 ? "32-bit" : "unknown-class", " target (ELF class ",
                   int(head[EI_CLASS]), "); this Ferry is a 64-bit ", machine_name(kHostMachine),
                   " build: install the plugin built for this host");
    constexpr uint8_t host_data = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? ELFDATA2LSB : ELFDATA2MSB;
    if (head[EI_DATA] != host_data)
        return "built for a target of the other byte order: install the plugin built for this host";
    if (head.size() < sizeof(Elf64_Ehdr)) return cat("truncated: only ", file_size, " bytes, less than an ELF header");
    auto eh = field_at<Elf64_Ehdr>(head, 0);
    if (kHostMachine != EM_NONE && eh.e_machine != kHostMachine)
        return cat("built for ", machine_name(eh.e_machine), ", this host runs ", machine_name(kHostMachine),
                   ": install the plugin built for this host");
    if (eh.e_type != ET_DYN)
        return cat("not a shared object (ELF type ", eh.e_type, ", a shared object is ", ET_DYN, ")");
    if (eh.e_phnum == 0 || eh.e_phentsize != sizeof(Elf64_Phdr))
        return cat("corrupt ELF header (", eh.e_phnum, " program headers of ", eh.e_phentsize, " bytes)");
    uint64_t ph_end = eh.e_phoff + uint64_t(eh.e_phnum) * sizeof(Elf64_Phdr);
    if (eh.e_phoff > file_size || ph_end > file_size || ph_end < eh.e_phoff)
        return cat("truncated: its program headers end at byte ", ph_end, " but the file has ", file_size,
                   " bytes (an interrupted copy or download?)");
    if (ph_end > head.size()) return "program headers beyond the first 64 KiB: not a shared object a linker wrote";
    for (unsigned i = 0; i < eh.e_phnum; ++i) {
        auto ph = field_at<Elf64_Phdr>(head, eh.e_phoff + i * sizeof(Elf64_Phdr));
        if (ph.p_type != PT_LOAD && ph.p_type != PT_DYNAMIC) continue;
        uint64_t end = ph.p_offset + ph.p_filesz;
        if (end < ph.p_offset || end > file_size)
            return cat("truncated: its segments need ", end, " bytes but the file has ", file_size,
                       " (an interrupted copy or download?)");
    }
    if (eh.e_shnum != 0) {
        uint64_t sh_end = eh.e_shoff + uint64_t(eh.e_shnum) * eh.e_shentsize;
        if (sh_end < eh.e_shoff || sh_end > file_size)
            return cat("truncated: its section headers end at byte ", sh_end, " but the file has ", file_size,
                       " bytes (an interrupted copy or download?)");
    }
    return {};
}

std::string check_elf_fd(int fd) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) return cat("cannot stat: ", std::strerror(errno));
    std::vector<uint8_t> head(std::min<uint64_t>(uint64_t(st.st_size), kElfHeadBytes));
    ssize_t n = ::pread(fd, head.data(), head.size(), 0);
    if (n < 0) return cat("cannot read: ", std::strerror(errno));
    return check_elf_image(std::span(head.data(), size_t(n)), uint64_t(st.st_size));
}

}  // namespace ferry
