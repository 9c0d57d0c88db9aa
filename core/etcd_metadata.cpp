// etcd metadata backend over etcd's v3 JSON gateway (libcurl).
//
// Key layout: <prefix>/segments/<segment name> -> the encoded segment descriptor, attached to a
// lease the engine keeps alive, so a crashed engine's segment disappears after the lease TTL.
// A watch on <prefix>/segments/ tells the engine when a peer re-registers (restart with new
// endpoints or keys), so cached descriptors are re-read. If etcd goes away and comes back (a
// restart loses leases), the keep-alive loop registers the segment again.
#include <unistd.h>

#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>

#include <cerrno>
#include <condition_variable>
#include <mutex>
#include <sstream>
#include <thread>

#include "base64.hpp"
#include "http_client.hpp"
#include "log.hpp"
#include "metadata.hpp"

namespace ferry {
namespace {

namespace pt = boost::property_tree;

Result<pt::ptree> parse_json(const std::string &text) {
    try {
        std::istringstream in(text);
        pt::ptree tree;
        pt::read_json(in, tree);
        return tree;
    } catch (const pt::json_parser_error &e) {
        return fail(-EPROTO, cat("etcd answered with malformed JSON: ", e.what()));
    }
}

std::string prefix_end(std::string key) {
    // The smallest key greater than every key starting with `key`.
    while (!key.empty() && static_cast<unsigned char>(key.back()) == 0xff) key.pop_back();
    if (!key.empty()) key.back() = static_cast<char>(key.back() + 1);
    return key;
}

class EtcdMetadata final : public MetadataBackend {
public:
    EtcdMetadata(MetadataSettings settings, std::vector<std::string> endpoints, std::string prefix, std::string name)
        : settings_(std::move(settings)), endpoints_(std::move(endpoints)), prefix_(std::move(prefix)),
          name_(std::move(name)), key_(prefix_ + "/segments/" + name_) {}

    ~EtcdMetadata() override {
        {
            std::lock_guard lock(mutex_);
            stop_ = true;
        }
        watch_stop_ = true;
        stop_cv_.notify_all();
        if (keepalive_.joinable()) keepalive_.join();
        if (watch_.joinable()) watch_.join();
        // Leave at once on a clean shutdown instead of waiting for the lease to run out.
        std::lock_guard lock(mutex_);
        if (lease_ != 0) (void)call(client_, "/v3/lease/revoke", cat("{\"ID\":\"", lease_, "\"}"));
    }

    // Registers with retries: an engine may start while etcd is briefly unreachable.
    Result<void> start() {
        auto deadline = std::chrono::steady_clock::now() + settings_.retry_for;
        auto backoff = std::chrono::milliseconds(100);
        for (;;) {
            auto r = [&]() -> Result<void> {
                std::lock_guard lock(mutex_);
                return grant_locked(client_);
            }();
            if (r) break;
            if (std::chrono::steady_clock::now() + backoff > deadline)
                return fail(r.error().code, cat("etcd metadata: cannot reach etcd (", r.error().message, ") after ",
                                                settings_.retry_for.count(), " ms; check the etcd:// address and that etcd runs"));
            FERRY_LOG(Warn, "etcd", "etcd unreachable (", r.error().message, "); retrying in ", backoff.count(), " ms");
            std::this_thread::sleep_for(backoff);
            backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
        }
        keepalive_ = std::thread([this] { keepalive_loop(); });
        watch_ = std::thread([this] { watch_loop(); });
        return {};
    }

    const std::string &segment_name() const override { return name_; }

    Result<void> publish(const SegmentDescriptor &descriptor) override {
        std::lock_guard lock(mutex_);
        descriptor_ = encode_descriptor(descriptor);
        auto r = put_locked(client_);
        if (!r) {
            // The keep-alive loop puts it as soon as etcd answers again.
            dirty_ = true;
            FERRY_LOG(Warn, "etcd", "publishing segment ", name_, " failed (", r.error().message, "); will retry");
        }
        return {};
    }

