// One client connection ("lane") to a peer: connection set-up with HELLO, pipelined
// WRITE_REQ / READ_REQ slices, in-order responses, failure and reconnect.
//
// State machine (loop thread only):
//   Down --work queued / start()--> Connecting --socket writable--> Hello --HELLO_ACK--> Ready
//   any state --error / EOF / timeout--> Down (every queued and in-flight slice fails)
//   any state --shutdown()--> Closed (final)
// A Down lane reconnects when new slices arrive, so a restarted peer becomes usable again.
#pragma once

#include "handshake.hpp"
#include "op.hpp"
#include "reactor.hpp"
#include "splice_pipe.hpp"
#include "tx.hpp"
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

class Lane final : public Handler, private TxSource {
public:
    using Batch = std::list<std::vector<Slice>>;

    Lane(Peer &peer, Reactor &reactor, unsigned index);
    ~Lane() override;

    Reactor &reactor() { return reactor_; }

    // ---- any thread (submit, under the peer's submit mutex) ----
    // Splices a prepared one-element batch in and kicks the reactor. Never throws.
    void push(Batch &batch) noexcept;
    // Bytes queued or in flight: the least-loaded lane gets the next slice.
    uint64_t load() const { return load_.load(std::memory_order_relaxed); }
    void add_load(uint64_t n) { load_.fetch_add(n, std::memory_order_relaxed); }

    // ---- loop thread ----
    void start();                                       // first connect
    void shutdown(int status, const std::string &why);  // fail everything, close for good

    void on_events(uint32_t events) override;
    void on_kick() override;
    bool on_timer(Clock::time_point now) override;
    void on_ready() override { progress(); }

private:
    enum class State { Down, Connecting, Hello, Ready, Closed };
    enum class Rx { Header, Payload, Message };

    void connect_now();
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
    const unsigned index_;
    std::atomic<uint64_t> load_{0};

    std::mutex in_mu_;
    Batch incoming_;  // guarded by in_mu_

    // Loop thread only from here on.
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
