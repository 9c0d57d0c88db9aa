#include "auth_proof.hpp"

#include <string.h>
#include <sys/random.h>

#include <cerrno>

namespace ferry_auth {
namespace {

// On the wire inside every proof: changing one breaks compatibility with earlier versions.
std::string_view label(Protocol p) {
    switch (p) {
        case Protocol::kControl: return "ferry control v2";
        case Protocol::kTcp: return "ferry tcp v2";
        case Protocol::kRdma: return "ferry rdma v1";
    }
    return {};
}

std::string_view role_name(Role r) { return r == Role::kServer ? "server" : "client"; }

}  // namespace

Proof make_proof(std::string_view key, Protocol protocol, Role role, NonceView client_nonce, NonceView server_nonce,
                 std::string_view context) {
    if (key.empty()) return Proof{};
    ferry_crypto::HmacSha256 mac(key.data(), key.size());
    mac.update(label(protocol)).update(role_name(role));
    mac.update(client_nonce.data(), client_nonce.size()).update(server_nonce.data(), server_nonce.size());
    mac.update(context);
    return mac.finish();
}

bool proof_matches(std::string_view key, Protocol protocol, Role role, NonceView client_nonce, NonceView server_nonce,
                   ProofView received, std::string_view context) {
    Proof expected = make_proof(key, protocol, role, client_nonce, server_nonce, context);
    return ferry_crypto::equal_digests(expected.data(), received.data(), expected.size());
}

bool fill_random(std::span<uint8_t> out) {
    size_t got = 0;
    while (got < out.size()) {
        ssize_t n = ::getrandom(out.data() + got, out.size() - got, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        got += static_cast<size_t>(n);
    }
    return true;
}

std::string transport_key_hex(std::string_view secret) {
    auto key = ferry_crypto::hmac_sha256(secret, "ferry transport key v1");
    std::string hex = ferry_crypto::to_hex(key.data(), key.size());
    explicit_bzero(key.data(), key.size());
    return hex;
}

bool transport_key_from_hex(std::string_view hex, std::string &out) {
    std::string raw;
    if (hex.size() < 32 || !ferry_crypto::from_hex(hex, raw)) return false;
    out = std::move(raw);
    return true;
}

}  // namespace ferry_auth