    Result<SegmentDescriptor> fetch(const std::string &name) override {
        std::string value;
        {
            std::lock_guard lock(mutex_);
            auto body = call(client_, "/v3/kv/range", cat("{\"key\":\"", base64_encode(prefix_ + "/segments/" + name), "\"}"));
            if (!body) return fail(body.error().code, cat("cannot fetch segment '", name, "' from etcd: ", body.error().message));
            auto tree = parse_json(*body);
            if (!tree) return std::unexpected(tree.error());
            auto kvs = tree->get_child_optional("kvs");
            if (!kvs || kvs->empty())
                return fail(-ENOENT, cat("segment '", name, "' is not registered in etcd under ", prefix_,
                                         "/segments/ (not started yet, or its engine died and its lease expired)"));
            value = kvs->front().second.get<std::string>("value", "");
        }
        auto bytes = base64_decode(value);
        if (!bytes) return fail(-EPROTO, cat("segment '", name, "' in etcd holds a value that is not base64"));
        return decode_descriptor(*bytes);
    }

    void on_change(std::function<void(const std::string &)> listener) override {
        std::lock_guard lock(listener_mutex_);
        listener_ = std::move(listener);
    }

private:
    // Tries every endpoint, starting with the one that answered last.
    Result<std::string> call(HttpClient &client, const std::string &path, const std::string &body) {
        Error last{-ECONNREFUSED, "no etcd endpoint"};
        for (size_t k = 0; k < endpoints_.size(); ++k) {
            size_t i = (good_endpoint_ + k) % endpoints_.size();
            auto r = client.post(endpoints_[i] + path, body, settings_.timeout);
            if (r) {
                good_endpoint_ = i;
                return r;
            }
            last = r.error();
        }
        return std::unexpected(last);
    }

    Result<void> grant_locked(HttpClient &client) {
        auto body = call(client, "/v3/lease/grant", cat("{\"TTL\":", settings_.lease_ttl_s, "}"));
        if (!body) return std::unexpected(body.error());
        auto tree = parse_json(*body);
        if (!tree) return std::unexpected(tree.error());
        lease_ = std::strtoll(tree->get<std::string>("ID", "0").c_str(), nullptr, 10);
        if (lease_ == 0) return fail(-EPROTO, "etcd granted no lease: " + body->substr(0, 200));
        return {};
    }

    Result<void> put_locked(HttpClient &client) {
        if (descriptor_.empty()) return {};
        auto r = call(client, "/v3/kv/put",
                      cat("{\"key\":\"", base64_encode(key_), "\",\"value\":\"", base64_encode(descriptor_), "\",\"lease\":\"",
                          lease_, "\"}"));
        if (!r) return std::unexpected(r.error());
        dirty_ = false;
        return {};
    }

    void keepalive_loop() {
        HttpClient client;
        bool outage = false;
        std::unique_lock lock(mutex_);
        auto period = std::chrono::milliseconds(std::max(200, settings_.lease_ttl_s * 1000 / 3));
        while (!stop_cv_.wait_for(lock, period, [&] { return stop_; })) {
            // Publishing and fetching go on while this request waits on a slow etcd.
            std::string request = cat("{\"ID\":\"", lease_, "\"}");
            lock.unlock();
            auto alive = call(client, "/v3/lease/keepalive", request);
            lock.lock();
            if (stop_) break;
            bool expired = false;
            if (alive) {
                auto tree = parse_json(*alive);
                // An expired or unknown lease (etcd restarted, or we were cut off past the TTL)
                // comes back without a TTL.
                expired = !tree || tree->get<int64_t>("result.TTL", 0) <= 0;
            }
            if (!alive) {
                if (!outage) FERRY_LOG(Warn, "etcd", "etcd unreachable (", alive.error().message, "); will re-register segment ", name_, " when it answers");
                outage = true;
                continue;
            }
            if (expired) {
                // A fresh lease first; until it is granted the old one keeps reading as expired.
                if (auto g = grant_locked(client); !g) {
                    FERRY_LOG(Warn, "etcd", "re-registering segment ", name_, " failed: ", g.error().message);
                    continue;
                }
                dirty_ = true; // the put must follow, however many tries it takes
            }
            if (dirty_) {
                if (auto r = put_locked(client); !r) {
                    FERRY_LOG(Warn, "etcd", "re-registering segment ", name_, " failed: ", r.error().message);
                    continue;
                }
                FERRY_LOG(Info, "etcd", "segment ", name_, " registered again in etcd", expired ? " (its lease had expired)" : "");
            }
            if (outage) FERRY_LOG(Info, "etcd", "etcd reachable again");
            outage = false;
        }
    }

