#include "control/control_client.hpp"

#include <poll.h>

#include <algorithm>
#include <cerrno>

#include "control/auth.hpp"
#include "control/control_protocol.hpp"
#include "util/log.hpp"

namespace ferry {

using namespace control;

namespace {
// Replies bigger than a descriptor are refused: a peer cannot make us allocate without bound.
constexpr size_t kMaxReplyBytes = 64u << 20;
}  // namespace

Result<ControlClient> ControlClient::connect(const std::string &address, const std::string &label,
                                             const std::string &self_name, const std::string &secret,
                                             Clock::time_point deadline) {
    auto where = parse_host_port(address);
    if (!where) return fail(-EINVAL, cat("control address '", address, "' of ", label, " is not ip:port"));
    auto fd = connect_tcp(*where, deadline);
    if (!fd) return std::unexpected(fd.error());
    return handshake(std::move(*fd), address, label, self_name, secret, deadline);
}

Result<ControlClient> ControlClient::handshake(Fd fd, const std::string &address, const std::string &label,
                                               const std::string &self_name, const std::string &secret,
                                               Clock::time_point deadline) {
    ControlClient client(std::move(fd), address, label);

    auto nonce = random_nonce();
    if (!nonce) return std::unexpected(nonce.error());
    ByteWriter hello;
    hello.bytes(*nonce);
    hello.u32(secret.empty() ? 0 : kFlagSecret);
    hello.str(std::string_view(self_name).substr(0, kMaxNameBytes));
    if (auto w = write_all(client.fd_.get(), frame(kHello, hello.data()), deadline); !w) {
        // A server that turned us away at once (a connection limit) closed before our HELLO
        // arrived; its reason is still waiting to be read.
        auto reason =
            client.read_reply(std::min(deadline, Clock::now() + std::chrono::milliseconds(100)), "the handshake");
        if (!reason && !client.failed_) return std::unexpected(reason.error());
        return fail(w.error().code,
                    cat(label, " (control ", address, "): ", w.error().message, " during the handshake"));
    }
    auto answer = client.read_reply(deadline, "the handshake");
    if (!answer) return std::unexpected(answer.error());

    ByteReader r(*answer);
    std::vector<uint8_t> server_nonce_bytes, server_proof;
    uint32_t flags = 0;
    if (!r.bytes(server_nonce_bytes, kNonceBytes) || server_nonce_bytes.size() != kNonceBytes || !r.u32(flags) ||
        !r.bytes(server_proof, sizeof(Proof)) || server_proof.size() != sizeof(Proof) || r.remaining() != 0)
        return fail(-EPROTO, cat(label, " answered the control handshake with a malformed reply"));
    Nonce server_nonce;
    std::copy(server_nonce_bytes.begin(), server_nonce_bytes.end(), server_nonce.begin());
    std::string name(std::string_view(self_name).substr(0, kMaxNameBytes));

    // The server decided about our flag already; here we check its proof. We send our proof
    // even when its proof is wrong, so the server logs the failed attempt too, then refuse.
    std::string server_problem;
    if (!secret.empty()) {
        if (!(flags & kFlagSecret))
            server_problem = cat("authentication failed: ", label,
                                 " has no cluster secret but this engine requires one (auth_secret); set the same "
                                 "auth_secret, auth_secret_file or FERRY_AUTH_SECRET on every engine of the cluster");
        else if (!ferry_auth::proof_matches(secret, kProtocol, Role::kServer, *nonce, server_nonce,
                                            ferry_auth::proof_at(server_proof.data()), name))
            server_problem = cat("authentication failed: ", label,
                                 " does not know this cluster's secret (wrong auth_secret on one side); set the same "
                                 "auth_secret on every engine of the cluster");
    }
    Proof proof = ferry_auth::make_proof(secret, kProtocol, Role::kClient, *nonce, server_nonce, name);
    if (auto w = write_all(client.fd_.get(), frame(kAuth, proof), deadline); !w) return std::unexpected(w.error());
    auto accepted = client.read_reply(deadline, "authentication");
    if (!server_problem.empty()) {
        FERRY_LOG(Warn, "control", server_problem);
        return fail(-EACCES, server_problem);
    }
    if (!accepted) return std::unexpected(accepted.error());
    return client;
}

Result<std::vector<uint8_t>> ControlClient::read_reply(Clock::time_point deadline, const char *during) {
    std::array<uint8_t, kHeaderBytes> head{};
    auto io_failed = [&](const Error &e) {
        failed_ = true;
        return fail(e.code, cat(label_, " (control ", address_, "): ", e.message, " during ", during));
    };
    if (auto r = read_all(fd_.get(), head, deadline); !r) return io_failed(r.error());
    Header h = parse_header(head);
    if (h.magic != kMagic) {
        failed_ = true;
        return fail(-EPROTO, cat(label_, " (", address_, ") did not answer as a Ferry engine (bad magic)"));
    }
    if (h.length > kMaxReplyBytes) {
        failed_ = true;
        return fail(-EPROTO, cat(label_, " announced a ", h.length, "-byte reply; refused"));
    }
    // Grown as the bytes arrive: a header alone cannot make us allocate 64 MiB.
    std::vector<uint8_t> payload;
    while (payload.size() < h.length) {
        size_t at = payload.size();
        payload.resize(at + std::min<size_t>(h.length - at, 1u << 20));
        if (auto r = read_all(fd_.get(), std::span(payload).subspan(at), deadline); !r) return io_failed(r.error());
    }
    if (h.code != 0) {
        std::string why(payload.begin(), payload.end());
        // A server at a connection limit or out of descriptors says so in a whole sentence,
        // naming itself ("control server at X refused the connection: ...").
        if (h.code == EUSERS || h.code == EMFILE) {
            failed_ = true;
            return fail(-static_cast<int>(h.code), cat(label_, ": ", why));
        }
        // Refusals that end the connection (version, authentication) arrive before Ready.
        return fail(-static_cast<int>(h.code), cat(label_, " refused: ", why));
    }
    if (h.version != kVersion) {
        failed_ = true;
        return fail(-EPROTONOSUPPORT,
                    cat(label_, " speaks control protocol version ", h.version, ", this engine speaks ", kVersion,
                        "; run the same Ferry release everywhere"));
    }
    return payload;
}

Result<std::vector<uint8_t>> ControlClient::call(uint16_t type, std::span<const uint8_t> payload,
                                                 Clock::time_point deadline) {
    if (failed_) return fail(-ENOTCONN, cat("control connection to ", label_, " failed earlier; reconnect"));
    if (auto w = write_all(fd_.get(), frame(type, payload), deadline); !w) {
        failed_ = true;
        return fail(w.error().code, cat(label_, " (control ", address_, "): ", w.error().message));
    }
    return read_reply(deadline, "a request");
}

bool ControlClient::broken() const {
    if (failed_ || !fd_) return true;
    // Idle: nothing may be readable; readable means EOF, a reset or stray bytes.
    pollfd p{fd_.get(), POLLIN, 0};
    return ::poll(&p, 1, 0) != 0;
}

}  // namespace ferry
