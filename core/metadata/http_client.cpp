#include "metadata/http_client.hpp"

#include <curl/curl.h>
#include <dlfcn.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "util/log.hpp"

namespace ferry {
namespace {

// libcurl is loaded when an etcd or HTTP metadata backend first needs it, not linked: a host
// that uses neither (a bare container, say) needs no libcurl at all.
struct Curl {
    decltype(&curl_global_init) global_init = nullptr;
    decltype(&curl_easy_init) easy_init = nullptr;
    decltype(&curl_easy_cleanup) easy_cleanup = nullptr;
    decltype(&curl_easy_reset) easy_reset = nullptr;
    decltype(&curl_easy_setopt) easy_setopt = nullptr;
    decltype(&curl_easy_perform) easy_perform = nullptr;
    decltype(&curl_easy_getinfo) easy_getinfo = nullptr;
    decltype(&curl_easy_strerror) easy_strerror = nullptr;
    decltype(&curl_slist_append) slist_append = nullptr;
    decltype(&curl_slist_free_all) slist_free_all = nullptr;
    std::string error;
};

const Curl &curl() {
    static Curl c = [] {
        Curl c;
        void *lib = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            const char *e = dlerror();
            c.error = std::string("etcd and HTTP metadata need libcurl: ") + (e ? e : "libcurl.so.4 not found") +
                      " (apt-get install libcurl4)";
            return c;
        }
        auto get = [&](auto &fn, const char *name) {
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
            if (!fn && c.error.empty()) c.error = std::string("libcurl.so.4 lacks ") + name;
        };
        get(c.global_init, "curl_global_init");
        get(c.easy_init, "curl_easy_init");
        get(c.easy_cleanup, "curl_easy_cleanup");
        get(c.easy_reset, "curl_easy_reset");
        get(c.easy_setopt, "curl_easy_setopt");
        get(c.easy_perform, "curl_easy_perform");
        get(c.easy_getinfo, "curl_easy_getinfo");
        get(c.easy_strerror, "curl_easy_strerror");
        get(c.slist_append, "curl_slist_append");
        get(c.slist_free_all, "curl_slist_free_all");
        if (c.error.empty()) c.global_init(CURL_GLOBAL_DEFAULT);
        return c;
    }();
    return c;
}

size_t append(char *data, size_t size, size_t n, void *out) {
    static_cast<std::string *>(out)->append(data, size * n);
    return size * n;
}

struct Bounded {
    std::string body;
    size_t max;
    bool over;
};

size_t append_bounded(char *data, size_t size, size_t n, void *out) {
    auto *b = static_cast<Bounded *>(out);
    if (b->body.size() + size * n > b->max) {
        b->over = true;
        return 0;  // a short count ends the transfer
    }
    b->body.append(data, size * n);
    return size * n;
}

struct StreamState {
    const std::atomic<bool> *stop;
    const std::function<bool(std::string_view)> *on_data;
};

size_t deliver(char *data, size_t size, size_t n, void *state) {
    auto *s = static_cast<StreamState *>(state);
    // A short count makes curl end the transfer (CURLE_WRITE_ERROR): the reader is done.
    return (*s->on_data)(std::string_view(data, size * n)) ? size * n : 0;
}

int check_stop(void *state, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
    return static_cast<StreamState *>(state)->stop->load() ? 1 : 0;  // non-zero aborts the transfer
}

bool contains(const char *text, const char *part) { return std::strstr(text, part) != nullptr; }

}  // namespace

HttpClient::HttpClient(HttpTls tls) : tls_(std::move(tls)) {
    curl_ = curl().error.empty() ? curl().easy_init() : nullptr;
}

HttpClient::~HttpClient() {
    if (curl_) curl().easy_cleanup(static_cast<CURL *>(curl_));
}

