// Serving side: the listening socket and the connections peers opened to this instance.
// Every request is checked against the region table before a byte of memory is touched.
#pragma once

#include "conn_limits.hpp"
#include "handshake.hpp"
#include "options.hpp"
#include "plugin_util.hpp"
#include "rate_limited_log.hpp"
#include "reactor.hpp"
#include "region_table.hpp"
#include "splice_pipe.hpp"
#include "tx.hpp"
#include "wire.hpp"

#include "staged_device.hpp"

#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace ferry_tcp {

struct ServerContext {
    const Config &cfg;
    const Logger &log;
    RegionTable &regions;
    ConnLimits &limits;
    RateLimitedLog &peer_log;      // what peers cause: bad connections, refused requests
    ferry_staged::Stager &stager;  // device regions (server_staged.cpp)
};

// How the listener admitted a connection (conn_limits.hpp).
struct Admission {
    std::string ip;        // the peer's address, the key of the per-address caps
    bool refused = false;  // over a cap: answer the HELLO with an ERROR, then close
    std::string refusal;   // the ERROR message
};

class ServerConn final : public Handler, private TxSource {
public:
    ServerConn(ServerContext &ctx, Reactor &reactor, int fd, std::string peer_name, Admission admission);
    ~ServerConn() override;  // releases region references and its admission slot, closes the socket

    int start();  // registers with the reactor; 0 or -errno

    void on_events(uint32_t events) override;
    bool on_timer(Clock::time_point now) override;
    void on_ready() override { progress(); }
    void on_kick() override;  // a staging copy ended (server_staged.cpp)

private:
    enum class Rx { Header, Payload, Drain, Handshake, Staged };
    struct Resp {
        uint8_t hdr[kHeaderSize];
        uint64_t id = 0;
        const uint8_t *data = nullptr;  // READ_RESP payload, or the ERROR message
        size_t len = 0;
        Region *ref = nullptr;    // held until sent, or until READ_DONE when needs_done
        bool by_ref = false;      // payload spliced by reference
        bool needs_done = false;  // sent with kFlagNeedsDone
        std::string msg;
        // Staged READ_RESP of device memory (server_staged.cpp): one item per staging slice, the
        // first with the header, the others continuing its payload from their own buffers.
        ferry_staged::SlicePtr slice;
        bool head = true;              // has a header (false: a continuation item)
        bool ready = true;             // false until its slice is copied (or its ack decided)
        bool dead = false;             // its request failed before a byte of it was sent: skipped
        bool in_staged = false;        // listed in staged_
        bool staged = false;           // counted in staged_in_out_
        uint32_t group = 0;            // head of a request sent all-or-nothing: its items
        uint64_t dev_addr = 0;         // device address of this item's bytes
        Region *dev_region = nullptr;  // for the item's slice (a reference per slice)
    };
    // A WRITE into device memory: its payload is received into slices copied to the device;
    // acknowledged (or refused) once every copy ended.
    struct StagedWrite {
        Resp *ack = nullptr;  // placeholder in out_
        std::vector<ferry_staged::SlicePtr> slices;
        bool received = false;
        int status = 0;
        std::string why;
    };
    struct Awaiting {
        uint64_t id;
        Region *ref;
    };

    size_t tx_count() const override;
    TxItem tx_item(size_t i) const override;
    bool on_read_done(const Header &h);

    void progress();
    ssize_t do_send();
    ssize_t do_recv();
    bool on_header();  // false: the connection was closed
    ssize_t read_request_run();
    void queue(uint8_t type, uint64_t id, int status, uint64_t length, uint8_t flags = 0);
    void queue_error(uint64_t id, int status, const std::string &msg);
    void queue_data(uint8_t type, uint8_t flags, const uint8_t *data, uint32_t len);
    bool on_handshake_header();                       // before AUTH_ACK: HELLO or AUTH
    void on_handshake_data();                         // their data arrived in hs_
    void refuse(int status, const std::string &why);  // ERROR, then close once it is sent
    void close_conn(int level, const std::string &why);
    bool busy() const;
    bool can_read() const;

