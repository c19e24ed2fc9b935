// Restarts across machines. With num_machines > 1 and max_restarts > 0 the launchers (the
// "agents", in torchrun's word) of every machine agree on each round of workers, so that a
// failure on any machine stops the workers on all of them and every machine starts its
// workers again together:
//
//   machine 0's launcher hosts a coordinator on main_process_port + 1 (the workers' own
//   store, on main_process_port, is hosted by worker rank 0 and dies with the round);
//   every launcher, machine 0's included, connects to it and joins with its machine rank;
//   once all have joined the coordinator starts round 0 (and names the workers' port);
//   a launcher whose worker fails says so at once; the coordinator tells every other
//   launcher to stop its workers, waits until every machine's workers have ended, then starts
//   the next round, up to max_restarts times, or ends the run with the failure's exit code.
//
// A launcher that disconnects (its machine died, it was SIGKILLed), or says nothing for
// kSilentFor (agent_wire.hpp: launchers PING every second; a machine that lost power or its
// network closes no connection), ends the run on every other machine with one line naming it:
// with a fixed membership (static rendezvous) no round could start without it. The coordinator lives in machine 0's launcher: losing machine 0 ends the
// run, as losing torchrun's store host does.
//
// Elastic (min_machines > 0, `--num_machines MIN:MAX`): a round runs on the machines present,
// MIN to MAX of them. The first starts once MAX have joined, or MIN have and kLastCall has
// passed since; a launcher that disconnects stops the round and the next starts without it
// (while MIN remain), and one that joins during a round (below MAX) stops it and the next
// starts with it. Every new round counts against max_restarts. Each round numbers its
// machines 0.. in the order of their machine_rank (machine 0, the coordinator's, stays 0), so
// the workers' ranks are dense and the world is machines x processes per machine.
//
// The wire is one text line per message over TCP:
//   launcher -> coordinator: JOIN <machine>, FAIL <round> <rank> <what>, END <round> <code> <interrupted>,
//                            PING
//   coordinator -> launcher: START <round> <port> <machines> <place>, STOP <round> <machine> <what>,
//                            EXIT <code> <why>
#pragma once

#include <memory>
#include <string>

namespace hasten::cli {

class MachineAgents {
 public:
  struct Settings {
    int num_machines = 2;
    int machine_rank = 0;
    std::string main_addr;     // machine 0's address (main_process_ip)
    int agent_port = 0;        // the coordinator's port (main_process_port + 1)
    int master_port = 0;       // the workers' store port of the first round
    int max_restarts = 0;
    int min_machines = 0;         // elastic: rounds run on min_machines..num_machines; 0: all, fixed
    double join_timeout_s = 300;  // rendezvous_timeout_s: how long machines may take to join
    std::string token;            // the run's secret; JOIN must carry it (empty: none)
    std::string bind_override;    // HASTEN_BIND_ADDR: where machine 0's coordinator listens
  };
  // Machine 0 starts the coordinator; every machine connects and joins. Throws hasten::Error
  // (one line) when the coordinator's port cannot be bound or reached within join_timeout_s.
  explicit MachineAgents(const Settings& settings);
  ~MachineAgents();
  MachineAgents(const MachineAgents&) = delete;
  MachineAgents& operator=(const MachineAgents&) = delete;

  struct Round {
    bool run = false;     // false: the run is over, exit with exit_code
    int number = 0;       // 0 for the first start, then one more per restart
    int master_port = 0;  // the workers' store port for this round
    int exit_code = 0;
    std::string why;      // when the run is over and did not succeed: what ended it
    int num_machines = 0;  // the machines of this round (elastic: fewer than num_machines maybe)
    int machine_rank = 0;  // this machine's place among them
  };
  // Blocks until the coordinator starts the next round or ends the run.
  Round next_round();
  // Polled while workers run (never blocks): true once this round must stop on this machine
  // because another machine's worker failed or a launcher left; stop_reason() says which.
  bool stop_requested();
  std::string stop_reason() const;
  // This machine's first failing worker, reported the moment it fails so that the
  // coordinator can name the first failure of the round across machines.
  void report_failure(int rank, const std::string& what);
  // Every local worker of the round has ended; code is the launcher's local exit status.
  void report_end(int code, bool interrupted);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hasten::cli
