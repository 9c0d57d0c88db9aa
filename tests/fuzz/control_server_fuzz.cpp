// The engine's control server (core/control/control_server.cpp) fed over a real socket: each input is
// sent on a fresh connection to a server that has a cluster secret, then the connection is
// half-closed and the reply read until the server closes (control_server_harness.hpp). The
// HELLO/AUTH/request decoders live inside the server's connection state machine, so this
// reaches them as a peer would; control_server_open does the same without a secret, so that
// the requests after the handshake are fuzzed too.
// Invariants: the server never crashes or hangs on a connection (5 s guard), and a peer that
// cannot know the secret never receives the published descriptor (its marker never appears in
// a reply).
#include "control_server_harness.hpp"

namespace {
control_fuzz::Server g;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    g = control_fuzz::start("fuzz-cluster-secret-0123456789abcdef");
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    std::string reply = control_fuzz::exchange(g.port, data, size);
    FUZZ_CHECK(reply.find(control_fuzz::kMarker) == std::string::npos, "descriptor served without authentication");
    return 0;
}
