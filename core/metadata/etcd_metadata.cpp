// etcd metadata backend over etcd's v3 JSON gateway (libcurl).
//
// Key layout: <prefix>/segments/<segment name> -> the segment descriptor's header, and its regions
// in chunk keys after it (descriptor_parts.hpp: a register rewrites one chunk and the header in
// one transaction; a fetch reads them at one revision), all attached to a lease the engine keeps
// alive, so a crashed engine's segment disappears after the lease TTL.
// A watch on <prefix>/segments/ tells the engine when a peer re-registers (restart with new
// endpoints or keys), so cached descriptors are re-read. If etcd goes away and comes back (a
// restart loses leases), the keep-alive loop registers the segment again. TLS and etcd's
// user/password authentication are EtcdClient's (etcd_client.hpp).
#include <unistd.h>
#include <atomic>

#include <cerrno>
#include <condition_variable>
#include <mutex>
#include <sstream>
#include <thread>

#include "metadata/descriptor_parts.hpp"
#include "metadata/etcd_client.hpp"
#include "metadata/etcd_json.hpp"
#include "metadata/metadata.hpp"
#include "metadata/metadata_retry.hpp"
#include "util/base64.hpp"
#include "util/log.hpp"

namespace ferry {
namespace {

using etcd_json::bool_or;
using etcd_json::int_or;
using etcd_json::Request;
using etcd_json::string_at;
using etcd_json::string_or;

std::string prefix_end(std::string key) {
    // The smallest key greater than every key starting with `key`.
    while (!key.empty() && static_cast<unsigned char>(key.back()) == 0xff) key.pop_back();
    if (!key.empty()) key.back() = static_cast<char>(key.back() + 1);
    return key;
}

class EtcdMetadata final : public MetadataBackend {
public:
    EtcdMetadata(MetadataSettings settings, std::vector<std::string> endpoints, std::string prefix, std::string name)
        : settings_(std::move(settings)),
          etcd_(std::move(endpoints), settings_.etcd, settings_.timeout),
          prefix_(std::move(prefix)),
          name_(std::move(name)),
          key_(prefix_ + "/segments/" + name_),
          client_(etcd_.tls()),
          parts_(key_) {}

    ~EtcdMetadata() override {
        {
            std::lock_guard lock(mutex_);
            stop_ = true;
        }
        {
            std::lock_guard lock(keepalive_mutex_);
            keepalive_stop_ = true;
        }
        watch_stop_ = true;
        stop_cv_.notify_all();
        keepalive_cv_.notify_all();
        if (keepalive_.joinable()) keepalive_.join();
        if (watch_.joinable()) watch_.join();
        // Leave at once on a clean shutdown instead of waiting for the lease to run out.
        std::lock_guard lock(mutex_);
        if (lease_ != 0) (void)call(client_, "/v3/lease/revoke", etcd_json::text({{"ID", cat(lease_.load())}}));
    }

    // Registers with retries: an engine may start while etcd is briefly unreachable.
    Result<void> start() {
        auto attempt = [&]() -> Result<void> {
            std::lock_guard lock(mutex_);
            if (auto g = grant_locked(client_); !g) return g;
            // etcd grants leases to anyone; reading our own key tells now whether this
            // engine's credentials may use its prefix.
            auto access =
                call(client_, "/v3/kv/range", etcd_json::text({{"key", base64_encode(key_)}, {"count_only", true}}));
            if (!access) return std::unexpected(access.error());
            return {};
        };
        auto r = retry_at_start("etcd metadata", "etcd", "etcd", settings_.retry_for,
                                "check the etcd:// address and that etcd runs", attempt);
        if (!r) return r;
        keepalive_ = std::thread([this] { keepalive_loop(); });
        watch_ = std::thread([this] { watch_loop(); });
        return {};
    }

    const std::string &segment_name() const override { return name_; }

    Result<void> publish(const SegmentDescriptor &descriptor) override {
        std::lock_guard lock(mutex_);
        parts_.reset(descriptor);
        published_ = true;
        if (auto r = flush_locked(client_); !r) failed_locked(r.error());
        return {};
    }

    Result<void> publish_changes(uint64_t generation, std::span<const RegionChange> changes) override {
        std::lock_guard lock(mutex_);
        parts_.set_generation(generation);
        // After a failed write the keep-alive loop writes everything again; until then changes
        // only gather.
        DescriptorParts::Commit commit;
        if (!dirty_) commit = [&](const DescriptorParts::Write &w) { return txn_locked(client_, w); };
        if (auto r = parts_.apply_all(changes, kTxnOps, kTxnBytes, commit); !r) failed_locked(r.error());
        return {};
    }

