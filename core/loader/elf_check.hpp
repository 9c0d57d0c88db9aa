// Checks a plugin file's ELF headers before dlopen sees it. The dynamic loader maps a truncated
// shared object and then dies of SIGBUS touching the missing pages, and it reports a library
// built for another architecture as "No such file or directory"; both are caught here with a
// message that says what is wrong with the file.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace ferry {

// How much of a file check_elf_image needs: the ELF header and the program headers, which
// linkers put right after it.
inline constexpr size_t kElfHeadBytes = 64u << 10;

// `head` is the first min(file_size, kElfHeadBytes) bytes of a file of `file_size` bytes.
// Returns an empty string when it looks like a shared object this process can load, else why
// not (without the path).
std::string check_elf_image(std::span<const uint8_t> head, uint64_t file_size);

// Reads the head of the file open on `fd` (from offset 0) and checks it; a read error is
// reported too.
std::string check_elf_fd(int fd);

}  // namespace ferry
