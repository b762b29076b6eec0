// A graceful stop on SIGTERM or SIGINT: what schedulers send before they
// end a job (SLURM's time limit, a preemption, `timeout`, Ctrl-C). While a
// StopRequest lives, the first such signal only sets a flag; the trainer
// reads it between steps, finishes the step it is in, writes a checkpoint
// and returns kExitStoppedOnRequest, so that running the same command resumes.
// A second signal ends the process as the signal would have (the default
// action), for a user who does not want to wait.
#pragma once

namespace dflash::train {

// One at a time: the handlers and the flag are the process's (a process
// trains one run at a time; ab runs its arms one after another).
class StopRequest {
 public:
  StopRequest();   // installs the handlers
  ~StopRequest();  // restores the previous ones
  StopRequest(const StopRequest&) = delete;
  StopRequest& operator=(const StopRequest&) = delete;

  // The signal that asked for a stop (SIGTERM, SIGINT), or 0.
  int signal() const;
};

// "SIGTERM", "SIGINT", or "a stop signal" for any other number.
const char* stop_signal_name(int signal);

}  // namespace dflash::train
