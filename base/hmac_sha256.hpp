// HMAC-SHA-256 from OpenSSL's libcrypto, for libferry and the plugins that authenticate their
// connections (through auth_proof.hpp). libcrypto is loaded at run time (dlopen), not linked:
// Ferry ships one wheel for every Linux host, and a linked libcrypto.so.3 would stop the core
// (and tcp.so) from loading at all on a host that has only 1.1, or none, although only engines
// with an auth_secret need it; the distribution's libcrypto also gets that distribution's
// security updates, which a vendored copy would not. The same reasoning made
// core/metadata/http_client.cpp load libcurl. Each module that links base/ has its own handle (its
// symbols are hidden; dlopen counts references).
//
// Tried in order: $FERRY_LIBCRYPTO (a file name or path, for a libcrypto outside the loader's
// search path; when set, only it), libcrypto.so.3, libcrypto.so.1.1. Code that needs a MAC checks
// available() first, when it is configured, and fails with load_error(); computing a MAC
// without the library aborts rather than produce a predictable proof.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ferry_crypto {

inline constexpr size_t kDigestBytes = 32;
using Digest = std::array<uint8_t, kDigestBytes>;

// True when HMAC-SHA-256 can be computed; load_error() says why not (and what to install).
bool available();
const std::string &load_error();

// HMAC-SHA-256 of the concatenation of every update(). The messages are a few dozen bytes
// (protocol labels, nonces, names), so they are collected and MACed in one call. The key and
// the message are wiped when done.
class HmacSha256 {
public:
    HmacSha256(const void *key, size_t key_len) : key_(static_cast<const char *>(key), key_len) {}
    ~HmacSha256();
    HmacSha256(const HmacSha256 &) = delete;
    HmacSha256 &operator=(const HmacSha256 &) = delete;

    HmacSha256 &update(const void *data, size_t n) {
        message_.append(static_cast<const char *>(data), n);
        return *this;
    }
    HmacSha256 &update(std::string_view s) { return update(s.data(), s.size()); }

    Digest finish();

private:
    std::string key_;
    std::string message_;
};

inline Digest hmac_sha256(std::string_view key, std::string_view message) {
    return HmacSha256(key.data(), key.size()).update(message).finish();
}

// Constant-time comparison (CRYPTO_memcmp), so timing does not tell how many leading bytes of
// a proof matched. Without libcrypto no secret is configured and the proofs compared are the
// all-zero ones of unauthenticated peers, so a plain OR-of-differences loop does.
bool equal_digests(const uint8_t *a, const uint8_t *b, size_t n);

std::string to_hex(const uint8_t *p, size_t n);
// Hex (either case) to bytes; false on odd length or a non-hex character.
bool from_hex(std::string_view hex, std::string &out);

}  // namespace ferry_crypto
