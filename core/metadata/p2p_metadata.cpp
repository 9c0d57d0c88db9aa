// P2PHANDSHAKE metadata: the engine's control server serves its descriptor; fetching a peer's
// descriptor is a GET_DESCRIPTOR request to the control server named by the segment name
// (control_protocol.hpp), over an authenticated connection when the cluster has a secret.
#include <cerrno>

#include "control/control_client.hpp"
#include "control/control_protocol.hpp"
#include "control/control_server.hpp"
#include "metadata/metadata.hpp"
#include "util/log.hpp"
#include "util/socket_util.hpp"

namespace ferry {
namespace {

class P2PMetadata final : public MetadataBackend {
public:
    P2PMetadata(MetadataSettings settings, ControlServer &control, std::string secret)
        : settings_(std::move(settings)), control_(control), secret_(std::move(secret)), name_(control.address()) {}

    const std::string &segment_name() const override { return name_; }

    Result<void> publish(const SegmentDescriptor &descriptor) override {
        control_.publish(encode_descriptor(descriptor));
        return {};
    }

    bool serve_on_demand(DescriptorSource source) override {
        control_.serve_descriptor(std::move(source));
        return true;
    }

    Result<SegmentDescriptor> fetch(const std::string &segment_name) override {
        if (!parse_host_port(segment_name))
            return fail(-EINVAL, cat("segment name '", segment_name,
                                     "' is not ip:port; with P2PHANDSHAKE a segment is named by the "
                                     "address its engine listens on"));
        auto deadline = Clock::now() + settings_.timeout;
        auto context = [&](const Error &e) {
            return fail(e.code, cat("cannot fetch segment '", segment_name, "': ", e.message));
        };
        auto client =
            ControlClient::connect(segment_name, cat("segment '", segment_name, "'"), name_, secret_, deadline);
        if (!client) return context(client.error());
        auto bytes =
            client->call(control::kGetDescriptor,
                         {reinterpret_cast<const uint8_t *>(segment_name.data()), segment_name.size()}, deadline);
        if (!bytes) return context(bytes.error());
        auto d = decode_descriptor(*bytes);
        if (!d) return context(d.error());
        return d;
    }

private:
    MetadataSettings settings_;
    ControlServer &control_;
    std::string secret_;
    std::string name_;
};

}  // namespace

Result<std::unique_ptr<MetadataBackend>> make_metadata_backend(const MetadataSettings &settings, ControlServer &control,
                                                               const std::string &secret) {
    if (settings.url == "P2PHANDSHAKE" || settings.url.empty()) {
        std::unique_ptr<MetadataBackend> backend = std::make_unique<P2PMetadata>(settings, control, secret);
        return backend;
    }
    if (settings.url.rfind("etcd://", 0) == 0 || settings.url.rfind("etcds://", 0) == 0)
        return make_etcd_metadata(settings);
    // Redis and HTTP name segments by the control server's address unless told otherwise.
    if (settings.url.rfind("redis://", 0) == 0 || settings.url.rfind("rediss://", 0) == 0)
        return make_redis_metadata(settings, control.address());
    if (settings.url.rfind("http://", 0) == 0 || settings.url.rfind("https://", 0) == 0)
        return make_http_metadata(settings, control.address());
    return fail(-EPROTONOSUPPORT,
                cat("metadata server '", settings.url,
                    "' is not supported; use P2PHANDSHAKE, etcd://host:2379[,host:2379]/prefix, etcds:// (TLS), "
                    "redis://host:6379[/db] or http://host:8080/metadata (Mooncake's HTTP metadata server)"));
}

}  // namespace ferry
