#include "http_client.hpp"

#include <curl/curl.h>

#include <cerrno>
#include <mutex>

#include "log.hpp"

namespace ferry {
namespace {

void global_init() {
    static std::once_flag once;
    std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
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

HttpClient::HttpClient() {
    global_init();
    curl_ = curl_easy_init();
}

HttpClient::~HttpClient() { curl_easy_cleanup(static_cast<CURL *>(curl_)); }

Result<std::string> HttpClient::post(const std::string &url, const std::string &body, std::chrono::milliseconds timeout) {
    CURL *c = static_cast<CURL *>(curl_);
    if (!c) return fail(-ENOMEM, "curl_easy_init failed");
    curl_easy_reset(c);
    std::string response;
    curl_slist *headers = curl_slist_append(nullptr, "Content-Type: application/json");
    curl_easy_setopt(c, CURLOPT_URL, url.c_str());
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, append);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &response);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout.count()));
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(timeout.count()));
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROXY, ""); // etcd is reached directly, never through a proxy
    CURLcode rc = curl_easy_perform(c);
    curl_slist_free_all(headers);
    if (rc != CURLE_OK)
        return fail(rc == CURLE_OPERATION_TIMEDOUT ? -ETIMEDOUT : -ECONNREFUSED, cat(url, ": ", curl_easy_strerror(rc)));
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    if (status != 200) return fail(-EPROTO, cat(url, ": HTTP ", status, ": ", response.substr(0, 300)));
    return response;
}

Result<void> HttpClient::stream(const std::string &url, const std::string &body, const std::atomic<bool> &stop,
                                const std::function<void(std::string_view)> &on_data) {
    CURL *c = static_cast<CURL *>(curl_);
    if (!c) return fail(-ENOMEM, "curl_easy_init failed");
    curl_easy_reset(c);
    StreamState state{&stop, &on_data};
    curl_slist *headers = curl_slist_append(nullptr, "Content-Type: application/json");
    curl_easy_setopt(c, CURLOPT_URL, url.c_str());
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, deliver);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &state);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, check_stop);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, &state);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 3000L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROXY, "");
    // A silent stream is normal for a watch; still notice a dead server within a minute.
    curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(c, CURLOPT_TCP_KEEPIDLE, 10L);
    curl_easy_setopt(c, CURLOPT_TCP_KEEPINTVL, 5L);
    CURLcode rc = curl_easy_perform(c);
    curl_slist_free_all(headers);
    if (rc == CURLE_ABORTED_BY_CALLBACK) return {};
    if (rc != CURLE_OK) return fail(-ECONNRESET, cat(url, ": ", curl_easy_strerror(rc)));
    return {};
}

} // namespace ferry
