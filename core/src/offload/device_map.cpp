// Device maps (hasten/big_modeling.hpp): infer_auto_device_map sizes the units and fills the
// devices in order; load_checkpoint_and_dispatch resolves each tensor to its innermost listed
// module and reads it there, or hands it to its unit's stream (unit_stream.hpp).
#include <hasten/big_modeling.hpp>
#include <hasten/error.hpp>
#include <hasten/safetensors.hpp>
#include <hasten/unit.hpp>

#include <torch/torch.h>

#include <map>
#include <algorithm>
#include <memory>
#include <optional>
#include <set>

#include "checkpoint/weight_files.hpp"
#include "offload/unit_stream.hpp"

namespace hasten {

namespace {

using detail::StoredTensor;
using detail::UnitStream;

// name is `module` or lies inside it ("" holds everything).
bool inside(const std::string& name, const std::string& module) {
  return module.empty() || name == module || (name.size() > module.size() && name.compare(0, module.size(), module) == 0 &&
                                              name[module.size()] == '.');
}

// A device of a map: the CPU, disk (units only) or a GPU of this machine.
struct MapDevice {
  enum Kind { kCpu, kDisk, kGpu } kind = kCpu;
  c10::DeviceIndex index = 0;
  torch::Device device() const { return kind == kGpu ? torch::Device(torch::kCUDA, index) : torch::Device(torch::kCPU); }
};

MapDevice parse_device(const std::string& device, const char* who, bool disk_allowed) {
  if (device == "cpu") return {};
  if (disk_allowed && device == "disk") return {MapDevice::kDisk};
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  const bool gpu = device == "cuda" || (device.size() > 5 && device.size() <= 8 && device.compare(0, 5, "cuda:") == 0 &&
                                        std::all_of(device.begin() + 5, device.end(), digit) &&
                                        (device[5] != '0' || device.size() == 6));
  if (!gpu)
    throw UsageError(std::string(who) + ": '" + device + "' is not a device (allowed: cpu, " +
                     (disk_allowed ? "disk, " : "") + "cuda, cuda:N)");
  const int index = device == "cuda" ? 0 : std::stoi(device.substr(5));
  const int count = static_cast<int>(torch::cuda::device_count());
  if (index >= count)
    throw UsageError(std::string(who) + ": device '" + device + "': this machine has " +
                     (count == 0 ? std::string("no CUDA GPU")
                                 : std::to_string(count) + " (cuda:0" +
                                       (count > 1 ? " to cuda:" + std::to_string(count - 1) : std::string()) + ")"));
  return {MapDevice::kGpu, static_cast<c10::DeviceIndex>(index)};
}

// The outermost units, by name, in module order.
std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> outer_units(torch::nn::Module& model) {
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> out;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (dynamic_cast<UnitBase*>(item.value().get()) == nullptr) continue;
    bool nested = false;
    for (auto& [name, m] : out) nested = nested || inside(item.key(), name);
    if (!nested) out.emplace_back(item.key(), item.value());
  }
  return out;
}

// Its parameters' and buffers' bytes, at the shapes they were declared with (a unit built under
// EmptyWeights holds none, but will).
uint64_t bytes_of(torch::nn::Module& m) {
  uint64_t n = 0;
  std::set<const void*> seen;  // a tied tensor counts once
  auto add = [&](const torch::Tensor& t) {
    if (!seen.insert(t.unsafeGetTensorImpl()).second) return;
    n += static_cast<uint64_t>(c10::multiply_integers(detail::declared_shape(t))) * t.element_size();
  };
  for (auto& p : m.parameters()) add(p);
  for (auto& b : m.buffers()) add(b);
  return n;
}

}  // namespace

DeviceMap infer_auto_device_map(torch::nn::Module& model, const std::vector<std::pair<std::string, uint64_t>>& max_memory) {
  if (max_memory.empty()) throw UsageError("infer_auto_device_map: max_memory names no device (allowed: cpu, cuda:N)");
  for (auto& [device, bytes] : max_memory) parse_device(device, "infer_auto_device_map", false);
  const auto units = outer_units(model);
  // The root's own share: everything outside the units.
  uint64_t in_units = 0;
  for (auto& [name, m] : units) in_units += bytes_of(*m);
  const uint64_t total = bytes_of(model);
  std::vector<uint64_t> left;
  for (auto& [device, bytes] : max_memory) left.push_back(bytes);
  left[0] = left[0] > total - in_units ? left[0] - (total - in_units) : 0;
  DeviceMap map{{"", max_memory[0].first}};
  size_t d = 0;
  for (auto& [name, m] : units) {
    const uint64_t need = bytes_of(*m);
    // Devices fill in order (Accelerate's rule): once a unit does not fit one, the units after
    // it go to the next, even where a smaller one would still fit.
    while (d < left.size() && left[d] < need) ++d;
    if (d == left.size()) {
      map.push_back({name, "disk"});
      continue;
    }
    left[d] -= need;
    map.push_back({name, max_memory[d].first});
  }
  return map;
}

