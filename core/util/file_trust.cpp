#include "util/file_trust.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>

#include "util/log.hpp"

namespace ferry {
namespace {

// As the kernel's own limit on symlinks followed in one lookup (MAXSYMLINKS).
constexpr int kMaxSymlinks = 40;

std::string mode_text(mode_t mode) {
    char buf[8];
    snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
    return buf;
}

std::string join_path(const std::string &dir, const std::string &name) {
    return dir == "/" ? "/" + name : dir + "/" + name;
}

void split_into(const std::string &path, std::deque<std::string> &out, bool front) {
    std::deque<std::string> parts;
    size_t start = 0;
    while (start <= path.size()) {
        size_t end = path.find('/', start);
        if (end == std::string::npos) end = path.size();
        if (end > start) parts.push_back(path.substr(start, end - start));
        start = end + 1;
    }
    if (front) out.insert(out.begin(), parts.begin(), parts.end());
    else out.insert(out.end(), parts.begin(), parts.end());
}

// A walk can pass one directory twice (a symlink leading through ..): say each problem once.
void add(std::vector<TrustProblem> &out, TrustProblem problem) {
    for (const auto &p : out)
        if (p.what == problem.what) return;
    out.push_back(std::move(problem));
}

// The rules of one check: who may own what, and whether the sticky bit excuses a directory
// others can write.
class Rules {
public:
    explicit Rules(TrustLevel level) : strict_(level == TrustLevel::Strict), euid_(geteuid()) {}

    void owner(const struct stat &st, const std::string &path, bool symlink, std::vector<TrustProblem> &out) const {
        if (st.st_uid == 0 || (!strict_ && st.st_uid == euid_)) return;
        std::string chown = symlink ? "chown -h root " : "chown root ";
        if (strict_) {
            add(out, {cat(path, " is owned by uid ", st.st_uid, ", not root (plugin_trust=strict)"), chown + path});
        } else {
            add(out, {cat(path, " is owned by uid ", st.st_uid, ", not root or this process's user (uid ", euid_, ")"),
                      euid_ == 0 ? chown + path : cat(chown, path, " (or use a copy of your own)")});
        }
    }

    // A directory on the path: replacing any entry in it replaces what is loaded.
    void directory(const struct stat &st, const std::string &path, std::vector<TrustProblem> &out) const {
        owner(st, path, false, out);
        if (!(st.st_mode & (S_IWGRP | S_IWOTH))) return;
        const bool sticky = st.st_mode & S_ISVTX;
        if (sticky && !strict_) return;  // others cannot rename or remove what they do not own
        std::string what = cat(path, " is writable by ", (st.st_mode & S_IWOTH) ? "others" : "group", " (mode ",
                               mode_text(st.st_mode), ")");
        if (!sticky) {
            add(out, {what, "chmod go-w " + path});
            return;
        }
        // A shared directory such as /tmp is meant to stay writable: the fix is elsewhere.
        add(out, {what + "; the sticky bit is not enough under plugin_trust=strict",
                  "keep the file under directories only root can write, not under " + path});
    }

    void file(const struct stat &st, const std::string &path, std::vector<TrustProblem> &out) const {
        owner(st, path, false, out);
        if (st.st_mode & (S_IWGRP | S_IWOTH))
            add(out, {cat(path, " is writable by ", (st.st_mode & S_IWOTH) ? "others" : "group", " (mode ",
                          mode_text(st.st_mode), ")"),
                      "chmod go-w " + path});
    }