    void watch_loop() {
        HttpClient client;
        const std::string dir = prefix_ + "/segments/";
        const std::string body = cat("{\"create_request\":{\"key\":\"", base64_encode(dir), "\",\"range_end\":\"",
                                     base64_encode(prefix_end(dir)), "\"}}");
        std::string pending;
        auto on_data = [&](std::string_view chunk) {
            pending.append(chunk);
            size_t nl;
            while ((nl = pending.find('\n')) != std::string::npos) {
                std::string line = pending.substr(0, nl);
                pending.erase(0, nl + 1);
                auto tree = parse_json(line);
                if (!tree) continue;
                auto events = tree->get_child_optional("result.events");
                if (!events) continue;
                for (auto &[_, ev] : *events) {
                    auto key = base64_decode(ev.get<std::string>("kv.key", ""));
                    if (!key) continue;
                    std::string name(key->begin(), key->end());
                    if (name.compare(0, dir.size(), dir) != 0) continue;
                    name = name.substr(dir.size());
                    if (name == name_) continue;
                    FERRY_LOG(Debug, "etcd", "segment ", name, " changed in etcd");
                    std::lock_guard l(listener_mutex_);
                    if (listener_) listener_(name);
                }
            }
        };
        auto backoff = std::chrono::milliseconds(200);
        while (!stopping()) {
            pending.clear();
            for (size_t i = 0; i < endpoints_.size() && !stopping(); ++i) {
                auto r = client.stream(endpoints_[i] + "/v3/watch", body, watch_stop_, on_data);
                if (!r) FERRY_LOG(Debug, "etcd", "watch ended: ", r.error().message);
            }
            std::unique_lock lock(mutex_);
            stop_cv_.wait_for(lock, backoff, [&] { return stop_; });
            backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
        }
    }

    bool stopping() {
        std::lock_guard lock(mutex_);
        watch_stop_ = stop_;
        return stop_;
    }

    MetadataSettings settings_;
    std::vector<std::string> endpoints_;
    std::string prefix_;
    std::string name_;
    std::string key_;

    std::mutex mutex_; // client_, lease_, descriptor_, dirty_, stop_, good_endpoint_
    std::condition_variable stop_cv_;
    HttpClient client_;
    int64_t lease_ = 0;
    std::vector<uint8_t> descriptor_;
    bool dirty_ = false;
    bool stop_ = false;
    std::atomic<bool> watch_stop_{false};
    std::atomic<size_t> good_endpoint_{0};

    std::mutex listener_mutex_;
    std::function<void(const std::string &)> listener_;

    std::thread keepalive_;
    std::thread watch_;
};

} // namespace

// etcd://host:2379[,host:2379...]/prefix
Result<std::unique_ptr<MetadataBackend>> make_etcd_metadata(const MetadataSettings &settings) {
    std::string rest = settings.url.substr(std::string("etcd://").size());
    auto slash = rest.find('/');
    std::string hosts = rest.substr(0, slash);
    std::string prefix = slash == std::string::npos ? "" : rest.substr(slash + 1);
    while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
    if (prefix.empty()) prefix = "ferry";
    prefix = "/" + prefix;
    std::vector<std::string> endpoints;
    std::istringstream in(hosts);
    for (std::string h; std::getline(in, h, ',');)
        if (!h.empty()) endpoints.push_back("http://" + h);
    if (endpoints.empty())
        return fail(-EINVAL, cat("metadata '", settings.url, "' names no etcd endpoint; use etcd://host:2379[,host:2379]/prefix"));
    std::string name = settings.local_server_name;
    if (name.empty()) {
        char host[256] = "host";
        gethostname(host, sizeof host - 1);
        name = cat(host, ":", getpid());
    }
    auto backend = std::make_unique<EtcdMetadata>(settings, std::move(endpoints), std::move(prefix), std::move(name));
    if (auto r = backend->start(); !r) return std::unexpected(r.error());
    return std::unique_ptr<MetadataBackend>(std::move(backend));
}

} // namespace ferry
