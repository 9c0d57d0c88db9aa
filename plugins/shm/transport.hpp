// One shm.so instance: a listening abstract unix socket, an epoll I/O thread, copy workers, the
// registered regions and the peers it initiates to. See wire.hpp for the protocol and
// docs/DESIGN.md ("shm.so") for why the serving side copies with process_vm_readv/writev.
#pragma once

#include "map_wire.hpp"
#include "memfd.hpp"
#include "options.hpp"
#include "peer.hpp"
#include "plugin_util.hpp"
#include "rate_limited_log.hpp"
#include "regions.hpp"
#include "split_copy.hpp"
#include "stage.hpp"
#include "staged_device.hpp"
#include "wire.hpp"

#include <ferry/plugin.h>

#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

namespace ferry_shm {

// Limits against initiators that do not follow the protocol (docs/DESIGN.md, "shm.so").
inline constexpr size_t kMaxReplyBacklog = 256 << 10;                 // unsent answers before we stop reading requests
inline constexpr uint64_t kMaxActivePerConn = 256;                    // requests being copied before we stop reading
inline constexpr auto kRevokeGrace = std::chrono::milliseconds(200);  // see check_timeouts
inline constexpr auto kRefusalLogInterval = std::chrono::seconds(10);
// One vectored copy (batch.cpp): the kernel takes at most UIO_MAXIOV = 1024 iovecs a side, and
// the gate's byte comes first.
inline constexpr size_t kMaxIov = 1024;
inline constexpr size_t kMaxGroupOps = kMaxIov - 1;

// An op's status from copy()'s result: the initiator reads -ECONNRESET when it was gone, -EFAULT
// when the kernel could not pin its pages.
inline int copy_status(int e) { return e == -ENOMEM ? -EFAULT : e == -ESRCH ? -ECONNRESET : e; }

// Reads exactly len bytes before the deadline: 0, -ETIMEDOUT, or -errno / -ECONNRESET (client.cpp).
int read_full(int fd, void *buf, size_t len, Clock::time_point deadline);

// Yama's /proc/sys/kernel/yama/ptrace_scope, or -1 when Yama is not present (probe.cpp).
int yama_ptrace_scope();

// A socket shared by the I/O thread and writers. Only the I/O thread closes it, under out_mu.
struct Conn {
    enum class Kind { Server, Client };
    explicit Conn(Kind k) : kind(k) {}
    virtual ~Conn();
    const Kind kind;
    int fd = -1;
    pid_t pid = 0;   // the process at the other end
    int pidfd = -1;  // serving side: pins that process (peer.hpp)
    std::mutex out_mu;
    std::string out;          // bytes the socket did not take yet
    bool out_armed = false;   // EPOLLOUT requested
    bool reading = true;      // EPOLLIN requested (off while a serving side applies backpressure)
    std::vector<uint8_t> rx;  // I/O thread only
};

// The serving side of one initiator's connection.
struct ServerConn : Conn {
    ServerConn() : Conn(Kind::Server) {}
    ~ServerConn() override;
    uid_t uid = 0;
    bool hello_done = false;   // I/O thread only
    bool map_channel = false;  // I/O thread only: a map channel (map_wire.hpp), not a data connection
    bool in_epoll = true;      // I/O thread only
    bool no_memfd = false;     // I/O thread only: mapping its memfds failed once, use CMA
    bool counted = false;      // I/O thread only: in the connection caps' counts
    bool paused = false;       // I/O thread only: not reading its requests (backpressure)
    Clock::time_point accepted;
    std::unordered_map<int, std::shared_ptr<PeerMapping>> maps;  // I/O thread only: its memfds, by fd
    std::atomic<bool> gone{false};    // the initiator went away: skip copies, close when idle
    std::atomic<uint64_t> active{0};  // requests accepted and not answered yet
    // I/O thread only: the initiator's staging area (stage.hpp), and a descriptor that came
    // with its bytes and waits for the StageOffer record it belongs to.
    std::unique_ptr<StageArea> stage;
    int stage_fd = -1;
};

// The local regions of one submit, each pinned once, unpinned when the last op of that submit
// holding it is answered (or reported, for staged ops: nothing touches their buffers then).
struct PinHold {
    std::vector<std::shared_ptr<Region>> regions;
    PinHold() = default;
    PinHold(const PinHold &) = delete;
    PinHold &operator=(const PinHold &) = delete;
    ~PinHold() {
        for (auto &r : regions) r->unpin();
    }
};

struct Pending {
    uint64_t user_data = 0;
    std::shared_ptr<PinHold> local;  // pinned until the serving side answers or is gone
    Clock::time_point start;
    std::shared_ptr<Gate> gate;  // the gate its request names (wire.hpp)
    bool reported = false;       // a completion was already delivered
    // Revoked (timeout, disconnect): reported with this status once the serving side answered,
    // its socket closed, or revoke_at + kRevokeGrace passed, whichever comes first.
    int revoked_status = 0;
    std::string revoked_message;
    Clock::time_point revoke_at;
};

// Small ops sent through the staging area in one block (stage.hpp), answered together.
struct StagedOp {
    uint64_t user_data = 0;
    uint8_t *local = nullptr;
    uint64_t data_off = 0;
    uint32_t length = 0, opcode = 0;
    int status = 0;  // a failure the serving side reported for this op alone
    std::string message;
};

struct StagedBatch {
    uint64_t id = 0, off = 0;  // its record id; its block in the area
    uint64_t end = 0;          // the ring's head after it (the area is free up to here once answered)
    Clock::time_point start;
    std::vector<StagedOp> ops;
    std::shared_ptr<PinHold> pins;  // its local regions, until reported
    bool answered = false;          // its Done came (or the connection ended)
    bool reported = false;
    int revoked_status = 0;  // as Pending: the serving side had claimed it when we gave up on it
    std::string revoked_message;
    Clock::time_point revoke_at;
};

// The initiating side of a connection to one peer.
struct ClientConn : Conn {
    ClientConn() : Conn(Kind::Client) {}
    uint64_t peer_id = 0;
    std::string who;     // "peer pid N" for messages
    EndpointBytes ep{};  // what connect was given (a map channel goes to the same instance)
    std::mutex mu;       // guards what follows
    std::unordered_map<uint64_t, Pending> pending;
    uint64_t next_id = 1;
    std::shared_ptr<Gate> gate;  // the one new requests name
    bool closing = false;        // disconnected: shut down, waiting for the serving side to finish
    bool dead = false;           // EOF: nothing from that peer can touch our memory any more
    std::string dead_reason;
    // Staging (stage.hpp): nullptr when the serving side refused it (then everything uses CMA).
    // The area is a ring: blocks are taken at stage_head and freed, in order, up to stage_tail.
    std::unique_ptr<StageArea> stage;  // set at connect, before the peer is published
    bool stage_ok = false;             // the serving side accepted it (its answer to the offer)
    std::vector<uint8_t> scratch;      // where bytes of ops not to be copied go (stage_file_copy)
    uint64_t stage_head = 0, stage_tail = 0;
    std::deque<StagedBatch> staged;  // in the order sent
};

struct Import {
    uint64_t peer = 0, addr = 0, length = 0;
    uint32_t access = 0;
    std::shared_ptr<SharedMapping> map;  // the peer's managed buffer mapped here: memcpy (shared_client.cpp)
    uint32_t kind = 0;                   // ferry_mem_kind_t
};

struct Job {
    std::shared_ptr<ServerConn> conn;
    std::shared_ptr<Region> region;    // pinned
    std::shared_ptr<PeerMapping> map;  // the initiator's memfd, when it has one: memcpy instead of CMA
    Request req{};
    std::atomic<uint32_t> left{0};  // pieces not copied yet
    std::atomic<int> status{0};
    std::atomic<int> sys_errno{0};
    std::mutex why_mu;
    std::string why;  // the message of a staging failure (status set by the same piece)
};

struct Piece {
    std::shared_ptr<Job> job;
    uint64_t off = 0, len = 0;
};

// The small cross-memory-attach ops of one read of requests that one copy syscall can take
// (batch.cpp): same opcode, same gate, each op checked and its region pinned.
struct CopyGroup {
    struct Op {
        Request req;
        std::shared_ptr<Region> region;
    };
    std::vector<Op> ops;
    uint64_t bytes = 0;
};

class Transport {
public:
    static constexpr const char *kName = "shm";
    static int create(const ferry_kv_t *options, size_t n, const ferry_host_api_t *host, Transport **out,
                      ferry_error_t *err);
    static int probe(const ferry_kv_t *options, size_t n, ferry_probe_result_t *result);
    ~Transport();

