// Standard base64 (RFC 4648, with padding), for etcd's JSON gateway.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace ferry {

std::string base64_encode(std::span<const uint8_t> in);
inline std::string base64_encode(std::string_view s) {
    return base64_encode({reinterpret_cast<const uint8_t *>(s.data()), s.size()});
}
// nullopt on any character outside the alphabet or bad padding.
std::optional<std::vector<uint8_t>> base64_decode(std::string_view in);

}  // namespace ferry
