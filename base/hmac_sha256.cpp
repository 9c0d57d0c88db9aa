#include "hmac_sha256.hpp"

#include "runtime_library.hpp"

#include <dlfcn.h>
#include <string.h>

#include <cstdio>
#include <cstdlib>
#include <utility>

namespace ferry_crypto {
namespace {

struct EvpMd;  // OpenSSL's EVP_MD, opaque in 1.1 and 3
// The few symbols used; their signatures are the same in OpenSSL 1.1 and 3.
using HmacFn = unsigned char *(*)(const EvpMd *md, const void *key, int key_len, const unsigned char *data,
                                  size_t data_len, unsigned char *out, unsigned int *out_len);
using Sha256Fn = const EvpMd *(*)();
using MemcmpFn = int (*)(const void *a, const void *b, size_t len);

struct Libcrypto {
    HmacFn hmac = nullptr;
    Sha256Fn evp_sha256 = nullptr;
    MemcmpFn memcmp = nullptr;
    std::string error;  // empty once every symbol is resolved
};

Libcrypto load_libcrypto() {
    Libcrypto c;
    auto opened = ferry_base::open_runtime_library("FERRY_LIBCRYPTO", {"libcrypto.so.3", "libcrypto.so.1.1"});
    void *lib = opened.handle;
    if (!lib) {
        c.error =
            "auth_secret is set but OpenSSL's libcrypto (libcrypto.so.3) could not be loaded: install libssl3 "
            "(Debian/Ubuntu) or openssl-libs (RHEL)";
        if (opened.overridden) c.error += ", or point FERRY_LIBCRYPTO at an existing libcrypto";
        c.error += " (" + opened.tried + ")";
        return c;
    }
    c.hmac = reinterpret_cast<HmacFn>(dlsym(lib, "HMAC"));
    c.evp_sha256 = reinterpret_cast<Sha256Fn>(dlsym(lib, "EVP_sha256"));
    c.memcmp = reinterpret_cast<MemcmpFn>(dlsym(lib, "CRYPTO_memcmp"));
    if (!c.hmac || !c.evp_sha256 || !c.memcmp) {
        c.error =
            "auth_secret is set but the libcrypto that was loaded lacks HMAC, EVP_sha256 or CRYPTO_memcmp; "
            "install OpenSSL 1.1 or 3 (libssl3 on Debian/Ubuntu, openssl-libs on RHEL)";
        c.hmac = nullptr;
        c.memcmp = nullptr;
    }
    return c;  // never dlclose'd: function pointers stay valid until the process exits
}

const Libcrypto &libcrypto() {
    static const Libcrypto c = load_libcrypto();
    return c;
}

}  // namespace

bool available() { return libcrypto().error.empty(); }
const std::string &load_error() { return libcrypto().error; }

HmacSha256::~HmacSha256() {
    explicit_bzero(key_.data(), key_.size());
    explicit_bzero(message_.data(), message_.size());
}

Digest HmacSha256::finish() {
    const auto &c = libcrypto();
    if (!c.error.empty()) {
        // Unreachable when callers check available() at configuration time, as they must.
        std::fprintf(stderr, "ferry: HMAC-SHA-256 requested without libcrypto: %s\n", c.error.c_str());
        std::abort();
    }
    Digest out{};
    unsigned int len = 0;
    if (!c.hmac(c.evp_sha256(), key_.data(), static_cast<int>(key_.size()),
                reinterpret_cast<const unsigned char *>(message_.data()), message_.size(), out.data(), &len) ||
        len != out.size()) {
        std::fprintf(stderr, "ferry: libcrypto's HMAC failed\n");
        std::abort();
    }
    explicit_bzero(message_.data(), message_.size());
    message_.clear();
    return out;
}

bool equal_digests(const uint8_t *a, const uint8_t *b, size_t n) {
    const auto &c = libcrypto();
    if (c.memcmp) return c.memcmp(a, b, n) == 0;
    uint8_t diff = 0;
    for (size_t i = 0; i < n; ++i) diff |= static_cast<uint8_t>(a[i] ^ b[i]);
    return diff == 0;
}

std::string to_hex(const uint8_t *p, size_t n) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string out(2 * n, '0');
    for (size_t i = 0; i < n; ++i) {
        out[2 * i] = digits[p[i] >> 4];
        out[2 * i + 1] = digits[p[i] & 15];
    }
    return out;
}

bool from_hex(std::string_view hex, std::string &out) {
    auto nibble = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
    };
    if (hex.size() % 2 != 0) return false;
    std::string bytes(hex.size() / 2, '\0');
    for (size_t i = 0; i < bytes.size(); ++i) {
        int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) return false;
        bytes[i] = static_cast<char>(hi << 4 | lo);
    }
    out = std::move(bytes);
    return true;
}

}  // namespace ferry_crypto