    // A symlink cannot be rewritten, only replaced, which its directory's rules already cover,
    // except in a sticky directory others can write: there its owner may replace it.
    void symlink(const struct stat &st, const std::string &path, const struct stat &dir,
                 std::vector<TrustProblem> &out) const {
        if (dir.st_mode & (S_IWGRP | S_IWOTH)) owner(st, path, true, out);
    }

private:
    bool strict_;
    uid_t euid_;
};

struct Dir {
    Fd fd;
    std::string path;
    struct stat st {};
};

Error open_error(int err, const std::string &here, const std::string &path) {
    return {-err, here == path ? std::string(std::strerror(err)) : cat(here, ": ", std::strerror(err))};
}

Result<std::string> read_link(int fd, const std::string &here) {
    std::string target(4096, '\0');
    ssize_t n = readlinkat(fd, "", target.data(), target.size());
    if (n < 0) return fail(-errno, cat("cannot read the symlink ", here, ": ", std::strerror(errno)));
    if (static_cast<size_t>(n) == target.size()) return fail(-ENAMETOOLONG, cat("the symlink ", here, " is too long"));
    target.resize(static_cast<size_t>(n));
    return target;
}

}  // namespace

const char *to_string(TrustLevel level) {
    switch (level) {
        case TrustLevel::Strict: return "strict";
        case TrustLevel::Owner: return "owner";
        case TrustLevel::Any: return "any";
    }
    return "unknown";
}

std::optional<TrustLevel> parse_trust_level(std::string_view text) {
    for (auto level : {TrustLevel::Strict, TrustLevel::Owner, TrustLevel::Any})
        if (text == to_string(level)) return level;
    return std::nullopt;
}

std::string describe(TrustLevel level) {
    switch (level) {
        case TrustLevel::Strict:
            return "strict: plugin files and every directory above them owned by root and writable by nobody else, "
                   "sticky directories included";
        case TrustLevel::Owner:
            return cat("owner: plugin files and every directory above them owned by root or uid ", geteuid(),
                       ", not writable by group or others (sticky directories such as /tmp excepted)");
        case TrustLevel::Any: return "any: every plugin file loads; what owner would refuse is reported";
    }
    return "unknown";
}

Result<TrustLevel> resolve_plugin_trust(const std::string *configured) {
    std::string origin = "config key 'plugin_trust'";
    std::string text;
    if (configured && !configured->empty()) {
        text = *configured;
    } else if (const char *env = std::getenv("FERRY_PLUGIN_TRUST"); env && *env) {
        text = env;
        origin = "environment FERRY_PLUGIN_TRUST";
    } else {
        return kDefaultTrust;
    }
    if (auto level = parse_trust_level(text)) return *level;
    return fail(-EINVAL, cat(origin, " = '", text, "'; use strict, owner (the default) or any"));
}

std::string problems_text(const std::vector<TrustProblem> &problems) {
    std::string what, fix;
    for (const auto &p : problems) {
        what += (what.empty() ? "" : "; ") + p.what;
        fix += (fix.empty() ? "" : " and ") + p.fix;
    }
    return what + "; fix: " + fix;
}

Result<CheckedFile> open_checked(const std::string &path, TrustLevel level, Secrecy secrecy) {
    if (path.empty()) return fail(-ENOENT, "the path is empty");
    const Rules rules(level);
    CheckedFile out;
    std::deque<std::string> todo;
    if (path[0] != '/') {
        char cwd[4096];
        if (!getcwd(cwd, sizeof cwd))
            return fail(-errno, cat("cannot resolve the relative path: getcwd: ", std::strerror(errno)));
        split_into(cwd, todo, false);
    }
    split_into(path, todo, false);

    // The directories from '/' down to where the walk is, each opened from its parent.
    std::vector<Dir> chain;
    Dir root{Fd(::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC)), "/"};
    if (!root.fd || ::fstat(root.fd.get(), &root.st) != 0) return fail(-errno, cat("/: ", std::strerror(errno)));
    rules.directory(root.st, "/", out.problems);
    chain.push_back(std::move(root));