    int export_endpoint(void *buf, size_t *len, ferry_error_t *err);
    // shared: a managed buffer's memfd (register_mem_fd), nullptr for ordinary memory
    int register_mem(const ferry_mem_region_t *region, uint64_t *handle, ferry_error_t *err,
                     SharedBacking *shared = nullptr);
    int register_mem_fd(const ferry_mem_region_t *region, int fd, uint64_t fd_offset, uint64_t *handle,
                        ferry_error_t *err);  // shared_server.cpp
    int deregister_mem(uint64_t handle, ferry_error_t *err);
    int connect(const void *endpoint, size_t len, uint64_t *peer, ferry_error_t *err);
    int disconnect(uint64_t peer, ferry_error_t *err);
    // No per-region keys: the serving side checks every address against its own region table,
    // so the exported descriptor is empty, except for a managed buffer: a SharedDesc, telling
    // importers to ask for its memfd (shared_server.cpp).
    int export_mem(uint64_t handle, void *buf, size_t *len, ferry_error_t *err);
    int import_mem(uint64_t peer, const ferry_mem_region_t *region, const void *desc, size_t desc_len,
                   uint64_t *remote_mem, ferry_error_t *err);
    int release_mem(uint64_t peer, uint64_t remote_mem, ferry_error_t *err);
    int submit(uint64_t peer, const ferry_xfer_op_t *ops, size_t n, ferry_error_t *err);
    int poll(ferry_completion_t *out, size_t max) { return static_cast<int>(cq_.poll(out, max)); }
    int completion_fd() const { return cq_.fd(); }

private:
    Transport(const Config &cfg, const ferry_host_api_t *host);
    int start(ferry_error_t *err);
    void shutdown_all();

