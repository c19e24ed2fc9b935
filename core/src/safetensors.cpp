#include <hasten/error.hpp>
#include <hasten/safetensors.hpp>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace hasten {

namespace {

const std::vector<std::pair<torch::ScalarType, const char*>>& dtypes() {
  static const std::vector<std::pair<torch::ScalarType, const char*>> d = {
      {torch::kFloat, "F32"}, {torch::kDouble, "F64"}, {torch::kHalf, "F16"}, {torch::kBFloat16, "BF16"},
      {torch::kLong, "I64"},  {torch::kInt, "I32"},    {torch::kShort, "I16"}, {torch::kChar, "I8"},
      {torch::kByte, "U8"},   {torch::kBool, "BOOL"}};
  return d;
}

}  // namespace

void write_safetensors(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata,
                       const std::function<void(const void*, size_t)>& sink) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<torch::Tensor> data;
  uint64_t offset = 0;
  for (auto& [name, tensor] : tensors) {
    if (header.contains(name)) throw Error("safetensors: duplicate tensor name '" + name + "'");
    torch::Tensor t = tensor.detach().to(torch::kCPU).contiguous();
    const char* code = nullptr;
    for (auto& [type, c] : dtypes())
      if (type == t.scalar_type()) code = c;
    if (code == nullptr) throw Error("safetensors: tensor '" + name + "' has unsupported dtype " + c10::toString(t.scalar_type()));
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[name] = {{"dtype", code}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(t);
  }
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');  // the data starts 8-byte aligned
  const uint64_t n = text.size();
  unsigned char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(n >> (8 * i));
  sink(le, 8);
  sink(text.data(), text.size());
  for (auto& t : data) sink(t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size());
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error("safetensors: cannot write '" + tmp + "'");
    write_safetensors(tensors, metadata, [&](const void* p, size_t size) {
      out.write(static_cast<const char*>(p), static_cast<std::streamsize>(size));
    });
    out.flush();
    if (!out) throw Error("safetensors: writing '" + tmp + "' failed (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error("safetensors: cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
}

NamedTensors load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("safetensors: cannot read '" + path + "'");
  unsigned char le[8];
  if (!in.read(reinterpret_cast<char*>(le), 8)) throw Error("safetensors: '" + path + "' is too short");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(le[i]) << (8 * i);
  const auto size = std::filesystem::file_size(path);
  if (n > size - 8) throw Error("safetensors: '" + path + "' declares a header larger than the file");
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  auto header = nlohmann::ordered_json::parse(text, nullptr, false);
  if (header.is_discarded() || !header.is_object()) throw Error("safetensors: '" + path + "' has a malformed header");
  const uint64_t base = 8 + n;
  NamedTensors out;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const auto& e = it.value();
    torch::ScalarType type = torch::kFloat;
    bool known = false;
    for (auto& [t, c] : dtypes())
      if (e.value("dtype", "") == c) type = t, known = true;
    if (!known) throw Error("safetensors: '" + path + "': tensor '" + it.key() + "' has an unsupported dtype");
    const auto shape = e.at("shape").get<std::vector<int64_t>>();
    const auto offsets = e.at("data_offsets").get<std::vector<uint64_t>>();
    torch::Tensor t = torch::empty(shape, torch::TensorOptions().dtype(type));
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    if (offsets.size() != 2 || offsets[1] - offsets[0] != bytes || base + offsets[1] > size)
      throw Error("safetensors: '" + path + "': tensor '" + it.key() + "' has inconsistent data_offsets");
    in.seekg(static_cast<std::streamoff>(base + offsets[0]));
    in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(bytes));
    out.emplace_back(it.key(), t);
  }
  return out;
}

}  // namespace hasten