curl_slist *HttpClient::prepare(const std::string &url, const std::string *body, std::string_view authorization,
                                const char *content_type) {
    CURL *c = static_cast<CURL *>(curl_);
    curl().easy_reset(c);
    error_buffer_[0] = '\0';
    curl_slist *headers = curl().slist_append(nullptr, cat("Content-Type: ", content_type).c_str());
    if (!authorization.empty()) headers = curl().slist_append(headers, cat("Authorization: ", authorization).c_str());
    curl().easy_setopt(c, CURLOPT_URL, url.c_str());
    if (body) {
        curl().easy_setopt(c, CURLOPT_POSTFIELDS, body->c_str());
        curl().easy_setopt(c, CURLOPT_POSTFIELDSIZE, static_cast<long>(body->size()));
    }
    curl().easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    curl().easy_setopt(c, CURLOPT_ERRORBUFFER, error_buffer_);
    curl().easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl().easy_setopt(c, CURLOPT_PROXY, "");  // metadata servers are reached directly, never through a proxy
    // HTTP/1.1 over https too: etcd would accept HTTP/2 by ALPN, and failures would then all
    // read CURLE_HTTP2, hiding which TLS step failed.
    curl().easy_setopt(c, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
    // TLS: the peer's certificate chain and its host name are always verified.
    curl().easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L);
    curl().easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 2L);
    if (!tls_.ca_file.empty()) curl().easy_setopt(c, CURLOPT_CAINFO, tls_.ca_file.c_str());
    if (!tls_.cert_file.empty()) curl().easy_setopt(c, CURLOPT_SSLCERT, tls_.cert_file.c_str());
    if (!tls_.key_file.empty()) curl().easy_setopt(c, CURLOPT_SSLKEY, tls_.key_file.c_str());
    return headers;
}

// Names the URL, what went wrong and, for TLS, which setting to change.
Error HttpClient::failure(const std::string &url, int curl_code) const {
    auto rc = static_cast<CURLcode>(curl_code);
    std::string detail = error_buffer_[0] ? error_buffer_ : curl().easy_strerror(rc);
    switch (rc) {
        case CURLE_UNSUPPORTED_PROTOCOL:
        case CURLE_WEIRD_SERVER_REPLY:
            // Something answered, but not in HTTP (another service on that port): waiting does
            // not cure it.
            return {-EPROTO, cat(url, ": the server does not answer in HTTP (", detail,
                                 "); check the host and port: is it the metadata server's?")};
        case CURLE_URL_MALFORMAT: return {-EINVAL, cat(url, ": not a valid URL (", detail, ")")};
        default: break;
    }
    if (tls_.service != "etcd") {
        switch (rc) {
            case CURLE_PEER_FAILED_VERIFICATION:
                return {-EACCES, cat(url, ": TLS certificate verify failed (", detail, "): ", tls_.service,
                                     "'s certificate is not signed by a CA in the system's CA store or does not name "
                                     "this host")};
            case CURLE_SSL_CONNECT_ERROR:
                if (contains(detail.c_str(), "alert"))
                    return {-EACCES, cat(url, ": ", tls_.service, " refused the TLS connection (", detail, ")")};
                break;
            default: break;
        }
        return {rc == CURLE_OPERATION_TIMEDOUT ? -ETIMEDOUT : -ECONNREFUSED,
                cat(url, ": ", detail, " (curl error ", curl_code, ")")};
    }
    std::string ca = tls_.ca_file.empty() ? std::string("the system's CA store (etcd_ca_file is not set)")
                                          : cat("etcd_ca_file '", tls_.ca_file, "'");
    switch (rc) {
        case CURLE_PEER_FAILED_VERIFICATION:
            return {
                -EACCES,
                cat(url, ": TLS certificate verify failed (", detail, "): etcd's certificate is not signed by ", ca,
                    " or does not name this host; set etcd_ca_file to the CA that signed etcd's server certificate")};
        case CURLE_SSL_CACERT_BADFILE:
            return {-EINVAL, cat(url, ": cannot use ", ca, " (", detail,
                                 "); it must be a readable PEM file of CA certificates")};
        case CURLE_SSL_CERTPROBLEM:
            return {-EINVAL, cat(url, ": cannot use the client certificate etcd_cert_file '", tls_.cert_file,
                                 "' with etcd_key_file '", tls_.key_file, "' (", detail,
                                 "); they must be a PEM certificate and its unencrypted private key")};
        case CURLE_SSL_CONNECT_ERROR:
        case CURLE_RECV_ERROR:
        case CURLE_SEND_ERROR:
        case CURLE_GOT_NOTHING:
        case CURLE_HTTP2:
        case CURLE_HTTP2_STREAM:
            if (url.rfind("https://", 0) == 0) {
                // etcd with --client-cert-auth refuses a missing or untrusted client certificate
                // with a TLS alert; under TLS 1.3 that comes after the client's handshake, and the
                // request crossing it may turn the alert into a bare reset.
                std::string hint =
                    tls_.cert_file.empty()
                        ? "it requires a client certificate; set etcd_cert_file and etcd_key_file"
                        : "it does not accept the client certificate in etcd_cert_file; use one signed by the "
                          "CA etcd trusts (its --trusted-ca-file)";
                if (contains(detail.c_str(), "alert"))
                    return {-EACCES, cat(url, ": etcd refused the TLS connection (", detail, "): ", hint)};
                return {-ECONNRESET,
                        cat(url, ": ", detail,
                            " (if etcd runs with --client-cert-auth and closes connections at once, ", hint, ")")};
            }
            break;
        default: break;
    }
    return {rc == CURLE_OPERATION_TIMEDOUT ? -ETIMEDOUT : -ECONNREFUSED,
            cat(url, ": ", detail, " (curl error ", curl_code, ")")};
}