    Result<SegmentDescriptor> fetch(const std::string &name) override {
        const std::string header = prefix_ + "/segments/" + name;
        std::vector<std::pair<std::string, std::vector<uint8_t>>> kvs;
        {
            std::lock_guard lock(mutex_);
            // [header, header\x01): the header and its chunks, page by page at one revision.
            std::string from = header;
            int64_t revision = 0;
            for (;;) {
                Request range{
                    {"key", base64_encode(from)}, {"range_end", base64_encode(header + '\x01')}, {"limit", kFetchPage}};
                if (revision) range["revision"] = cat(revision);
                auto body = call(client_, "/v3/kv/range", etcd_json::text(range));
                if (!body)
                    return fail(body.error().code,
                                cat("cannot fetch segment '", name, "' from etcd: ", body.error().message));
                auto tree = etcd_json::parse(*body);
                if (!tree) return std::unexpected(tree.error());
                if (revision == 0) revision = int_or(*tree, {"header", "revision"});
                auto page = etcd_json::find(*tree, {"kvs"});
                if (page && !page->is_array())
                    return fail(-EPROTO,
                                cat("etcd answered a read of segment '", name, "' with kvs that are not a list"));
                if (!page || page->empty()) break;
                for (const auto &kv : *page) {
                    // A key or value that is not a string is no more base64 than a wrong one.
                    auto key_text = string_at(kv, {"key"}), value_text = string_at(kv, {"value"});
                    auto key = key_text ? base64_decode(*key_text) : std::nullopt;
                    auto value = value_text ? base64_decode(*value_text) : std::nullopt;
                    if (!key || !value)
                        return fail(-EPROTO, cat("segment '", name, "' in etcd holds a value that is not base64"));
                    kvs.emplace_back(std::string(key->begin(), key->end()), std::move(*value));
                }
                if (!bool_or(*tree, {"more"})) break;
                from = kvs.back().first + '\0';
            }
        }
        auto d = assemble_parts(header, kvs);
        if (!d && d.error().code == -ENOENT)
            return fail(-ENOENT, cat("segment '", name, "' is not registered in etcd under ", prefix_,
                                     "/segments/ (not started yet, or its engine died and its lease expired)"));
        return d;
    }

    void on_change(std::function<void(const std::string &)> listener) override {
        std::lock_guard lock(listener_mutex_);
        listener_ = std::move(listener);
    }

private:
    Result<std::string> call(HttpClient &client, const std::string &path, const std::string &body) {
        return etcd_.call(client, path, body);
    }

    Result<void> grant_locked(HttpClient &client) {
        auto body = call(client, "/v3/lease/grant", etcd_json::text({{"TTL", settings_.lease_ttl_s}}));
        if (!body) return std::unexpected(body.error());
        auto tree = etcd_json::parse(*body);
        if (!tree) return std::unexpected(tree.error());
        lease_ = int_or(*tree, {"ID"});
        if (lease_ == 0) return fail(-EPROTO, "etcd granted no lease: " + body->substr(0, 200));
        return {};
    }

    // Everything again (after an outage or with a new lease): a new epoch of chunks, header last.
    Result<void> put_locked(HttpClient &client) {
        if (!published_) return {};
        parts_.rewrite_all();
        if (auto r = flush_locked(client); !r) return r;
        dirty_ = false;
        return {};
    }

    // What the parts hold unwritten, one transaction at a time.
    Result<void> flush_locked(HttpClient &client) {
        while (parts_.pending())
            if (auto r = txn_locked(client, parts_.take(kTxnOps, kTxnBytes)); !r) return r;
        return {};
    }

    Result<void> txn_locked(HttpClient &client, const DescriptorParts::Write &w) {
        Request success = Request::array();
        for (auto &[k, v] : w.puts)
            success.push_back(
                {{"request_put",
                  {{"key", base64_encode(k)}, {"value", base64_encode(v)}, {"lease", cat(lease_.load())}}}});
        for (auto &[from, to] : w.deletes)
            success.push_back(
                {{"request_delete_range", {{"key", base64_encode(from)}, {"range_end", base64_encode(to)}}}});
        auto r = call(client, "/v3/kv/txn", etcd_json::text({{"success", std::move(success)}}));
        if (!r) return std::unexpected(r.error());
        return {};
    }

