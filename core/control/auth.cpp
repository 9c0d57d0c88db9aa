#include "control/auth.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "util/file_trust.hpp"
#include "util/log.hpp"

namespace ferry {

Result<std::string> read_secret_file(const std::string &path, const std::string &origin, const char *what) {
    // Checked and read through one descriptor: refused when other users could change it, warned
    // about (once) when they could read it.
    auto file = open_private_file(path, origin, what, Secrecy::Secret);
    if (!file) return std::unexpected(file.error());
    // Bounded: a path like /dev/zero must not make the engine read forever.
    constexpr size_t kMaxSecretFileBytes = 64 * 1024;
    auto secret = read_all(*file, kMaxSecretFileBytes);
    if (!secret && secret.error().code == -EFBIG)
        return fail(-EINVAL, cat(origin, ": the ", what, " file '", path, "' holds more than ", kMaxSecretFileBytes,
                                 " bytes; it should hold only the ", what));
    if (!secret) return fail(secret.error().code, cat(origin, ": cannot read '", path, "': ", secret.error().message));
    while (!secret->empty() && (secret->back() == '\n' || secret->back() == '\r')) secret->pop_back();
    return std::move(*secret);
}

Result<AuthSettings> resolve_auth_secret(const std::string *config_secret, const std::string *config_file) {
    AuthSettings auth;
    const char *env_secret = std::getenv("FERRY_AUTH_SECRET");
    const char *env_file = std::getenv("FERRY_AUTH_SECRET_FILE");
    if (config_secret && config_file)
        return fail(-EINVAL, "config keys 'auth_secret' and 'auth_secret_file' are both set; set one of them");
    if (config_secret) {
        auth.secret = *config_secret;
        auth.origin = "config key 'auth_secret'";
    } else if (config_file) {
        auth.origin = "config key 'auth_secret_file'";
        auto s = read_secret_file(*config_file, auth.origin, "cluster secret");
        if (!s) return std::unexpected(s.error());
        auth.secret = std::move(*s);
    } else if (env_secret && *env_secret) {
        auth.secret = env_secret;
        auth.origin = "environment FERRY_AUTH_SECRET";
    } else if (env_file && *env_file) {
        auth.origin = "environment FERRY_AUTH_SECRET_FILE";
        auto s = read_secret_file(env_file, auth.origin, "cluster secret");
        if (!s) return std::unexpected(s.error());
        auth.secret = std::move(*s);
    } else {
        return auth;  // no secret: peers are not authenticated
    }
    // A short secret falls to an offline guess from one captured handshake.
    if (auth.secret.size() < kMinSecretBytes)
        return fail(-EINVAL,
                    cat("the cluster secret from ", auth.origin, " has ", auth.secret.size(), " bytes; use at least ",
                        kMinSecretBytes, " (e.g. the output of `head -c 32 /dev/urandom | base64`)"));
    // The proofs are HMACs from libcrypto, loaded only now that a secret needs it.
    if (!ferry_crypto::available())
        return fail(-ENOENT, cat(ferry_crypto::load_error(), "; the secret comes from ", auth.origin));
    return auth;
}

Result<control::Nonce> random_nonce() {
    control::Nonce nonce;
    if (!ferry_auth::fill_random(nonce)) return fail(-errno, cat("getrandom failed: ", std::strerror(errno)));
    return nonce;
}

std::string transport_auth_key(const std::string &secret) { return ferry_auth::transport_key_hex(secret); }

}  // namespace ferry
