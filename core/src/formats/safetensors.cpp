#include <hasten/error.hpp>
#include <hasten/safetensors.hpp>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <system_error>
#include <unordered_set>

#include "formats/file_records.hpp"
#include "formats/tensor_bytes.hpp"

// Tensor bytes go between files and storages unchanged, which is the format's little-endian
// order only on a little-endian host.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors.cpp assumes a little-endian host");

namespace hasten {

namespace {

using json = nlohmann::json;

struct Dtype {
  torch::ScalarType type;
  const char* code;
};
constexpr Dtype kDtypes[] = {{torch::kDouble, "F64"}, {torch::kFloat, "F32"}, {torch::kHalf, "F16"},
                             {torch::kBFloat16, "BF16"}, {torch::kLong, "I64"}, {torch::kInt, "I32"},
                             {torch::kShort, "I16"}, {torch::kChar, "I8"}, {torch::kByte, "U8"},
                             {torch::kBool, "BOOL"}};

const char* dtype_code(torch::ScalarType type) {
  for (const Dtype& d : kDtypes)
    if (d.type == type) return d.code;
  return nullptr;
}

std::string dtype_list() {
  std::string s;
  for (const Dtype& d : kDtypes) s += std::string(s.empty() ? "" : ", ") + d.code;
  return s;
}

// Tensor names, keys and values in messages come from the file: quoted, control characters
// escaped and long ones cut, so that an error stays one readable line.
std::string quote(const std::string& s) {
  constexpr size_t kShown = 80;
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < kShown; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      static const char hex[] = "0123456789abcdef";
      out += std::string("\\x") + hex[c >> 4] + hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > kShown) out += "...";
  return out + "'";
}

// A JSON value from the file, shortened for a message.
std::string shown(const json& v) {
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return text.size() > 40 ? text.substr(0, 40) + "..." : text;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string offsets_text(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
}

// A header nests three levels (the object, an entry, its shape or offsets); a little more is
// let through so that a wrongly typed value gets its own message, and the bound keeps what a
// hostile header costs to parse proportional to its size.
constexpr int kMaxDepth = 8;
// More dimensions than any model uses; bounds the work one shape can ask for.
constexpr size_t kMaxDims = 64;

// The first pass over the header text, before it becomes a DOM: a DOM keeps one value of a
// repeated key, so another reader could see a different tensor under that name than this one
// would; here repeats are refused, as is nesting past kMaxDepth.
class HeaderPrecheck {
 public:
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(number_integer_t) { return true; }
  bool number_unsigned(number_unsigned_t) { return true; }
  bool number_float(number_float_t, const string_t&) { return true; }
  bool string(string_t&) { return true; }
  bool binary(binary_t&) { return true; }
  bool start_object(std::size_t) {
    keys_.emplace_back();
    return enter();
  }
  bool key(string_t& k) {
    if (keys_.size() == 1) entry_ = k;
    if (keys_.back().insert(k).second) return true;
    error_ = keys_.size() == 1 ? "the header names " + quote(k) + " twice"
                               : "the entry " + quote(entry_) + " has the key " + quote(k) + " twice";
    return false;
  }
  bool end_object() {
    keys_.pop_back();
    return true;
  }
  bool start_array(std::size_t) {
    keys_.emplace_back();  // arrays have no keys; the stack's depth is what counts
    return enter();
  }
  bool end_array() {
    keys_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const json::exception& e) {
    std::string what = e.what();  // "[json.exception.parse_error.101] parse error at ..."
    const auto bracket = what.find("] ");
    if (bracket != std::string::npos) what = what.substr(bracket + 2);
    error_ = "the header is not valid JSON: " + what;
    return false;
  }
  const std::string& error() const { return error_; }

 private:
  bool enter() {
    if (static_cast<int>(keys_.size()) <= kMaxDepth) return true;
    error_ = "the header nests deeper than " + std::to_string(kMaxDepth) + " levels";
    return false;
  }
  std::vector<std::set<std::string>> keys_;
  std::string entry_;
  std::string error_;
};

uint64_t unsigned_or(const json& v, bool& ok) {
  ok = v.is_number_unsigned();
  return ok ? v.get<uint64_t>() : 0;
}

// Turns the header text into a validated header whose data region holds data_size bytes.
// `where` starts every message ("safetensors: 'file': ").
SafetensorsHeader parse_header(const std::string& where, const std::string& text, uint64_t data_size) {
  auto fail = [&](const std::string& what) { throw Error(where + what); };
  if (text.empty() || text[0] != '{') fail("the header is not a JSON object (it must begin with '{')");
  // The JSON parser takes a NUL byte for the end of its input, which would hide what follows
  // from this reader but not from others; JSON has no place for one anyway.
  const auto nul = text.find('\0');
  if (nul != std::string::npos) fail("the header holds a NUL byte at offset " + std::to_string(nul));
  HeaderPrecheck precheck;
  if (!json::sax_parse(text, &precheck)) fail(precheck.error());
  // The format pads a header with spaces only; JSON would also let tabs and newlines through.
  const auto last = text.find_last_not_of(' ');
  if (text[last] != '}') fail("the header is padded with bytes other than spaces");
  const json header = json::parse(text);

  SafetensorsHeader out;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& e = it.value();
    if (name == "__metadata__") {
      if (!e.is_object()) fail("__metadata__ is " + shown(e) + ", not an object of strings");
      for (auto m = e.begin(); m != e.end(); ++m) {
        if (!m.value().is_string()) fail("__metadata__ " + quote(m.key()) + " is " + shown(m.value()) + ", not a string");
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    // No reader can look an unnamed tensor up, and a state dict has no key "".
    if (name.empty()) fail("a tensor has an empty name; every tensor is named");
    const std::string tensor = "tensor " + quote(name);
    if (!e.is_object()) fail(tensor + " is " + shown(e) + ", not an object {dtype, shape, data_offsets}");
    for (const char* key : {"dtype", "shape", "data_offsets"})
      if (!e.contains(key)) fail(tensor + " has no " + key);

    SafetensorsEntry entry;
    entry.name = name;
    const json& dtype = e.at("dtype");
    const Dtype* known = nullptr;
    for (const Dtype& d : kDtypes)
      if (dtype.is_string() && dtype.get<std::string>() == d.code) known = &d;
    if (known == nullptr) fail(tensor + " has dtype " + shown(dtype) + "; supported: " + dtype_list());
    entry.dtype = known->type;

    const json& shape = e.at("shape");
    if (!shape.is_array()) fail(tensor + " has shape " + shown(shape) + ", not an array of dimensions");
    if (shape.size() > kMaxDims)
      fail(tensor + " has " + std::to_string(shape.size()) + " dimensions, more than " + std::to_string(kMaxDims));
    // The product of the dimensions, a zero counted as one, is what strides reach: it has to
    // fit int64_t even where the tensor is empty.
    uint64_t reach = 1;
    for (const json& d : shape) {
      bool ok = false;
      const uint64_t n = unsigned_or(d, ok);
      if (!ok) fail(tensor + " has the dimension " + shown(d) + "; dimensions are non-negative integers");
      if (__builtin_mul_overflow(reach, std::max<uint64_t>(n, 1), &reach) ||
          reach > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(tensor + " has a shape " + shown(shape) + " whose element count overflows 64 bits");
      entry.shape.push_back(static_cast<int64_t>(n));
    }
    const bool empty = std::find(entry.shape.begin(), entry.shape.end(), 0) != entry.shape.end();
    uint64_t bytes = 0;
    if (!empty && __builtin_mul_overflow(reach, c10::elementSize(entry.dtype), &bytes))
      fail(tensor + " has a shape " + shown(shape) + " whose byte size overflows 64 bits");

    const json& offsets = e.at("data_offsets");
    bool ok_begin = false, ok_end = false;
    if (offsets.is_array() && offsets.size() == 2) {
      entry.begin = unsigned_or(offsets[0], ok_begin);
      entry.end = unsigned_or(offsets[1], ok_end);
    }
    if (!ok_begin || !ok_end) fail(tensor + " has data_offsets " + shown(offsets) + ", not two non-negative integers [begin, end]");
    const std::string at = tensor + " has data_offsets " + offsets_text(entry.begin, entry.end);
    if (entry.end < entry.begin) fail(at + ", which end before they begin");
    if (entry.end - entry.begin != bytes)
      fail(at + " but " + known->code + " " + shape_text(entry.shape) + " needs " + std::to_string(bytes) + " bytes");
    if (entry.end > data_size)
      fail(at + " past the end of the data, which is " + std::to_string(data_size) + " bytes (is the file truncated?)");
    out.tensors.push_back(std::move(entry));
  }

  // The tensors tile the data region: each begins where the one before ended, the first at 0,
  // and the last ends where the file does.
  std::stable_sort(out.tensors.begin(), out.tensors.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return std::make_pair(a.begin, a.end) < std::make_pair(b.begin, b.end);
  });
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& e : out.tensors) {
    const uint64_t expected = previous ? previous->end : 0;
    if (e.begin > expected && previous == nullptr)
      fail("the data begins with " + std::to_string(e.begin) + " bytes that belong to no tensor (the first, " +
           quote(e.name) + ", has data_offsets " + offsets_text(e.begin, e.end) + ")");
    if (e.begin > expected)
      fail("the " + std::to_string(e.begin - expected) + " bytes between tensor " + quote(previous->name) + " (data_offsets " +
           offsets_text(previous->begin, previous->end) + ") and tensor " + quote(e.name) + " (data_offsets " +
           offsets_text(e.begin, e.end) + ") belong to no tensor");
    if (e.begin < expected)
      fail("tensor " + quote(e.name) + " (data_offsets " + offsets_text(e.begin, e.end) + ") overlaps tensor " +
           quote(previous->name) + " (data_offsets " + offsets_text(previous->begin, previous->end) + ")");
    previous = &e;
  }
  const uint64_t covered = previous ? previous->end : 0;
  if (covered != data_size)
    fail("the data after the header is " + std::to_string(data_size) + " bytes but the tensors cover only " +
         std::to_string(covered) + "; " + std::to_string(data_size - covered) + " bytes belong to no tensor");
  return out;
}

// A file opened for reading at offsets, closed on scope exit.
class InputFile {
 public:
  explicit InputFile(const std::string& path) : path_(path) {
    // O_NONBLOCK: a FIFO given as the path is refused below instead of blocking the open;
    // regular files ignore it.
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0) throw Error("safetensors: cannot read '" + path + "': " + std::generic_category().message(errno));
    struct stat st {};
    const bool stat_ok = ::fstat(fd_, &st) == 0;
    const int stat_errno = errno;
    if (!stat_ok || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      throw Error("safetensors: '" + path + "' " +
                  (stat_ok ? "is not a regular file" : "cannot be inspected: " + std::generic_category().message(stat_errno)));
    }
    size_ = static_cast<uint64_t>(st.st_size);
  }
  ~InputFile() { ::close(fd_); }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  uint64_t size() const { return size_; }

  // Reads exactly `n` bytes at `offset` into `dst`; false when the file ends first (it shrank
  // after the size was taken).
  bool read_at(void* dst, uint64_t n, uint64_t offset) const {
    auto* p = static_cast<char*>(dst);
    while (n > 0) {
      const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, uint64_t{1} << 30));
      const ssize_t got = ::pread(fd_, p, chunk, static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) throw Error("safetensors: reading '" + path_ + "' failed: " + std::generic_category().message(errno));
      if (got == 0) return false;
      p += got;
      n -= static_cast<uint64_t>(got);
      offset += static_cast<uint64_t>(got);
    }
    return true;
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// The header size first, checked against the limit and the file's size before anything is
// allocated for it.
SafetensorsHeader read_header(const InputFile& file, const std::string& path) {
  const std::string where = "safetensors: '" + path + "': ";
  if (file.size() < 8)
    throw Error(where + "the file is " + std::to_string(file.size()) + " bytes, too short for the 8-byte header size");
  unsigned char le[8];
  if (!file.read_at(le, 8, 0)) throw Error(where + "the file ended while its header size was read");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(le[i]) << (8 * i);
  if (n > kSafetensorsMaxHeaderBytes)
    throw Error(where + "declares a header of " + std::to_string(n) + " bytes, more than the limit of " +
                std::to_string(kSafetensorsMaxHeaderBytes));
  if (n > file.size() - 8)
    throw Error(where + "declares a header of " + std::to_string(n) + " bytes but only " + std::to_string(file.size() - 8) +
                " bytes follow its size (is the file truncated?)");
  std::string text(static_cast<size_t>(n), '\0');
  if (!file.read_at(text.data(), n, 8)) throw Error(where + "the file ended while its header was read");
  SafetensorsHeader header = parse_header(where, text, file.size() - 8 - n);
  header.data_start = 8 + n;
  return header;
}

std::string json_text(const json& value, const std::string& what) {
  try {
    return value.dump();
  } catch (const json::type_error&) {
    throw Error("safetensors: " + what + " is not valid UTF-8");
  }
}

}  // namespace

