// The control client's decoding of what a (hostile) server sends back (core/control/control_client.cpp):
// the handshake reply (server nonce, flags, proof), the AUTH verdict, refusals, and request
// replies. Input byte 0 picks the client's configuration (bit 0: it has a cluster secret);
// the rest is the server's whole byte stream, queued on a socketpair before the client runs,
// so every read is deterministic and ends at the stream's end (no ports, no threads, no sleeps).
// Invariants: no crash, no hang (every read hits the end of the stream); a client with a secret
// never accepts a server that cannot know it; a reply's payload is never larger than the bytes
// the server sent.
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "control/control_client.hpp"
#include "control/control_protocol.hpp"
#include "fuzz_check.hpp"
#include "util/log.hpp"

using namespace ferry;

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    log::set_level(log::Level::Error);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    // Bigger inputs would not fit the socket buffer; they add nothing a 64 KiB one cannot do.
    if (size < 1 || size > (64u << 10)) return 0;
    const bool with_secret = data[0] & 1;
    int sv[2];
    FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair");
    for (size_t done = 1; done < size;) {
        ssize_t n = send(sv[1], data + done, size - done, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        FUZZ_CHECK(n > 0, "queueing the server's bytes");
        done += static_cast<size_t>(n);
    }
    shutdown(sv[1], SHUT_WR);
    auto deadline = Clock::now() + std::chrono::seconds(5);
    const std::string secret = with_secret ? "fuzz-cluster-secret-0123456789abcdef" : "";
    auto client = ControlClient::handshake(Fd(sv[0]), "127.0.0.1:7", "fuzzed server", "fuzz-client", secret, deadline);
    if (with_secret) FUZZ_CHECK(!client, "a client with a secret accepted a server that cannot know it");
    if (client) {
        const std::string what = "127.0.0.1:7";
        (void)client->broken();        // bytes still queued read as "broken": it must say so, not block
        for (int i = 0; i < 8; ++i) {  // after an I/O error call() refuses at once (-ENOTCONN)
            auto r = client->call(i % 2 ? control::kNotify : control::kGetDescriptor,
                                  {reinterpret_cast<const uint8_t *>(what.data()), what.size()}, deadline);
            if (r) FUZZ_CHECK(r->size() <= size, "a reply larger than what the server sent");
            else FUZZ_CHECK(r.error().code < 0 && !r.error().message.empty(), "a failure without a code or message");
        }
    }
    close(sv[1]);
    return 0;
}
