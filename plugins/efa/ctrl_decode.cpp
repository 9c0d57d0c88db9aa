#include "ctrl_decode.hpp"

#include <cstring>

namespace ferry_efa {

CtrlBad decode_ctrl(const uint8_t *data, size_t len, size_t addr_len, CtrlMsg *out) {
    CtrlHeader h;
    if (data == nullptr || len < sizeof h || len > kCtrlSize) return CtrlBad::Short;
    memcpy(&h, data, sizeof h);
    if (h.magic != kCtrlMagic) return CtrlBad::Magic;
    if (h.version != kWireVersion) return CtrlBad::Version;
    if (h.body_len > len - sizeof h) return CtrlBad::BodyLength;
    const size_t n = h.body_len;
    switch (static_cast<CtrlType>(h.type)) {
        case CtrlType::Hello:
            if (n != addr_len || n == 0) return CtrlBad::Body;
            break;
        case CtrlType::Query:
            if (n != sizeof(QueryBody)) return CtrlBad::Body;
            break;
        case CtrlType::Revoke:
            if (n % sizeof(uint64_t) != 0 || n / sizeof(uint64_t) > kMaxRevokeKeys) return CtrlBad::Body;
            break;
        case CtrlType::QueryReply: {
            QueryReplyHead q;
            if (n < sizeof q) return CtrlBad::Body;
            memcpy(&q, data + sizeof h, sizeof q);
            if (q.count > kChunksPerReply || n < sizeof q + q.count * sizeof(RemoteChunk)) return CtrlBad::Body;
            break;
        }
        case CtrlType::StageRead:
        case CtrlType::StageWrite: {
            StageReqBody b;
            if (n != sizeof b) return CtrlBad::Body;
            memcpy(&b, data + sizeof h, sizeof b);
            if (b.len == 0 || b.addr + b.len < b.addr) return CtrlBad::Body;
            break;
        }
        case CtrlType::StageGrant: {
            StageGrantBody b;
            if (n != sizeof b) return CtrlBad::Body;
            memcpy(&b, data + sizeof h, sizeof b);
            if (b.len == 0 || b.offset + b.len < b.offset) return CtrlBad::Body;
            break;
        }
        case CtrlType::StageDone:
            if (n != sizeof(StageDoneBody)) return CtrlBad::Body;
            break;
        case CtrlType::HelloAck:
        case CtrlType::RevokeAck:
        case CtrlType::StageAck: break;  // StageAck: any text
        default: return CtrlBad::Type;
    }
    out->h = h;
    out->type = static_cast<CtrlType>(h.type);
    out->body = data + sizeof h;
    out->body_len = n;
    return CtrlBad::None;
}

const char *ctrl_bad_name(CtrlBad why) {
    switch (why) {
        case CtrlBad::None: return "ok";
        case CtrlBad::Short: return "too short";
        case CtrlBad::Magic: return "bad magic";
        case CtrlBad::Version: return "unknown version";
        case CtrlBad::BodyLength: return "body past the message";
        case CtrlBad::Type: return "unknown type";
        case CtrlBad::Body: return "malformed body";
        case CtrlBad::Count: break;
    }
    return "?";
}

}  // namespace ferry_efa
