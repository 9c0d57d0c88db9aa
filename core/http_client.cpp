#include "http_client.hpp"

#include <curl/curl.h>
#include <dlfcn.h>

#include <cerrno>
#include <mutex>

#include "log.hpp"

namespace ferry {
namespace {

// libcurl is loaded when an etcd backend first needs it, not linked: a host that never uses
// etcd (a bare container, say) needs no libcurl at all.
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
            c.error = std::string("etcd metadata needs libcurl: ") + (e ? e : "libcurl.so.4 not found") +
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

struct StreamState {
    const std::atomic<bool> *stop;
    const std::function<void(std::string_view)> *on_data;
};

size_t deliver(char *data, size_t size, size_t n, void *state) {
    auto *s = static_cast<StreamState *>(state);
    (*s->on_data)(std::string_view(data, size * n));
    return size * n;
}

int check_stop(void *state, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
    return static_cast<StreamState *>(state)->stop->load() ? 1 : 0; // non-zero aborts the transfer
}

} // namespace

HttpClient::HttpClient() { curl_ = curl().error.empty() ? curl().easy_init() : nullptr; }

HttpClient::~HttpClient() {
    if (curl_) curl().easy_cleanup(static_cast<CURL *>(curl_));
}

Result<std::string> HttpClient::post(const std::string &url, const std::string &body, std::chrono::milliseconds timeout) {
    CURL *c = static_cast<CURL *>(curl_);
    if (!c) return fail(curl().error.empty() ? -ENOMEM : -ENOENT, curl().error.empty() ? "curl_easy_init failed" : curl().error);
    curl().easy_reset(c);
    std::string response;
    curl_slist *headers = curl().slist_append(nullptr, "Content-Type: application/json");
    curl().easy_setopt(c, CURLOPT_URL, url.c_str());
    curl().easy_setopt(c, CURLOPT_POSTFIELDS, body.c_str());
    curl().easy_setopt(c, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
    curl().easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    curl().easy_setopt(c, CURLOPT_WRITEFUNCTION, append);
    curl().easy_setopt(c, CURLOPT_WRITEDATA, &response);
    curl().easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout.count()));
    curl().easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(timeout.count()));
    curl().easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl().easy_setopt(c, CURLOPT_PROXY, ""); // etcd is reached directly, never through a proxy
    CURLcode rc = curl().easy_perform(c);
    curl().slist_free_all(headers);
    if (rc != CURLE_OK)
        return fail(rc == CURLE_OPERATION_TIMEDOUT ? -ETIMEDOUT : -ECONNREFUSED, cat(url, ": ", curl().easy_strerror(rc)));
    long status = 0;
    curl().easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    if (status != 200) return fail(-EPROTO, cat(url, ": HTTP ", status, ": ", response.substr(0, 300)));
    return response;
}

Result<void> HttpClient::stream(const std::string &url, const std::string &body, const std::atomic<bool> &stop,
                                const std::function<void(std::string_view)> &on_data) {
    CURL *c = static_cast<CURL *>(curl_);
    if (!c) return fail(curl().error.empty() ? -ENOMEM : -ENOENT, curl().error.empty() ? "curl_easy_init failed" : curl().error);
    curl().easy_reset(c);
    StreamState state{&stop, &on_data};
    curl_slist *headers = curl().slist_append(nullptr, "Content-Type: application/json");
    curl().easy_setopt(c, CURLOPT_URL, url.c_str());
    curl().easy_setopt(c, CURLOPT_POSTFIELDS, body.c_str());
    curl().easy_setopt(c, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
    curl().easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    curl().easy_setopt(c, CURLOPT_WRITEFUNCTION, deliver);
    curl().easy_setopt(c, CURLOPT_WRITEDATA, &state);
    curl().easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl().easy_setopt(c, CURLOPT_XFERINFOFUNCTION, check_stop);
    curl().easy_setopt(c, CURLOPT_XFERINFODATA, &state);
    curl().easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 3000L);
    curl().easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl().easy_setopt(c, CURLOPT_PROXY, "");
    // A silent stream is normal for a watch; still notice a dead server within a minute.
    curl().easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
    curl().easy_setopt(c, CURLOPT_TCP_KEEPIDLE, 10L);
    curl().easy_setopt(c, CURLOPT_TCP_KEEPINTVL, 5L);
    CURLcode rc = curl().easy_perform(c);
    curl().slist_free_all(headers);
    if (rc == CURLE_ABORTED_BY_CALLBACK) return {};
    if (rc != CURLE_OK) return fail(-ECONNRESET, cat(url, ": ", curl().easy_strerror(rc)));
    return {};
}

} // namespace ferry
