// The files of one storage segment: "file:<path>" opens one, "file:<a>,<b>,..." several that the
// segment's offsets are striped over (stripe_bytes to each in turn, like RAID 0). Each file is
// opened once, with the caller's permissions: read-write, or read-only where only that is
// allowed (WRITEs to it then fail naming it), and a second time with O_DIRECT where the
// filesystem takes it and direct != off.
#pragma once

#include <ferry/plugin.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "options.hpp"

namespace ferry_file {

struct OpenFile {
    std::string path;
    int fd = -1;         // page cache
    int direct_fd = -1;  // O_DIRECT; -1 where refused or switched off
    bool writable = false;
    uint32_t mem_align = 4096;  // what O_DIRECT needs of addresses, and of offsets and lengths
    uint32_t off_align = 4096;
    OpenFile() = default;
    OpenFile(const OpenFile &) = delete;
    OpenFile &operator=(const OpenFile &) = delete;
    ~OpenFile();
    // Could this request go through direct_fd?
    bool direct_ok(uint64_t addr, uint64_t offset, uint64_t length) const {
        return direct_fd >= 0 && addr % mem_align == 0 && offset % off_align == 0 && length % off_align == 0;
    }
    // What O_DIRECT needs that the request lacks, for direct=require's message.
    std::string misalignment(uint64_t addr, uint64_t offset, uint64_t length) const;
};

// Where a segment offset lands: which file, the offset in it, and how many bytes stay in that
// file before the stripe moves on.
struct Extent {
    size_t file = 0;
    uint64_t offset = 0;
    uint64_t run = 0;
};

class FileSet {
public:
    // Opens every file of `spec`; on failure writes the message (naming the path and the fix).
    static int open(std::string_view spec, const Config &cfg, std::unique_ptr<FileSet> &out, ferry_error_t *err);
    Extent locate(uint64_t offset) const;
    OpenFile &file(size_t i) { return *files_[i]; }
    size_t size() const { return files_.size(); }
    const std::string &spec() const { return spec_; }

private:
    std::string spec_;
    std::vector<std::unique_ptr<OpenFile>> files_;
    uint64_t stripe_ = 0;  // a power of two; unused with one file
    unsigned shift_ = 0;
};

}  // namespace ferry_file
