// Checking a control message as a peer sent it (wire.hpp), before efa.so acts on it: every
// byte of it is the peer's, and nothing about the peer is authenticated. Kept apart from the
// Transport (no libfabric) so the fuzz target reaches it as a peer does.
#pragma once

#include "wire.hpp"

#include <cstddef>
#include <cstdint>

namespace ferry_efa {

// Most keys one Revoke may name (a registration split at max_mr_size carries one key per MR).
inline constexpr size_t kMaxRevokeKeys = (kCtrlSize - sizeof(CtrlHeader)) / sizeof(uint64_t);

enum class CtrlBad : uint8_t { None, Short, Magic, Version, BodyLength, Type, Body, Count };

struct CtrlMsg {
    CtrlHeader h{};
    CtrlType type = CtrlType::Hello;
    const uint8_t *body = nullptr;
    size_t body_len = 0;
};

// Checks the header (magic, version, a body inside the message, a known type) and the body each
// type needs: Hello exactly `addr_len` bytes (an address of this provider's format: the address
// vector reads that many), Query one QueryBody, Revoke whole keys (at most kMaxRevokeKeys),
// QueryReply a QueryReplyHead and the chunks it counts, StageRead/StageWrite one StageReqBody of
// a non-empty range that does not wrap, StageGrant one StageGrantBody (non-empty, no wrap),
// StageDone one StageDoneBody, StageAck any text. On success fills *out. Whether the ids, ranges
// and slices name anything of the receiver's is checked where it acts (staged_serve.cpp,
// staged_ops.cpp).
CtrlBad decode_ctrl(const uint8_t *data, size_t len, size_t addr_len, CtrlMsg *out);

const char *ctrl_bad_name(CtrlBad why);

}  // namespace ferry_efa
