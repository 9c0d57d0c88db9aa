// P2PHANDSHAKE metadata: a small server thread answers "send me your descriptor" requests.
//
// Request:  magic u32 | version u16 | type u16 | length u32 | segment name (length bytes)
// Response: magic u32 | version u16 | status u16 (errno, 0 = ok) | length u32 | payload
//           payload = encoded descriptor, or an error message when status != 0
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>

#include "byte_codec.hpp"
#include "log.hpp"
#include "metadata.hpp"
#include "socket_util.hpp"

namespace ferry {
namespace {

constexpr size_t kMaxRequestName = 4096;

std::vector<uint8_t> frame(uint16_t type_or_status, std::span<const uint8_t> payload) {
    ByteWriter w;
    w.u32(kHandshakeMagic);
    w.u16(kHandshakeVersion);
    w.u16(type_or_status);
    w.u32(static_cast<uint32_t>(payload.size()));
    auto out = w.take();
    out.insert(out.end(), payload.begin(), payload.end());
    return out;
}

struct FrameHeader {
    uint32_t magic = 0;
    uint16_t version = 0;
    uint16_t code = 0;
    uint32_t length = 0;
};

FrameHeader parse_header(std::span<const uint8_t, kHandshakeHeaderBytes> bytes) {
    ByteReader r(bytes);
    FrameHeader h;
    r.u32(h.magic);
    r.u16(h.version);
    r.u16(h.code);
    r.u32(h.length);
    return h;
}

class P2PMetadata final : public MetadataBackend {
public:
    P2PMetadata(MetadataSettings settings, Fd listener, std::string name)
        : settings_(std::move(settings)), listener_(std::move(listener)), name_(std::move(name)),
          stop_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
        server_ = std::thread([this] { serve(); });
    }

    ~P2PMetadata() override {
        uint64_t one = 1;
        [[maybe_unused]] auto n = ::write(stop_.get(), &one, sizeof one);
        if (server_.joinable()) server_.join();
    }

    const std::string &segment_name() const override { return name_; }

    Result<void> publish(const SegmentDescriptor &descriptor) override {
        auto bytes = encode_descriptor(descriptor);
        std::lock_guard lock(mutex_);
        published_ = std::move(bytes);
        return {};
    }

    Result<SegmentDescriptor> fetch(const std::string &segment_name) override {
        auto where = parse_host_port(segment_name);
        if (!where)
            return fail(-EINVAL, cat("segment name '", segment_name,
                                     "' is not ip:port; with P2PHANDSHAKE a segment is named by the "
                                     "address its engine listens on"));
        auto deadline = Clock::now() + settings_.timeout;
        auto context = [&](const Error &e) {
            return fail(e.code, cat("cannot fetch segment '", segment_name, "': ", e.message));
        };
        auto fd = connect_tcp(*where, deadline);
        if (!fd) return context(fd.error());
        auto request = frame(kHandshakeGetDescriptor,
                             {reinterpret_cast<const uint8_t *>(segment_name.data()), segment_name.size()});
        if (auto w = write_all(fd->get(), request, deadline); !w) return context(w.error());
        std::array<uint8_t, kHandshakeHeaderBytes> head{};
        if (auto r = read_all(fd->get(), head, deadline); !r) return context(r.error());
        FrameHeader h = parse_header(head);
        if (h.magic != kHandshakeMagic)
            return fail(-EPROTO, cat("'", segment_name, "' did not answer as a Ferry engine (bad magic)"));
        if (h.version != kHandshakeVersion)
            return fail(-EPROTONOSUPPORT, cat("'", segment_name, "' speaks handshake version ", h.version,
                                              ", this Ferry speaks ", kHandshakeVersion));
        if (h.length > kMaxDescriptorBytes)
            return fail(-EPROTO, cat("'", segment_name, "' announced a ", h.length, "-byte descriptor; refused"));
        std::vector<uint8_t> payload(h.length);
        if (auto r = read_all(fd->get(), payload, deadline); !r) return context(r.error());
        if (h.code != 0)
            return fail(-static_cast<int>(h.code),
                        cat("segment '", segment_name, "' refused: ", std::string(payload.begin(), payload.end())));
        auto d = decode_descriptor(payload);
        if (!d) return context(d.error());
        return d;
    }

private:
    void serve() {
        for (;;) {
            pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
            int n = ::poll(fds, 2, -1);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0 || (fds[1].revents & POLLIN)) return;
            if (!(fds[0].revents & POLLIN)) continue;
            Fd client(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
            if (!client) continue;
            answer(client.get());
        }
    }

    // One request per connection, bounded in size and time so a bad peer cannot stall us long.
    void answer(int fd) {
        auto deadline = Clock::now() + std::chrono::seconds(2);
        std::array<uint8_t, kHandshakeHeaderBytes> head{};
        if (!read_all(fd, head, deadline)) return;
        FrameHeader h = parse_header(head);
        auto refuse = [&](int code, const std::string &why) {
            FERRY_LOG(Warn, "handshake", "refused a request: ", why);
            auto reply = frame(static_cast<uint16_t>(code), {reinterpret_cast<const uint8_t *>(why.data()), why.size()});
            (void)write_all(fd, reply, deadline);
        };
        if (h.magic != kHandshakeMagic) return refuse(EPROTO, "bad magic: not a Ferry handshake");
        if (h.version != kHandshakeVersion)
            return refuse(EPROTONOSUPPORT, cat("handshake version ", h.version, " not supported (this engine speaks ",
                                               kHandshakeVersion, ")"));
        if (h.code != kHandshakeGetDescriptor) return refuse(EOPNOTSUPP, cat("unknown request type ", h.code));
        if (h.length > kMaxRequestName) return refuse(EPROTO, "request too long");
        std::vector<uint8_t> name(h.length);
        if (!read_all(fd, name, deadline)) return;
        std::vector<uint8_t> reply;
        {
            std::lock_guard lock(mutex_);
            reply = frame(0, published_);
        }
        (void)write_all(fd, reply, deadline);
    }

    MetadataSettings settings_;
    Fd listener_;
    std::string name_;
    Fd stop_;
    std::mutex mutex_;
    std::vector<uint8_t> published_;
    std::thread server_;
};

} // namespace

Result<std::unique_ptr<MetadataBackend>> make_metadata_backend(const MetadataSettings &settings) {
    if (settings.url == "P2PHANDSHAKE" || settings.url.empty()) {
        auto listener = listen_tcp(settings.local_ip, settings.rpc_port);
        if (!listener) return fail(listener.error().code, "metadata handshake server: " + listener.error().message);
        uint16_t port = bound_port(listener->get());
        std::string host = settings.local_ip.find(':') != std::string::npos ? "[" + settings.local_ip + "]" : settings.local_ip;
        std::string name = cat(host, ":", port);
        std::unique_ptr<MetadataBackend> backend =
            std::make_unique<P2PMetadata>(settings, std::move(*listener), std::move(name));
        return backend;
    }
    if (settings.url.rfind("etcd://", 0) == 0) return make_etcd_metadata(settings);
    return fail(-EPROTONOSUPPORT, cat("metadata server '", settings.url,
                                      "' is not supported; use P2PHANDSHAKE or etcd://host:2379[,host:2379]/prefix"));
}

} // namespace ferry
