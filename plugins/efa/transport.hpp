// One efa.so instance: one RDM endpoint + CQ on one domain, a progress thread (posting RMA,
// reading completions, driving the provider's progress, which the tcp provider needs on BOTH
// sides), and the state of the peers. A host thread in poll() reads the CQ too, under mu_ (one
// reader at a time), and the progress thread stands aside meanwhile (transport.cpp).
//
// Remotes: one per other instance (keyed by its random token), shared by every connect() to it
// and by the serving role (we answer its control messages). A remote is Up, Checking (a Hello is
// in flight: after connect, or after an op failed, to tell a refused op from a broken
// connection), Resetting (its address was removed from the AV, which makes the provider drop the
// connection and flush what it held; re-inserted after a pause), Dead (unreachable; ops fail) or
// Idle (nobody uses it). Ops to a remote that is not Up wait in `held`.
#pragma once

#include "ctrl_decode.hpp"
#include "fabric.hpp"
#include "fabric_api.hpp"
#include "memory.hpp"
#include "options.hpp"
#include "plugin_util.hpp"
#include "staged.hpp"
#include "staged_device.hpp"
#include "wire.hpp"

#include <ferry/plugin.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace ferry_efa {

enum class CtxKind : uint32_t { SubOp = 1, CtrlRecv = 2, CtrlSend = 3 };

// Every context handed to libfabric starts with this (FI_CONTEXT2 space first).
struct Ctx {
    fi_context2 fi{};
    CtxKind kind;
    explicit Ctx(CtxKind k) : kind(k) {}
};

struct Op;
struct Remote;

struct SubOp : Ctx {
    SubOp() : Ctx(CtxKind::SubOp) {}
    Op *op = nullptr;
    void *local = nullptr;
    uint64_t len = 0;
    void *desc = nullptr;
    uint64_t raddr = 0, key = 0;
    bool posted = false, done = false;
    uint32_t slice = 0;  // staged ops: the grant it belongs to
};

struct Op {
    uint64_t user_data = 0;
    uint64_t peer = 0;  // peer id (connect)
    uint32_t opcode = 0;
    Remote *remote = nullptr;
    std::shared_ptr<LocalRegion> pin;
    Clock::time_point start;
    std::vector<SubOp> subs;
    uint32_t unposted = 0;     // subs not handed to the provider yet
    uint32_t outstanding = 0;  // subs the provider holds
    int status = 0;
    std::string message;
    // It fails (timeout, cancel, revocation): nothing more of it is posted, and it is reported
    // only once the provider has handed back every piece it holds, so no byte lands in (READ)
    // or is taken from (WRITE) the caller's buffer after the failure was reported.
    bool doomed = false;
    Clock::time_point doomed_at;
    bool warned = false;  // logged that the provider still holds it long after it failed
    // A remote region the target serves through its staging calls (staged_ops.cpp): pieces are
    // made from the target's grants instead of from its keys.
    bool staged = false;
    StagedInit st;
    std::list<SubOp> stage_subs;  // posted or to post; a piece goes once it completed
};

struct CtrlBuf : Ctx {
    explicit CtrlBuf(CtxKind k) : Ctx(k) {}
    uint8_t *data = nullptr;
    size_t len = 0;
    Remote *to = nullptr;     // sends: destination
    bool unverified = false;  // counted in unverified_sending_
    uint64_t req_id = 0;
    CtrlType type = CtrlType::Hello;
};

struct Remote {
    enum class State { Up, Checking, Resetting, Dead, Idle };
    uint64_t token = 0;
    std::vector<uint8_t> name;
    std::string name_str;
    fi_addr_t addr = FI_ADDR_NOTAVAIL;
    State state = State::Idle;
    unsigned attempts = 0;
    Clock::time_point next_try, ping_sent;
    uint64_t ping_req = 0;
    std::deque<SubOp *> held;
    uint64_t outstanding = 0;         // subops the provider holds
    unsigned users = 0;               // live peer ids
    bool initiates = false;           // it said Hello to us: it may hold our keys
    std::string why;                  // last failure, for messages
    unsigned answers = 0;             // our answers to it waiting in ctrl_out_ (bounded: it may never read)
    unsigned sending = 0;             // our messages to it the provider holds
    bool verified = false;            // a message to it was delivered, or we connected to it
    unsigned connecting = 0;          // connect() calls waiting on it (they hold a reference)
    unsigned revokes = 0;             // its Revokes in revokes_ (bounded)
    unsigned stage_inflight = 0;      // our staged requests it serves now (<= kMaxStagedPerRemote)
    std::deque<Op *> stage_wait;      // our staged ops not sent yet
    Clock::time_point stage_heard{};  // its last grant or answer (or our first request since)
};

