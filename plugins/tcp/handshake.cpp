#include "handshake.hpp"

#include "hmac_sha256.hpp"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

namespace ferry_tcp {

bool random_bytes(uint8_t *out, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t k = getrandom(out + got, n - got, 0);
        if (k < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        got += static_cast<size_t>(k);
    }
    return true;
}

void make_proof(const std::string &key, const char *role, const uint8_t *client_nonce, const uint8_t *server_nonce,
                uint8_t out[kProofSize]) {
    if (key.empty()) {
        memset(out, 0, kProofSize);
        return;
    }
    ferry_crypto::HmacSha256 mac(key.data(), key.size());
    mac.update("ferry tcp v2").update(role);
    mac.update(client_nonce, kNonceSize).update(server_nonce, kNonceSize);
    ferry_crypto::Digest d = mac.finish();
    memcpy(out, d.data(), kProofSize);
}

bool proof_matches(const std::string &key, const char *role, const uint8_t *client_nonce, const uint8_t *server_nonce,
                   const uint8_t *proof) {
    uint8_t expected[kProofSize];
    make_proof(key, role, client_nonce, server_nonce, expected);
    return ferry_crypto::equal_digests(expected, proof, kProofSize);
}

}  // namespace ferry_tcp