void write_safetensors(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata,
                       const std::function<void(const void*, size_t)>& sink) {
  // The header is assembled as text so that its entries keep the order of `tensors` (a JSON
  // object type would sort them, or look keys up linearly to keep the order).
  std::string header = "{";
  auto add = [&](const std::string& name, const json& value, const std::string& what) {
    if (header.size() > 1) header += ',';
    header += json_text(name, "tensor name " + quote(name)) + ':' + json_text(value, what);
  };
  if (!metadata.empty()) add("__metadata__", metadata, "the metadata");
  std::unordered_set<std::string> names;
  uint64_t offset = 0;
  for (auto& [name, tensor] : tensors) {
    const std::string what = "safetensors: tensor " + quote(name);
    if (name.empty()) throw Error("safetensors: a tensor has an empty name; every tensor is named");
    if (name == "__metadata__") throw Error("safetensors: '__metadata__' names the file's metadata; no tensor can take it");
    if (!names.insert(name).second) throw Error("safetensors: duplicate tensor name " + quote(name));
    if (!tensor.defined()) throw Error(what + " is undefined");
    if (tensor.layout() != torch::kStrided)
      throw Error(what + " has layout " + c10::str(tensor.layout()) + "; only dense tensors can be written");
    const char* code = dtype_code(tensor.scalar_type());
    if (code == nullptr)
      throw Error(what + " has unsupported dtype " + c10::toString(tensor.scalar_type()) + "; supported: " + dtype_list());
    const uint64_t bytes = static_cast<uint64_t>(tensor.numel()) * tensor.element_size();
    add(name, {{"dtype", code}, {"shape", tensor.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}},
        "the entry of tensor " + quote(name));
    offset += bytes;
  }
  header += '}';
  // Spaces, the padding the format allows, start the data 8-byte aligned, so that a reader
  // that maps the file can use every tensor in place.
  while (header.size() % 8 != 0) header.push_back(' ');
  if (header.size() > kSafetensorsMaxHeaderBytes)
    throw Error("safetensors: the header would be " + std::to_string(header.size()) + " bytes, more than the " +
                std::to_string(kSafetensorsMaxHeaderBytes) + " readers accept");
  const uint64_t n = header.size();
  unsigned char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(n >> (8 * i));
  sink(le, 8);
  sink(header.data(), header.size());
  // One tensor at a time: a model on a GPU passes through host memory a tensor, not a model, at once.
  for (auto& [name, tensor] : tensors) {
    if (tensor.numel() == 0) continue;
    const torch::Tensor t = tensor.detach().to(torch::kCPU).contiguous();
    sink(t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size());
  }
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // Written to PATH.tmp, flushed and renamed: the file at path is the old one or the new one
  // whole, whatever happens meanwhile (formats/file_records.hpp).
  try {
    detail::replace_file(path, [&](const detail::ByteSink& sink) { write_safetensors(tensors, metadata, sink); });
  } catch (const Error& e) {
    const std::string what = e.what();
    throw Error("safetensors: " + what.substr(what.rfind("checkpoint: ", 0) == 0 ? 12 : 0));
  }
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  const InputFile file(path);
  return read_header(file, path);
}

