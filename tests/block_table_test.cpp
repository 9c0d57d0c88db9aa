// Block tables through the engine (core/engine/blocks.cpp) over tcp.so, between two engines in
// this process: a transport without block lists, so each transfer's pairs go as ordinary ops.
// Bytes verified on both sides for permuted pairs, READ and WRITE; each pair's status; every
// refusal of bad input before anything moved; destroyed tables and memory unregistered since;
// and the C API.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <sstream>

#include "ferry/engine.hpp"
#include "ferry/ferry.h"

using namespace ferry;

namespace {

std::unique_ptr<Engine> make_engine() {
    auto e = Engine::create({{"plugins", "tcp"}});
    EXPECT_TRUE(e) << e.error().message;
    return e ? std::move(*e) : nullptr;
}

std::string hex(const void *p) {
    std::ostringstream out;
    out << "0x" << std::hex << reinterpret_cast<uintptr_t>(p);
    return out.str();
}

bool contains(const std::string &s, const std::string &part) { return s.find(part) != std::string::npos; }

std::vector<uint32_t> reversed(size_t n) {
    std::vector<uint32_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint32_t>(n - 1 - i);
    return v;
}

// i -> (i * stride + 3) mod n: a permutation for a stride prime to n.
std::vector<uint32_t> strided(size_t n, size_t stride) {
    std::vector<uint32_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint32_t>((i * stride + 3) % n);
    return v;
}

class BlockTableTest : public ::testing::Test {
protected:
    static constexpr size_t kBytes = 4 << 20;
    void SetUp() override {
        target = make_engine();
        initiator = make_engine();
        ASSERT_TRUE(target && initiator);
        // Contents unlike anywhere else, so a pair landing at the wrong block shows.
        std::mt19937 rng(7);
        remote.resize(kBytes);
        local.resize(kBytes);
        for (auto &b : remote) b = static_cast<uint8_t>(rng());
        for (auto &b : local) b = static_cast<uint8_t>(rng());
        ASSERT_TRUE(target->register_memory(remote.data(), remote.size()));
        ASSERT_TRUE(initiator->register_memory(local.data(), local.size()));
        auto s = initiator->open_segment(target->segment_name());
        ASSERT_TRUE(s) << s.error().message;
        seg = *s;
    }
    uint64_t laddr(size_t off) const { return reinterpret_cast<uintptr_t>(local.data()) + off; }
    uint64_t raddr(size_t off) const { return reinterpret_cast<uintptr_t>(remote.data()) + off; }
    BlockTableId table(SegmentId segment, const std::vector<uint64_t> &addrs, const std::vector<uint64_t> &lengths) {
        auto t = initiator->create_block_table(segment, addrs, lengths);
        EXPECT_TRUE(t) << t.error().message;
        return t ? *t : 0;
    }
    // Waits for the transfer and checks each pair's status; the batch is freed.
    void run(Opcode opcode, BlockTableId l, const std::vector<uint32_t> &li, BlockTableId r,
             const std::vector<uint32_t> &ri) {
        auto b = initiator->submit_blocks(opcode, l, li, r, ri);
        ASSERT_TRUE(b) << b.error().message;
        auto w = initiator->wait(*b, std::chrono::seconds(30));
        ASSERT_TRUE(w) << w.error().message;
        for (size_t i = 0; i < li.size(); ++i) {
            auto st = initiator->status(*b, i);
            ASSERT_TRUE(st) << st.error().message;
            EXPECT_EQ(st->state, OpState::Done) << "pair " << i;
            EXPECT_EQ(st->transport, "tcp") << "pair " << i;
        }
        auto past = initiator->status(*b, li.size());
        ASSERT_FALSE(past);
        EXPECT_EQ(past.error().code, -EINVAL);
        EXPECT_TRUE(initiator->free_batch(*b));
    }
    Error refused(Opcode opcode, BlockTableId l, const std::vector<uint32_t> &li, BlockTableId r,
                  const std::vector<uint32_t> &ri) {
        auto b = initiator->submit_blocks(opcode, l, li, r, ri);
        EXPECT_FALSE(b) << "the transfer should have been refused";
        return b ? Error{} : b.error();
    }

    // Declared before the engines, so they outlive them: an engine's threads may still be in
    // a send from registered memory when the transfer it serves was reported done.
    std::vector<uint8_t> remote, local, later;
    std::unique_ptr<Engine> target, initiator;
    SegmentId seg = 0;
};

}  // namespace

