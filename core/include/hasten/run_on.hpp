// hasten::RunOn: a callable that runs the wrapped function only on the processes chosen when
// it was made, what Accelerate's decorators on_main_process, on_local_main_process,
// on_last_process, on_process and on_local_process return:
//
//   auto save = acc.on_main_process([&](const std::string& path) { write_report(path); });
//   save("report.txt");                       // writes on rank 0, does nothing elsewhere
//   auto n = acc.on_process([] { return 42; }, 1)();   // std::optional<int>: 42 on rank 1 only
//
// A function returning void gives void; one returning R gives std::optional<R> (empty on the
// processes where it did not run), where Accelerate's wrapper returns None.
#pragma once

#include <functional>
#include <optional>
#include <type_traits>
#include <utility>

namespace hasten {

template <class F>
class RunOn {
 public:
  RunOn(F fn, bool runs_here) : fn_(std::move(fn)), runs_here_(runs_here) {}

  template <class... A>
  auto operator()(A&&... args) {
    using R = std::invoke_result_t<F&, A&&...>;
    if constexpr (std::is_void_v<R>) {
      if (runs_here_) std::invoke(fn_, std::forward<A>(args)...);
    } else {
      if (!runs_here_) return std::optional<std::decay_t<R>>();
      return std::optional<std::decay_t<R>>(std::invoke(fn_, std::forward<A>(args)...));
    }
  }
  // Whether calls run the function on this process.
  bool runs_here() const { return runs_here_; }

 private:
  F fn_;
  bool runs_here_;
};

}  // namespace hasten