void load_checkpoint_and_dispatch(torch::nn::Module& model, const std::string& checkpoint, const DeviceMap& map) {
  const char* who = "load_checkpoint_and_dispatch";
  std::map<std::string, std::shared_ptr<torch::nn::Module>> modules;
  for (const auto& item : model.named_modules()) modules[item.key()] = item.value();
  for (const auto& [name, m] : modules)
    if (auto* unit = dynamic_cast<UnitBase*>(m.get()); unit != nullptr && unit->hasten_attached())
      throw UsageError(std::string(who) + ": '" + name + "' is prepared by an Accelerator or dispatched already");
  std::set<std::string> listed;
  std::vector<MapDevice> devices;  // map[i]'s
  for (auto& e : map) {
    devices.push_back(parse_device(e.device, who, true));
    if (!listed.insert(e.module).second)
      throw UsageError(std::string(who) + ": the device map lists '" + e.module + "' twice");
    auto it = modules.find(e.module);
    if (it == modules.end()) throw UsageError(std::string(who) + ": the device map names '" + e.module + "', which the model does not have");
    if (e.device == "disk" && dynamic_cast<UnitBase*>(it->second.get()) == nullptr)
      throw UsageError(std::string(who) + ": '" + e.module +
                       "' is mapped to disk but is not a hasten::Unit (only a unit can read its weights as it runs)");
  }
  // Where every stored tensor is (the files stay open: later reads are of the files checked now).
  std::map<std::string, StoredTensor> stored;
  std::map<std::filesystem::path, std::pair<std::shared_ptr<const detail::WeightFile>, SafetensorsHeader>> files;
  for (auto& [name, path] : detail::weight_files(checkpoint, who)) {
    auto f = files.find(path);
    if (f == files.end())
      f = files.emplace(path, std::make_pair(std::make_shared<const detail::WeightFile>(path),
                                             read_safetensors_header(path.string()))).first;
    const auto& [file, header] = f->second;
    for (auto& e : header.tensors)
      if (e.name == name) stored[name] = {file, e.dtype, e.shape, header.data_start + e.begin, e.end - e.begin};
    if (!stored.count(name)) throw Error(std::string(who) + ": '" + path.string() + "' lacks '" + name + "', which the index lists");
  }
  // The innermost listed module holding `name`, or none.
  auto entry_of = [&](const std::string& name) -> std::optional<size_t> {
    std::optional<size_t> where;
    for (size_t i = 0; i < map.size(); ++i)
      if (inside(name, map[i].module) && (!where || map[i].module.size() > map[*where].module.size())) where = i;
    return where;
  };
  // Accelerate's main device: with a GPU in the map, the first one, where the units whose weights
  // are on disk or offloaded to the CPU run. Every outermost unit then runs on a GPU (its own, or
  // the main one) and moves its forward's inputs there.
  std::optional<torch::Device> main_gpu;
  for (auto& d : devices)
    if (d.kind == MapDevice::kGpu && !main_gpu) main_gpu = d.device();
  const auto units = outer_units(model);
  std::map<std::string, torch::Device> runs_on;  // outermost unit -> its device
  for (auto& [name, m] : units) {
    const auto e = entry_of(name);
    runs_on.emplace(name, e && devices[*e].kind == MapDevice::kGpu ? devices[*e].device()
                                                                    : main_gpu.value_or(torch::Device(torch::kCPU)));
  }
  // The outermost unit holding `name` (a module or a tensor), or none.
  auto outer_unit_of = [&](const std::string& name) -> const std::string* {
    for (auto& [unit, m] : units)
      if (inside(name, unit)) return &unit;
    return nullptr;
  };

  // First every check, then the reads: a refusal leaves the model as it was. Each tensor goes
  // where its innermost listed module goes: onto its device, or into the stream of the unit that
  // reads it in for each forward (a unit on disk; with a GPU in the map, the outermost unit
  // around a tensor mapped to the CPU). A tensor under several names (tied weights) is read
  // once, and all its names must go to the same place.
  struct Destination {
    std::optional<std::string> stream;  // the unit that streams it
    torch::Device device{torch::kCPU};  // where it is read to (streamed: where its unit runs)
    bool from_disk = false;
    bool operator==(const Destination& o) const { return stream == o.stream && device == o.device; }
  };
  struct Placement {
    std::string name;
    torch::Tensor tensor;
    size_t entry;
    Destination to;
  };
  std::vector<Placement> placements;
  std::map<const void*, size_t> by_tensor;  // TensorImpl -> its first placement
  std::set<std::string> used;
  auto resolve = [&](const std::string& name, const torch::Tensor& tensor) {
    const auto entry = entry_of(name);
    if (!entry)
      throw UsageError(std::string(who) + ": no module of the device map holds '" + name +
                       "' (list it, a module above it, or the root \"\")");
    auto s = stored.find(name);
    if (s == stored.end()) throw Error(std::string(who) + ": '" + checkpoint + "' has no '" + name + "', which the model has");
    const std::vector<int64_t> shape = detail::declared_shape(tensor);  // built under EmptyWeights: its shape then
    if (s->second.shape != shape)
      throw Error(std::string(who) + ": '" + name + "' has shape " + c10::str(c10::IntArrayRef(s->second.shape)) + " in '" +
                  checkpoint + "', the model's is " + c10::str(c10::IntArrayRef(shape)));
    used.insert(name);
    Destination to;
    const MapDevice& device = devices[*entry];
    const std::string& module = map[*entry].module;
    const std::string* outer = outer_unit_of(module == "" ? name : module);
    if (device.kind == MapDevice::kGpu) {
      to.device = device.device();
      if (outer != nullptr && runs_on.at(*outer) != to.device)
        throw UsageError(std::string(who) + ": '" + module + "' is mapped to " + map[*entry].device + " inside the unit '" +
                         *outer + "', which runs on " + runs_on.at(*outer).str() +
                         ": a module inside a unit runs where the unit runs (map the unit there instead)");
    } else if (device.kind == MapDevice::kDisk) {
      to.stream = module;
      to.from_disk = true;
      to.device = outer != nullptr ? runs_on.at(*outer) : main_gpu.value_or(torch::Device(torch::kCPU));
    } else if (main_gpu && (outer = outer_unit_of(name)) != nullptr) {
      to.stream = *outer;  // offloaded: kept on the CPU, read in to its unit's GPU for each forward
      to.device = runs_on.at(*outer);
    }
    const auto [first, fresh] = by_tensor.emplace(tensor.unsafeGetTensorImpl(), placements.size());
    if (!fresh) {
      const Placement& other = placements[first->second];
      if (!(other.to == to))
        throw UsageError(std::string(who) + ": '" + other.name + "' and '" + name +
                         "' are one tensor (tied weights), placed with '" + map[other.entry].module + "' (" +
                         map[other.entry].device + ") and '" + module + "' (" + map[*entry].device +
                         "): a tied tensor cannot be streamed with one of its modules only, nor be on two devices; "
                         "map both modules to one device or into one unit");
      return;
    }
    placements.push_back({name, tensor, *entry, std::move(to)});
  };
  for (auto& item : model.named_parameters()) resolve(item.key(), item.value());
  for (auto& item : model.named_buffers()) resolve(item.key(), item.value());
  for (auto& [name, s] : stored)
    if (!used.count(name)) throw Error(std::string(who) + ": '" + checkpoint + "' has '" + name + "', which the model does not");
  std::map<std::string, std::pair<std::vector<UnitStream::Slot>, torch::Device>> streamed;  // unit -> its tensors
  torch::NoGradGuard no_grad;
  for (auto& p : placements) {
    const StoredTensor& s = stored.at(p.name);
    if (!p.to.stream) {
      p.tensor.set_data(detail::read_stored(s, p.tensor.scalar_type(), p.name).to(p.to.device));
      continue;
    }
    auto& [slots, device] = streamed.try_emplace(*p.to.stream, std::vector<UnitStream::Slot>{}, p.to.device).first->second;
    slots.push_back({p.name, p.tensor, s, p.to.from_disk ? torch::Tensor() : detail::read_stored(s, p.tensor.scalar_type(), p.name)});
  }
  for (auto& [module, slots] : streamed)
    UnitStream::attach(*dynamic_cast<UnitBase*>(modules.at(module).get()),
                       std::make_shared<UnitStream>(module, std::move(slots.first), slots.second));
  if (main_gpu)
    for (auto& [name, m] : units) UnitStream::run_on(*dynamic_cast<UnitBase*>(m.get()), runs_on.at(name));
}

}  // namespace hasten