TEST_F(BlockTableTest, PermutedPairsMoveWhereTheirIndicesSayBothWays) {
    // 64 blocks of 16 KiB each side: one length for all (local), one per block (remote).
    constexpr size_t kBlocks = 64, kLen = 16 << 10;
    std::vector<uint64_t> la, ra;
    for (size_t i = 0; i < kBlocks; ++i) la.push_back(laddr(i * kLen)), ra.push_back(raddr((1 << 20) + i * kLen));
    const BlockTableId l = table(kLocalMemory, la, {kLen});
    const BlockTableId r = table(seg, ra, std::vector<uint64_t>(kBlocks, kLen));
    const auto li = reversed(kBlocks), ri = strided(kBlocks, 5);

    auto want = remote;
    for (size_t i = 0; i < kBlocks; ++i) memcpy(&want[(1 << 20) + ri[i] * kLen], &local[li[i] * kLen], kLen);
    run(Opcode::Write, l, li, r, ri);
    EXPECT_TRUE(want == remote) << "WRITE: each pair's remote block holds its local block, nothing else moved";

    std::fill(local.begin(), local.begin() + kBlocks * kLen, 0);
    auto want_local = local;
    const auto li2 = strided(kBlocks, 7), ri2 = reversed(kBlocks);
    for (size_t i = 0; i < kBlocks; ++i) memcpy(&want_local[li2[i] * kLen], &remote[(1 << 20) + ri2[i] * kLen], kLen);
    run(Opcode::Read, l, li2, r, ri2);
    EXPECT_TRUE(want_local == local) << "READ: each pair's local block holds its remote block, nothing else moved";
}

TEST_F(BlockTableTest, BlocksOfOddLengthsAndAddressesOnePerBlock) {
    const uint64_t lens[] = {1, 3, 4097, 17, 65537, 300001};
    std::vector<uint64_t> la, ra, ll, rl;
    size_t at = 0;
    for (size_t k = 0; k < std::size(lens); ++k) {
        la.push_back(laddr(at + k + 1));
        ra.push_back(raddr(at + 2 * k + 3));
        ll.push_back(lens[k]);
        at += lens[k] + 64;
    }
    // The remote table lists them backwards: pair i is local i, remote n-1-i.
    std::reverse(ra.begin(), ra.end());
    rl.assign(ll.rbegin(), ll.rend());
    const BlockTableId l = table(kLocalMemory, la, ll), r = table(seg, ra, rl);
    std::vector<uint32_t> li(std::size(lens));
    for (size_t i = 0; i < li.size(); ++i) li[i] = static_cast<uint32_t>(i);
    const auto ri = reversed(li.size());
    std::mt19937 rng(11);
    for (Opcode op : {Opcode::Write, Opcode::Read}) {
        // Fresh bytes on the side read from: a READ must not find the WRITE's bytes in place.
        for (auto &b : op == Opcode::Write ? local : remote) b = static_cast<uint8_t>(rng());
        auto want_local = local, want_remote = remote;
        for (size_t i = 0; i < li.size(); ++i) {
            const size_t lo = la[li[i]] - laddr(0), ro = ra[ri[i]] - raddr(0);
            if (op == Opcode::Write) memcpy(&want_remote[ro], &local[lo], ll[li[i]]);
            else memcpy(&want_local[lo], &remote[ro], ll[li[i]]);
        }
        run(op, l, li, r, ri);
        const char *name = op == Opcode::Write ? "WRITE" : "READ";
        EXPECT_TRUE(want_remote == remote) << name << ": remote memory";
        EXPECT_TRUE(want_local == local) << name << ": local memory";
    }
}

