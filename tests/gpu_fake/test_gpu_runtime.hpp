// A test stand-in for the GPU IPC runtime interface (plugins/gpu_ipc/gpu_runtime.hpp) and a
// transport connected to itself over it, for the transport's own tests: "device" memory is host
// memory, each stream is a worker thread running its queue in order, events are markers in
// that queue, and a copy kernel launch is a task on its stream that runs the kernel's own
// source on the CPU (copy_kernel_host.hpp) over its table, read from the "device" copy then. Counts what a batch costs; injects failures.
#pragma once

#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "copy_kernel_host.hpp"
#include "gpu_runtime.hpp"
#include "ipc_transport.hpp"

namespace ferry_gpu_test {

using namespace ferry_gpu;

// One in-order queue with its own thread, like a GPU stream.
class TestStream {
public:
    TestStream() : thread_([this] { loop(); }) {}
    ~TestStream() {
        {
            std::lock_guard l(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }
    void push(std::function<void()> fn) {
        {
            std::lock_guard l(mu_);
            q_.push_back(std::move(fn));
        }
        cv_.notify_all();
    }
    void drain() {
        std::unique_lock l(mu_);
        cv_.wait(l, [&] { return q_.empty() && !busy_; });
    }

private:
    void loop() {
        std::unique_lock l(mu_);
        for (;;) {
            cv_.wait(l, [&] { return stop_ || !q_.empty(); });
            if (q_.empty()) return;
            auto fn = std::move(q_.front());
            q_.pop_front();
            busy_ = true;
            l.unlock();
            fn();
            l.lock();
            busy_ = false;
            cv_.notify_all();
        }
    }
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> q_;
    bool busy_ = false, stop_ = false;
    std::thread thread_;
};

struct TestEvent {
    std::mutex mu;
    std::condition_variable cv;
    int state = 1;  // 0 pending, 1 done, < 0 failed (never recorded counts as done, as on CUDA)
};

struct Counters {
    std::atomic<int> copy_async{0}, copy_batch{0}, events_recorded{0}, stream_waits{0}, bytes_landed{0};
    std::atomic<int> event_waits{0};  // the completion thread's waits for an event
    // The copy kernel: loads asked, launches queued, tables made, ops run through it, tables
    // whose chunk numbering did not add up, and the last launch's shape.
    // Of the launches, those that carried their table (no table copy), and the last one's size.
    std::atomic<int> kernel_loads{0}, kernel_launches{0}, tables{0}, kernel_ops{0}, bad_tables{0};
    std::atomic<int> inline_launches{0};
    std::atomic<uint32_t> last_blocks{0}, last_inline_ops{0};
    std::atomic<uint64_t> last_chunks{0};
    void reset() {
        for (auto *a : {&copy_async, &copy_batch, &events_recorded, &stream_waits, &bytes_landed, &event_waits,
                        &kernel_loads, &kernel_launches, &tables, &kernel_ops, &bad_tables, &inline_launches})
            *a = 0;
        last_blocks = 0;
        last_inline_ops = 0;
        last_chunks = 0;
    }
};

class TestRuntime final : public Runtime {
public:
    TestRuntime(Counters &c, bool batch) : c_(c), batch_(batch) {}
    std::atomic<int> fail_copy_async_at{-1};  // this copy_async call (0-based) fails synchronously
    std::atomic<bool> fail_batch{false};      // copy_batch queues half its copies, then fails
    std::atomic<bool> fail_event_record{false};
    std::atomic<bool> fail_async{false};  // copies queued from now on fail on the "GPU"
    std::atomic<int> copy_delay_ms{0};
    std::atomic<bool> kernel{false};             // the runtime has the copy kernel
    std::atomic<bool> kernel_inline{false};      // and the one that takes its table in the launch
    std::atomic<int> fail_kernel_launch_at{-1};  // this launch (0-based) is refused

    // While held, event_wait (the completion thread's) blocks before it looks at the event.
    void hold_event_waits(bool hold) {
        {
            std::lock_guard g(gate_mu_);
            hold_waits_ = hold;
        }
        gate_cv_.notify_all();
    }
    // While held, queued copies and kernels wait on their streams before they run: a transfer
    // stays in flight, with nothing landed, until released.
    void hold_copies(bool hold) {
        {
            std::lock_guard g(gate_mu_);
            hold_copies_ = hold;
        }
        gate_cv_.notify_all();
    }

    const char *name() const override { return "TEST"; }
    uint32_t memory_kind() const override { return FERRY_MEM_CUDA; }
    void probe(bool &available, std::string &) override { available = true; }
    int device_count(int &count, std::string &) override { return count = 1, 0; }
    int current_device(int &device, std::string &) override { return device = 0, 0; }
    int set_device(int, std::string &) override { return 0; }
    int pointer_device(const void *, int &device, bool &is_device, std::string &) override {
        device = 0;
        is_device = true;
        return 0;
    }
    int allocation_range(const void *ptr, uintptr_t &base, size_t &size, std::string &) override {
        base = reinterpret_cast<uintptr_t>(ptr);  // every region is its own allocation here
        size = 64 << 20;
        return 0;
    }
    int ipc_export(void *, IpcHandle &h, std::string &) override { return memset(h.bytes, 0, sizeof h.bytes), 0; }
    int ipc_open(const IpcHandle &, void *&, std::string &e) override { return e = "same process only", -ENOTSUP; }
    int ipc_close(void *, std::string &) override { return 0; }
    int enable_peer_access(int, int, std::string &) override { return 0; }
    int stream_create(Stream &s, std::string &) override { return s = new TestStream, 0; }
    void stream_destroy(Stream s) override { delete static_cast<TestStream *>(s); }
    int event_create(Event &e, std::string &) override { return e = new TestEvent, 0; }
    void event_destroy(Event e) override { delete static_cast<TestEvent *>(e); }
    int event_record(Event e, Stream s, std::string &error) override {
        if (fail_event_record) return error = "event record failed (injected)", -EIO;
        ++c_.events_recorded;
        auto *ev = static_cast<TestEvent *>(e);
        {
            std::lock_guard l(ev->mu);
            ev->state = 0;
        }
        bool failing = fail_async;
        static_cast<TestStream *>(s)->push([ev, failing] {
            std::lock_guard l(ev->mu);
            ev->state = failing ? -EIO : 1;
            ev->cv.notify_all();
        });
        return 0;
    }
    int event_query(Event e, std::string &) override {
        auto *ev = static_cast<TestEvent *>(e);
        std::lock_guard l(ev->mu);
        return ev->state;
    }
    int event_wait(Event e, std::string &error) override {
        ++c_.event_waits;
        {
            std::unique_lock g(gate_mu_);
            gate_cv_.wait(g, [&] { return !hold_waits_; });
        }
        auto *ev = static_cast<TestEvent *>(e);
        std::unique_lock l(ev->mu);
        ev->cv.wait(l, [&] { return ev->state != 0; });
        if (ev->state < 0) return error = "an illegal memory access was encountered (injected)", ev->state;
        return 0;
    }
    int copy_async(void *dst, const void *src, size_t bytes, Stream s, std::string &error) override {
        if (c_.copy_async++ == fail_copy_async_at) return error = "copy refused (injected)", -EINVAL;
        queue_copy(dst, src, bytes, s);
        return 0;
    }
    int stream_wait(Stream s, std::string &) override {
        ++c_.stream_waits;
        static_cast<TestStream *>(s)->drain();
        return 0;
    }
    bool has_copy_batch() override { return batch_; }
    int copy_batch(void *const *dsts, const void *const *srcs, const size_t *sizes, size_t n, Stream s,
                   std::string &error) override {
        ++c_.copy_batch;
        size_t upto = fail_batch ? n / 2 : n;
        for (size_t i = 0; i < upto; ++i) queue_copy(dsts[i], srcs[i], sizes[i], s);
        if (fail_batch) return error = "batched copy failed (injected)", -EIO;
        return 0;
    }

    int copy_kernel_load(int, std::string &error) override {
        ++c_.kernel_loads;
        if (!kernel) return error = "no copy kernel in this test runtime", -ENOSYS;
        return 0;
    }
    int table_alloc(size_t bytes, void *&host, void *&device_table, std::string &) override {
        ++c_.tables;
        host = new uint8_t[bytes];
        device_table = new uint8_t[bytes];
        return 0;
    }
    void table_free(void *host, void *device_table) override {
        delete[] static_cast<uint8_t *>(host);
        delete[] static_cast<uint8_t *>(device_table);
    }
    // The kernel as a task on its stream: it reads the table from the "device" when it runs,
    // after the table's copy queued before it, as the GPU does.
    int copy_kernel_launch(int, const void *table, uint32_t n, uint64_t chunks, uint32_t blocks, Stream s,
                           std::string &error) override {
        if (c_.kernel_launches++ == fail_kernel_launch_at) return error = "launch refused (injected)", -EIO;
        c_.last_blocks = blocks;
        c_.last_chunks = chunks;
        bool failing = fail_async;
        int delay = copy_delay_ms;
        static_cast<TestStream *>(s)->push([=, this] {
            wait_copy_gate();
            if (delay) std::this_thread::sleep_for(std::chrono::milliseconds(delay));
            const auto *t = static_cast<const CopyTableEntry *>(table);
            uint64_t next = 0;
            for (uint32_t i = 0; i < n; ++i) {
                if (t[i].first_chunk != next) ++c_.bad_tables;
                next += copy_chunks(t[i].bytes);
            }
            if (next != chunks || blocks == 0) ++c_.bad_tables;
            if (failing) return;  // a faulting kernel stops here: nothing lands
            ferry_copy_kernel_host::launch(table, n, chunks, blocks, kCopyKernelThreads);
            for (uint32_t i = 0; i < n; ++i) {
                c_.bytes_landed += static_cast<int>(t[i].bytes);
                ++c_.kernel_ops;
            }
        });
        return 0;
    }
    bool copy_kernel_inline(int, std::string &why) override {
        if (!kernel_inline) why = "not in this test runtime";
        return kernel_inline;
    }
    // As the driver does, the launch copies its parameters when it is queued: the kernel reads
    // that copy when it runs, whatever the caller's buffer holds by then.
    int copy_kernel_launch_inline(int, const InlineLaunch &launch, uint32_t blocks, Stream s,
                                  std::string &error) override {
        if (c_.kernel_launches++ == fail_kernel_launch_at) return error = "launch refused (injected)", -EIO;
        if (launch.n == 0 || launch.n > kInlineTableOps) return error = "bad inline table size", -EINVAL;
        ++c_.inline_launches;
        c_.last_blocks = blocks;
        c_.last_chunks = launch.chunks;
        c_.last_inline_ops = launch.n;
        const uint32_t chunks = launch.chunks;
        std::vector<InlineCopyOp> table(launch.ops, launch.ops + launch.n);
        bool failing = fail_async;
        int delay = copy_delay_ms;
        static_cast<TestStream *>(s)->push([=, this, table = std::move(table)] {
            wait_copy_gate();
            if (delay) std::this_thread::sleep_for(std::chrono::milliseconds(delay));
            uint64_t next = 0;
            for (const auto &e : table) {
                if (e.first_chunk != next) ++c_.bad_tables;
                next += copy_chunks(e.bytes);
            }
            if (next != chunks || blocks == 0) ++c_.bad_tables;
            if (failing) return;
            ferry_copy_kernel_host::launch_inline(table.data(), static_cast<uint32_t>(table.size()), chunks, blocks,
                                                  kCopyKernelThreads);
            for (const auto &e : table) {
                c_.bytes_landed += static_cast<int>(e.bytes);
                ++c_.kernel_ops;
            }
        });
        return 0;
    }

private:
    void queue_copy(void *dst, const void *src, size_t bytes, Stream s) {
        bool failing = fail_async;
        int delay = copy_delay_ms;
        static_cast<TestStream *>(s)->push([=, this] {
            wait_copy_gate();
            if (delay) std::this_thread::sleep_for(std::chrono::milliseconds(delay));
            if (failing) return;  // a faulting copy moves nothing here
            memcpy(dst, src, bytes);
            c_.bytes_landed += static_cast<int>(bytes);
        });
    }
    void wait_copy_gate() {
        std::unique_lock g(gate_mu_);
        gate_cv_.wait(g, [&] { return !hold_copies_; });
    }
    Counters &c_;
    bool batch_;
    std::mutex gate_mu_;
    std::condition_variable gate_cv_;
    bool hold_waits_ = false, hold_copies_ = false;
};

// One transport connected to itself (same process: the peer's memory is our own), a source and
// a destination region, and helpers to submit and collect.
class GpuIpcFixture : public ::testing::TestWithParam<bool> {
protected:
    static constexpr size_t kStreams = 4;
    void SetUp() override { make({}); }
    // The transport under test, with the given poll window and copy kernel policy (IpcTransport);
    // `kernel`: whether the runtime has the copy kernel.
    // `kernel_inline`: whether it also has the one that takes its table in the launch.
    void make(std::chrono::microseconds poll_window, KernelPolicy policy = {}, bool kernel = false,
              bool kernel_inline = false) {
        t_.reset();  // the one SetUp made, when a test makes its own
        counters.reset();
        auto rt = std::make_unique<TestRuntime>(counters, GetParam());
        rt_ = rt.get();
        rt_->kernel = kernel;
        rt_->kernel_inline = kernel_inline;
        t_ = std::make_unique<IpcTransport>(std::move(rt), nullptr, "test_ipc", kStreams, poll_window, policy);
        ferry_error_t err{};
        ASSERT_EQ(t_->start(&err), 0) << err.message;
        src.assign(16 << 20, 0);
        dst.assign(16 << 20, 0);
        for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 1);
        ferry_mem_region_t rs{reinterpret_cast<uint64_t>(src.data()),
                              src.size(),
                              FERRY_MEM_CUDA,
                              0,
                              FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE,
                              0};
        ferry_mem_region_t rd = rs;
        rd.addr = reinterpret_cast<uint64_t>(dst.data());
        ASSERT_EQ(t_->register_mem(&rs, &src_h_, &err), 0) << err.message;
        ASSERT_EQ(t_->register_mem(&rd, &dst_local_h_, &err), 0) << err.message;
        uint8_t ep[64], key[256];
        size_t ep_len = sizeof ep, key_len = sizeof key;
        ASSERT_EQ(t_->export_endpoint(ep, &ep_len, &err), 0) << err.message;
        ASSERT_EQ(t_->connect(ep, ep_len, &peer_, &err), 0) << err.message;
        ASSERT_EQ(t_->export_mem(dst_local_h_, key, &key_len, &err), 0) << err.message;
        ASSERT_EQ(t_->import_mem(peer_, &rd, key, key_len, &dst_h_, &err), 0) << err.message;
    }
    void TearDown() override {
        if (t_) {
            rt_->hold_event_waits(false);
            rt_->hold_copies(false);
            ferry_error_t err{};
            t_->release_mem(peer_, dst_h_, &err);
        }
        t_.reset();
    }
    // n WRITEs of `len` bytes from src into dst, op i at offset i * len; user_data = first + i.
    int submit(size_t n, size_t len, uint64_t first = 0) {
        std::vector<ferry_xfer_op_t> ops(n);
        for (size_t i = 0; i < n; ++i)
            ops[i] = {FERRY_OP_WRITE,
                      0,
                      reinterpret_cast<uint64_t>(src.data()) + i * len,
                      src_h_,
                      reinterpret_cast<uint64_t>(dst.data()) + i * len,
                      dst_h_,
                      len,
                      first + i};
        ferry_error_t err{};
        return t_->submit(peer_, ops.data(), n, &err);
    }
    // One op between the two regions at byte offsets into them: WRITE copies src -> dst, READ
    // dst -> src (src is the local region, dst the peer's).
    ferry_xfer_op_t op(ferry_opcode_t opcode, size_t src_off, size_t dst_off, size_t len, uint64_t user_data) const {
        return {opcode,
                0,
                reinterpret_cast<uint64_t>(src.data()) + src_off,
                src_h_,
                reinterpret_cast<uint64_t>(dst.data()) + dst_off,
                dst_h_,
                len,
                user_data};
    }
    int submit_ops(const std::vector<ferry_xfer_op_t> &ops) {
        ferry_error_t err{};
        return t_->submit(peer_, ops.data(), ops.size(), &err);
    }
    // Every completion of n ops, by user_data; fails the test after 30 s (a hang).
    std::map<uint64_t, ferry_completion_t> collect(size_t n, int *wakeups = nullptr) {
        std::map<uint64_t, ferry_completion_t> got;
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        std::vector<ferry_completion_t> buf(512);
        while (got.size() < n && std::chrono::steady_clock::now() < deadline) {
            pollfd p{t_->completion_fd(), POLLIN, 0};
            if (::poll(&p, 1, 100) <= 0) continue;
            if (wakeups) ++*wakeups;
            int k = t_->poll(buf.data(), buf.size());
            for (int i = 0; i < k; ++i) got[buf[i].user_data] = buf[i];
        }
        EXPECT_EQ(got.size(), n) << "every op completes";
        return got;
    }

    Counters counters;
    TestRuntime *rt_ = nullptr;
    std::unique_ptr<IpcTransport> t_;
    std::vector<uint8_t> src, dst;
    uint64_t src_h_ = 0, dst_local_h_ = 0, dst_h_ = 0, peer_ = 0;
};

}  // namespace ferry_gpu_test