Result<std::string> HttpClient::post(const std::string &url, const std::string &body, std::chrono::milliseconds timeout,
                                     std::string_view authorization) {
    CURL *c = static_cast<CURL *>(curl_);
    if (!c)
        return fail(curl().error.empty() ? -ENOMEM : -ENOENT,
                    curl().error.empty() ? "curl_easy_init failed" : curl().error);
    std::string response;
    curl_slist *headers = prepare(url, &body, authorization);
    curl().easy_setopt(c, CURLOPT_WRITEFUNCTION, append);
    curl().easy_setopt(c, CURLOPT_WRITEDATA, &response);
    curl().easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout.count()));
    curl().easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(timeout.count()));
    CURLcode rc = curl().easy_perform(c);
    curl().slist_free_all(headers);
    if (rc != CURLE_OK) return std::unexpected(failure(url, rc));
    long status = 0;
    curl().easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    if (status != 200)
        return fail(status == 401 ? -EACCES : -EPROTO, cat(url, ": HTTP ", status, ": ", response.substr(0, 300)));
    return response;
}

Result<HttpResponse> HttpClient::request(const char *method, const std::string &url, const std::string *body,
                                         std::chrono::milliseconds timeout, size_t max_body) {
    CURL *c = static_cast<CURL *>(curl_);
    if (!c)
        return fail(curl().error.empty() ? -ENOMEM : -ENOENT,
                    curl().error.empty() ? "curl_easy_init failed" : curl().error);
    Bounded response{{}, max_body, false};
    curl_slist *headers = prepare(url, body, {}, "application/octet-stream");
    if (std::strcmp(method, "GET") != 0) curl().easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl().easy_setopt(c, CURLOPT_WRITEFUNCTION, append_bounded);
    curl().easy_setopt(c, CURLOPT_WRITEDATA, &response);
    curl().easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout.count()));
    curl().easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(timeout.count()));
    CURLcode rc = curl().easy_perform(c);
    curl().slist_free_all(headers);
    if (response.over)
        return fail(-EMSGSIZE, cat(url, ": the answer to ", method, " is larger than ", max_body,
                                   " bytes, more than any value Ferry stores; it was not read further"));
    if (rc != CURLE_OK) return std::unexpected(failure(url, rc));
    HttpResponse out;
    curl().easy_getinfo(c, CURLINFO_RESPONSE_CODE, &out.status);
    out.body = std::move(response.body);
    return out;
}

Result<void> HttpClient::stream(const std::string &url, const std::string &body, const std::atomic<bool> &stop,
                                const std::function<bool(std::string_view)> &on_data, std::string_view authorization) {
    CURL *c = static_cast<CURL *>(curl_);
    if (!c)
        return fail(curl().error.empty() ? -ENOMEM : -ENOENT,
                    curl().error.empty() ? "curl_easy_init failed" : curl().error);
    StreamState state{&stop, &on_data};
    curl_slist *headers = prepare(url, &body, authorization);
    curl().easy_setopt(c, CURLOPT_WRITEFUNCTION, deliver);
    curl().easy_setopt(c, CURLOPT_WRITEDATA, &state);
    curl().easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl().easy_setopt(c, CURLOPT_XFERINFOFUNCTION, check_stop);
    curl().easy_setopt(c, CURLOPT_XFERINFODATA, &state);
    curl().easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 3000L);
    // A silent stream is normal for a watch; still notice a dead server within a minute.
    curl().easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
    curl().easy_setopt(c, CURLOPT_TCP_KEEPIDLE, 10L);
    curl().easy_setopt(c, CURLOPT_TCP_KEEPINTVL, 5L);
    CURLcode rc = curl().easy_perform(c);
    curl().slist_free_all(headers);
    if (rc == CURLE_ABORTED_BY_CALLBACK || rc == CURLE_WRITE_ERROR) return {};
    if (rc != CURLE_OK) {
        Error e = failure(url, rc);
        if (e.code == -ECONNREFUSED) e.code = -ECONNRESET;
        return std::unexpected(e);
    }
    return {};
}

}  // namespace ferry
