// Whether another user of this machine could have chosen what is in a file Ferry runs (a
// transport plugin) or believes (its configuration file, a private key, a password, the cluster
// secret). Engines often run as root: a plugin in a directory anyone can write is code anyone can
// run as root. One check serves every such file, on an open descriptor, so the file checked is
// the file then loaded or read (docs/DESIGN.md, "What the loader trusts").
#pragma once

#include <sys/stat.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/result.hpp"
#include "util/fd.hpp"

namespace ferry {

// The engine's plugin_trust key (FERRY_PLUGIN_TRUST): which plugin files load.
enum class TrustLevel {
    // As Owner, and every directory, symlink and file on the path is owned by root, and a
    // directory others can write is refused even with the sticky bit.
    Strict,
    // The file and every directory on its resolved path are owned by root or this process's
    // effective user and are not writable by group or others; a directory with the sticky bit
    // (like /tmp) may be, since others cannot replace the entries they do not own there.
    Owner,
    // Nothing is refused; what Owner would refuse is still found and reported.
    Any,
};
inline constexpr TrustLevel kDefaultTrust = TrustLevel::Owner;

const char *to_string(TrustLevel level);
std::optional<TrustLevel> parse_trust_level(std::string_view text);
// One line for ferry-info: what the level accepts.
std::string describe(TrustLevel level);

// The level an engine uses: `configured` (the plugin_trust key) when given and not empty, else
// the environment's FERRY_PLUGIN_TRUST, else owner. A word that is none of strict, owner, any is
// an error naming where it came from.
Result<TrustLevel> resolve_plugin_trust(const std::string *configured);

// One reason another user could change a file: what is wrong, and the command that fixes it.
struct TrustProblem {
    std::string what;  // "/x is writable by group (mode 0775)"
    std::string fix;   // "chmod go-w /x"
};

// "A; B; fix: chmod go-w /x and chown root /y": the problems and their fixes in one clause.
std::string problems_text(const std::vector<TrustProblem> &problems);

// Secret: a private key or password, which group or others should not read either (warned
// about, as ssh does, not refused).
enum class Secrecy { Public, Secret };

struct CheckedFile {
    Fd fd;                               // O_RDONLY | O_CLOEXEC, on the file that was checked
    struct stat st {};                   // fstat of fd
    std::vector<TrustProblem> problems;  // empty: trusted at the level asked
    std::string exposure;  // Secret only: "<path> is readable by others (mode 0644); fix: chmod 600 <path>"
};

// Opens `path` one component at a time from '/' (a relative path from the working directory),
// resolving symlinks itself, and checks every directory it passes through, every symlink it
// follows that sits in a directory others can write, and the file, by fstat on the descriptors
// it opened, under `level`'s rules (Any: Owner's, for the report). The file is opened with
// O_NOFOLLOW from its checked directory's descriptor, so a rename or symlink swap after the
// check cannot change what the returned descriptor reads. Trust problems are returned, not
// failed; errors are only for a path that cannot be opened (the message names the component)
// or is not a regular file.
Result<CheckedFile> open_checked(const std::string &path, TrustLevel level, Secrecy secrecy);

// The whole file, read from offset 0 on its descriptor; -EFBIG when it holds more than
// `max_bytes` (a secret or a configuration is small; /dev/zero-like surprises must end).
Result<std::string> read_all(const CheckedFile &file, size_t max_bytes);

// For the files an engine reads its configuration and secrets from: open_checked under the
// Owner rules, refusing (-EACCES) a file other users could change with the problems and their
// fixes, and warning once (per path) when a Secret file is readable by group or others.
// `origin` says where the path came from ("config key 'etcd_key_file'"), `what` what it holds.
Result<CheckedFile> open_private_file(const std::string &path, const std::string &origin, const std::string &what,
                                      Secrecy secrecy);

// Logs `message` as a warning the first time this process sees it; later calls do nothing.
void warn_once(const std::string &message);

}  // namespace ferry
