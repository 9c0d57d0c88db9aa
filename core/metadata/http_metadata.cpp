// Metadata on Mooncake's HTTP metadata server (mooncake_http_metadata_server, an aiohttp app;
// tests/metadata/http_metadata_server.py speaks the same protocol): one URL, the key in its
// query, the value as the raw body.
//   GET    <url>?key=K          200 and the value, or 404 "metadata not found"
//   PUT    <url>?key=K  (body)  200
//   DELETE <url>?key=K          200, or 404 when there was no such key
// K is URL-escaped. The server has no leases, no watches and no authentication: kv_metadata.cpp
// says how liveness and changes are handled instead, docs/DESIGN.md why an untrusted server
// cannot make an engine with a cluster secret move data for anyone else.
#include <cerrno>

#include "metadata/descriptor.hpp"
#include "metadata/http_client.hpp"
#include "metadata/kv_store.hpp"
#include "util/log.hpp"

namespace ferry {
namespace {

// The largest value read back: a whole descriptor at the decoder's limit, and a little more.
constexpr size_t kMaxValueBytes = kMaxDescriptorBytes + 4096;

std::string url_escape(std::string_view text) {
    static constexpr char digits[] = "0123456789ABCDEF";
    std::string out;
    for (char ch : text) {
        auto c = static_cast<unsigned char>(ch);
        if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
            c == '_' || c == '~') {
            out += ch;
        } else {
            out += '%';
            out += digits[c >> 4];
            out += digits[c & 15];
        }
    }
    return out;
}

// A server's words in our messages: short, printable.
std::string quote_body(const std::string &body) {
    std::string out = body.substr(0, 160);
    for (char &c : out)
        if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
    if (body.size() > 160) out += "...";
    return out.empty() ? "empty body" : "\"" + out + "\"";
}

// http://user:password@host/... -> http://user:***@host/...
std::string hide_password(const std::string &url) {
    auto scheme = url.find("://");
    if (scheme == std::string::npos) return url;
    auto host_end = url.find_first_of("/?#", scheme + 3);
    auto at = url.rfind('@', host_end == std::string::npos ? url.size() : host_end);
    if (at == std::string::npos || at < scheme + 3) return url;
    auto colon = url.find(':', scheme + 3);
    if (colon == std::string::npos || colon > at) return url;
    return url.substr(0, colon + 1) + "***" + url.substr(at);
}

class HttpStore final : public KvStore {
public:
    HttpStore(std::string url, std::string where, std::chrono::milliseconds timeout)
        : url_(std::move(url)),
          where_(std::move(where)),
          timeout_(timeout),
          client_(HttpTls{{}, {}, {}, "the HTTP metadata server"}) {}

    // HTTP has no session: the backend's probe (a PUT and a GET) is the check.
    Result<void> check() override { return {}; }

    Result<std::optional<std::string>> get(const std::string &key) override {
        auto r = call("GET", key, nullptr);
        if (!r) return std::unexpected(r.error());
        if (r->status == 404) return std::optional<std::string>();
        if (r->status != 200) return std::unexpected(refused("GET", key, *r, 0));
        return std::optional<std::string>(std::move(r->body));
    }

    Result<void> put(const std::string &key, const std::string &value) override {
        auto r = call("PUT", key, &value);
        if (!r) return std::unexpected(r.error());
        if (r->status != 200) return std::unexpected(refused("PUT", key, *r, value.size()));
        return {};
    }

    Result<void> remove(const std::string &key) override {
        auto r = call("DELETE", key, nullptr);
        if (!r) return std::unexpected(r.error());
        if (r->status != 200 && r->status != 404) return std::unexpected(refused("DELETE", key, *r, 0));
        return {};
    }

private:
    std::string key_url(const std::string &key) const {
        return url_ + (url_.find('?') == std::string::npos ? "?key=" : "&key=") + url_escape(key);
    }

    Result<HttpResponse> call(const char *method, const std::string &key, const std::string *body) {
        auto r = client_.request(method, key_url(key), body, timeout_, kMaxValueBytes);
        if (!r) {
            // The client's messages name the URL it was given, which may carry a password.
            Error e = r.error();
            auto at = e.message.find(url_);
            if (at != std::string::npos) e.message.replace(at, url_.size(), where_);
            return std::unexpected(e);
        }
        return r;
    }

    // What an answer other than the protocol's means, and what to do about it.
    Error refused(const char *method, const std::string &key, const HttpResponse &r, size_t bytes) const {
        std::string what = cat(method, " ", where_, " (key ", key, "): HTTP ", r.status, ", ", quote_body(r.body));
        switch (r.status) {
            case 401:
            case 403:
                return {-EACCES, cat(what,
                                     "; the server wants credentials, and Ferry sends none to an HTTP metadata "
                                     "server: run it without authentication on a private network, or use "
                                     "redis:// or etcd://")};
            case 404:
            case 405:
                return {-EINVAL, cat(what, "; ", where_,
                                     " is not a metadata endpoint: Mooncake's HTTP metadata server answers at its "
                                     "/metadata path, e.g. http://host:8080/metadata")};
            case 413:
                return {-EMSGSIZE,
                        cat(what, "; the segment descriptor (", bytes,
                            " bytes) is larger than the server takes (Mooncake's aiohttp server: 1 MiB, some 10k "
                            "regions): register fewer, larger regions, raise the server's limit, or use etcd://")};
            default: break;
        }
        if (r.status >= 500) return {-EIO, cat(what, "; see the metadata server's log")};
        return {-EPROTO, cat(what, "; the server does not speak Mooncake's metadata protocol (GET/PUT/DELETE ",
                             "<url>?key=K); check the URL")};
    }

    std::string url_;
    std::string where_;
    std::chrono::milliseconds timeout_;
    HttpClient client_;
};

}  // namespace

Result<KvStoreMaker> http_store(const MetadataSettings &settings) {
    const std::string &url = settings.url;
    const bool tls = url.rfind("https://", 0) == 0;
    std::string where = hide_password(url);
    const size_t host_at = tls ? 8 : 7;
    if ((!tls && url.rfind("http://", 0) != 0) || url.size() <= host_at || url[host_at] == '/' ||
        url.find_first_of(" \t\r\n#") != std::string::npos)
        return fail(-EINVAL, cat("metadata '", where,
                                 "' is not an HTTP metadata server URL; use http://host:port/metadata "
                                 "(Mooncake's HTTP metadata server) or https://"));
    KvStoreInfo info{"HTTP metadata server", "HTTP metadata", where,
                     "check the URL (Mooncake's server: http://host:8080/metadata) and that the server runs", false};
    auto timeout = settings.timeout;
    return KvStoreMaker{std::move(info), [url, where, timeout]() -> std::unique_ptr<KvStore> {
                            return std::make_unique<HttpStore>(url, where, timeout);
                        }};
}

Result<std::unique_ptr<MetadataBackend>> make_http_metadata(const MetadataSettings &settings,
                                                            const std::string &default_name) {
    auto maker = http_store(settings);
    if (!maker) return std::unexpected(maker.error());
    std::string name = settings.local_server_name.empty() ? default_name : settings.local_server_name;
    return make_kv_metadata(settings, std::move(maker->info), std::move(maker->factory), std::move(name));
}

}  // namespace ferry
