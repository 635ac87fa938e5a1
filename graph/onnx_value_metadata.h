// A ValueInfoProto's metadata_props (field 4, ONNX 1.16): the onnx.proto this project builds
// against predates the field, so protobuf keeps it among the message's unknown fields. Import
// reads it from there and export writes it back the same way (Value::metadata), so a file's
// value metadata survives onnxtrain -- a trained model keeps torch's parameter / buffer marks.
#pragma once

#include <google/protobuf/unknown_field_set.h>

#include <string>
#include <utility>
#include <vector>

#include "graph/error.h"
#include "onnx/onnx_pb.h"

namespace onnxtrain::graph {

inline constexpr int kValueInfoMetadataField = 4;

// `where` names the value in the error a malformed entry gives.
inline std::vector<std::pair<std::string, std::string>> read_value_metadata(
    const onnx::ValueInfoProto& vi, const std::string& where) {
  std::vector<std::pair<std::string, std::string>> out;
  const google::protobuf::UnknownFieldSet& fields = vi.unknown_fields();
  for (int i = 0; i < fields.field_count(); ++i) {
    const google::protobuf::UnknownField& f = fields.field(i);
    if (f.number() != kValueInfoMetadataField) continue;
    onnx::StringStringEntryProto entry;
    OT_CHECK(f.type() == google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED &&
                 entry.ParseFromString(f.length_delimited()),
             where, ": metadata_props entry ", out.size(), " is not a key/value pair");
    out.emplace_back(entry.key(), entry.value());
  }
  return out;
}

// Adds `more` to a value's metadata, skipping keys it already has (a file may describe one value
// in more than one ValueInfoProto: its input or output entry and a value_info entry).
inline void merge_value_metadata(std::vector<std::pair<std::string, std::string>>& metadata,
                                 const std::vector<std::pair<std::string, std::string>>& more) {
  for (const auto& entry : more) {
    bool known = false;
    for (const auto& have : metadata) known = known || have.first == entry.first;
    if (!known) metadata.push_back(entry);
  }
}

inline void write_value_metadata(const std::vector<std::pair<std::string, std::string>>& metadata,
                                 onnx::ValueInfoProto* vi) {
  for (const auto& [key, value] : metadata) {
    onnx::StringStringEntryProto entry;
    entry.set_key(key);
    entry.set_value(value);
    vi->mutable_unknown_fields()->AddLengthDelimited(kValueInfoMetadataField,
                                                     entry.SerializeAsString());
  }
}

}  // namespace onnxtrain::graph
