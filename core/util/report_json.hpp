// JSON of the reports (ferry-info --json, ferry-info --options --json), in nlohmann-json: members
// in the order written and no spaces, which tests and tools that look for `"key":value` rely on.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

namespace ferry {

using ReportJson = nlohmann::ordered_json;

// A report's text. Text that is not UTF-8 (a file name, say) gets U+FFFD for each bad byte, so
// the report stays JSON.
inline std::string report_text(const ReportJson &j) {
    return j.dump(-1, ' ', false, ReportJson::error_handler_t::replace);
}

// A measured duration as the reports give it: 6 significant digits, a whole number without a
// fraction.
inline ReportJson report_number(double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    const double rounded = std::strtod(buf, nullptr);
    if (std::isfinite(rounded) && std::trunc(rounded) == rounded && std::fabs(rounded) < 0x1p53)
        return static_cast<int64_t>(rounded);
    return rounded;
}

}  // namespace ferry