    // The store may now hold part of a change: everything is written again once etcd answers.
    void failed_locked(const Error &e) {
        dirty_ = true;
        FERRY_LOG(Warn, "etcd", "publishing segment ", name_, " failed (", e.message, "); will retry");
    }

    void keepalive_loop() {
        HttpClient client(etcd_.tls());
        bool outage = false;
        auto period = std::chrono::milliseconds(std::max(200, settings_.lease_ttl_s * 1000 / 3));
        for (;;) {
            {
                std::unique_lock wake(keepalive_mutex_);
                if (keepalive_cv_.wait_for(wake, period, [&] { return keepalive_stop_; })) return;
            }
            // Without mutex_: a publish holds it for as long as its transactions take (100,000
            // regions are hundreds of them, seconds under a sanitizer), and the lease must not
            // run out meanwhile (its keys, the segment, would vanish from etcd). Publishing and
            // fetching go on while this request waits on a slow etcd, too.
            auto alive = call(client, "/v3/lease/keepalive", etcd_json::text({{"ID", cat(lease_.load())}}));
            bool expired = false;
            if (alive) {
                auto tree = etcd_json::parse(*alive);
                // An expired or unknown lease (etcd restarted, or we were cut off past the TTL)
                // comes back without a TTL.
                expired = !tree || int_or(*tree, {"result", "TTL"}) <= 0;
            }
            if (!alive) {
                if (!outage)
                    FERRY_LOG(Warn, "etcd", "etcd unreachable (", alive.error().message, "); will re-register segment ",
                              name_, " when it answers");
                outage = true;
                continue;
            }
            if (!expired && !dirty_) {
                if (outage) FERRY_LOG(Info, "etcd", "etcd reachable again");
                outage = false;
                continue;
            }
            std::unique_lock lock(mutex_);
            if (stop_) return;
            if (expired) {
                // A fresh lease first; until it is granted the old one keeps reading as expired.
                if (auto g = grant_locked(client); !g) {
                    FERRY_LOG(Warn, "etcd", "re-registering segment ", name_, " failed: ", g.error().message);
                    continue;
                }
                dirty_ = true;  // the put must follow, however many tries it takes
            }
            if (dirty_) {
                if (auto r = put_locked(client); !r) {
                    FERRY_LOG(Warn, "etcd", "re-registering segment ", name_, " failed: ", r.error().message);
                    continue;
                }
                FERRY_LOG(Info, "etcd", "segment ", name_, " registered again in etcd",
                          expired ? " (its lease had expired)" : "");
            }
            if (outage) FERRY_LOG(Info, "etcd", "etcd reachable again");
            outage = false;
        }
    }