TEST_F(BlockTableTest, BadTransfersAreRefusedWithNothingMoved) {
    std::vector<uint64_t> la, ra;
    for (size_t i = 0; i < 8; ++i) la.push_back(laddr(i * 4096)), ra.push_back(raddr(i * 4096));
    const BlockTableId l = table(kLocalMemory, la, {4096}), r = table(seg, ra, {4096});
    std::vector<uint64_t> odd(8, 4096);
    odd[6] = 4000;
    const BlockTableId r_odd = table(seg, ra, odd);
    const std::vector<uint32_t> ok = {0, 1, 2, 3, 4, 5, 6, 7};
    auto past_local = ok, past_remote = ok;
    past_local[3] = 8;
    past_remote[5] = 100;
    const auto remote_was = remote, local_was = local;

    auto e = refused(Opcode::Write, l, past_local, r, ok);
    EXPECT_EQ(e.code, -EINVAL);
    EXPECT_TRUE(contains(e.message, "pair 3") && contains(e.message, "local index 8")) << e.message;
    e = refused(Opcode::Read, l, ok, r, past_remote);
    EXPECT_EQ(e.code, -EINVAL);
    EXPECT_TRUE(contains(e.message, "pair 5") && contains(e.message, "remote index 100")) << e.message;
    e = refused(Opcode::Write, l, ok, r_odd, ok);
    EXPECT_EQ(e.code, -EINVAL);
    EXPECT_TRUE(contains(e.message, "pair 6") && contains(e.message, "4000")) << e.message;
    e = refused(Opcode::Write, l, ok, r, {0, 1, 2});
    EXPECT_EQ(e.code, -EINVAL);
    EXPECT_TRUE(contains(e.message, "8 local indices but 3 remote")) << e.message;
    EXPECT_EQ(refused(Opcode::Write, l, {}, r, {}).code, -EINVAL) << "no pairs";
    EXPECT_EQ(refused(Opcode::Write, 4242, ok, r, ok).code, -EINVAL) << "unknown local table";
    EXPECT_EQ(refused(Opcode::Write, l, ok, 4242, ok).code, -EINVAL) << "unknown remote table";
    e = refused(Opcode::Write, l, ok, l, ok);
    EXPECT_EQ(e.code, -EINVAL);
    EXPECT_TRUE(contains(e.message, "not a block table of an open segment")) << e.message;
    e = refused(Opcode::Write, r, ok, r, ok);
    EXPECT_EQ(e.code, -EINVAL);
    EXPECT_TRUE(contains(e.message, "not a block table of local memory")) << e.message;
    EXPECT_TRUE(remote == remote_was && local == local_was) << "a refused transfer moved bytes";

    // The same tables move bytes with good indices: the refusals were the indices' own.
    run(Opcode::Write, l, ok, r, ok);
    EXPECT_EQ(0, memcmp(remote.data(), local.data(), 8 * 4096));
}

TEST_F(BlockTableTest, TablesOfBlocksOutsideRegisteredMemoryAreRefused) {
    std::vector<uint64_t> ra = {raddr(0), raddr(4096), raddr(kBytes - 100), raddr(8192)};
    auto t = initiator->create_block_table(seg, ra, std::vector<uint64_t>{4096});
    ASSERT_FALSE(t) << "a remote block past the peer's region";
    EXPECT_EQ(t.error().code, -EFAULT);
    EXPECT_TRUE(contains(t.error().message, "remote block 2") &&
                contains(t.error().message, hex(&remote[kBytes - 100])))
        << t.error().message;
    std::vector<uint64_t> la = {laddr(0), laddr(kBytes), laddr(4096)};
    t = initiator->create_block_table(kLocalMemory, la, std::vector<uint64_t>{4096});
    ASSERT_FALSE(t) << "a local block outside registered memory";
    EXPECT_EQ(t.error().code, -EFAULT);
    EXPECT_TRUE(contains(t.error().message, "local block 1")) << t.error().message;
    t = initiator->create_block_table(kLocalMemory, std::vector{laddr(0), laddr(4096), laddr(8192)},
                                      std::vector<uint64_t>{4096, 4096});
    ASSERT_FALSE(t);
    EXPECT_EQ(t.error().code, -EINVAL) << "2 lengths for 3 blocks: " << t.error().message;
    t = initiator->create_block_table(kLocalMemory, std::vector{laddr(0), laddr(4096)}, std::vector<uint64_t>{4096, 0});
    ASSERT_FALSE(t);
    EXPECT_EQ(t.error().code, -EINVAL) << "a block of length 0: " << t.error().message;
    t = initiator->create_block_table(kLocalMemory, {}, std::vector<uint64_t>{4096});
    ASSERT_FALSE(t);
    EXPECT_EQ(t.error().code, -EINVAL) << "no blocks";
    t = initiator->create_block_table(seg + 1000, std::vector{raddr(0)}, std::vector<uint64_t>{4096});
    ASSERT_FALSE(t);
    EXPECT_EQ(t.error().code, -ENOENT) << "a segment never opened: " << t.error().message;
}