    // transport.cpp: sockets and the I/O thread
    void io_loop();
    void accept_all();
    void add_conn(const std::shared_ptr<Conn> &c, uint32_t events);
    void close_conn(Conn &c);                          // I/O thread
    bool send(Conn &c, const void *data, size_t len);  // false: the connection is closed
    void flush_locked(Conn &c);
    void wake();

    // server.cpp: the serving side
    void on_server_event(const std::shared_ptr<ServerConn> &c, uint32_t events);
    void on_hello(ServerConn &c, const Hello &h);
    // Answers are appended to `reply` (Done records) when known at once, else sent by finish().
    void on_request(const std::shared_ptr<ServerConn> &c, const Request &r, std::string &reply, CopyGroup &group);
    void worker_loop();
    // mine: the bytes on this side (default: the region itself; a staging buffer for device memory)
    int copy(const Job &job, uint64_t off, uint64_t len, uint8_t *mine = nullptr);
    int copy(const ServerConn &c, const Request &r, const PeerMapping *map, uint64_t off, uint64_t len, uint8_t *mine);
    std::string copy_failure_message(const ServerConn &c, const Request &r, int sys_errno) const;

    // batch.cpp: a read's worth of requests, small ones copied by few vectored syscalls
    void on_requests(const std::shared_ptr<ServerConn> &c, const uint8_t *data, size_t n);
    void copy_group(ServerConn &c, CopyGroup &group, std::string &reply);
    // One syscall copies no more than a worker's piece would (or one op, when larger): it is
    // what a revoked gate may still let through (client.cpp, kRevokeGrace).
    uint64_t max_group_bytes() const { return std::max(cfg_.chunk_size, cfg_.inline_size); }
    int copy_piece(Job &job, uint64_t off, uint64_t len);  // a worker's piece, staged or not
    std::shared_ptr<PeerMapping> peer_mapping(ServerConn &c, const Request &r);
    void finish(Job &job);
    void send_done(ServerConn &c, uint64_t id, int status, const std::string &message);
    static void append_done(std::string &out, uint64_t id, int status, const std::string &message);
    void server_gone(const std::shared_ptr<ServerConn> &c);
    void reap_idle_servers();
    std::string access_hint(uid_t them) const;

    // stage_server.cpp / stage_client.cpp: small ops through the initiator's staging area (stage.hpp)
    void take_stage(ServerConn &c, const Request &r, std::string &reply);   // a StageOffer
    void serve_stage(ServerConn &c, const Request &r, std::string &reply);  // a StageBatch
    void keep_stage_fds(ServerConn &c, const int *fds, size_t n);           // descriptors a read brought
    // Makes and offers the area on a new connection (before the I/O thread reads it). 0 also when
    // the peer refused it; an error only when the connection broke.
    int offer_stage(ClientConn &c, ferry_error_t *err);
    // Puts ops[i] with stage[i] set into blocks (c.mu held) and appends their StageBatch records
    // to wire; clears stage[i] of ops that found no room (they go through CMA).
    size_t stage_locked(ClientConn &c, const ferry_xfer_op_t *ops, size_t n, std::vector<char> &stage,
                        const std::shared_ptr<PinHold> &pins, std::string &wire);
    // A Done that is no CMA request's: a staged batch's (c.mu held). Completions into done,
    // pins into unpin; the number of ops it ended (for in_flight_).
    size_t on_staged_done(ClientConn &c, const Done &d, std::string_view message, std::vector<ferry_completion_t> &done,
                          std::vector<std::shared_ptr<PinHold>> &unpin);
    // Gives up on batch b (c.mu held): reported at once when the serving side had not claimed it.
    void revoke_staged_locked(ClientConn &c, StagedBatch &b, int status, const std::string &message,
                              Clock::time_point now, std::vector<ferry_completion_t> &done);
    void report_staged(StagedBatch &b, int status, const std::string &message, std::vector<ferry_completion_t> &done);

