// One client connection ("lane") to a peer: connection set-up with HELLO, pipelined
// WRITE_REQ / READ_REQ slices, in-order responses, failure and reconnect.
//
// State machine (under mu_, normally on the loop thread):
//   Down --work queued / start()--> Connecting --socket writable--> Hello --HELLO_ACK--> Ready
//   any state --error / EOF / timeout--> Down (every queued and in-flight slice fails)
//   any state --shutdown()--> Closed (final)
// A Down lane reconnects when new slices arrive, so a restarted peer becomes usable again.
//
// Small ops skip the reactor thread (two wake-ups of other CPUs per batch fewer): a Ready lane
// that carries only small ops is in waiter mode. Its socket is in the transport's WaitSet
// (the host's completion fd) instead of the reactor's read interest, so the host thread
// waiting for completions wakes on the responses and parses them itself (receive_now), and a
// submitting thread sends a small batch itself when the lane is idle (send_now). Exactly one
// thread at a time touches the lane's state: mu_ is held by whoever drives it (reactor,
// submitter or waiter), so responses are parsed by one reader, in order, and a byte lands in
// an op's memory only while that op is at the front of the queue, never after it failed. The
// reactor keeps the timers (op timeouts; it also reads what no host polled for, once a tick),
// hang-ups and blocked sends, and leaves waiter mode for large ops and after a second idle.
#pragma once

#include "handshake.hpp"
#include "op.hpp"
#include "rail_tally.hpp"
#include "reactor.hpp"
#include "splice_pipe.hpp"
#include "tx.hpp"
#include "wait_set.hpp"
#include "wire.hpp"

#include <atomic>
#include <cstdint>
#include <deque>
#include <list>
#include <mutex>
#include <string>
#include <vector>

namespace ferry_tcp {

class Peer;

// READ payloads up to this size are received into the lane's run buffer and copied out (one
// recv for many responses); larger ones go straight from the socket into local memory.
inline constexpr uint64_t kSmallPayload = 16 * 1024;
inline constexpr size_t kRxBuf = 64 * 1024;
// A batch whose slices are all small and that holds at most this many bytes may be sent by the
// submitting thread itself (send_now).
inline constexpr uint64_t kSendNowMax = 64 * 1024;

class Lane final : public Handler, private TxSource {
public:
    using Batch = std::list<std::vector<Slice>>;

    Lane(Peer &peer, Reactor &reactor, WaitSet &waiters, unsigned index, unsigned rail);
    ~Lane() override;

    Reactor &reactor() { return reactor_; }
    unsigned rail() const { return rail_; }
    const Endpoint &remote() const;  // the address this lane connects to (its rail's)
    // Bytes of slices that completed successfully (Peer::sample_rates measures rails with it).
    uint64_t done_bytes() const { return counts_->done_bytes(); }

    // ---- any thread (submit, under the peer's submit mutex) ----
    // Splices a prepared one-element batch in and kicks the reactor. Never throws.
    void push(Batch &batch) noexcept;
    // Bytes queued or in flight: the least-loaded lane gets the next slice.
    uint64_t load() const { return load_.load(std::memory_order_relaxed); }
    void add_load(uint64_t n) { load_.fetch_add(n, std::memory_order_relaxed); }
    // Sends small slices from this thread when the lane is in waiter mode, idle and not held
    // by another thread (never waits for it). True: the lane took them (sent, or queued behind
    // a full socket for the reactor); completions of a failure are appended to `done`. False:
    // nothing changed, push() them.
    bool send_now(std::vector<Slice> &slices, std::vector<ferry_completion_t> &done) noexcept;
    // The host's poll(): parses the responses waiting on a waiter-mode lane (skipped when
    // another thread holds the lane); completions are appended to `done`.
    void receive_now(std::vector<ferry_completion_t> &done) noexcept;

    // ---- loop thread ----
    void start();                                       // first connect
    void shutdown(int status, const std::string &why);  // fail everything, close for good

    void on_events(uint32_t events) override;
    void on_kick() override;
    bool on_timer(Clock::time_point now) override;
    void on_ready() override;

private:
    enum class State { Down, Connecting, Hello, Ready, Closed };
    enum class Rx { Header, Payload, Message };