TEST_F(BlockTableTest, ARegionThePeerRegisteredSinceTheSegmentWasOpenedIsFound) {
    later.resize(1 << 20);
    for (size_t i = 0; i < later.size(); ++i) later[i] = static_cast<uint8_t>(i * 31 + 5);
    ASSERT_TRUE(target->register_memory(later.data(), later.size()));
    const auto base = reinterpret_cast<uintptr_t>(later.data());
    const BlockTableId r = table(seg, {base + 4096, base + 1}, {5000});
    const BlockTableId l = table(kLocalMemory, {laddr(0), laddr(8192)}, {5000});
    run(Opcode::Read, l, {0, 1}, r, {1, 0});
    EXPECT_EQ(0, memcmp(&local[0], &later[1], 5000));
    EXPECT_EQ(0, memcmp(&local[8192], &later[4096], 5000));
}

TEST_F(BlockTableTest, ADestroyedTableIsGoneAndItsTransferInFlightCompletes) {
    constexpr size_t kBlocks = 32, kLen = 64 << 10;
    std::vector<uint64_t> la, ra;
    for (size_t i = 0; i < kBlocks; ++i) la.push_back(laddr(i * kLen)), ra.push_back(raddr(i * kLen));
    const BlockTableId l = table(kLocalMemory, la, {kLen}), r = table(seg, ra, {kLen});
    const auto li = reversed(kBlocks), ri = strided(kBlocks, 3);
    auto b = initiator->submit_blocks(Opcode::Write, l, li, r, ri);
    ASSERT_TRUE(b) << b.error().message;
    EXPECT_TRUE(initiator->destroy_block_table(l));
    EXPECT_TRUE(initiator->destroy_block_table(r));
    auto w = initiator->wait(*b, std::chrono::seconds(30));
    ASSERT_TRUE(w) << w.error().message;
    for (size_t i = 0; i < kBlocks; ++i)
        EXPECT_EQ(0, memcmp(&remote[ri[i] * kLen], &local[li[i] * kLen], kLen)) << "pair " << i;
    (void)initiator->free_batch(*b);

    auto again = initiator->destroy_block_table(l);
    ASSERT_FALSE(again);
    EXPECT_EQ(again.error().code, -ENOENT);
    auto e = refused(Opcode::Write, l, li, r, ri);
    EXPECT_EQ(e.code, -EINVAL);
    EXPECT_TRUE(contains(e.message, std::to_string(l))) << e.message;
}

TEST_F(BlockTableTest, ATableWhoseLocalMemoryWasUnregisteredFailsNamingIt) {
    std::vector<uint8_t> spare(1 << 20, 0x5a);
    ASSERT_TRUE(initiator->register_memory(spare.data(), spare.size()));
    const auto base = reinterpret_cast<uintptr_t>(spare.data());
    const BlockTableId l = table(kLocalMemory, {base, base + 4096}, {4096});
    const BlockTableId r = table(seg, {raddr(0), raddr(4096)}, {4096});
    ASSERT_TRUE(initiator->unregister_memory(spare.data()));
    const auto remote_was = remote;
    // Refused at submit, or failed once waited for: either way an error naming the memory.
    Error e;
    const std::vector<uint32_t> pairs = {0, 1};
    auto b = initiator->submit_blocks(Opcode::Write, l, pairs, r, pairs);
    if (!b) {
        e = b.error();
    } else {
        auto w = initiator->wait(*b, std::chrono::seconds(30));
        ASSERT_FALSE(w) << "a WRITE from unregistered memory succeeded";
        e = w.error();
        (void)initiator->free_batch(*b);
    }
    EXPECT_EQ(e.code, -EFAULT) << e.message;
    EXPECT_TRUE(contains(e.message, hex(spare.data())) && contains(e.message, "registered")) << e.message;
    EXPECT_TRUE(remote == remote_was) << "nothing of it landed";
}

