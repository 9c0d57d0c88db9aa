// The block-list fixture of the GPU IPC transport's tests (gpu_ipc_blocks_test.cpp,
// gpu_ipc_blocks_in_launch_test.cpp): a transport on the test runtime, lists over its regions,
// transfers by index, and their one completion taken the way the engine takes it.
#pragma once

#include <algorithm>
#include <array>
#include <random>

#include "test_gpu_runtime.hpp"

namespace ferry_gpu_test {

constexpr KernelPolicy kPolicy{1 << 20, 16};
constexpr uint64_t kUserData = 0xb10c0001;
constexpr uint64_t kSentinel = 0x5e4711e1;

struct Block {
    size_t off, len;
};

// The counters' values, to put back what a sentinel op added.
class CounterSnapshot {
public:
    explicit CounterSnapshot(Counters &c) : c_(c) {
        for (size_t i = 0; i < kN; ++i) v_[i] = fields()[i]->load();
    }
    void restore() {
        for (size_t i = 0; i < kN; ++i) *fields()[i] = v_[i];
    }

private:
    static constexpr size_t kN = 10;
    std::array<std::atomic<int> *, kN> fields() {
        return {&c_.copy_async,   &c_.copy_batch,      &c_.events_recorded, &c_.stream_waits, &c_.bytes_landed,
                &c_.kernel_loads, &c_.kernel_launches, &c_.tables,          &c_.kernel_ops,   &c_.bad_tables};
    }
    Counters &c_;
    std::array<int, kN> v_{};
};

class GpuIpcBlocks : public GpuIpcFixture {
protected:
    void SetUp() override { remake({}, kPolicy, true); }
    void TearDown() override {
        if (t_) {
            rt_->hold_copies(false);  // a test that failed while holding them
            ferry_error_t err{};
            t_->release_mem(peer_, scratch_imp_, &err);
        }
        GpuIpcFixture::TearDown();
    }
    // make(), contents unlike anywhere else (a pair landing at the wrong block shows), and a
    // scratch region of its own for sentinel ops.
    void remake(std::chrono::microseconds poll_window, KernelPolicy policy, bool kernel, bool kernel_inline = false) {
        make(poll_window, policy, kernel, kernel_inline);
        std::mt19937 rng(42);
        for (auto &b : src) b = static_cast<uint8_t>(rng());
        for (auto &b : dst) b = static_cast<uint8_t>(rng());
        scratch_.assign(8192, 1);
        ferry_mem_region_t r{reinterpret_cast<uint64_t>(scratch_.data()),
                             scratch_.size(),
                             FERRY_MEM_CUDA,
                             0,
                             FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE,
                             0};
        ferry_error_t err{};
        uint8_t key[256];
        size_t key_len = sizeof key;
        uint64_t h = 0;
        ASSERT_EQ(t_->register_mem(&r, &h, &err), 0) << err.message;
        ASSERT_EQ(t_->export_mem(h, key, &key_len, &err), 0) << err.message;
        ASSERT_EQ(t_->import_mem(peer_, &r, key, key_len, &scratch_imp_, &err), 0) << err.message;
        scratch_h_ = h;
        counters.reset();
    }
    uint8_t *base(uint32_t side) { return side == FERRY_BLOCKS_LOCAL ? src.data() : dst.data(); }
    // A list of blocks at these offsets into src (local) or dst (remote, of `peer`) in region `mem`.
    int try_list(uint32_t side, const std::vector<Block> &blocks, uint64_t mem, uint64_t *list, ferry_error_t *err,
                 uint64_t peer = 0) {
        std::vector<ferry_block_t> b;
        for (auto &k : blocks) b.push_back({reinterpret_cast<uint64_t>(base(side)) + k.off, k.len, mem});
        return t_->create_block_list(side, side == FERRY_BLOCKS_REMOTE && !peer ? peer_ : peer, b.data(), b.size(),
                                     list, err);
    }
    uint64_t local_list(const std::vector<Block> &blocks) { return list(FERRY_BLOCKS_LOCAL, blocks, src_h_); }
    uint64_t remote_list(const std::vector<Block> &blocks) { return list(FERRY_BLOCKS_REMOTE, blocks, dst_h_); }
    uint64_t list(uint32_t side, const std::vector<Block> &blocks, uint64_t mem) {
        ferry_error_t err{};
        uint64_t l = 0;
        EXPECT_EQ(try_list(side, blocks, mem, &l, &err), 0) << err.message;
        return l;
    }
    int move(ferry_opcode_t opcode, uint64_t l, const std::vector<uint32_t> &li, uint64_t r,
             const std::vector<uint32_t> &ri, ferry_error_t *err, uint64_t peer = 0) {
        EXPECT_EQ(li.size(), ri.size());
        return t_->submit_blocks(peer ? peer : peer_, opcode, l, li.data(), r, ri.data(), li.size(), kUserData, err);
    }
    // Polls completions into `got` (when the fd says so, as the engine does) until `done` holds
    // or 30 s passed.
    template <class Done>
    void take_until(std::vector<ferry_completion_t> &got, Done done) {
        std::vector<ferry_completion_t> buf(64);
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (!done() && std::chrono::steady_clock::now() < deadline) {
            pollfd p{t_->completion_fd(), POLLIN, 0};
            if (::poll(&p, 1, 100) <= 0) continue;
            int k = t_->poll(buf.data(), buf.size());
            got.insert(got.end(), buf.begin(), buf.begin() + std::max(k, 0));
        }
    }
    static size_t count(const std::vector<ferry_completion_t> &got, uint64_t user_data) {
        return std::count_if(got.begin(), got.end(), [&](auto &c) { return c.user_data == user_data; });
    }
    // Everything reported up to a sentinel op submitted now, the sentinel's own completion left
    // out: runs are reported in submission order, so a late or second report of anything
    // submitted before comes first. The counters are as they were before it.
    std::vector<ferry_completion_t> drain(std::vector<ferry_completion_t> got = {}) {
        CounterSnapshot before(counters);
        ferry_xfer_op_t op{FERRY_OP_WRITE,
                           0,
                           reinterpret_cast<uint64_t>(scratch_.data()),
                           scratch_h_,
                           reinterpret_cast<uint64_t>(scratch_.data()) + 4096,
                           scratch_imp_,
                           64,
                           kSentinel};
        ferry_error_t err{};
        EXPECT_EQ(t_->submit(peer_, &op, 1, &err), 0) << err.message;
        take_until(got, [&] { return count(got, kSentinel) > 0; });
        EXPECT_EQ(count(got, kSentinel), 1u) << "the sentinel completes";
        // Its completion may overtake a run reported by the other side (completion thread or
        // poll) by the moment between taking the run and queueing its report.
        std::vector<ferry_completion_t> late;
        take_until(late, [&, until = std::chrono::steady_clock::now() + std::chrono::milliseconds(20)] {
            return std::chrono::steady_clock::now() >= until;
        });
        got.insert(got.end(), late.begin(), late.end());
        std::erase_if(got, [](auto &c) { return c.user_data == kSentinel; });
        before.restore();
        return got;
    }
    // The transfer's one completion (status -ETIMEDOUT when none came), and no other report.
    ferry_completion_t one_completion() {
        std::vector<ferry_completion_t> got;
        take_until(got, [&] { return !got.empty(); });
        got = drain(std::move(got));
        EXPECT_EQ(got.size(), 1u) << "one completion per transfer";
        if (got.empty()) return {0, -ETIMEDOUT, 0, "no completion"};
        EXPECT_EQ(got[0].user_data, kUserData);
        return got[0];
    }
    void expect_ok() {
        auto c = one_completion();
        EXPECT_EQ(c.status, 0) << c.message;
    }
    // Pair i moved its blocks' bytes (from their copies taken before the transfer).
    void expect_pairs(ferry_opcode_t opcode, const std::vector<Block> &lb, const std::vector<uint32_t> &li,
                      const std::vector<Block> &rb, const std::vector<uint32_t> &ri, const std::vector<uint8_t> &was) {
        for (size_t i = 0; i < li.size(); ++i) {
            const Block &l = lb[li[i]], &r = rb[ri[i]];
            const bool write = opcode == FERRY_OP_WRITE;
            EXPECT_EQ(0, memcmp(write ? &dst[r.off] : &src[l.off], &was[write ? l.off : r.off], l.len))
                << "pair " << i << " (local block " << li[i] << ", remote block " << ri[i] << ")";
        }
    }
    // n blocks of `len`, local ones backwards against remote ones in a strided order: one
    // completion, every pair where its indices say.
    void move_permuted_exactly(ferry_opcode_t opcode, size_t n, size_t len) {
        auto blocks = uniform(n, len);
        const uint64_t l = local_list(blocks), r = remote_list(blocks);
        const auto li = reversed(n), ri = strided(n, 13);
        const auto was = opcode == FERRY_OP_WRITE ? src : dst;
        ferry_error_t err{};
        ASSERT_EQ(move(opcode, l, li, r, ri, &err), 0) << err.message;
        expect_ok();
        expect_pairs(opcode, blocks, li, blocks, ri, was);
    }
    void expect_nothing_started() {
        EXPECT_EQ(counters.kernel_launches.load(), 0);
        EXPECT_EQ(counters.copy_async.load(), 0);
        EXPECT_EQ(counters.copy_batch.load(), 0);
        EXPECT_EQ(counters.events_recorded.load(), 0);
        EXPECT_TRUE(drain().empty()) << "a refused transfer reports nothing";
    }
    static std::vector<Block> uniform(size_t n, size_t len) {
        std::vector<Block> b;
        for (size_t i = 0; i < n; ++i) b.push_back({i * len, len});
        return b;
    }
    std::vector<uint8_t> scratch_;
    uint64_t scratch_h_ = 0, scratch_imp_ = 0;

    static std::vector<uint32_t> reversed(size_t n) {
        std::vector<uint32_t> v(n);
        for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint32_t>(n - 1 - i);
        return v;
    }
    // i -> (i * stride + 11) mod n: a permutation for a stride prime to n.
    static std::vector<uint32_t> strided(size_t n, size_t stride) {
        std::vector<uint32_t> v(n);
        for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint32_t>((i * stride + 11) % n);
        return v;
    }
};

}  // namespace ferry_gpu_test
