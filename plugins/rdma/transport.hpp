// One rdma.so instance: the NICs it opened, its registered regions, the peers it connected to
// (one RC queue pair per (local NIC, remote NIC) pair and per connect()), the control server
// that answers other instances' handshakes, and one progress thread that polls every NIC's
// completion queue.
//
// RDMA targets are passive: no CPU of the serving side touches a READ or WRITE. Bounds are
// therefore enforced twice: by the NIC, which checks every access against the memory region
// the rkey names (a region registered with exactly the rights granted, split at max_mr_size,
// and deregistered by deregister_mem), and by the initiator, which refuses locally any op whose
// range or right the imported descriptor does not grant, so only stale keys reach the wire.
#pragma once

#include "control.hpp"
#include "control_server.hpp"
#include "gpu_memory.hpp"
#include "nic_stats.hpp"
#include "options.hpp"
#include "pin_count.hpp"
#include "plan.hpp"
#include "plugin_util.hpp"
#include "verbs.hpp"
#include "wire.hpp"

#include <ferry/plugin.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace ferry_rdma {

class LocalRegion {
public:
    uint64_t handle = 0, addr = 0, length = 0;
    uint32_t access = 0, kind = FERRY_MEM_HOST;
    int32_t device = -1;
    std::vector<Span> chunks;                // registrations, at most max_mr_size each
    std::vector<std::vector<ibv_mr *>> mrs;  // [chunk][nic]
    std::vector<uint16_t> nearest;           // local NICs nearest this memory
    std::vector<uint16_t> farther;           // the other local NICs: while every nearest one is paused
    DmabufExport dmabuf;                     // GPU memory: one fd for every NIC's registrations
    GpuRuntime *runtime = nullptr;

    bool contains(uint64_t a, uint64_t len) const { return a >= addr && len <= length && a - addr <= length - len; }
    bool pin() { return pins_.pin(); }  // false once retired
    void unpin() { pins_.unpin(); }
    void retire_and_wait() { pins_.retire_and_wait(); }

private:
    PinCount pins_;
};

struct Op {
    uint64_t user_data = 0;
    uint32_t opcode = 0;
    uint32_t remaining = 0;  // work requests not finished
    int status = 0;
    std::string message;
    std::shared_ptr<LocalRegion> pin;
};

struct Pair;

struct Wr {
    Op *op = nullptr;
    WrPiece piece;
    uint32_t lkey = 0, rkey = 0;
    bool last_on_pair = false;  // the op's last work request on this queue pair
    Clock::time_point queued;
};

struct Peer;

// One RC queue pair towards one remote NIC.
struct Pair {
    enum class State { Ready, Repairing, Dead };
    Peer *peer = nullptr;
    uint16_t lnic = 0, rnic = 0;
    std::unique_ptr<QueuePair> qp;
    SendWindow window{2, 1};
    std::deque<Wr> pending;   // not posted yet (window full, or the pair is being repaired)
    std::deque<Wr> inflight;  // posted, in window order
    State state = State::Ready;
    std::string why;          // Dead: what happened
    uint16_t generation = 0;  // high 16 bits of wr_id: completions of a replaced queue pair are ignored
};

struct Peer {
    uint64_t id = 0;
    Endpoint ep;
    std::string name;  // "ip:port" of its control server, for messages
    int ctrl_fd = -1;
    std::mutex ctrl_mu;  // one control request at a time on ctrl_fd
    uint64_t next_req = 1;
    std::vector<std::unique_ptr<Pair>> pairs;  // index lnic * remote NICs + rnic; nullptr: not reachable
    bool closing = false;
    Pair *pair(uint16_t l, uint16_t r) const;
};

struct Import {
    uint64_t peer = 0, addr = 0, length = 0;
    MemDescriptor desc;
    std::vector<Span> spans;        // desc.chunks as spans
    std::vector<uint16_t> nearest;  // the owner's NICs nearest it
};

// The serving side of one initiator's authenticated control connection: the queue pairs created
// for it (destroyed with the connection: the NIC then refuses that initiator).
struct Served : ServedSession {
    uint64_t token = 0;
    std::vector<NicAddress> nics;                                             // the initiator's
    std::map<std::pair<uint16_t, uint16_t>, std::unique_ptr<QueuePair>> qps;  // (our nic, its nic)
};

class Transport {
public:
    static constexpr const char *kName = "rdma";
    static int create(const ferry_kv_t *options, size_t n, const ferry_host_api_t *host, Transport **out,
                      ferry_error_t *err);
    static int probe(const ferry_kv_t *options, size_t n, ferry_probe_result_t *result);
    ~Transport();