TEST(BlockTableCApi, CreateSubmitWaitAndDestroy) {
    const char *keys[] = {"plugins"};
    const char *values[] = {"tcp"};
    ferry_engine_t *a = nullptr, *b = nullptr;
    ASSERT_EQ(ferry_engine_create(keys, values, 1, &a), 0) << ferry_last_error();
    ASSERT_EQ(ferry_engine_create(keys, values, 1, &b), 0) << ferry_last_error();
    char name[128];
    ASSERT_EQ(ferry_engine_segment_name(b, name, sizeof name), 0);
    constexpr size_t kBlocks = 16, kLen = 8192;
    std::vector<uint8_t> src(kBlocks * kLen), dst(kBlocks * kLen, 0);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
    ASSERT_EQ(ferry_register(a, src.data(), src.size(), FERRY_MEMORY_HOST, -1, FERRY_REMOTE_READ | FERRY_REMOTE_WRITE),
              0)
        << ferry_last_error();
    ASSERT_EQ(ferry_register(b, dst.data(), dst.size(), FERRY_MEMORY_HOST, -1, FERRY_REMOTE_READ | FERRY_REMOTE_WRITE),
              0)
        << ferry_last_error();
    ferry_segment_id_t seg;
    ASSERT_EQ(ferry_open_segment(a, name, &seg), 0) << ferry_last_error();
    std::vector<uint64_t> la, ra;
    for (size_t i = 0; i < kBlocks; ++i)
        la.push_back(reinterpret_cast<uintptr_t>(&src[i * kLen])),
            ra.push_back(reinterpret_cast<uintptr_t>(&dst[i * kLen]));
    const uint64_t len = kLen;
    ferry_block_table_t lt = 0, rt = 0;
    ASSERT_EQ(ferry_create_block_table(a, FERRY_LOCAL_MEMORY, la.data(), la.size(), &len, 1, &lt), 0)
        << ferry_last_error();
    ASSERT_EQ(ferry_create_block_table(a, seg, ra.data(), ra.size(), &len, 1, &rt), 0) << ferry_last_error();
    const auto li = reversed(kBlocks), ri = strided(kBlocks, 5);
    ferry_batch_id_t batch;
    ASSERT_EQ(ferry_submit_blocks(a, FERRY_WRITE, lt, li.data(), rt, ri.data(), kBlocks, &batch), 0)
        << ferry_last_error();
    ASSERT_EQ(ferry_wait_batch(a, batch, 30000), 0) << ferry_last_error();
    for (size_t i = 0; i < kBlocks; ++i) {
        EXPECT_EQ(0, memcmp(&dst[ri[i] * kLen], &src[li[i] * kLen], kLen)) << "pair " << i;
        ferry_op_status_t st;
        ASSERT_EQ(ferry_get_status(a, batch, i, &st), 0) << ferry_last_error();
        EXPECT_EQ(st.state, static_cast<uint32_t>(FERRY_OP_DONE)) << "pair " << i;
    }
    EXPECT_EQ(ferry_free_batch(a, batch), 0);

    // Refusals: each with its code and a message.
    uint32_t past[kBlocks];
    std::copy(li.begin(), li.end(), past);
    past[9] = kBlocks;
    EXPECT_EQ(ferry_submit_blocks(a, FERRY_WRITE, lt, past, rt, ri.data(), kBlocks, &batch), -EINVAL);
    EXPECT_TRUE(contains(ferry_last_error(), "pair 9")) << ferry_last_error();
    EXPECT_EQ(ferry_submit_blocks(a, 7, lt, li.data(), rt, ri.data(), kBlocks, &batch), -EINVAL) << "opcode";
    EXPECT_EQ(ferry_submit_blocks(a, FERRY_WRITE, lt, nullptr, rt, ri.data(), kBlocks, &batch), -EINVAL);
    EXPECT_EQ(ferry_submit_blocks(a, FERRY_WRITE, lt, li.data(), rt, ri.data(), kBlocks, nullptr), -EINVAL);
    EXPECT_EQ(ferry_create_block_table(a, FERRY_LOCAL_MEMORY, nullptr, 3, &len, 1, &lt), -EINVAL);
    const uint64_t two[] = {kLen, kLen};
    ferry_block_table_t unused = 0;
    EXPECT_EQ(ferry_create_block_table(a, FERRY_LOCAL_MEMORY, la.data(), la.size(), two, 2, &unused), -EINVAL)
        << "2 lengths for 16 blocks";
    EXPECT_EQ(ferry_destroy_block_table(a, lt), 0) << ferry_last_error();
    EXPECT_EQ(ferry_destroy_block_table(a, lt), -ENOENT);
    EXPECT_EQ(ferry_submit_blocks(a, FERRY_WRITE, lt, li.data(), rt, ri.data(), kBlocks, &batch), -EINVAL)
        << "a destroyed table";
    EXPECT_STRNE(ferry_last_error(), "");
    EXPECT_EQ(ferry_destroy_block_table(a, rt), 0) << ferry_last_error();
    ferry_engine_destroy(a);
    ferry_engine_destroy(b);
}