// What unauthenticated peers may make an instance hold, and the ignored control messages,
// counted and logged once per interval instead of a line each.
inline constexpr size_t kMaxRemotes = 4096;
inline constexpr size_t kMaxRemotesPerAddress = 4;
inline constexpr unsigned kMaxAnswersPerRemote = 64;
inline constexpr unsigned kMaxRevokesPerRemote = 64;
inline constexpr size_t kMaxQueuedAnswers = 4096;    // all peers together (answers are up to 4 KiB)
inline constexpr unsigned kMaxSendsPerRemote = 4;    // of the send buffers, so one peer cannot hold them all
inline constexpr unsigned kMaxUnverifiedSends = 16;  // to peers never reached yet (a Hello names any address)
inline constexpr auto kIgnoredLogInterval = std::chrono::seconds(10);
inline constexpr size_t kCqBatch = 64;                    // completions per fi_cq_read
inline constexpr int kActiveWaitMs = 20;                  // the progress thread's longest sleep while ops are in flight
inline constexpr uint64_t kQuietSubmitBytes = 256 << 10;  // submits up to this size do not wake it
// How long after a host's poll() the progress thread leaves the CQ to the host: longer than one
// op's round trip (a host in Engine::wait polls once per wake-up), short enough that a host
// that stopped polling delays the provider's progress by at most this much.
inline constexpr auto kHostLease = std::chrono::milliseconds(2);
// The longest a spinning host stays in one poll() (transport.cpp, host_progress).
inline constexpr auto kHostSpinSlice = std::chrono::microseconds(200);

struct IgnoredCtrl {
    uint64_t malformed[static_cast<size_t>(CtrlBad::Count)] = {};
    uint64_t impostor = 0;     // a Hello naming a known instance from another address
    uint64_t unreachable = 0;  // a Hello whose address the provider does not take
    uint64_t unknown = 0;      // from an instance that never said Hello
    uint64_t crowded = 0;      // a new instance while kMaxRemotes are known and none can go, or its address is busy
    uint64_t flooded = 0;      // answers dropped: the peer let kMaxAnswersPerRemote pile up
    uint64_t total = 0;
    Clock::time_point next_log{};
};

struct PendingRevoke {
    Remote *from = nullptr;
    uint64_t req_id = 0;
    std::vector<uint64_t> keys;
    bool told_busy = false;  // the interim RevokeAck (-EINPROGRESS) went out
};

struct Peer {
    uint64_t token = 0;
};

struct Import {
    uint64_t peer = 0, addr = 0, length = 0;
    uint32_t access = 0;
    std::vector<RemoteChunk> chunks;  // ascending
    bool staged = false;              // served through the target's staging calls (no keys)
};

struct Waiter {
    bool done = false;
    bool busy = false;  // a Revoke's interim answer: the peer is alive, its RMA still in flight
    int status = 0;
    std::vector<uint8_t> body;
};

class Transport {
public:
    static constexpr const char *kName = "efa";
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
    int poll(ferry_completion_t *out, size_t max);
    int completion_fd() const { return host_fd_ >= 0 ? host_fd_ : cq_.fd(); }

private:
    Transport(const Config &cfg, const ferry_host_api_t *host);
    int start(ferry_error_t *err);

