// What Ferry writes to etcd's JSON gateway and how it reads the answers (core/etcd_json.hpp,
// core/base64.hpp), without an etcd: request bodies byte for byte, proto3 JSON's omitted fields
// and string-encoded integers, fields of the wrong type, malformed JSON, and base64 that is
// refused.
#include <gtest/gtest.h>

#include <cerrno>
#include <string>

#include "metadata/etcd_json.hpp"
#include "util/base64.hpp"

namespace {

using namespace ferry;
using etcd_json::Request;

TEST(EtcdJson, RequestBodiesKeepTheirMemberOrderAndTypes) {
    Request range{{"key", "QQ=="}, {"range_end", "QgE="}, {"limit", size_t{512}}};
    range["revision"] = "42";
    EXPECT_EQ(etcd_json::text(range), R"({"key":"QQ==","range_end":"QgE=","limit":512,"revision":"42"})");
    Request success = Request::array();
    success.push_back({{"request_put", {{"key", "aw=="}, {"value", "dg=="}, {"lease", "7"}}}});
    success.push_back({{"request_delete_range", {{"key", "YQ=="}, {"range_end", "Yg=="}}}});
    EXPECT_EQ(etcd_json::text({{"success", std::move(success)}}),
              R"({"success":[{"request_put":{"key":"aw==","value":"dg==","lease":"7"}},)"
              R"({"request_delete_range":{"key":"YQ==","range_end":"Yg=="}}]})");
    EXPECT_EQ(etcd_json::text({{"TTL", 10}}), R"({"TTL":10})");
    EXPECT_EQ(etcd_json::text({{"ID", "12"}}), R"({"ID":"12"})");
}

TEST(EtcdJson, CredentialsAreEscapedAndBadUtf8IsReplacedAsEtcdWouldReadIt) {
    EXPECT_EQ(etcd_json::text({{"name", "a\"b\\c\n\x01"}, {"password", std::string("p\xff")}}),
              "{\"name\":\"a\\\"b\\\\c\\n\\u0001\",\"password\":\"p\xef\xbf\xbd\"}");
}

TEST(EtcdJson, MissingFieldsReadAsTheirDefaultsAndIntegersComeFromStrings) {
    auto j = etcd_json::parse(R"({"header":{"revision":"12"},"kvs":[{"key":"YQ=="}],"more":true,"n":5})");
    ASSERT_TRUE(j) << j.error().message;
    EXPECT_EQ(etcd_json::int_or(*j, {"header", "revision"}), 12);
    EXPECT_EQ(etcd_json::int_or(*j, {"n"}), 5);
    EXPECT_TRUE(etcd_json::bool_or(*j, {"more"}));
    EXPECT_FALSE(etcd_json::bool_or(*j, {"result", "canceled"}));
    EXPECT_EQ(etcd_json::int_or(*j, {"result", "TTL"}), 0);
    const auto &kv = (*j)["kvs"][0];
    EXPECT_EQ(etcd_json::string_at(kv, {"key"}), std::optional<std::string>("YQ=="));
    EXPECT_EQ(etcd_json::string_at(kv, {"value"}), std::optional<std::string>("")) << "an empty value is left out";
    EXPECT_EQ(etcd_json::string_or(*j, {"error", "message"}, "cancelled"), "cancelled");
}

TEST(EtcdJson, FieldsOfAnotherTypeAreNotTrusted) {
    auto j = etcd_json::parse(
        R"({"ID":"12x","TTL":[1],"big":18446744073709551615,"neg":"-3","more":"true","key":5,"header":"h"})");
    ASSERT_TRUE(j) << j.error().message;
    EXPECT_EQ(etcd_json::int_or(*j, {"ID"}), 0);
    EXPECT_EQ(etcd_json::int_or(*j, {"TTL"}), 0);
    EXPECT_EQ(etcd_json::int_or(*j, {"big"}, -1), -1) << "past int64";
    EXPECT_EQ(etcd_json::int_or(*j, {"neg"}), -3);
    EXPECT_FALSE(etcd_json::bool_or(*j, {"more"}));
    EXPECT_EQ(etcd_json::string_at(*j, {"key"}), std::nullopt);
    EXPECT_EQ(etcd_json::int_or(*j, {"header", "revision"}), 0) << "a step that is not an object";
    auto array = etcd_json::parse("[1,2]");
    ASSERT_TRUE(array);
    EXPECT_EQ(etcd_json::find(*array, {"kvs"}), nullptr);
}

TEST(EtcdJson, MalformedJsonIsAProtocolErrorSayingSo) {
    for (const char *text : {"", "{\"a\":", "{\"a\":1}}", "not json", "{\"a\":\"\xff\"}"}) {
        auto j = etcd_json::parse(text);
        ASSERT_FALSE(j) << text;
        EXPECT_EQ(j.error().code, -EPROTO);
        EXPECT_EQ(j.error().message.rfind("etcd answered with malformed JSON: ", 0), 0u) << j.error().message;
    }
}

TEST(Base64, RoundTripsAndRefusesWhatIsNotStrictBase64) {
    EXPECT_EQ(base64_encode(std::string_view("")), "");
    EXPECT_EQ(base64_encode(std::string_view("a")), "YQ==");
    EXPECT_EQ(base64_encode(std::string_view("ab")), "YWI=");
    EXPECT_EQ(base64_encode(std::string_view("abc")), "YWJj");
    EXPECT_EQ(base64_encode(std::string_view("\xff\xfe\x00", 3)), "//4A");
    auto d = base64_decode("//4A");
    ASSERT_TRUE(d);
    EXPECT_EQ(*d, (std::vector<uint8_t>{0xff, 0xfe, 0x00}));
    EXPECT_EQ(base64_decode(""), std::vector<uint8_t>());
    EXPECT_EQ(base64_decode("YQ=="), std::vector<uint8_t>{'a'});
    for (const char *bad : {"YQ", "YQ=", "Y===", "====", "YQ=a", "Y=Q=", "YQ==YQ==", "YW J", "YW-_", "YWJj\n"})
        EXPECT_EQ(base64_decode(bad), std::nullopt) << bad;
}

}  // namespace
