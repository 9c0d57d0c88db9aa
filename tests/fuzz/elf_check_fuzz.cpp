// The plugin file pre-check (core/loader/elf_check.cpp) that runs before dlopen. The input is a whole
// file. Invariants: a file it accepts is a 64-bit shared object for this host whose program
// headers and loadable segments all lie inside the file (so dlopen cannot fault on a missing
// page); a refusal always says why.
#include <elf.h>

#include <cstring>

#include "fuzz_check.hpp"
#include "loader/elf_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t head = std::min(size, ferry::kElfHeadBytes);
    std::string why = ferry::check_elf_image({data, head}, size);
    if (!why.empty()) return 0;
    FUZZ_CHECK(size >= sizeof(Elf64_Ehdr) && memcmp(data, ELFMAG, SELFMAG) == 0, "accepted a non-ELF file");
    Elf64_Ehdr eh;
    memcpy(&eh, data, sizeof eh);
    FUZZ_CHECK(eh.e_ident[EI_CLASS] == ELFCLASS64 && eh.e_type == ET_DYN, "accepted a foreign ELF file");
    FUZZ_CHECK(eh.e_phoff + uint64_t(eh.e_phnum) * sizeof(Elf64_Phdr) <= head, "program headers outside the file");
    for (unsigned i = 0; i < eh.e_phnum; ++i) {
        Elf64_Phdr ph;
        memcpy(&ph, data + eh.e_phoff + i * sizeof ph, sizeof ph);
        if (ph.p_type == PT_LOAD)
            FUZZ_CHECK(ph.p_offset + ph.p_filesz >= ph.p_offset && ph.p_offset + ph.p_filesz <= size,
                       "a loadable segment outside the file");
    }
    return 0;
}