    // transport.cpp: the progress thread
    void progress_loop();
    size_t read_cq();
    size_t host_progress(ferry_completion_t *out, size_t max, bool *again);
    size_t host_round(ferry_completion_t *out, size_t max, size_t *n);
    bool host_leased(Clock::time_point now, int *left_ms) const;
    void idle_wait();
    void wake();
    void arm_timer();
    void on_completion(const fi_cq_msg_entry &e);
    void on_error(const fi_cq_err_entry &e);
    void post_recvs();

    // peers.cpp (remotes, connect, queries) and ctrl.cpp (control messages, revocation); all with mu_ held
    Remote *remote_for(uint64_t token, const uint8_t *name, size_t name_len);
    bool insert_addr(Remote &r);
    void remove_addr(Remote &r);
    void send_ctrl(Remote &r, CtrlType type, uint64_t req_id, int status, const void *body, size_t len);
    bool post_ctrl_sends();
    void on_ctrl(const uint8_t *data, size_t len);
    Remote *remote_for_hello(uint64_t token, const uint8_t *name, size_t len);
    bool forgettable(const Remote &r) const;
    void forget(Remote &r);
    bool evict_one();
    void log_ignored(bool force);
    void on_ctrl_send_done(CtrlBuf &b, int fi_err);
    void ctrl_send_failed(Remote &r, CtrlType type, uint64_t req_id, int fi_err);
    void drop_held(Remote &r, int status, const std::string &message);
    void ping(Remote &r);
    void remote_up(Remote &r);
    void remote_failed(Remote &r, const std::string &why, bool refused);
    void reset(Remote &r, const std::string &why);
    void kill_remote(Remote &r, const std::string &why);
    bool run_remotes();
    int wait_reply(uint64_t req_id, Waiter &w, std::unique_lock<std::mutex> &lock);
    void on_revoke(Remote &from, uint64_t req_id, std::vector<uint64_t> keys);
    void check_revokes();
    void revoke(const LocalRegion &region, std::unique_lock<std::mutex> &lock);
    int query(uint64_t peer, Remote &r, uint64_t addr, uint64_t len, std::vector<RemoteChunk> *out,
              std::unique_lock<std::mutex> &lock, std::string *why);

    // ops.cpp: building, posting and finishing ops (all with mu_ held)
    bool post_ops();
    int post(SubOp &s);
    void sub_done(SubOp &s, const fi_cq_err_entry *e);
    bool sub_returned(SubOp &s, const fi_cq_err_entry *e);  // false: it succeeded
    void fail_op(Op &op, int status, const std::string &message);
    void maybe_finish(Op &op);
    void settle(Remote &r);
    void reclaim(Remote &r);
    void check_timeouts();
    void quiesce();
    std::string describe_error(const fi_cq_err_entry &e, const Remote &r, int *status) const;

    // staged_ops.cpp: the initiator's side of staged regions (all with mu_ held)
    void stage_submit(std::unique_ptr<Op> op);
    bool stage_pump();
    void stage_on_grant(Remote &r, const CtrlHeader &h, const StageGrantBody &g);
    void stage_on_ack(Remote &r, const CtrlHeader &h, const uint8_t *text, size_t len);
    void stage_sub_done(SubOp &s, const fi_cq_err_entry *e);
    bool stage_end(Op &op);  // maybe_finish: false while a staged op is not over
    bool stage_send_failed(Remote &r, CtrlType type, uint64_t req_id);
    void stage_remote_gone(Remote &r, const std::string &why);

    // staged_serve.cpp: the target's side (all with mu_ held)
    int stage_register(const ferry_mem_region_t &r, LocalRegion &region, std::string *why);
    void stage_on_request(Remote &r, const CtrlHeader &h, bool write, const StageReqBody &b);
    void stage_on_done(Remote &r, const CtrlHeader &h, const StageDoneBody &b);
    bool stage_serve();
    void stage_serve_one(Remote &r, Serving &sv);
    void stage_fail_req(Serving &sv, ServeReq &q, int code, const std::string &why);
    void stage_drop_slot(Serving &sv, ServeSlot &slot);
    void stage_drop_peer(Remote &r, const std::string &why, bool cut);
    void stage_region_gone(const LocalRegion &region);
    void stage_check_grants();
    bool stage_progress();
    bool stage_active() const { return !serving_.empty() || stage_waiting_ > 0; }
    void stage_teardown();