    // shared_server.cpp / shared_client.cpp: managed buffers over map channels (map_wire.hpp)
    bool serve_map_requests(ServerConn &c, size_t *at);  // false: close the channel
    std::shared_ptr<SharedMapping> map_shared(uint64_t peer, const ferry_mem_region_t &r);
    static constexpr int kNotMapped = 1;
    // kNotMapped when some op of the batch cannot take the mapped path (submit goes on with
    // cross-memory attach); otherwise submit's result, every op copied and completed.
    int submit_mapped(uint64_t peer, const ferry_xfer_op_t *ops, size_t n, ferry_error_t *err);
    int open_channel(const EndpointBytes &ep, uint32_t hello_magic, const std::string &who, int *out,
                     ferry_error_t *err);  // client.cpp

    // client.cpp: the initiating side
    void on_client_event(const std::shared_ptr<ClientConn> &c, uint32_t events);
    // The answers of one read, under one lock, into the completion queue at once.
    void on_dones(ClientConn &c, const uint8_t *data, size_t len, size_t *used);
    void client_dead(ClientConn &c, const std::string &reason);
    void check_timeouts();
    // Revokes c's gate and every op that names it (c.mu held); they are reported later.
    void revoke_locked(ClientConn &c, int status, const std::string &message, Clock::time_point now);

    // limits.cpp: connection caps, handshake deadlines, backpressure, accept back-off
    bool admit(ServerConn &c);   // false: refused (answered and to be closed)
    void forget(ServerConn &c);  // leaves the caps' counts
    void check_handshakes(Clock::time_point now);
    bool throttled(const ServerConn &c);  // out_mu held
    void pause_reading(const std::shared_ptr<ServerConn> &c);
    void resume_paused();
    void rearm_locked(Conn &c);  // out_mu held: epoll interest from reading/out_armed
    void accept_failed(int e);
    void maybe_resume_accept(Clock::time_point now);
    int loop_timeout_ms() const;

    const Config cfg_;
    const Logger log_;
    ferry_staged::Stager stager_;  // device regions: every copy staged through the host (server.cpp)
    uint64_t token_ = 0;
    pid_t pid_ = 0;
    uid_t uid_ = 0;
    alignas(16) uint64_t probe_[2] = {0, 0};  // read by peers' serving sides at connect

    int listen_fd_ = -1, epoll_fd_ = -1, wake_fd_ = -1;
    std::thread io_;
    std::vector<std::thread> workers_;
    std::atomic<bool> stop_{false};

    RegionTable regions_;
    CompletionQueue cq_;

    std::mutex conns_mu_;  // every open socket, keyed by the pointer epoll carries
    std::unordered_map<Conn *, std::shared_ptr<Conn>> conns_;
    std::vector<std::shared_ptr<ServerConn>> gone_servers_;  // I/O thread only
    // I/O thread only: the serving side's limits (limits.cpp)
    std::deque<std::weak_ptr<ServerConn>> handshaking_;  // in accept order, so deadlines are too
    std::vector<std::shared_ptr<ServerConn>> paused_;
    std::unordered_map<uid_t, unsigned> per_uid_;
    unsigned n_served_ = 0;
    bool accept_paused_ = false;
    Clock::time_point accept_resume_{};
    std::chrono::milliseconds accept_backoff_{0};
    RateLimitedLog refused_log_{log_, FERRY_LOG_INFO, kRefusalLogInterval};
    RateLimitedLog accept_log_{log_, FERRY_LOG_WARN, kRefusalLogInterval};
    std::condition_variable dead_cv_;  // a client connection saw EOF

    std::shared_mutex peers_mu_;
    std::unordered_map<uint64_t, std::shared_ptr<ClientConn>> peers_;
    std::unordered_map<uint64_t, Import> imports_;
    uint64_t next_peer_ = 1, next_import_ = 1;
    std::atomic<uint64_t> in_flight_{0};  // client ops not answered yet (for the timeout scan)
    std::mutex shared_mu_;                // guards the cache below
    // Peers' managed buffers mapped here, by (peer, inode): one mapping however often imported.
    std::map<std::pair<uint64_t, uint64_t>, std::weak_ptr<SharedMapping>> shared_maps_;
    SplitCopier copier_;  // the mapped path's copies: the caller and copy_threads - 1 helpers

    std::vector<StageOp> stage_ops_;  // I/O thread only: serve_stage's copy of a block's op list
    std::mutex work_mu_;
    std::condition_variable work_cv_;
    std::deque<Piece> work_;
};

}  // namespace ferry_shm
