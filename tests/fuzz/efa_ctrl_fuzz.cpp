// efa.so's control-message decoder (plugins/efa/ctrl_decode.cpp: decode_ctrl), which every
// message a peer fi_sends to an instance goes through before on_ctrl acts on it. The first byte
// picks the address length the instance's provider uses (16: sockaddr_in, 28: sockaddr_in6),
// the rest is the message. Invariants: an accepted message has the magic and version, a known
// type, a body inside the message of exactly the size its type needs; staged requests and grants
// name a non-empty range that does not wrap (staged_serve.cpp and staged_ops.cpp add their
// bounds against the receiver's regions and ops to these).
#include <cstring>

#include "ctrl_decode.hpp"
#include "fuzz_check.hpp"

using namespace ferry_efa;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const size_t addr_len = (data[0] & 1) ? 28 : 16;
    const uint8_t *msg = data + 1;
    const size_t len = size - 1;
    CtrlMsg m;
    CtrlBad bad = decode_ctrl(msg, len, addr_len, &m);
    FUZZ_CHECK(ctrl_bad_name(bad)[0] != '?', "unnamed refusal");
    if (bad != CtrlBad::None) return 0;
    FUZZ_CHECK(len >= sizeof(CtrlHeader) && len <= kCtrlSize, "accepted a message of impossible size");
    FUZZ_CHECK(m.h.magic == kCtrlMagic && m.h.version == kWireVersion, "accepted a foreign header");
    FUZZ_CHECK(
        m.body == msg + sizeof(CtrlHeader) && m.body_len == m.h.body_len && m.body_len <= len - sizeof(CtrlHeader),
        "body outside the message");
    switch (m.type) {
        case CtrlType::Hello: FUZZ_CHECK(m.body_len == addr_len, "Hello address of the wrong size"); break;
        case CtrlType::Query: FUZZ_CHECK(m.body_len == sizeof(QueryBody), "Query of the wrong size"); break;
        case CtrlType::Revoke:
            FUZZ_CHECK(m.body_len % 8 == 0 && m.body_len / 8 <= kMaxRevokeKeys, "Revoke of partial keys");
            break;
        case CtrlType::QueryReply: {
            QueryReplyHead q;
            FUZZ_CHECK(m.body_len >= sizeof q, "QueryReply without its head");
            memcpy(&q, m.body, sizeof q);
            FUZZ_CHECK(m.body_len >= sizeof q + q.count * sizeof(RemoteChunk), "QueryReply counts chunks it lacks");
            break;
        }
        case CtrlType::StageRead:
        case CtrlType::StageWrite: {
            StageReqBody b;
            FUZZ_CHECK(m.body_len == sizeof b, "staged request of the wrong size");
            memcpy(&b, m.body, sizeof b);
            FUZZ_CHECK(b.len > 0 && b.addr + b.len >= b.addr, "staged request of an empty or wrapping range");
            break;
        }
        case CtrlType::StageGrant: {
            StageGrantBody g;
            FUZZ_CHECK(m.body_len == sizeof g, "StageGrant of the wrong size");
            memcpy(&g, m.body, sizeof g);
            FUZZ_CHECK(g.len > 0 && g.offset + g.len >= g.offset, "StageGrant of an empty or wrapping slice");
            break;
        }
        case CtrlType::StageDone: FUZZ_CHECK(m.body_len == sizeof(StageDoneBody), "StageDone of the wrong size"); break;
        case CtrlType::HelloAck:
        case CtrlType::RevokeAck:
        case CtrlType::StageAck: break;
        default: FUZZ_CHECK(false, "accepted an unknown type");
    }
    // Touch every body byte: ASan sees any read past the message.
    volatile uint8_t sum = 0;
    for (size_t i = 0; i < m.body_len; ++i) sum = static_cast<uint8_t>(sum + m.body[i]);
    (void)sum;
    return 0;
}