    // ---- device regions (server_staged.cpp) ----
    bool stage_read(const Header &h, Region *r);   // queues the items of a READ_REQ
    void stage_write(const Header &h, Region *r);  // a WRITE_REQ: rx_ = Staged
    bool stage_rx_slice();                         // a buffer for the next payload bytes
    void stage_rx_filled();                        // the buffer is full: copy it to the device
    void stage_rx_done();                          // the payload is in
    void stage_progress();                         // feed copies, mark items ready, acks
    bool stage_feed_pack();                        // small READs at feed_ share one buffer
    uint64_t stage_pack_max() const;               // largest request packed (0: none)
    void stage_flush_pack();                       // the packed WRITEs' copy to the device
    void stage_fail_read(Resp *head, int code, const std::string &why);
    void stage_release(Resp &r);  // its slice back; it leaves out_
    void stage_pop();             // staged_.front() is decided
    static void make_error(Resp &r, int status, const std::string &msg);
    ferry_staged::SlicePtr stage_take(Region *r, uint64_t off, uint64_t len, int *code, std::string *why, bool *wait);
    ferry_staged::StageWindow &window();
    void stage_teardown();
    bool stage_busy() const;

    ServerContext &ctx_;
    Reactor &reactor_;
    int fd_;
    const std::string name_;
    const Admission adm_;
    bool established_ = false;  // holds an established slot instead of a handshake slot
    Clock::time_point handshake_deadline_{};
    bool hello_done_ = false;     // authenticated: requests are served
    bool awaiting_auth_ = false;  // HELLO_ACK sent, AUTH next
    bool client_has_key_ = false;
    uint8_t hs_[kHelloData > kAuthData ? kHelloData : kAuthData] = {};  // handshake data
    uint8_t client_nonce_[kNonceSize] = {};
    uint8_t server_nonce_[kNonceSize] = {};
    bool closing_ = false;  // close once the queued responses are sent
    bool closed_ = false;
    bool readable_ = false;
    bool writable_ = false;
    bool hup_ = false;
    int lowat_ = 1;  // SO_RCVLOWAT currently set

    Rx rx_ = Rx::Header;
    uint8_t last_type_ = 0;  // type of the last request
    uint8_t hdr_[kHeaderSize] = {};
    size_t hdr_got_ = 0;
    Header cur_;
    uint8_t *dst_ = nullptr;
    uint64_t left_ = 0;
    Region *cur_ref_ = nullptr;  // region a WRITE payload is being received into
    int drain_status_ = 0;
    std::string drain_why_;
    std::vector<uint8_t> scratch_;  // sink for refused WRITE payloads

    std::deque<Resp> out_;
    TxCursor tx_;                    // position inside out_.front()
    SplicePipe pipe_;                // zero-copy READ_RESP payloads
    std::deque<Awaiting> awaiting_;  // by-reference READ_RESPs not yet reported consumed

    // ---- device regions ----
    struct FdCloser {
        int fd = -1;
        ~FdCloser();
    };
    std::unique_ptr<ferry_staged::StageWindow> window_;
    std::shared_ptr<FdCloser> fd_keeper_;  // the socket closes once no staging copy runs
    std::deque<Resp *> staged_;            // staged READ items not yet ready, in order
    size_t feed_ = 0;                      // staged_[feed_] is the next item without a slice
    size_t staged_in_out_ = 0;             // staged items in out_ (tx_count scans only then)
    std::deque<StagedWrite> writes_;
    ferry_staged::SlicePtr rx_slice_;  // WRITE payload bytes go here
    uint8_t *rx_base_ = nullptr;       // at rx_base_ (rx_len_ bytes) of its buffer
    uint64_t rx_len_ = 0;
    uint64_t rx_slice_got_ = 0;
    bool rx_in_pack_ = false;  // rx_slice_ is pack_: this request's part of it
    // Small WRITEs received back to back share one buffer (pack_), copied to the device in one
    // host copy once it is full, another kind of request comes, or nothing more is to be read.
    ferry_staged::SlicePtr pack_;
    Region *pack_region_ = nullptr;
    std::vector<ferry_stage_part_t> pack_parts_;
    std::vector<StagedWrite *> pack_writes_;  // writes_ keeps its elements in place (a deque)
    uint64_t pack_end_ = 0;
    uint64_t rx_dev_ = 0;      // device address of the next WRITE payload byte
    bool stage_wait_ = false;  // receiving waits for a staging buffer
    bool stage_hold_ = false;  // a run of requests is being read: their copies start after it
    Clock::time_point last_progress_{};
};

}  // namespace ferry_tcp
