// What the FERRY backend puts into NIXL's metadata and into Ferry notifications. NIXL carries
// these strings between agents opaquely; each starts with a version tag so a peer built from a
// different release is refused with a message instead of being misread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ferry_nixl {

// Connection info: the Ferry segment name other agents open to reach this agent.
std::string encode_conn_info(std::string_view segment_name);
std::optional<std::string> decode_conn_info(std::string_view blob);

// Public data of one registered region: the Ferry region descriptor (where it lives, how large,
// which memory) and the segment that serves it.
struct RegionInfo {
    uint64_t addr = 0;
    uint64_t length = 0;
    uint32_t memory_kind = 0;  // FERRY_MEMORY_*
    int32_t device = -1;
    std::string segment;
};
std::string encode_region(const RegionInfo &region);
std::optional<RegionInfo> decode_region(std::string_view blob);

// A NIXL notification inside a Ferry notification: Ferry tells the receiver the sender's
// segment, NIXL wants the sender's agent name, so the name travels with the message.
struct AgentMessage {
    std::string agent;
    std::string message;
};
std::string encode_notification(std::string_view agent, std::string_view message);
std::optional<AgentMessage> decode_notification(std::string_view bytes);

}  // namespace ferry_nixl
