// Boost.Beast's base64 codec, made strict: Beast's decoder stops quietly at the first character
// outside the alphabet (and at '='), so the length, the padding and that every character was
// read are checked here.
#include "util/base64.hpp"

#include <boost/beast/core/detail/base64.hpp>

namespace ferry {
namespace codec = boost::beast::detail::base64;

std::string base64_encode(std::span<const uint8_t> in) {
    std::string out(codec::encoded_size(in.size()), '\0');
    out.resize(codec::encode(out.data(), in.data(), in.size()));
    return out;
}

std::optional<std::vector<uint8_t>> base64_decode(std::string_view in) {
    if (in.size() % 4 != 0) return std::nullopt;
    // One or two '=' may close the last group of four; '=' anywhere else is malformed.
    size_t pad = 0;
    while (pad < 2 && pad < in.size() && in[in.size() - 1 - pad] == '=') ++pad;
    const std::string_view text = in.substr(0, in.size() - pad);
    std::vector<uint8_t> out(codec::decoded_size(in.size()));
    auto [written, read] = codec::decode(out.data(), text.data(), text.size());
    if (read != text.size()) return std::nullopt;
    out.resize(written);
    return out;
}

}  // namespace ferry