    // Holds mu_ and points completions at `sink` for the scope.
    class Held {
    public:
        Held(Lane &l, std::vector<ferry_completion_t> &sink) : l_(l), lk_(l.mu_) { l.sink_ = &sink; }
        ~Held() { l_.sink_ = nullptr; }
        Held(const Held &) = delete;
        Held &operator=(const Held &) = delete;

    private:
        Lane &l_;
        std::lock_guard<std::mutex> lk_;
    };

    void connect_now();
    void stamp(Slice &s);  // request id and header
    static bool is_small(const Slice &s) { return s.len <= kSmallPayload; }
    void enter_waiter();
    void leave_waiter();
    void fail(int status, const std::string &why, State next = State::Down);
    void protocol_error(const std::string &what);
    void take_incoming();
    void progress();
    bool has_output() const;
    // Transmit path (lane_send.cpp): bytes sent, 0 when it would block, -1 when the lane failed.
    ssize_t do_send();
    ssize_t send_done();
    ssize_t send_failed(int e);
    size_t tx_count() const override;
    TxItem tx_item(size_t i) const override;
    // Receive path (lane_recv.cpp).
    ssize_t do_recv();  // bytes received, 0 when it would block, -1 when the lane failed
    size_t run_bytes() const;
    bool consume(const uint8_t *p, size_t n);
    void payload_done();
    bool on_header();
    bool on_message_done();
    bool on_hello_ack();  // HELLO_ACK's data is in msg_: check the server, queue AUTH
    void complete_front(int status, const char *message);
    bool needs_timer() const;

    Peer &peer_;
    Reactor &reactor_;
    WaitSet &waiters_;
    const unsigned index_;
    const unsigned rail_;
    std::atomic<uint64_t> load_{0};
    RailTally::LaneCounts *const counts_;  // its local rail's share of what it completed (rail_stats)

    std::mutex in_mu_;
    Batch incoming_;  // guarded by in_mu_

    // Guarded by mu_ from here on (held by the loop thread's callbacks, send_now, receive_now).
    std::mutex mu_;
    std::vector<ferry_completion_t> *sink_ = nullptr;  // where finished slices go (Held)
    bool waiter_ = false;                              // waiter mode: fd_ is in waiters_
    State state_ = State::Down;
    int fd_ = -1;
    bool readable_ = false;
    bool writable_ = false;
    bool hup_ = false;  // the peer hung up or the socket has an error: read until EOF
    int lowat_ = 1;     // SO_RCVLOWAT currently set
    uint64_t next_id_ = 1;
    std::deque<Slice> q_;  // in send order; [0, send_idx_) fully sent and awaiting a response
    size_t send_idx_ = 0;  // first slice not fully committed to the stream
    TxCursor tx_;          // position inside q_[send_idx_]
    // READ_DONE owed to the server for READ_RESPs it sent by reference (wire.hpp).
    uint64_t done_count_ = 0;
    uint64_t done_last_id_ = 0;
    uint8_t done_hdr_[kHeaderSize] = {};
    size_t done_off_ = kHeaderSize;  // bytes of done_hdr_ sent
    SplicePipe pipe_;                // zero-copy WRITE payloads (splice_pipe.hpp)
    // Handshake (handshake.hpp): HELLO, then AUTH once HELLO_ACK arrived; hello_[hello_off_,
    // hello_len_) is still to be sent.
    uint8_t hello_[kHeaderSize + kHelloData] = {};
    size_t hello_len_ = 0;
    size_t hello_off_ = 0;
    bool auth_sent_ = false;
    uint8_t client_nonce_[kNonceSize] = {};
    std::string auth_problem_;  // the server failed to prove the key: reported once it answers AUTH

    Rx rx_ = Rx::Header;
    uint8_t hdr_[kHeaderSize] = {};
    size_t hdr_got_ = 0;
    Header cur_;
    uint8_t *payload_dst_ = nullptr;
    uint64_t payload_left_ = 0;
    char msg_[kMaxErrorMsg + 1] = {};
    uint32_t msg_got_ = 0;
    std::vector<uint8_t> rxbuf_;  // runs of small responses arrive in one recv (lane_recv.cpp)

    Clock::time_point connect_start_{};
    Clock::time_point last_progress_{};
};

}  // namespace ferry_tcp
