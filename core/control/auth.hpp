// The optional cluster secret: where it comes from, and what is derived from it.
#pragma once

#include <string>

#include "control/control_protocol.hpp"
#include "ferry/engine.hpp"

namespace ferry {

struct AuthSettings {
    std::string secret;  // empty: this engine does not authenticate peers
    std::string origin;  // where the secret came from, for messages (never the secret itself)
};

inline constexpr size_t kMinSecretBytes = 16;

// Precedence: config `auth_secret`, config `auth_secret_file`, environment FERRY_AUTH_SECRET,
// environment FERRY_AUTH_SECRET_FILE (config beats environment; a value beats a file; setting
// both keys of one level is an error). A file's trailing newline is not part of the secret.
Result<AuthSettings> resolve_auth_secret(const std::string *config_secret, const std::string *config_file);

// A secret kept in a file (the cluster secret, etcd's password): its text without a trailing
// newline. Refused when other users could change the file or a directory above it; warns
// (once) when they may read it (file_trust.hpp). `what` names it in messages.
Result<std::string> read_secret_file(const std::string &path, const std::string &origin, const char *what);

// Fresh random bytes from the kernel (getrandom).
Result<control::Nonce> random_nonce();

// Key handed to transports that authenticate their own connections (plugin option `auth_key`):
// hex of HMAC-SHA-256(secret, "ferry transport key v1"), so a plugin never sees the secret.
std::string transport_auth_key(const std::string &secret);

}  // namespace ferry
