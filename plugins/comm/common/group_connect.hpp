// The comm slot split (ABI 1.11) the simple way, shared by the first-party backends: a group's
// communicator is a new instance of the backend's class, made with the parent's options and
// connected by its own init among the group's members, under the group's store prefix. Every
// rank of the parent calls split, so the members of each group connect while the others
// connect theirs.
#pragma once

#include <hasten/plugin.hpp>

#include <memory>
#include <string_view>

namespace hasten::comm {

// `init`: the parent's init (deadlines, device), its rank, size and prefix replaced by the group's.
template <class T>
T* connect_group(const hasten_host_api* host, std::string_view options, hasten_comm_init init,
                 const hasten_comm_split& split) {
  auto group = std::make_unique<T>(host, options);
  init.rank = split.rank;
  init.world_size = split.size;
  init.store_prefix = split.store_prefix;
  group->init(init);
  return group.release();
}

}  // namespace hasten::comm