    const Config cfg_;
    const Logger log_;
    Fabric fab_;
    std::unique_ptr<KeySource> keys_;
    uint64_t token_ = 0;
    CompletionQueue cq_;

    // Control buffers: one registered slab, receives always posted, sends from a free list.
    std::vector<uint8_t> ctrl_slab_;
    fid_mr *ctrl_mr_ = nullptr;
    void *ctrl_desc_ = nullptr;
    std::vector<std::unique_ptr<CtrlBuf>> recv_bufs_, send_bufs_;
    std::vector<CtrlBuf *> free_sends_, unposted_recvs_;
    struct OutMsg {
        Remote *to;
        CtrlType type;
        uint64_t req_id;
        std::vector<uint8_t> bytes;
    };
    std::deque<OutMsg> ctrl_out_;  // waiting for a send buffer or for fi_send to take it

    std::mutex mu_;  // everything below, and the progress thread's work
    std::condition_variable cv_;
    std::atomic<bool> stop_{false};
    std::thread progress_;
    int wake_fd_ = -1, timer_fd_ = -1, epoll_fd_ = -1;
    // The host's side: completion_fd is host_fd_, an epoll set of the completion
    // eventfd and the CQ's wait fd, so a host thread waiting on it wakes on the provider's events
    // and poll() reads the CQ itself. While a host polled within kHostLease, the progress thread
    // sleeps on aside_fd_ (wake_fd_, timer_fd_: not the CQ) so the data wakes one thread only.
    int host_fd_ = -1, aside_fd_ = -1;
    std::atomic<int64_t> host_polled_{0};  // Clock ticks of the last host poll()
    // While host_progress runs (mu_ held): the caller's array, which maybe_finish fills first
    // (no eventfd write and read for completions the polling thread takes at once).
    ferry_completion_t *host_out_ = nullptr;
    size_t host_room_ = 0, host_n_ = 0;
    Clock::time_point host_work_{};  // a host's poll() read the CQ, or a submit: its spin window

    std::map<uint64_t, std::shared_ptr<LocalRegion>> regions_;  // by handle
    uint64_t next_region_ = 1;
    std::unordered_map<uint64_t, std::unique_ptr<Remote>> remotes_;  // by token
    std::unordered_map<uint64_t, Peer> peers_;
    std::unordered_map<uint64_t, Import> imports_;
    uint64_t next_peer_ = 1, next_import_ = 1, next_req_ = 1;
    std::unordered_map<uint64_t, Waiter *> waiters_;
    std::vector<PendingRevoke> revokes_;  // keys a peer revoked, acknowledged once our RMA on them is done
    std::unordered_map<Op *, std::unique_ptr<Op>> ops_;
    std::deque<SubOp *> ready_;  // to post
    IgnoredCtrl ignored_;
    size_t queued_answers_ = 0;
    unsigned unverified_sending_ = 0;
    unsigned revoking_ = 0;  // revoke() calls waiting (they hold Remote pointers: no eviction)
    Clock::time_point next_timeout_scan_;
    Clock::time_point last_work_;  // progress thread only: when it last found something to do
    bool parked_ = false;          // the progress thread may sleep without a deadline: submit wakes it

    // Staged device memory (staged.hpp). The Stager counts the host's buffers we hold; destroy
    // waits for all to come back.
    ferry_staged::Stager stager_;
    std::map<Remote *, std::unique_ptr<Serving>> serving_;  // peers whose staged requests we serve
    size_t served_ = 0;                                     // their requests, all peers together
    Remote *serve_next_ = nullptr;                          // round robin: who acquires first
    std::atomic<bool> stage_kick_{false};                   // a staging copy ended (host thread)
    std::unordered_map<uint64_t, Op *> stage_ops_;          // our staged ops by request id
    uint64_t next_stage_id_ = 1;
    size_t stage_waiting_ = 0;  // our staged ops in Remote::stage_wait, all remotes
    Clock::time_point next_grant_scan_{};
};

}  // namespace ferry_efa
