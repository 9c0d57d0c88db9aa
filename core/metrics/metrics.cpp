// Loading and running ferry_metrics.so (metrics.hpp).
#include "metrics/metrics.hpp"

#include <boost/dll/runtime_symbol_info.hpp>
#include <cerrno>
#include <cstdlib>
#include <filesystem>

#include "loader/elf_check.hpp"
#include "metrics/transfer_stats.hpp"
#include "util/log.hpp"

namespace ferry {

std::string metrics_module_path() {
    if (const char *env = std::getenv("FERRY_METRICS_MODULE"); env && *env) return env;
    boost::system::error_code ec;
    auto self = boost::dll::this_line_location(ec);
    if (ec) return "ferry_metrics.so";
    return (std::filesystem::path(self.parent_path().string()) / "ferry" / "ferry_metrics.so").string();
}

int MetricsExporter::read_stats(void *ctx, ferry_engine_stats_t *engine, ferry_transport_stats_t *transports,
                                size_t *n) {
    auto *self = static_cast<MetricsExporter *>(ctx);
    return stats_to_c(self->source_(), engine, transports, n);
}

int MetricsExporter::read_rail_stats(void *ctx, ferry_engine_rail_stats_t *rails, size_t *n) {
    auto *self = static_cast<MetricsExporter *>(ctx);
    return rails_to_c(self->source_(), rails, n);
}

Result<std::unique_ptr<MetricsExporter>> MetricsExporter::start(const std::string &bind_ip, uint16_t port,
                                                                TrustLevel trust, std::function<EngineStats()> source) {
    const std::string path = metrics_module_path();
    auto refuse = [&](int code, const std::string &why) { return fail(code, cat("metrics_port ", port, ": ", why)); };
    auto file = open_checked(path, trust, Secrecy::Public);
    if (!file)
        return refuse(-ENOENT,
                      cat("the Prometheus endpoint's module ", path, " cannot be opened (", file.error().message,
                          "): this Ferry was built without prometheus-cpp (apt-get install "
                          "prometheus-cpp-dev, then rebuild), or set FERRY_METRICS_MODULE to its path"));
    if (!file->problems.empty() && trust != TrustLevel::Any)
        return refuse(-EACCES, cat(path, " is not trusted: ", problems_text(file->problems)));
    if (auto problem = check_elf_fd(file->fd.get()); !problem.empty())
        return refuse(-ENOEXEC, cat(path, ": ", problem));
    auto library = SharedLibrary::load_fd(file->fd.get(), path);
    if (!library)
        return refuse(-ENOENT, cat(library.error().message,
                                   " (the endpoint needs prometheus-cpp's libraries: apt-get install "
                                   "libprometheus-cpp-pull1.0)"));
    const auto *module = static_cast<const ferry_metrics_module_t *>(library->symbol(FERRY_METRICS_MODULE_SYMBOL));
    if (!module || module->version != FERRY_METRICS_MODULE_VERSION)
        return refuse(-ENOEXEC, cat(path, " is not the metrics module of this Ferry (", FERRY_METRICS_MODULE_SYMBOL,
                                    module ? cat(" version ", module->version) : std::string(" missing"),
                                    "); install the one built with this libferry"));
    std::unique_ptr<MetricsExporter> out(new MetricsExporter);
    out->library_ = std::move(*library);
    out->module_ = module;
    out->source_ = std::move(source);
    out->c_source_ = {out.get(), &MetricsExporter::read_stats, kLatencyBoundsSeconds,
                      &MetricsExporter::read_rail_stats};
    const bool v6 = bind_ip.find(':') != std::string::npos;
    std::string listen = cat(v6 ? "[" : "", bind_ip, v6 ? "]" : "", ":", port);
    char err[512] = "";
    out->server_ = module->start(listen.c_str(), &out->c_source_, err, sizeof err);
    if (!out->server_)
        return refuse(-EADDRINUSE, cat("cannot serve metrics on ", listen, ": ", err,
                                       "; choose a free port for metrics_port (or leave it unset)"));
    out->address_ = cat(v6 ? "[" : "", bind_ip, v6 ? "]" : "", ":", module->port(out->server_));
    FERRY_INFO("Prometheus metrics on http://", out->address_, "/metrics");
    return out;
}

MetricsExporter::~MetricsExporter() {
    if (server_) module_->stop(server_);
}

}  // namespace ferry