    int export_endpoint(void *buf, size_t *len, ferry_error_t *err);
    int register_mem(const ferry_mem_region_t *region, uint64_t *handle, ferry_error_t *err);
    int deregister_mem(uint64_t handle, ferry_error_t *err);
    int export_mem(uint64_t handle, void *buf, size_t *len, ferry_error_t *err);
    int connect(const void *endpoint, size_t len, uint64_t *peer, ferry_error_t *err);
    int disconnect(uint64_t peer, ferry_error_t *err);
    int import_mem(uint64_t peer, const ferry_mem_region_t *region, const void *desc, size_t len, uint64_t *remote_mem,
                   ferry_error_t *err);
    int release_mem(uint64_t peer, uint64_t remote_mem, ferry_error_t *err);
    int submit(uint64_t peer, const ferry_xfer_op_t *ops, size_t n, ferry_error_t *err);
    int poll(ferry_completion_t *out, size_t max) { return static_cast<int>(cq_.poll(out, max)); }
    int completion_fd() const { return cq_.fd(); }
    // ABI 1.5: one entry per local NIC ("mlx5_0:1"), summed over peers.
    int rail_stats(ferry_rail_stats_t *out, size_t *n, ferry_error_t *err);

private:
    Transport(const Config &cfg, const ferry_host_api_t *host);
    int start(ferry_error_t *err);

    // transport.cpp: memory
    int register_chunks(LocalRegion &r, std::string *why);
    void deregister_chunks(LocalRegion &r);
    MemDescriptor describe(const LocalRegion &r) const;
    GpuRuntime *runtime_for(uint32_t kind);

    // control.cpp side: serving other instances, and requests to peers
    // An authenticated request; false: close the connection.
    bool serve_request(ServedConn &c, const CtrlHeader &h, const std::vector<uint8_t> &body);
    int serve_connect(Served &s, const ConnectBody &b, ConnectAckBody *ack, std::string *why);
    int request(Peer &p, CtrlType type, const std::vector<uint8_t> &body, CtrlType reply_type,
                std::vector<uint8_t> *reply, std::string *why);
    int handshake(Peer &p, const std::vector<std::pair<uint16_t, uint16_t>> &which, CtrlType type,
                  std::vector<std::unique_ptr<QueuePair>> *qps, std::string *why);

    // datapath.cpp: posting and completions (mu_ held unless noted)
    void post_pending(Pair &p);
    void progress_loop();  // the progress thread
    void on_wc(size_t nic, const ibv_wc &wc);
    // A work request is over (it left its queue pair's queues): its NIC's counts, then its op.
    void finish_wr(const Wr &w, int status, const std::string &message);
    void pause_nic(uint16_t nic, const std::string &why);  // after a path error on it
    void pair_failed(Pair &p, const std::string &why);
    void repair_loop();  // the repair thread: re-creates failed queue pairs over the control channel
    void repair(const std::shared_ptr<Peer> &peer, Pair &p);  // without mu_
    void kill_pair(Pair &p, int status, const std::string &why);
    void drop_peer_ops(Peer &peer, int status, const std::string &why);
    std::string pair_name(const Pair &p) const;
    // 0, or -EFAULT / -EACCES with *why when the imported registrations do not grant the range.
    int refusal(const Import &im, uint64_t ra, uint64_t len, uint32_t need, std::string *why) const;
    void check_timeouts();
    void wake();

    const Config cfg_;
    const Logger log_;
    RegDmabufMrFn reg_dmabuf_ = nullptr;
    std::vector<std::unique_ptr<Nic>> nics_;
    Endpoint self_;
    CompletionQueue cq_;

    std::mutex mu_;
    std::atomic<bool> stop_{false};
    std::thread progress_, repairer_;
    int wake_fd_ = -1, epoll_fd_ = -1, listen_fd_ = -1;

    std::map<uint64_t, std::shared_ptr<LocalRegion>> regions_;  // by handle
    std::unordered_map<uint64_t, std::shared_ptr<Peer>> peers_;
    std::unordered_map<uint64_t, Import> imports_;
    std::unordered_map<uint32_t, Pair *> by_qpn_[kMaxNics];  // initiator queue pairs, per NIC
    std::unordered_map<Op *, std::unique_ptr<Op>> ops_;
    uint64_t next_region_ = 1, next_peer_ = 1, next_import_ = 1;
    uint32_t rotation_ = 0;
    // Per local NIC: bytes queued and completed, throughput, pauses after path errors
    // (plugins/common/rail_balance.hpp). Submit stripes and places work requests by it; work
    // requests leave it and path errors pause through nic_stats_, which counts them (rail_stats).
    RailBalancer nic_balance_;
    NicStats nic_stats_;
    Clock::time_point next_timeout_scan_;

    std::mutex repair_mu_;
    std::condition_variable repair_cv_;
    std::deque<std::pair<std::shared_ptr<Peer>, Pair *>> to_repair_;

    std::mutex runtime_mu_;
    std::unique_ptr<GpuRuntime> cuda_, rocm_;
    std::unique_ptr<ControlServer> server_;  // other instances' control connections
};

}  // namespace ferry_rdma