NamedTensors load_safetensors(const std::string& path) {
  const InputFile file(path);
  const SafetensorsHeader header = read_header(file, path);
  const std::string where = "safetensors: '" + path + "': ";
  const detail::ReadAt read = [&file](void* dst, uint64_t n, uint64_t offset) { return file.read_at(dst, n, offset); };
  NamedTensors out;
  out.reserve(header.tensors.size());
  for (const SafetensorsEntry& e : header.tensors)
    out.emplace_back(e.name, detail::read_tensor_bytes(read, e.dtype, e.shape, header.data_start + e.begin,
                                                       e.end - e.begin, where, e.name));
  return out;
}

namespace detail {

torch::Tensor read_tensor_bytes(const ReadAt& read, torch::ScalarType dtype, const std::vector<int64_t>& shape,
                                uint64_t offset, uint64_t bytes, const std::string& where, const std::string& name) {
  torch::Tensor t;
  try {
    t = torch::empty(shape, torch::TensorOptions().dtype(dtype));
  } catch (const c10::Error& err) {
    throw Error(where + "cannot allocate tensor " + quote(name) + " (" + std::to_string(bytes) +
                " bytes): " + err.what_without_backtrace());
  }
  if (static_cast<uint64_t>(t.numel()) * t.element_size() != bytes)
    throw Error(where + "tensor " + quote(name) + ": " + std::to_string(bytes) + " bytes do not hold its shape " +
                shape_text(shape));
  if (bytes > 0 && !read(t.data_ptr(), bytes, offset))
    throw Error(where + "the file ended while tensor " + quote(name) + " was read (did it change meanwhile?)");
  if (dtype == torch::kBool) {
    // Any other byte would be a C++ bool with an undefined value.
    const auto* b = static_cast<const uint8_t*>(t.data_ptr());
    const auto* bad = std::find_if(b, b + bytes, [](uint8_t v) { return v > 1; });
    if (bad != b + bytes)
      throw Error(where + "tensor " + quote(name) + " is BOOL but holds the byte " + std::to_string(*bad) +
                  " at element " + std::to_string(bad - b) + "; BOOL bytes are 0 or 1");
  }
  return t;
}

}  // namespace detail

}  // namespace hasten
