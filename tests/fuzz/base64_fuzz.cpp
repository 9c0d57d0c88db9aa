// base64 (core/util/base64.cpp: Boost.Beast's codec, checked strictly), which decodes etcd's JSON
// gateway values. Invariants: every byte string survives encode then decode; text that decodes
// has a length that is a multiple of 4, yields 3 bytes per group less padding, and its bytes
// re-encode to text that decodes the same.
#include <string_view>

#include "fuzz_check.hpp"
#include "util/base64.hpp"

using namespace ferry;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    std::span<const uint8_t> bytes(data, size);
    std::string text = base64_encode(bytes);
    FUZZ_CHECK(text.size() == (size + 2) / 3 * 4, "encoded length");
    auto back = base64_decode(text);
    FUZZ_CHECK(back && back->size() == size && std::equal(back->begin(), back->end(), data),
               "encode/decode round trip");

    std::string_view in(reinterpret_cast<const char *>(data), size);
    if (auto d = base64_decode(in)) {
        FUZZ_CHECK(size % 4 == 0, "decoded text whose length is not a multiple of 4");
        size_t pad = size == 0 ? 0 : (in[size - 1] == '=') + (size > 1 && in[size - 2] == '=');
        FUZZ_CHECK(d->size() == size / 4 * 3 - pad, "decoded length");
        auto again = base64_decode(base64_encode(*d));
        FUZZ_CHECK(again && *again == *d, "decode/encode/decode");
    }
    return 0;
}
