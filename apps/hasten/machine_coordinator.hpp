// Machine 0's coordinator of the launchers' rounds (machine_agents.hpp has the protocol): a
// thread in machine 0's launcher that joins the launchers, starts rounds, turns the first
// failure of a round (or, elastic, a machine leaving or joining) into a stop everywhere and the
// round's end into the next round or the end of the run.
#pragma once

#include <memory>
#include <string>

#include "machine_agents.hpp"

namespace hasten::cli {

class MachineCoordinator {
 public:
  // Listens on settings.agent_port and starts the thread; hasten::Error (one line) when the
  // port cannot be bound.
  explicit MachineCoordinator(const MachineAgents::Settings& settings);
  ~MachineCoordinator();
  MachineCoordinator(const MachineCoordinator&) = delete;
  MachineCoordinator& operator=(const MachineCoordinator&) = delete;
  // Where machine 0's own launcher reaches it.
  std::string local_address() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hasten::cli