    void watch_loop() {
        HttpClient client(etcd_.tls());
        const std::string dir = prefix_ + "/segments/";
        // A re-opened watch resumes after the last revision seen, so a change made while it
        // was down (etcd restarting, a token being replaced) is not missed.
        int64_t seen = 0, resume = 0;
        auto body = [&] {
            Request create{{"key", base64_encode(dir)}, {"range_end", base64_encode(prefix_end(dir))}};
            if (resume > 0) create["start_revision"] = cat(resume);
            return etcd_json::text({{"create_request", std::move(create)}});
        };
        std::string pending, cancelled;
        bool created = false;
        auto on_data = [&](std::string_view chunk) {
            pending.append(chunk);
            size_t nl;
            while ((nl = pending.find('\n')) != std::string::npos) {
                std::string line = pending.substr(0, nl);
                pending.erase(0, nl + 1);
                auto tree = etcd_json::parse(line);
                if (!tree) continue;
                // A refused watch (an expired token, a compaction) stays open and silent: end
                // it and watch again.
                if (bool_or(*tree, {"result", "canceled"}) || etcd_json::find(*tree, {"error"})) {
                    cancelled = string_or(*tree, {"result", "cancel_reason"},
                                          string_or(*tree, {"error", "message"}, "cancelled"));
                    if (int_or(*tree, {"result", "compact_revision"}) > 0) seen = 0;  // history gone: from now on
                    return false;
                }
                int64_t revision = int_or(*tree, {"result", "header", "revision"});
                if (bool_or(*tree, {"result", "created"})) {
                    created = true;
                    // etcd lost its data (revisions start again): resuming would wait for a
                    // revision that may never come.
                    if (resume > 0 && revision < resume - 1) {
                        seen = 0;
                        cancelled = "etcd's revision went back";
                        return false;
                    }
                    seen = std::max(seen, revision);
                }
                auto events = etcd_json::find(*tree, {"result", "events"});
                if (!events || !events->is_array()) continue;
                for (const auto &ev : *events) {
                    seen = std::max(seen, int_or(ev, {"kv", "mod_revision"}));
                    auto key_text = string_at(ev, {"kv", "key"});
                    auto key = key_text ? base64_decode(*key_text) : std::nullopt;
                    if (!key) continue;
                    std::string name(key->begin(), key->end());
                    if (name.compare(0, dir.size(), dir) != 0) continue;
                    name = name.substr(dir.size());
                    if (name.find('\0') != std::string::npos) continue;  // a chunk: its header changes with it
                    if (name == name_) continue;
                    FERRY_LOG(Debug, "etcd", "segment ", name, " changed in etcd");
                    std::lock_guard l(listener_mutex_);
                    if (listener_) listener_(name);
                }
            }
            return true;
        };
        auto backoff = std::chrono::milliseconds(200);
        while (!stopping()) {
            for (size_t i = 0; i < etcd_.endpoint_count() && !stopping(); ++i) {
                pending.clear();
                cancelled.clear();
                created = false;
                auto token = etcd_.token(client);
                if (!token) {
                    FERRY_LOG(Debug, "etcd", "watch: ", token.error().message);
                    continue;
                }
                resume = seen > 0 ? seen + 1 : 0;
                auto r = etcd_.stream(client, i, "/v3/watch", body(), watch_stop_, on_data);
                if (!r) FERRY_LOG(Debug, "etcd", "watch ended: ", r.error().message);
                if (!cancelled.empty()) {
                    FERRY_LOG(Debug, "etcd", "watch cancelled by etcd: ", cancelled);
                    if (etcd_token_rejected(cancelled)) etcd_.forget_token(*token);
                }
                if (created && cancelled.empty())
                    backoff = std::chrono::milliseconds(200);  // it ran: no backlog of failures
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
    EtcdClient etcd_;
    std::string prefix_;
    std::string name_;
    std::string key_;

    // A transaction stays under etcd's default --max-txn-ops (128) and --max-request-bytes
    // (1.5 MiB, base64 makes values 4/3 larger); a fetch reads this many keys per page.
    static constexpr size_t kTxnOps = 100;
    static constexpr size_t kTxnBytes = 640u << 10;
    static constexpr size_t kFetchPage = 512;

    std::mutex mutex_;  // client_, parts_, published_, stop_; lease_ and dirty_ are written under it
    std::condition_variable stop_cv_;
    std::mutex keepalive_mutex_;  // keepalive_stop_: the keep-alive loop sleeps on it, never on mutex_
    std::condition_variable keepalive_cv_;
    bool keepalive_stop_ = false;
    HttpClient client_;
    std::atomic<int64_t> lease_{0};
    DescriptorParts parts_;
    bool published_ = false;
    std::atomic<bool> dirty_{false};  // etcd may hold a partial change: write everything again
    bool stop_ = false;
    std::atomic<bool> watch_stop_{false};

    std::mutex listener_mutex_;
    std::function<void(const std::string &)> listener_;

    std::thread keepalive_;
    std::thread watch_;
};

}  // namespace

// etcd://host:2379[,host:2379...]/prefix, or etcds:// for https
Result<std::unique_ptr<MetadataBackend>> make_etcd_metadata(const MetadataSettings &settings) {
    const bool tls = settings.url.rfind("etcds://", 0) == 0;
    std::string rest = settings.url.substr(std::string(tls ? "etcds://" : "etcd://").size());
    auto slash = rest.find('/');
    std::string hosts = rest.substr(0, slash);
    std::string prefix = slash == std::string::npos ? "" : rest.substr(slash + 1);
    while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
    if (prefix.empty()) prefix = "ferry";
    prefix = "/" + prefix;
    std::vector<std::string> endpoints;
    std::istringstream in(hosts);
    for (std::string h; std::getline(in, h, ',');)
        if (!h.empty()) endpoints.push_back((tls ? "https://" : "http://") + h);
    if (endpoints.empty())
        return fail(-EINVAL, cat("metadata '", settings.url,
                                 "' names no etcd endpoint; use etcd://host:2379[,host:2379]/prefix "
                                 "(etcds:// for TLS)"));
    if (rest.rfind("http://", 0) == 0 || rest.rfind("https://", 0) == 0 || hosts.find('@') != std::string::npos)
        return fail(-EINVAL, cat("metadata '", settings.url,
                                 "': list bare host:port endpoints (etcds://h1:2379,h2:2379/prefix "
                                 "for TLS) and give credentials in etcd_user and etcd_password_file"));
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

}  // namespace ferry
