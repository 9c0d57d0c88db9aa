#include "files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "plugin_util.hpp"

namespace ferry_file {

namespace {

constexpr unsigned kStatxDioAlign = 0x2000;  // STATX_DIOALIGN (Linux 6.1), newer than glibc 2.36's headers
// Where Linux's struct statx keeps stx_dio_mem_align and stx_dio_offset_align: glibc 2.36 calls
// that part __statx_pad2.
constexpr size_t kDioMemAlignAt = 0x98;
constexpr size_t kDioOffsetAlignAt = 0x9c;
static_assert(sizeof(struct statx) >= kDioOffsetAlignAt + 4);

int open_error(ferry_error_t *err, int e, const std::string &path, const char *fix) {
    return set_error(err, -e, "file: open %s: %s%s", path.c_str(), errno_string(e).c_str(), fix);
}

// Opens one file with the caller's permissions.
int open_one(const std::string &path, const Config &cfg, OpenFile &f, ferry_error_t *err) {
    f.path = path;
    int flags = O_CLOEXEC | O_RDWR | (cfg.create ? O_CREAT : 0);
    f.fd = ::open(path.c_str(), flags, 0600);
    if (f.fd >= 0) f.writable = true;
    else if (errno == EACCES || errno == EROFS || errno == EPERM) f.fd = ::open(path.c_str(), O_CLOEXEC | O_RDONLY);
    if (f.fd < 0) {
        int e = errno;
        if (e == ENOENT)
            return open_error(err, e, path,
                              cfg.create
                                  ? " (its directory does not exist)"
                                  : "; create the file first, or set file.create=true to let open_segment do it");
        if (e == EACCES || e == EPERM) return open_error(err, e, path, "; this process may neither read nor write it");
        if (e == EISDIR) return open_error(err, e, path, "; name a file, or several separated by commas (striped)");
        return open_error(err, e, path, "");
    }
    struct stat st {};
    if (::fstat(f.fd, &st) != 0) return open_error(err, errno, path, " (fstat)");
    if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode))
        return set_error(err, -EINVAL, "file: %s is neither a regular file nor a block device", path.c_str());
    if (cfg.direct == Direct::Off) return 0;

    // O_DIRECT's alignment, as the filesystem states it (Linux 6.1+); else a page, which every
    // filesystem that takes O_DIRECT accepts.
    struct statx sx {};
    if (::statx(f.fd, "", AT_EMPTY_PATH, kStatxDioAlign, &sx) == 0 && (sx.stx_mask & kStatxDioAlign)) {
        uint32_t mem = 0, off = 0;
        std::memcpy(&mem, reinterpret_cast<const char *>(&sx) + kDioMemAlignAt, 4);
        std::memcpy(&off, reinterpret_cast<const char *>(&sx) + kDioOffsetAlignAt, 4);
        if (off == 0) {  // the filesystem says: no direct I/O here
            if (cfg.direct == Direct::Require)
                return set_error(err, -EINVAL,
                                 "file: %s: its filesystem does not support O_DIRECT and file.direct=require; "
                                 "put the file on one that does (ext4, xfs, a block device) or set file.direct=auto",
                                 path.c_str());
            return 0;
        }
        f.mem_align = mem ? mem : 1;
        f.off_align = off;
    }
    f.direct_fd = ::open(path.c_str(), O_CLOEXEC | O_DIRECT | (f.writable ? O_RDWR : O_RDONLY));
    if (f.direct_fd < 0 && cfg.direct == Direct::Require)
        return set_error(err, -errno,
                         "file: %s: O_DIRECT open refused (%s) and file.direct=require; put the file on a filesystem "
                         "that supports it or set file.direct=auto",
                         path.c_str(), errno_string(errno).c_str());
    return 0;
}

}  // namespace

OpenFile::~OpenFile() {
    if (fd >= 0) ::close(fd);
    if (direct_fd >= 0) ::close(direct_fd);
}

std::string OpenFile::misalignment(uint64_t addr, uint64_t offset, uint64_t length) const {
    if (direct_fd < 0) return "O_DIRECT is not available for " + path;
    std::string out;
    auto add = [&](const char *what, uint64_t v, uint32_t a) {
        if (v % a == 0) return;
        out += strprintf("%s%s %% %u != 0", out.empty() ? "" : ", ", what, a);
    };
    add("address", addr, mem_align);
    add("offset", offset, off_align);
    add("length", length, off_align);
    return out;
}

int FileSet::open(std::string_view spec, const Config &cfg, std::unique_ptr<FileSet> &out, ferry_error_t *err) {
    auto set = std::make_unique<FileSet>();
    set->spec_ = std::string(spec);
    set->stripe_ = cfg.stripe_bytes;
    while ((uint64_t{1} << set->shift_) < set->stripe_) ++set->shift_;
    size_t start = 0;
    for (;;) {
        size_t comma = spec.find(',', start);
        std::string path(spec.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
        if (path.empty() || path.find('\0') != std::string::npos)
            return set_error(err, -EINVAL, "file: '%s' has an empty path; write file:/path or file:/a,/b,...",
                             set->spec_.c_str());
        auto f = std::make_unique<OpenFile>();
        if (int rc = open_one(path, cfg, *f, err)) return rc;
        set->files_.push_back(std::move(f));
        if (comma == std::string_view::npos) break;
        start = comma + 1;
    }
    out = std::move(set);
    return 0;
}

Extent FileSet::locate(uint64_t offset) const {
    if (files_.size() == 1) return {0, offset, UINT64_MAX - offset};
    uint64_t stripe = offset >> shift_;
    uint64_t within = offset & (stripe_ - 1);
    uint64_t n = files_.size();
    return {static_cast<size_t>(stripe % n), ((stripe / n) << shift_) + within, stripe_ - within};
}

}  // namespace ferry_file
