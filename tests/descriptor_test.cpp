// Segment descriptor codec: round trips, and every malformed input is refused, never over-read.
#include <gtest/gtest.h>

#include "metadata/descriptor.hpp"

using namespace ferry;

namespace {

SegmentDescriptor sample() {
    SegmentDescriptor d;
    d.name = "127.0.0.1:7000";
    d.host_id = "machine/boot";
    d.generation = 9;
    d.transports = {{"tcp", {1, 2, 3}}, {"shm", {}}};
    d.regions = {{0x1000, 0x1000, 0, -1, 3, {{"tcp", {}}, {"shm", {9, 9}}}}, {0x4000, 0x100, 1, 2, 1, {{"tcp", {7}}}}};
    return d;
}

}  // namespace

TEST(Descriptor, RoundTrip) {
    auto bytes = encode_descriptor(sample());
    auto d = decode_descriptor(bytes);
    ASSERT_TRUE(d) << d.error().message;
    EXPECT_EQ(d->name, "127.0.0.1:7000");
    EXPECT_EQ(d->generation, 9u);
    ASSERT_EQ(d->regions.size(), 2u);
    EXPECT_EQ(d->regions[1].device, 2);
    EXPECT_EQ(d->regions[0].key_for("shm")->key, (std::vector<uint8_t>{9, 9}));
    EXPECT_EQ(d->endpoint_for("tcp")->endpoint, (std::vector<uint8_t>{1, 2, 3}));
}

TEST(Descriptor, ControlAddressRoundTripsAndIsOptional) {
    auto d = sample();
    EXPECT_TRUE(decode_descriptor(encode_descriptor(d))->control.empty()) << "older engines publish none";
    d.control = "10.0.0.7:40123";
    auto bytes = encode_descriptor(d);
    auto back = decode_descriptor(bytes);
    ASSERT_TRUE(back) << back.error().message;
    EXPECT_EQ(back->control, "10.0.0.7:40123");
    EXPECT_EQ(back->regions.size(), 2u);
    for (size_t n = 0; n < bytes.size(); ++n)
        EXPECT_FALSE(decode_descriptor(std::span(bytes.data(), n))) << "prefix of " << n << " bytes decoded";
    auto unknown_flag = bytes;
    unknown_flag[6] |= 0x2;  // header flags: bit 1 is not defined
    auto refused = decode_descriptor(unknown_flag);
    ASSERT_FALSE(refused);
    EXPECT_NE(refused.error().message.find("unknown header flags"), std::string::npos) << refused.error().message;
}

TEST(Descriptor, FindRegionHonoursBounds) {
    auto d = sample();
    EXPECT_NE(d.find_region(0x1000, 0x1000), nullptr);
    EXPECT_NE(d.find_region(0x1fff, 1), nullptr);
    EXPECT_EQ(d.find_region(0x1fff, 2), nullptr) << "crosses the end";
    EXPECT_EQ(d.find_region(0xfff, 2), nullptr) << "starts before";
    EXPECT_EQ(d.find_region(0x2000, 1), nullptr) << "in the gap";
    EXPECT_EQ(d.find_region(0x1000, UINT64_MAX), nullptr) << "huge length";
    EXPECT_EQ(d.find_region(UINT64_MAX, 1), nullptr);
}

TEST(Descriptor, EveryTruncationIsRefused) {
    auto bytes = encode_descriptor(sample());
    for (size_t n = 0; n < bytes.size(); ++n) {
        auto d = decode_descriptor(std::span(bytes.data(), n));
        EXPECT_FALSE(d) << "prefix of " << n << " bytes decoded";
        if (!d) {
            EXPECT_EQ(d.error().code, -EPROTO);
        }
    }
}

TEST(Descriptor, CorruptionsAreRefusedOrDecodeSafely) {
    auto bytes = encode_descriptor(sample());
    // Flip every byte: the decoder must never crash; whatever it accepts must be consistent.
    for (size_t i = 0; i < bytes.size(); ++i) {
        auto copy = bytes;
        copy[i] ^= 0xff;
        auto d = decode_descriptor(copy);
        if (d) {
            for (size_t r = 1; r < d->regions.size(); ++r) EXPECT_GE(d->regions[r].addr, d->regions[r - 1].end());
        }
    }
}

TEST(Descriptor, RejectsOverlapHugeCountsAndOtherVersions) {
    auto d = sample();
    d.regions[1].addr = 0x1800;
    EXPECT_FALSE(decode_descriptor(encode_descriptor(d)));
    auto bytes = encode_descriptor(sample());
    bytes[4] = 2;  // version 2
    auto v = decode_descriptor(bytes);
    ASSERT_FALSE(v);
    EXPECT_EQ(v.error().code, -EPROTONOSUPPORT);
    EXPECT_NE(v.error().message.find("version 2"), std::string::npos);
    d = sample();
    d.regions[0].length = 0;
    EXPECT_FALSE(decode_descriptor(encode_descriptor(d)));
}
