// The control server without a cluster secret (core/control/control_server.cpp), as any peer that can
// reach its port sees it: HELLO with no secret flag and the all-zero AUTH proof are accepted,
// so the requests after the handshake (GET_DESCRIPTOR, NOTIFY, unknown types, oversized and
// truncated frames) are fuzzed too. The harness is control_server_fuzz's.
// Invariants: the server never crashes or hangs on a connection (5 s guard); every byte it
// sends back is a well-formed frame sequence (magic, version, a length that fits what came).
#include "control/control_protocol.hpp"
#include "control_server_harness.hpp"

namespace {
control_fuzz::Server g;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    g = control_fuzz::start("");
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    std::string reply = control_fuzz::exchange(g.port, data, size);
    using namespace ferry::control;
    auto *p = reinterpret_cast<const uint8_t *>(reply.data());
    size_t at = 0;
    while (reply.size() - at >= kHeaderBytes) {
        Header h = parse_header({p + at, kHeaderBytes});
        FUZZ_CHECK(h.magic == kMagic && h.version == kVersion, "the server sent a malformed frame header");
        FUZZ_CHECK(h.length <= reply.size() - at - kHeaderBytes, "the server cut a reply frame short");
        at += kHeaderBytes + h.length;
    }
    FUZZ_CHECK(at == reply.size(), "the server sent a partial frame header");
    // Drain what the input queued, so the next input starts from an empty queue.
    (void)g.server->take_notifications();
    return 0;
}