    for (int hops = 0;;) {
        if (todo.empty()) return fail(-EISDIR, cat(chain.back().path, " is a directory, not a file"));
        std::string name = std::move(todo.front());
        todo.pop_front();
        if (name == ".") continue;
        if (name == "..") {
            if (chain.size() > 1) chain.pop_back();
            continue;
        }
        const Dir &dir = chain.back();
        const std::string here = join_path(dir.path, name);
        const bool last = todo.empty();
        if (last) {
            // O_NONBLOCK: a FIFO put in the file's place must not hang the open.
            Fd fd(::openat(dir.fd.get(), name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY));
            if (fd) {
                if (::fstat(fd.get(), &out.st) != 0) return fail(-errno, cat(here, ": ", std::strerror(errno)));
                if (!S_ISREG(out.st.st_mode)) return fail(-EINVAL, cat(here, " is not a regular file"));
                rules.file(out.st, here, out.problems);
                if (secrecy == Secrecy::Secret && (out.st.st_mode & (S_IRGRP | S_IROTH)))
                    out.exposure = cat(here, " is readable by ", (out.st.st_mode & S_IROTH) ? "others" : "group",
                                       " (mode ", mode_text(out.st.st_mode), "); fix: chmod 600 ", here);
                out.fd = std::move(fd);
                return out;
            }
            if (errno != ELOOP) return std::unexpected(open_error(errno, here, path));
            // ELOOP under O_NOFOLLOW: a symlink, resolved below.
        }
        Fd fd(::openat(dir.fd.get(), name.c_str(), O_PATH | O_CLOEXEC | O_NOFOLLOW));
        struct stat st {};
        if (!fd || ::fstat(fd.get(), &st) != 0) return std::unexpected(open_error(errno, here, path));
        if (S_ISLNK(st.st_mode)) {
            if (++hops > kMaxSymlinks) return fail(-ELOOP, cat(here, ": more than ", kMaxSymlinks, " symlinks"));
            rules.symlink(st, here, dir.st, out.problems);
            auto target = read_link(fd.get(), here);
            if (!target) return std::unexpected(target.error());
            if (!target->empty() && (*target)[0] == '/') chain.resize(1);
            split_into(*target, todo, true);
            continue;
        }
        if (last) {
            if (!S_ISREG(st.st_mode)) return fail(-EINVAL, cat(here, " is not a regular file"));
            // It was a symlink a moment ago and is a file again: look again, as from the start.
            if (++hops > kMaxSymlinks) return fail(-ELOOP, cat(here, " keeps changing while it is checked"));
            todo.push_front(name);
            continue;
        }
        if (!S_ISDIR(st.st_mode)) return fail(-ENOTDIR, cat(here, " is not a directory"));
        rules.directory(st, here, out.problems);
        chain.push_back({std::move(fd), here, st});
    }
}

Result<CheckedFile> open_private_file(const std::string &path, const std::string &origin, const std::string &what,
                                      Secrecy secrecy) {
    auto file = open_checked(path, TrustLevel::Owner, secrecy);
    if (!file) return fail(file.error().code, cat(origin, ": cannot read '", path, "': ", file.error().message));
    if (!file->problems.empty())
        return fail(-EACCES, cat(origin, ": the ", what, " file '", path,
                                 "' is refused because other users could change it: ", problems_text(file->problems)));
    if (!file->exposure.empty()) warn_once(cat(origin, ": the ", what, " file: ", file->exposure));
    return file;
}

Result<std::string> read_all(const CheckedFile &file, size_t max_bytes) {
    std::string text(std::min<size_t>(static_cast<size_t>(file.st.st_size), max_bytes) + 1, '\0');
    size_t got = 0;
    for (;;) {
        if (got == text.size()) {
            if (text.size() > max_bytes) return fail(-EFBIG, cat("it holds more than ", max_bytes, " bytes"));
            text.resize(std::min(text.size() * 2, max_bytes + 1));  // it grew since fstat
        }
        ssize_t n = ::pread(file.fd.get(), text.data() + got, text.size() - got, static_cast<off_t>(got));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return fail(-errno, std::strerror(errno));
        if (n == 0) break;
        got += static_cast<size_t>(n);
    }
    text.resize(got);
    return text;
}

void warn_once(const std::string &message) {
    static std::mutex mutex;
    static std::set<std::string> said;
    {
        std::lock_guard lock(mutex);
        if (!said.insert(message).second) return;
    }
    FERRY_WARN(message);
}

}  // namespace ferry
